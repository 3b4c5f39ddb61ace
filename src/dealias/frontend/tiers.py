"""Tiers: per compiled program, run the fastest of what can run it, measured on the user's own calls (and copies of
their tensors in the first call).

A program (one cache entry of a graph: one input layout) can run on
- "torch": dealias's torch executor (eager's kernels op by op, the functional graph, exact write-back);
- "graph": dynamo's captured graph run as it is, on the caller's tensors, as `backend="eager"` runs it. Its
  in-place ops are eager's own, so its results are eager's bit for bit (the same bits as the torch executor's:
  both run dynamo's graph's ops with eager's kernels). It is used only where dealias's capture of this layout
  found nothing it had to correct or rebuild around the graph (`graph_tier_refusal`): no inputs sharing memory, no
  in-place metadata change written back, no output re-strided, no detach_() of an input,
  no input whose writes eager restricts. Where dealias does any of that, running the graph as it is might not be
  eager's behaviour, so it is not tried;
- "fused": the fused executor (inductor), compiled in the program's first call (`FUSE_FIRST`, as torch.compile
  compiles: that call costs seconds either way), or, with DEALIAS_FUSE_FIRST=0, once the program has run
  `PROMOTE_AFTER` times or for `PROMOTE_AFTER_SECONDS`. Its results differ from eager's in the last bits.

executor="tiered" (the default) measures all three and keeps the fastest; executor="exact" ("auto" before) only the
two exact tiers: bit for bit eager's results. Either way never slower than eager's run of the same graph (beyond
measurement noise) where that graph is a candidate.
Each candidate's first call is not timed (warm-up: lazily built paths, caches); then the candidates take turns, call
by call (so a noisy stretch of the machine moves them all), until each has `SAMPLES` timed calls (or `MEASURE_SECONDS`
of them), and the one whose fastest timed call is fastest wins (load only adds to a call's time); tiers within `CLOSE`
of the best are measured on (`CLOSE_ROUNDS`); a clear loser (`CLEAR_LOSS`) stops being measured after 2, and the last
candidate left wins. The fused program is measured against the exact tier chosen before it (the promoting call chooses
between exact tiers still measured), whose timed calls count: each timed call of a slower tier is one a user waits
for. A call whose outputs carry autograd history is timed until the program's next call: its backward (and the freeing
of its autograd graph) is part of what the tier costs, and the tiers differ there most (the fused program's backward is
inductor's, the others' eager's). The user's code between the calls is timed along, the same for every tier, as noise
that each one's fastest call leaves out. (So
are the other programs of the same step, a graph break's second graph: measured in step with this one, turn by turn,
each then chooses the tier best for the two together, never worse than both on exact tiers.) After that, nothing is
timed: the graph's lean call is pointed at the winner directly.

With FUSE_FIRST, the first call also times the exact tiers, on copies of the call's tensors (each run on fresh
copies of those the plan writes, the random state set back after; `copies_refusal`: not for tensors off the CPU or
over `COPY_BYTES`, nor where the graph is no candidate; those runs stop after `COPIES_SECONDS` in all, the tiers
they did not measure measured on the user's calls; where the call records autograd, whose backward and the
user's code up to the next call are part of what a tier costs there, the copies only warm the exact tiers up), then
runs the user's call on the fused program (its untimed first call). So the user's next calls are the fused program's
timed calls, and a clearly faster one is chosen after 2 of them, against the exact tiers' samples, without a user's
call on an exact tier (a foreach optimizer's step, 0.6x eager fused, runs 1.2x on them); an exact tier close to it
is measured on the user's calls too. (The samples on copies are of the same inputs' values and layouts; if anything
a little fast, the copies just written and in the caches: that favours the exact tiers, the reference, so a fused
program is chosen only where it beats them.) No later call waits for a compile or runs beside one.

Without FUSE_FIRST, the promoting call builds the fused program (capture, passes, lowering and the trace for
inductor read its inputs and hold dynamo's compile lock; make_fx patches `nn.Module.__call__` for the whole process
while it traces). Inductor's compile of the traced graph, the seconds-long part, then runs in a thread of its own
where the torch allows it (`BACKGROUND`, fused.Background): the exact tiers serve calls meanwhile, slower (the
compile holds the GIL in turns), and the first call after it is done adopts the program, measured afresh against the
exact tier.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.convert_frame import compile_lock

from ..compat import saved_hooks
from ..compat.fx_lazy import generated_forward
from ..compat.inductor import compile_beside_calls
from ..errors import InvariantError
from ..ir.draws import kept_rng
from ..ir.plan import RefKind, Symbolic
from ..passes.pipeline import compile_program
from ..report import records as _report
from ..runtime import fused
from ..runtime.verify import clone_args

log = logging.getLogger("dealias")

# executor="tiered" compiles a program's fused program in its first call, as torch.compile does (its first call costs
# seconds either way), so that no later call waits for a compile or runs beside one. DEALIAS_FUSE_FIRST=0 (read once,
# at import; the test suite's setting, where tests not about tiers compare many calls bit for bit with eager) leaves it
# for the PROMOTE_AFTER-th call instead.
FUSE_FIRST = os.environ.get("DEALIAS_FUSE_FIRST", "1") != "0"
# The exact tiers measured in that first call on copies of the call's tensors (their timed calls then take no user's
# call: a foreach optimizer's step runs 1.2x eager on them), where those tensors take at most this many bytes.
COPY_BYTES = 256 << 20
# ...and while those runs took at most this many seconds in all: each is one more run of the program in the first
# call (a 2.3 s program ran 5 more times, 12 s); the tiers not measured there are measured on the user's calls.
COPIES_SECONDS = 1.0
PROMOTE_AFTER = 16  # calls of a program before executor="tiered" compiles its fused program (without FUSE_FIRST)
# ...or, sooner, seconds spent running it: an inductor compile costs seconds (a few for a small graph, 12 s for the
# 40-tensor Adam of bench/run.py), so a program whose calls take long (large tensors) earns one within a few calls.
PROMOTE_AFTER_SECONDS = 2.0
# Inductor's compile of the fused program runs in a thread of its own while the exact tiers serve calls (the calls
# run slower meanwhile, holding the GIL in turns, but none stops for the compile's seconds), on a torch where that
# is safe for other compiled functions' calls (compat.inductor.compile_beside_calls: 2.14, not 2.13).
BACKGROUND = True
SAMPLES = 5  # timed calls per candidate tier before choosing (after its untimed first call)
# Candidates whose fastest calls are within CLOSE of the best's are measured on, up to CLOSE_ROUNDS x SAMPLES timed
# calls each (the others stop): a close choice is the one a loaded machine's noise decides.
CLOSE = 0.05
CLOSE_ROUNDS = 3
# A candidate whose every timed call took this many times another's slowest (2 calls each at least) is dropped
# before its SAMPLES: its calls are the slow ones a user sees while the tiers are measured (the torch executor's
# op-by-op step of a foreach optimizer at 2-3x eager, where dynamo's graph runs at 1.2x).
CLEAR_LOSS = 1.5
MEASURE_SECONDS = 0.5  # ...or fewer, once a candidate's timed calls took this long in all (long calls)


def _now() -> float:
    """Where torch runs on one thread on the CPU, the calling thread's CPU time: all of a call's work is done there
    (eager's kernels, inductor's, compiled for that one thread, and the CPU backward), and the time other processes
    of a loaded machine take from it is not the tier's (on 2 shared cores, wall times of GPT-2's forward spread from
    0.5x to 2x of their median, its CPU times by 10 %, ranking the tiers alike from call to call). Otherwise the
    wall time: other threads' work (intra-op parallelism, a GPU's) is the call's too."""
    if torch.get_num_threads() == 1 and not torch.cuda.is_initialized():
        return time.thread_time()
    return time.perf_counter()


