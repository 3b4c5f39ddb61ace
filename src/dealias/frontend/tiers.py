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
Each candidate's first call is not timed (warm-up: lazily built paths, caches); then the candidates take turns of
`TURN_CALLS` calls, the first `SWITCH_CALLS` of each untimed, until each has `SAMPLES` timed calls (`MEASURE_SECONDS`),
and the one whose fastest calls are fastest wins (choosing.fastest_of: load only adds to a call's time); tiers within
`CLOSE` of the best are measured on (`CLOSE_ROUNDS`); a clear loser (`CLEAR_LOSS`, choosing.py) stops after 2, and
the last candidate left wins. The fused program is measured against the exact tier chosen before it (the promoting
call chooses between exact tiers still measured), whose timed calls count: each timed call of a slower tier is one a
user waits for. A call whose outputs carry autograd history is timed up to its thread's next call: its backward (and
the freeing of its autograd graph) is part of what the tier costs, and the tiers differ there most (the fused
program's backward is inductor's, the others' eager's). The user's code between the calls is timed along, the same for
every tier, as noise that each one's fastest call leaves out. (So are the other programs of the same step, a graph
break's second graph: measured in step with this one, turn by turn, each then chooses the tier best for the two
together, never worse than both on exact tiers.) After that, nothing is timed: the graph's lean call is pointed at the
winner directly.