def measure(tier: str, run: Callable[[list[Any]], Any], leaves: list[Any]) -> tuple[Any, float]:
    """Run one call on `tier`, and how long it took (tests replace this to make the choice deterministic)."""
    start = _now()
    out = run(leaves)
    return out, _now() - start


clock = _now  # times from a call with autograd history to the next (tests replace it, as `measure`)


def _has_history(out: Any) -> bool:
    """Whether a call's outputs may carry autograd history, whose backward the next call's timing then includes.
    (`requires_grad`, not `grad_fn`: reading a view's grad_fn after its base was written rebuilds it, or raises
    where eager forbids it, a view made under no_grad; an output that is a leaf only times a little more.)"""
    if not torch.is_grad_enabled():
        return False
    outs = out if isinstance(out, (list, tuple)) else (out,)
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in outs)


def graph_tier_refusal(program: Any) -> str:
    """Why dynamo's graph, run as it is, may not be eager's behaviour for this compiled program; "" when it is.
    Each reason is something dealias corrects or rebuilds around the graph for this layout."""
    cap, fp = program.captured, program.functional
    if cap.groups:
        return "inputs share memory"
    if fp.metadata_writebacks or any(slot.restride is not None for slot in fp.outputs):
        return "it changes a tensor's sizes or strides in place"
    # (Version counters that dealias's write-back would move where eager's writes do not, FunctionalProgram.
    # unmoved_counters: BatchNorm's running statistics, writes through `x.data` or unsafe_split elements, are
    # dealias's correction of its own write-back, not of dynamo's graph, whose ops move them as eager's do.)
    if cap.detached or cap.restricted:
        return "an input is detached in place or is a view whose writes eager restricts"
    return ""