With FUSE_FIRST, the first call also times every tier, the fused program's too, on copies of the call's tensors
(frontend/copies.py: each run on fresh copies of those the plan writes, the random state set back after;
`copies_refusal`: not for tensors off the CPU or over `COPY_BYTES`, nor where the graph is no candidate; those runs
stop after `COPIES_SECONDS` in all, the tiers they did not measure measured on the user's calls; where the call
records autograd, each run is its forward and its backward on the copies, `backward_refusal`: not where that backward
is the user's Python or a hook). The choice is made there, and the user's calls from the second on run the winner
(a foreach optimizer's step, 0.6x eager fused, runs 1.2x on the exact tiers, and its fused program's first 2-4 calls
after the compile ran 1.1-1.3x: the runs on copies are their warm-up); tiers close to the best are measured on the
user's calls too; where the call records autograd and more than one tier is close to the best on its forward and
backward or on its forward alone (timed apart), hooks on the first call's outputs' autograd nodes
(frontend/backward_seen.py) tell whether the user ran their backward, and that measure chooses (choosing.Choosing: no
user call timed; the fused backward timed at the end of the user's first backward, or at the next call where the
state there is not the call's; where no hook can be set, the user's calls time those tiers). No later call waits for
a compile or runs beside one.

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
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.convert_frame import compile_lock

from ..compat.fx_lazy import generated_forward
from ..compat.inductor import compile_beside_calls
from ..compat.internals import in_backward
from ..errors import InvariantError
from ..ir.plan import Symbolic
from ..passes.pipeline import compile_program
from ..report import records as _report
from ..runtime import fused
from . import choosing, copies_record, tier_record
from .by_backward import ByBackward
from .copies import graph_tier_refusal, has_history
from .eager_runs import graph_run

log = logging.getLogger("dealias")

# executor="tiered" compiles a program's fused program in its first call, as torch.compile does (its first call costs
# seconds either way), so that no later call waits for a compile or runs beside one. DEALIAS_FUSE_FIRST=0 (read once,
# at import; the test suite's setting, where tests not about tiers compare many calls bit for bit with eager) leaves it
# for the PROMOTE_AFTER-th call instead.
FUSE_FIRST = os.environ.get("DEALIAS_FUSE_FIRST", "1") != "0"
PROMOTE_AFTER = 16  # calls of a program before executor="tiered" compiles its fused program (without FUSE_FIRST)
# ...or, sooner, seconds spent running it: an inductor compile costs seconds (a few for a small graph, 12 s for the
# 40-tensor Adam of bench/run.py), so a program whose calls take long (large tensors) earns one within a few calls.
PROMOTE_AFTER_SECONDS = 2.0
# Inductor's compile of the fused program runs in a thread of its own while the exact tiers serve calls (the calls
# run slower meanwhile, holding the GIL in turns, but none stops for the compile's seconds), on a torch where that
# is safe for other compiled functions' calls (compat.inductor.compile_beside_calls: 2.14, not 2.13).
BACKGROUND = True
SAMPLES = 5  # timed calls per candidate tier before choosing (after its untimed first call)
# Candidates take turns of TURN_CALLS calls in a row, the first SWITCH_CALLS of a turn untimed: a tier's first calls
# after another's are slow (its working set out of cache; a conv+BN+ReLU training step fused: 1.4-1.9x its steady call,
# then 1.1x), the fused one's most: call by call, that step ranked fused 6 % behind the torch executor, in a row 5-7 %
# ahead. (Turns, not blocks of SAMPLES: a noisy stretch of the machine still falls on every tier.)
TURN_CALLS = 4
SWITCH_CALLS = 2
# Candidates whose fastest calls are within CLOSE of the best's are measured on, up to CLOSE_ROUNDS x SAMPLES timed
# calls each (the others stop): a close choice is the one a loaded machine's noise decides.
CLOSE = 0.05
CLOSE_ROUNDS = 3
# The fused program's narrower guard (`narrower`) rejecting this many of its turns' calls in a row, with none of its
# own between, is measured no more: the user's calls are not the ones it was compiled for.
REJECTED_CALLS = 2 * TURN_CALLS
# Runs on copies decide alone only between tiers further apart than this: closer, their order on copies is not the
# user's calls' (a foreach EMA's step, 0.2 ms a call, memory-bound: on fresh copies 1.3-2.3x what the user's calls
# take, the graph tier ranked 7-15 % ahead of the fused one, 4-7 % the faster on the user's tensors), so the tiers
# within COPIES_CLOSE of the copies' best are measured afresh on the user's calls (`_sift`).
COPIES_CLOSE = 0.20
MEASURE_SECONDS = 0.5  # ...or fewer, once a candidate's timed calls took this long in all (long calls)
# A call recording autograd whose tiers the runs on copies left to what the user runs (choosing.Choosing): the choice
# forward alone once this many calls ran with no backward through the first call's outputs (outputs the user keeps).
WATCH_CALLS = PROMOTE_AFTER


def _now() -> float:
    """On one CPU thread, the thread's CPU time: a call's work is all there (eager's and inductor's kernels, the
    backward), and other processes' time is not the tier's (on 2 shared cores GPT-2's forward's wall times spread
    0.5-2x their median, its CPU times 10 %). Otherwise wall time: other threads' work (intra-op, a GPU's) counts."""
    if torch.get_num_threads() == 1 and not torch.cuda.is_initialized():
        return time.thread_time()
    return time.perf_counter()


def measure(tier: str, run: Callable[[list[Any]], Any], leaves: list[Any]) -> tuple[Any, float]:
    """Run one call on `tier`, and how long it took (tests replace this to make the choice deterministic)."""
    start = _now()
    out = run(leaves)
    return out, _now() - start


clock = _now  # times from a call with autograd history to the next (tests replace it, as `measure`)
_MEASURE, _CLOCK = measure, clock  # (the real ones: only their times are kept on disk, copies_record)


def _enough(samples: list[float], rounds: int = 1) -> bool:
    """Whether a tier's timed calls `samples` are its SAMPLES (or MEASURE_SECONDS of them), `rounds` times over."""
    return len(samples) >= rounds * SAMPLES or (len(samples) > 0 and sum(samples) >= rounds * MEASURE_SECONDS)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


class Tiered(ByBackward):
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
            self.runs["graph"] = graph_run(forward)
        self.notes = [f"graph not tried: {refusal}"] if refusal else []
        self.fused_note = ""  # "not fusable" or "fused compile failed"
        self.samples: dict[str, list[float]] = {}
        self.dropped: dict[str, float] = {}  # candidates dropped (clear losers, not close): their fastest call
        self.kept: list[float] = []  # the exact tier chosen before the promotion: its timed calls
        # per thread (each its CPU clock), its call with autograd history timed until its next: (tier, its seconds,
        self.open: dict[int, tuple[str, float, float, bool]] = {}  # when it returned, timed)
        self.turn = ("", 0)  # the candidate whose turn it is (`_turn`), and its calls in that turn so far
        # what the last call ran: a call recording autograd inside a backward (a checkpoint's recomputation) runs it
        self.ran: Callable[[list[Any]], Any] | None = None
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
        self.rejections = 0  # calls of the fused program's turns its narrower guard rejected since its last call
        self.lock = threading.Lock()
        self.settled = False
        self.measured = ""  # "graph 40.1 us vs torch 55.0 us", once measured
        self.measured_on_copies = ""  # where the tiers chosen between were timed on copies: "the first call", ...
        self.choosing: choosing.Choosing | None = None  # the copies' measures, until the user's backward decides
        self.timing_backward = False  # (`_time_backward` running: the calls meanwhile run `current`)
        self.forward_only = False  # (no backward seen: the user's calls timed alone, `_choose_by_backward`)
        self.record_key: str | None = None  # (where the tier settled on is kept for a later process: tier_record.py)
        self.recorded = False  # (the tier was an earlier process's, read from its record)
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
        elif self.timing_backward:
            why = "timing each tier's forward and backward on copies: the first call's outputs were backpropagated"
        elif self.choosing is not None:
            tiers = ", ".join(self.choosing.tiers)
            why = f"choosing between {tiers} by whether the first call's outputs are backpropagated"
        elif self.candidates or self.promoting:
            calls = f"{self.calls} call{'s' if self.calls != 1 else ''} so far"
            why = f"measuring ({', '.join(self.candidates) or self.current}; {calls})"
        elif self.measured:
            copies = f", on copies in {self.measured_on_copies}" if self.measured_on_copies else ""
            why = f"fastest measured: {self.measured} (each one's fastest timed calls{copies})"
        elif self.fuse and not self.promoted:
            why = f"the only exact tier; fused after {PROMOTE_AFTER} calls or {PROMOTE_AFTER_SECONDS} s"
        else:
            why = "the only exact tier"
        return "; ".join([why, *self.notes])

    def __call__(self, leaves: list[Any]) -> Any:
        if self.settled:
            return self.run(leaves)
        if self.ran is not None and torch.is_grad_enabled() and in_backward():  # (a checkpoint's recomputation)
            return self.ran(leaves)
        now, thread = clock(), threading.get_ident()
        with self.lock:
            if thread in self.open:  # the thread's previous call's backward ran since: its tier's sample, whole
                tier, seconds, returned, timed = self.open.pop(thread)
                self._record(tier, seconds + max(0.0, now - returned), seconds, timed)
            self.calls += 1
            backward = None  # (a training step seen: the lazy tiers' backward to time on copies, this call)
            # (not in a backward: a checkpoint's recomputation runs its forward's tier; that backward's end chooses)
            if self.choosing is not None and self.choosing.watch is not None and not in_backward():
                backward = self._choose_by_backward()
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
            self._first(leaves)
        elif backward is not None:
            self._time_backward(leaves, backward, "the call after the first backward")
        elif due:
            self._promote(leaves)
        elif compiled:
            error = program.run_graph.pending.error
            if error is not None and not isinstance(error, Exception):
                raise error  # (KeyboardInterrupt, SystemExit: the user's, not a failed compile)
            self._adopt(program if error is None else None, _failure(error) if error is not None else "")
        with self.lock:
            tier, timed = self._turn() if self.candidates else (self.current, False)
        rejected = tier == "fused" and self.narrower is not None and not self.narrower(leaves)
        self.ran = self.runs[self.exact if rejected else tier]
        if rejected:  # (not timed, another program ran: the fused program's next call is one after a switch)
            with self.lock:
                self._rejected()
            return self.ran(leaves)
        out, seconds = measure(tier, self.ran, leaves)
        with self.lock:
            if self.choosing is not None and self.choosing.watch is None:  # (the first call: its outputs watched)
                self._watch(out, leaves)
            if tier in self.candidates and not self.settled and has_history(out) and not self.forward_only:
                self.open[thread] = (tier, seconds, clock(), timed)
            else:
                self._record(tier, seconds, seconds, timed)
        return out

    def _turn(self) -> tuple[str, bool]:
        """The candidate this call runs, and whether the call is timed: candidates take turns of TURN_CALLS calls in a
        row, the one measured least first (one not yet warm first), the first SWITCH_CALLS of each untimed."""
        tier, calls = self.turn
        if tier not in self.candidates or calls >= TURN_CALLS:
            tier, calls = min(self.candidates, key=lambda t: (t in self.warm, len(self.samples.get(t, ())))), 0
        self.turn = (tier, calls + 1)
        return tier, calls >= SWITCH_CALLS

    def _rejected(self) -> None:
        """A call of the fused program's turn its narrower guard rejected (the exact tier ran it, untimed): the turn
        ends, and REJECTED_CALLS of them with no fused call between drop the fused program from the candidates (the
        candidate measured least, it would take every call's turn, rejected, and the measurement never end)."""
        self.turn = ("", 0)
        self.rejections += 1
        if self.rejections < REJECTED_CALLS or "fused" not in self.candidates or len(self.candidates) < 2:
            return
        self.candidates.remove("fused")
        self.samples.pop("fused", None)
        self.notes.append(f"fused not chosen: its shape guard rejected {self.rejections} calls in a row")
        if all(self.samples.get(t) for t in self.candidates):
            self._decide()

    def prepare(self, leaves: list[Any]) -> None:
        """The first call's compile and measurement (FUSE_FIRST: the fused compile, the tiers timed on copies), done
        before that call runs (backend.GraphProgram.compile_first: where dynamo compiles the graph, `leaves` that
        call's own); the call then runs the tier chosen, or the first of those measured on the calls."""
        with self.lock:
            if not (self.fuse and FUSE_FIRST) or self.calls or self.promoted or self.promoting:
                return
            self.promoting = True
        self._first(leaves)

    def _first(self, leaves: list[Any]) -> None:
        """The first call's fused compile and runs on copies (FUSE_FIRST); or, where an earlier process of this
        program on this host settled (tier_record.py), its tier at once: the fused compile only where that is the
        fused one, nothing measured."""
        real = measure is _MEASURE and clock is _CLOCK
        self.record_key = tier_record.key(self, leaves) if real else None
        found = tier_record.load(self.record_key, self.runs)
        if found is not None and found.tier != "fused":
            self.first.front = None  # (kept for a fused compile: none)
            self._from_record(found)
            return
        self._promote(leaves, background=False)
        if found is not None and "fused" in self.runs and self.pending is None:
            self._from_record(found)
            return
        self._measure_on_copies(leaves)

    def _from_record(self, found: tier_record.Settled) -> None:
        """Settle on the tier an earlier process's calls chose (`found`), as measured there."""
        with self.lock:
            self.promoted, self.promoting, self.recorded = True, False, True
            self.fused_note = found.fused_note if found.tier != "fused" else ""
            self.timings, self.measured, self.measured_on_copies = dict(found.timings), found.measured, ""
            self.current, self.exact = found.tier, found.exact
            self.candidates, self.samples, self.dropped, self.choosing = [], {}, {}, None
            self.notes = [*found.notes, "settled so by an earlier process's calls (its record: tier_record.py)"]
            self.shown = self.fused if found.tier == "fused" else self.first
            self._settle()

    def _fastest(self, tier: str) -> float:
        return choosing.fastest_of(self.samples[tier])

    def _record(self, tier: str, seconds: float, own: float, timed: bool) -> None:
        """A call on `tier` took `seconds` (up to the next call, where it has autograd history), `own` of them in it:
        what promotion counts (the rest may be anything, another graph's compile); a sample where `timed`."""
        self.spent += own
        if tier == "fused":
            self.rejections = 0
        if tier not in self.candidates or self.settled:
            return
        if tier not in self.warm or not timed:
            self.warm.add(tier)  # its first call, or one of a turn's first: not a sample
            return
        self.samples.setdefault(tier, []).append(seconds)
        self._decide()

    def _decide(self) -> None:
        """After a timed call: drop clear losers, stop measuring tiers not close to the best once each has its
        samples, and choose once the close ones have theirs."""
        for t in choosing.clear_losers({t: s for t, s in self.samples.items() if t in self.candidates}):
            if len(self.candidates) > 1:  # (clear losers measured no more)
                self.candidates.remove(t)
                self.dropped[t] = min(self.samples[t])
        if self.promoting:
            return
        if len(self.candidates) > 1:  # (one left: the others lost clearly, it wins whatever its next calls take)
            if not all(_enough(self.samples.get(t, [])) for t in self.candidates):
                return
            best = min(map(self._fastest, self.candidates))
            close = [t for t in self.candidates if self._fastest(t) <= (1 + CLOSE) * best]
            if len(close) > 1 and not all(_enough(self.samples[t], CLOSE_ROUNDS) for t in close):
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
        # (for a later process's first call, tier_record.py: a choice the user's calls made, or no choice at all
        # where the fused program is not, whose record would lock in a verdict of a few runs on copies)
        by_calls = bool(self.measured) and not self.measured_on_copies
        if self.record_key is not None and not self.recorded and (by_calls or (self.fused_note and not self.measured)):
            timings, notes = dict(self.timings), list(self.notes)
            settled = tier_record.Settled(self.current, self.exact, timings, self.measured, notes, self.fused_note)
            tier_record.save(self.record_key, settled)
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
            self.candidates, self.samples, self.open = [*(self.candidates or [self.current]), "fused"], kept, {}
            self.dropped, self.turn = {}, ("", 0)  # (the turn under way ends: the tiers not yet warm go first)

    def _measure_on_copies(self, leaves: list[Any]) -> None:
        """In the first call (FUSE_FIRST), every candidate's warm-up and timed calls on copies of the call's tensors
        (copies.py), the fused program's among them: the choice made there where they are not close; tiers close to
        the best measured on the user's calls. Where the runs include their backward (`forwards`: their forwards
        alone; the fused backward not run, choosing.py), they only drop the tiers losing on both measures
        (choosing.drop_on_both); hooks on this call's outputs tell whether the user runs the backward (`_watch`),
        or, where none can be set, the user's calls, each timed up to the next call, the copies' samples not kept
        (mixed with them, they chose the torch executor for mha's forward never backpropagated, 1.11x eager beside
        the fused program's 1.00x). Every tier is timed on the user's calls where some was not timed on copies."""
        tiers = list(self.candidates)
        if "fused" in tiers and self.narrower is not None and not self.narrower(leaves):
            tiers.remove("fused")  # (the fused program's guard rejects this call: measured on the user's calls)
        samples, warmed, notes, forwards = self._copies(leaves, tiers, choosing.LAZY)
        self.notes += notes
        with self.lock:
            self.warm.update(warmed)
            if forwards is not None:  # (a lazy tier's backward not run: its first call on the user's is its warm-up)
                self.warm -= choosing.LAZY
            if forwards is not None and not all(forwards.get(t) for t in self.candidates):
                samples = {}
            self.measured_on_copies = "the first call" if samples else ""
            if forwards is not None and samples:
                dropped = choosing.drop_on_both(self.candidates, samples, forwards, COPIES_CLOSE, _enough)
                self.candidates[:] = [t for t in self.candidates if t not in dropped]
                self.dropped.update(dropped)
                if len(self.candidates) == 1:  # (an exact tier: one stays by `whole`, the fused one only beside it)
                    self.samples.update(samples)
                    self._choose()
                    return
                # (the user's backward, or none, chooses the measure: `_watch`, with this call's outputs. Even where
                # the two measures' fastest is one tier, timing the others close to it on the user's calls ran
                # resnet18's training step on the fused tier, close on the forward, whose backward is the slower)
                self.choosing = choosing.Choosing(list(self.candidates), samples, forwards, choosing.LAZY)
                trained = choosing.trained(self.candidates, samples, CLOSE)
                self.current = min(trained, key=lambda t: choosing.fastest_of(samples[t]))
                self.candidates = []
                return
            if samples and self.candidates and all(samples.get(t) for t in self.candidates):
                self._sift(samples)
                return
            self.samples.update(samples)
            if samples and self.candidates:
                self._decide()

    def _sift(self, samples: dict[str, list[float]], close: float | None = None) -> None:
        """The copies' verdict on a call without autograd history, every candidate timed there (`samples`): the
        tiers not within `close` of the copies' best are dropped; one left wins, else those left are measured on
        the user's calls, afresh (the copies' times, a little off from the user's calls', mixed with theirs would
        favour the tier the copies favoured). `close`: COPIES_CLOSE unless given."""
        close = COPIES_CLOSE if close is None else close
        kept = choosing.close_to_best(samples, self.candidates, close)
        for t in [t for t in self.candidates if t not in kept]:
            self.candidates.remove(t)
            self.dropped[t] = choosing.fastest_of(samples[t])
        if len(self.candidates) == 1:
            self.samples = dict(samples)
            self._choose()
            return
        self.samples, self.measured_on_copies = {}, ""
        tiers = ", ".join(self.candidates)
        self.notes.append(f"{tiers} measured on the calls: within {close:.0%} of each other on copies")

    def _copies(
        self,
        leaves: list[Any],
        tiers: list[str],
        lazy: frozenset[str] = frozenset(),
        warm: frozenset[str] = frozenset(),
        samples: int = SAMPLES,
    ) -> tuple[dict[str, list[float]], set[str], list[str], dict[str, list[float]] | None]:
        """The runs on copies of `_measure_on_copies` (`lazy`: the tiers whose backward they leave untimed; `warm`:
        those whose first forward and backward ran on copies already, not warmed up again; `samples`: timed runs per
        tier), or their times read from an earlier process's record of the same program on this host
        (frontend/copies_record.py). Times faked by tests are neither read nor kept."""
        real = measure is _MEASURE and clock is _CLOCK
        fastest = choosing.fastest_of
        # (with the tiers within COPIES_CLOSE of a record's fastest warmed up on copies: the user's calls measure them)
        close = COPIES_CLOSE
        args = (self, leaves, tiers, measure, samples, MEASURE_SECONDS, fastest, real, lazy, close, warm)
        return copies_record.runs(*args)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a fused compile running in the background (tests, benchmarks); True once none is running. The
        next call adopts it."""
        pending = self.pending
        return pending is None or pending.run_graph.pending.done.wait(timeout)


def _failure(error: BaseException) -> str:
    log.info("dealias: a fused compile failed: %s", error, exc_info=error)
    return "not fusable" if isinstance(error, fused.Unfusable) else "fused compile failed"