def _graph_run(forward: Callable[..., Any]) -> Callable[[list[Any]], Any]:
    """The "graph" tier's run of dynamo's graph `forward`. Its `with torch.no_grad()` (`enable_grad`,
    `set_grad_enabled`) is a pair of `_set_grad_enabled` calls in the graph, not Python's `with`: an error between
    them (an index out of range) left the region's grad mode on for the caller's code after the call
    (`backend="eager"` too), where eager's `with` restores it. So the caller's mode is set back when the run
    raises."""

    def run(leaves: list[Any]) -> Any:
        grad = torch.is_grad_enabled()
        try:
            return forward(*leaves)
        except BaseException:
            torch._C._set_grad_enabled(grad)
            raise

    return run


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


class Tiered:
    """A cache entry of executor "tiered" or "exact": the torch executor's program, the other tiers it may run on,
    and their measurements. `tier` says where it runs now, `tier_reason` why, `timings` the medians measured
    (seconds, per tier). Other attributes (traces, reports, layouts, shape_guard) are the torch program's, or the
    fused one's while that runs it."""

    def __init__(self, backend: Any, program: Any, symbolic: Symbolic | None, fuse: bool) -> None:
        self.backend, self.symbolic, self.fuse = backend, symbolic, fuse
        self.first = program  # the torch executor's program
        if not (fuse and FUSE_FIRST):
            program.front = None  # (what a fused compile in the first call would take from it: none here)
        self.fused: Any = None  # the fused program, once compiled
        self.shown = program  # the program whose traces and reports `last_traces` / `explain` show
        self.runs: dict[str, Callable[[list[Any]], Any]] = {"torch": program.lean_call}
        refusal = graph_tier_refusal(program)
        if not refusal:
            forward = generated_forward(backend.gm)  # (not dynamo's lazy forward: the module call on every call)
            self.runs["graph"] = _graph_run(forward)
        self.notes = [f"graph not tried: {refusal}"] if refusal else []
        self.fused_note = ""  # "not fusable" or "fused compile failed"
        self.samples: dict[str, list[float]] = {}
        self.dropped: dict[str, float] = {}  # candidates dropped (clear losers, not close): their fastest call
        self.kept: list[float] = []  # the exact tier chosen before the promotion: its timed calls
        # a call with autograd history being timed until the next call: (tier, its seconds, when it returned)
        self.open: tuple[str, float, float] | None = None
        self.candidates = list(self.runs) if len(self.runs) > 1 else []
        self.warm: set[str] = set()  # candidates whose (untimed) first call ran
        self.timings: dict[str, float] = {}
        self.current = "torch"  # the tier calls run on when nothing is being measured
        self.exact = "torch"  # the exact tier chosen (runs calls the fused program's guard rejects)
        self.run = self.runs["torch"]
        self.calls = 0
        self.spent = 0.0  # seconds the program's calls took (until settled)
        self.promoted = False
        self.promoting = False  # from the promoting call until the fused program is adopted (or failed)
        self.pending: Any = None  # the fused program while inductor compiles it in the background
        # The fused program's shape guard where it may hold for fewer calls than the first's, which the cache entry
        # checks (inductor's decisions on a program over symbols add guards): calls outside it run the exact tier.
        self.narrower: Callable[[list[Any]], bool] | None = None
        self.lock = threading.Lock()
        self.settled = False
        self.measured = ""  # "graph 40.1 us vs torch 55.0 us", once measured
        self.measured_on_copies = False  # the exact tiers timed on copies in the first call (FUSE_FIRST)
        if not self.candidates and not fuse:
            self._settle()

    def __getattr__(self, name: str) -> Any:  # traces, reports, layouts, shape_guard: the shown program's
        return getattr(self.__dict__["shown"], name)

    @property
    def program(self) -> Any:
        """The compiled program shown (the torch executor's, or the fused one while that runs calls)."""
        return self.shown

    @property
    def tier(self) -> str:
        """Where calls run now: "torch", "graph" or "fused", with why the fused executor is not among them."""
        return self.current + (f" ({self.fused_note})" if self.fused_note else "")

    @property
    def tier_reason(self) -> str:
        if self.pending is not None:
            why = "the fused program compiling in the background"
        elif self.candidates or self.promoting:
            calls = f"{self.calls} call{'s' if self.calls != 1 else ''} so far"
            why = f"measuring ({', '.join(self.candidates) or self.current}; {calls})"
        elif self.measured:
            copies = ", the exact tiers' on copies in the first call" if self.measured_on_copies else ""
            why = f"fastest measured: {self.measured} (each one's fastest timed call{copies})"
        elif self.fuse and not self.promoted:
            why = f"the only exact tier; fused after {PROMOTE_AFTER} calls or {PROMOTE_AFTER_SECONDS} s"
        else:
            why = "the only exact tier"
        return "; ".join([why, *self.notes])

    def __call__(self, leaves: list[Any]) -> Any:
        if self.settled:
            return self.run(leaves)
        now = clock()
        with self.lock:
            if self.open is not None:  # the previous call's backward ran since: its tier's sample, whole
                (tier, seconds, returned), self.open = self.open, None
                self._record(tier, seconds + max(0.0, now - returned), seconds)
            self.calls += 1
            due = self.fuse and not self.promoted and not self.promoting
            first = due and FUSE_FIRST and self.calls == 1
            due = due and (first or self.calls >= PROMOTE_AFTER or self.spent >= PROMOTE_AFTER_SECONDS)
            if due and self.candidates and all(self.samples.get(t) for t in self.candidates):
                # The exact tiers still measured (close ones measured on) are chosen between now, by their calls so
                # far: else the fused program would be measured against all of them afresh (their calls taken while
                # inductor compiles are no measure), each timed call of the slower exact tier one more slow call.
                self._choose()
            self.promoting = self.promoting or due
            compiled = self.pending is not None and self.pending.run_graph.pending.done.is_set()
            if compiled:
                program, self.pending = self.pending, None
        if first:
            self._promote(leaves, background=False)
            self._measure_on_copies(leaves)
        elif due:
            self._promote(leaves)
        elif compiled:
            error = program.run_graph.pending.error
            if error is not None and not isinstance(error, Exception):
                raise error  # (KeyboardInterrupt, SystemExit: the user's, not a failed compile)
            self._adopt(program if error is None else None, _failure(error) if error is not None else "")
        with self.lock:
            # the candidate measured least (one not yet warm first), else the current tier
            tier = min(self.candidates, key=self._measured) if self.candidates else self.current
        if tier == "fused" and self.narrower is not None and not self.narrower(leaves):
            return self.runs[self.exact](leaves)  # (not timed: another program ran)
        out, seconds = measure(tier, self.runs[tier], leaves)
        with self.lock:
            if tier in self.candidates and not self.settled and _has_history(out):
                self.open = (tier, seconds, clock())
            else:
                self._record(tier, seconds, seconds)
        return out

    def _measured(self, tier: str) -> tuple[bool, int]:
        return tier in self.warm, len(self.samples.get(tier, ()))

    def _enough(self, tier: str, rounds: int = 1) -> bool:
        samples = self.samples.get(tier, ())
        return len(samples) >= rounds * SAMPLES or (len(samples) > 0 and sum(samples) >= rounds * MEASURE_SECONDS)

    def _fastest(self, tier: str) -> float:
        """A candidate's fastest timed call: what it costs. The machine's load only adds to a call's time, and on a
        loaded machine by as much as the tiers differ (medians of 5 calls chose dynamo's graph for GPT-2's forward,
        0.87x eager, over the fused program's 0.72x)."""
        return min(self.samples[tier])

    def _record(self, tier: str, seconds: float, own: float) -> None:
        """A call on `tier` took `seconds` (until the next call, for one with autograd history), `own` of them in
        the call itself: what promotion counts (the rest may be anything, another graph's compile)."""
        self.spent += own
        if tier not in self.candidates or self.settled:
            return
        if tier not in self.warm:
            self.warm.add(tier)  # its first call: not a sample
            return
        self.samples.setdefault(tier, []).append(seconds)
        self._drop_clear_losers()
        if self.promoting:
            return
        if len(self.candidates) > 1:  # (one left: the others lost clearly, it wins whatever its next calls take)
            if not all(self._enough(t) for t in self.candidates):
                return
            best = min(map(self._fastest, self.candidates))
            close = [t for t in self.candidates if self._fastest(t) <= (1 + CLOSE) * best]
            if len(close) > 1 and not all(self._enough(t, CLOSE_ROUNDS) for t in close):
                for t in [t for t in self.candidates if t not in close]:  # (done: not close to the best)
                    self.candidates.remove(t)
                    self.dropped[t] = self._fastest(t)
                return
        self._choose()

    def _choose(self) -> None:
        """The candidates measured: the fastest runs calls from now on (settled, unless the fused one is to come)."""
        for t in self.candidates:
            self.timings[t] = self._fastest(t)
        self.timings.update(self.dropped)
        self.dropped = {}
        best = min(self.candidates, key=self.timings.__getitem__)
        others = ", ".join(f"{t} {_us(s)}" for t, s in self.timings.items() if t != best)
        self.measured = f"{best} {_us(self.timings[best])}" + (f" vs {others}" if others else "")
        # The exact tier chosen keeps its timed calls: the fused program, once compiled, is measured against them
        # (and against fresh ones only where the two are close), not after as many calls of the exact tier again.
        self.kept = self.samples[best] if best != "fused" and not self.promoted else []
        self.candidates, self.samples = [], {}
        self.current = best
        # (the exact tier that runs calls the fused program's guard rejects: the fastest measured)
        self.exact = min((t for t in self.timings if t != "fused"), key=self.timings.__getitem__, default=self.exact)
        self.shown = self.fused if best == "fused" else self.first
        if self.promoted or not self.fuse:
            self._settle()
        else:
            self.run = self.runs[best]

    def _drop_clear_losers(self) -> None:
        """Stop measuring a candidate each of whose timed calls took CLEAR_LOSS times the slowest timed call of
        another (2 calls each at least): a clear loser, whatever the remaining calls would say."""
        measured = {t: s for t, s in self.samples.items() if t in self.candidates and len(s) >= 2}
        if len(measured) < 2:
            return
        fastest_worst = min(max(s) for s in measured.values())
        for t, s in measured.items():
            if min(s) > CLEAR_LOSS * fastest_worst and len(self.candidates) > 1:
                self.candidates.remove(t)
                self.dropped[t] = min(s)

    def _settle(self) -> None:
        """No more measurement: calls run the chosen tier, and the graph's lean call runs it directly."""
        run = self.runs[self.current]
        if self.current == "fused" and self.narrower is not None:
            fused, exact, guard = run, self.runs[self.exact], self.narrower
            run = lambda leaves: fused(leaves) if guard(leaves) else exact(leaves)
        self.run = run
        self.settled = True
        backend = self.backend
        lean = backend.lean
        if lean is not None and lean[1] is self:
            attributes = tuple(backend.attributes)
            direct = (lambda args: run([*args, *attributes])) if attributes else run
            backend.lean = (lean[0], self, direct)
        log.info("dealias: a program of %s runs on %s: %s", backend.stats.name, self.tier, self.tier_reason)
        if _report.ACTIVE is not None:  # DEALIAS_REPORT (report/records.py)
            _report.ACTIVE.settled(backend, self)

    def _promote(self, leaves: list[Any], background: bool = True) -> None:
        """Build the fused program with this call's inputs (the entry's layout check held: the same program).
        Inductor's compile of it goes to a thread of its own where it can (`BACKGROUND`, fused.in_background), unless
        `background` is off (the first call, FUSE_FIRST): calls run the exact tiers until it is done, and the first
        call after adopts it."""
        b = self.backend
        grad = torch.is_grad_enabled()
        program, note = None, ""
        try:
            with compile_lock, fused.in_background(background and BACKGROUND and compile_beside_calls()):
                # (the first call: the torch executor's program was compiled from this call's leaves, and its
                # capture and passes up to optimize are the fused one's too)
                front, self.first.front = getattr(self.first, "front", None) if not background else None, None
                extra = {"front": front} if front is not None else {}
                program = compile_program(b.gm, leaves, b.names, "inductor", self.symbolic, **extra)
            if program.tier != "fused":
                note = "not fusable"
        except InvariantError:
            with self.lock:
                self.promoting = False
            raise
        except Exception as e:  # noqa: BLE001 - the exact tiers stay
            log.info("dealias: %s stays on the exact tiers: %s", b.stats.name, e, exc_info=True)
            note = "fused compile failed"
        finally:
            torch._C._set_grad_enabled(grad)
        if program is not None and not note and getattr(program.run_graph, "pending", None) is not None:
            with self.lock:
                self.pending = program
            return
        self._adopt(program, note)

    def _adopt(self, program: Any, note: str) -> None:
        """The fused program compiled (or `note`, why not): a candidate measured against the exact tier chosen."""
        with self.lock:
            self.promoted, self.promoting = True, False
            if note:
                self.fused_note = note
                if not self.candidates:
                    self._settle()
                return
            guard, entry_guard = program.shape_guard, self.first.shape_guard
            if guard is not None and (entry_guard is None or guard.text != entry_guard.text):
                self.narrower = guard
            self.fused = program
            self.runs["fused"] = program.lean_call
            # Against the exact tier chosen before the promotion, with its timed calls (`kept`; a candidate taken
            # first while it has fewer, so the fused program's calls come first, and a clear loss ends it after 2).
            # Samples taken while inductor compiled are dropped: the compile slowed those calls.
            kept = {self.current: self.kept} if not self.candidates and self.kept else {}
            self.candidates, self.samples, self.open = [*(self.candidates or [self.current]), "fused"], kept, None
            self.dropped = {}

    def _measure_on_copies(self, leaves: list[Any]) -> None:
        """In the first call (FUSE_FIRST), the exact tiers' warm-up and timed calls on copies of the call's tensors
        (`copies_refusal` says where not): each run on fresh copies of those the plan writes, as the user's call would
        run, the random state set back after. The user's calls then go to the fused program, measured against these
        samples, and to an exact tier only where the two are close (or the fused compile failed)."""
        exact = [t for t in self.candidates if t != "fused"]
        why = copies_refusal(self.first, leaves, self.backend.gm) if exact else ""
        if not exact or why:
            self.notes += [f"exact tiers measured on the calls: {why}"] if why else []
            return
        records = False  # (outputs with autograd history: only the untimed first runs, RECORDS)
        tensors = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        written = sorted({self.first.captured.tensor_positions[r.ref.key] for r in self.first.reports})
        grad = torch.is_grad_enabled()
        samples: dict[str, list[float]] = {}
        warmed: set[str] = set()
        total = 0.0  # (every run on copies, warm-ups included: COPIES_SECONDS)
        try:
            # (the caller's saved-tensor hooks set aside: a run on copies that records autograd called the user's
            # pack hooks, once per saved tensor: counting, offloading, 3 times in the first call where eager's once.
            # Warnings ignored: dynamo's graph calls torch's Python functions, `F.softmax(x)` without a dim warned
            # once per run, 6 more times in the first call. Python's filters and the default generator are the
            # process's, set aside and back here as by compiles in other threads: under dynamo's compile lock, as
            # the fused compile before, so that none restores another's. Another thread's warnings in these runs'
            # fraction of a second are ignored too.)
            with compile_lock, kept_rng(self.backend.gm, leaves), saved_hooks.set_aside(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if saved_hooks.in_force():  # (hooks that could not be set aside)
                    self.notes.append("exact tiers measured on the calls: saved-tensor hooks in force")
                    return
                base = list(leaves)  # (every tensor copied once: a write the plan would not name stays in the copy)
                for i, c in zip(tensors, clone_args([leaves[i] for i in tensors])):
                    base[i] = c
                for t in exact:
                    spent = 0.0
                    for k in range(SAMPLES + 1):  # (the first: the tier's warm-up, untimed)
                        if total >= COPIES_SECONDS:
                            break
                        copies = list(base)
                        for i, c in zip(written, clone_args([leaves[i] for i in written])):
                            copies[i] = c
                        out, seconds = measure(t, self.runs[t], copies)
                        torch._C._set_grad_enabled(grad)
                        records = records or _has_history(out)
                        del out
                        total += seconds
                        warmed.add(t)
                        if records:
                            break
                        if k:
                            samples.setdefault(t, []).append(seconds)
                            spent += seconds
                        if spent >= MEASURE_SECONDS:
                            break
        except Exception as e:  # noqa: BLE001 - the user's calls measure the exact tiers, as without copies
            torch._C._set_grad_enabled(grad)
            self.notes.append(f"exact tiers measured on the calls: a run on copies raised {type(e).__name__}")
            return
        if records:
            self.notes.append(f"exact tiers measured on the calls: {RECORDS}")
        elif total >= COPIES_SECONDS and any(t not in samples for t in exact):
            self.notes.append(f"exact tiers measured on the calls too: runs on copies stopped after {total:.1f} s")
        with self.lock:
            self.warm.update(warmed)
            self.samples.update(samples)
            self.measured_on_copies = bool(samples)
            # (no fused program, a failed compile: the exact tiers chosen now, from their runs on copies)
            if samples and all(self._enough(t) for t in self.candidates):
                self._choose()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a fused compile running in the background (tests, benchmarks); True once none is running. The
        next call adopts it."""
        pending = self.pending
        return pending is None or pending.run_graph.pending.done.wait(timeout)


def copies_refusal(program: Any, leaves: list[Any], gm: torch.fx.GraphModule | None = None) -> str:
    """Why the exact tiers cannot be timed on copies of what `program` (the torch executor's) writes in this call; ""
    when they can. (A call whose results carry autograd history is timed with its backward and the user's code up
    to the next call, which a run on copies has not: RECORDS, seen on the first run on copies.) The tensors must
    be ordinary CPU ones (a GPU's memory is not to be doubled, nor its errors risked) of at most COPY_BYTES in
    all, and everything written a caller's argument the plan names (not inputs sharing memory, a tensor the graph
    reads as an attribute, a size)."""
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    if any(x.device.type != "cpu" or x.layout != torch.strided or x.is_inference() for x in tensors):
        return "not all its tensors are ordinary CPU tensors"
    refusal = graph_tier_refusal(program)
    if refusal:
        return refusal
    if any(r.ref.kind is not RefKind.INPUT for r in program.reports):
        return "it writes a tensor it reads as an attribute"
    storages = {x.untyped_storage()._cdata: x.untyped_storage().nbytes() for x in tensors}
    if sum(storages.values()) > COPY_BYTES:
        return f"its tensors take more than {COPY_BYTES >> 20} MB"
    opaque = _opaque_call(gm) if gm is not None else ""
    return f"it calls {opaque}, whose effects eager has once a call" if opaque else ""


# Callables a graph may call any number of times unseen: torch's own functions and ops, Python's operators. Anything
# else, a custom op (torch.library: its Python body may count, log, write a file, or be a collective that every rank
# must call alike), a function `allow_in_graph` put in the graph, or a higher-order op with effects, would run once
# per run on copies: SAMPLES + 1 times per exact tier in the first call, where eager runs it once. (dealias's own ops
# are eager's kernels under other names, compat/tensor_scalars.py, dynamo_rng.py: the random state kept_rng keeps.)
_PURE_NAMESPACES = ("aten", "prims", "dealias")
_PURE_MODULES = ("torch", "_operator", "operator", "builtins", "math")
_PURE_HOPS = (
    "wrap",
    "wrap_with_set_grad_enabled",
    "wrap_with_autocast",
    "tag_activation_checkpoint",
    "autograd_function_apply",
)


def _opaque_call(gm: torch.fx.GraphModule) -> str:
    """The first call in dynamo's graph `gm` (or a subgraph of it) whose effects may be more than its results; ""
    when there is none."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_module":
            sub = gm.get_submodule(target)
            opaque = _opaque_call(sub) if isinstance(sub, torch.fx.GraphModule) else ""
            if opaque or not type(sub).__module__.startswith("torch."):
                return opaque or type(sub).__qualname__
        if node.op != "call_function":
            continue
        if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            namespace = target.namespace if isinstance(target, torch._ops.OpOverload) else target._qualified_op_name
            if namespace.split("::")[0] not in _PURE_NAMESPACES:
                return str(target)
        elif isinstance(target, torch._ops.HigherOrderOperator):
            if target.name() not in _PURE_HOPS:
                return f"higher-order op {target.name()}"
        elif (getattr(target, "__module__", None) or "").split(".")[0] not in _PURE_MODULES:
            return getattr(target, "__qualname__", str(target))
    for sub in gm.children():  # (the subgraphs higher-order ops take)
        opaque = _opaque_call(sub) if isinstance(sub, torch.fx.GraphModule) else ""
        if opaque:
            return opaque
    return ""


# Why the exact tiers are timed on the calls where a run's results carry autograd history (seen on the first run on
# copies: a graph may switch grad off inside, `with torch.no_grad()` in the function): the copies then only warm
# them up (their untimed first runs), so that the user's calls are all timed calls (or the fused program's first).
RECORDS = "its calls record autograd"


def _failure(error: BaseException) -> str:
    log.info("dealias: a fused compile failed: %s", error, exc_info=error)
    return "not fusable" if isinstance(error, fused.Unfusable) else "fused compile failed"
