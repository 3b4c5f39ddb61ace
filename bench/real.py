"""Real workloads (issue 38's table: torch.optim steps, a resnet18, GPT-2, MultiheadAttention, decode steps, small
fused programs; bench/real_workloads.py), timed as users run them: eager; dealias's default (`dealias.jit(f)`, no
options: executor="tiered"); executor="exact"; executor="torch"; executor="inductor" (fused);
torch.compile(backend="inductor").

Per call, once warm: each variant on its own copy of the arguments, warmed up (20 calls; the default and "tiered"
until the tier of each program has settled, which `cache_info(f).tiers` then reports; the variants built and warmed
in a shuffled order), timed on one thread in one process per workload (what earlier workloads leave in a process
skews a later one's times), in rounds whose order is shuffled (each variant's first call of a round untimed), as the
median over rounds of the ratio to eager's time in the same round.
Before timing, each variant's next call is checked against eager's call on a deep copy of the same state (outputs,
mutated arguments, module and optimizer state, gradients): bit for bit where every program runs on an exact tier,
within the fused tolerance otherwise. A variant that fails the check is reported, not timed.

First call (unless --no-first-call): in a fresh process with a fresh TORCHINDUCTOR_CACHE_DIR (cold), then in a
second process with the same cache directories (warm cache; the cold process, once its first call is timed, goes on
calling until its tiers settle, as a user's run does, so the warm one finds what a run leaves on disk, the tier
the default settled on included): the seconds from compiling the function
(`torch.compile(f, ...)` / `dealias.jit(f, ...)`) to the first call's return (the backward included on backward rows),
after imports and building the arguments. The construction counts: `torch.compile(backend="inductor")` imports
inductor there (about 1 s), where `dealias.jit` imports it at the first call that needs it.

    python bench/real.py                          # everything (~25 min on a 2-core machine)
    python bench/real.py --only mha gpt2 --rounds 5 --no-first-call
    python bench/real.py --variants torch --rounds 1 --no-first-call --json out.json
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import dealias
from dealias.frontend import tiers as dealias_tiers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_workloads import WORKLOADS, Workload  # noqa: E402 - bench/ is not a package

VARIANTS = ("default", "exact", "torch", "inductor", "torch.compile")  # (the default is "tiered")
FIRST_CALL_VARIANTS = ("default", "inductor", "torch.compile")  # ("tiered" and "torch" start as the default does)
EXACT_TIERS = {"torch", "graph"}
# one call of a fused program against eager's, from the same state (atol times the tensor's largest magnitude)
FUSED_TOLERANCE = dict(rtol=1e-3, atol=1e-4)
MIN_WARM_CALLS = 20
SETTLE_CALLS = 48  # calls before the default and "tiered" count as settled (the fused compile in the first call,
# or the 16th under DEALIAS_FUSE_FIRST=0, then measurement), and their tiers and reasons unchanged over the last
# SETTLE_STABLE calls: more than a program's measurement of three tiers takes (each tier's untimed first call and
# its samples), so that a program still "measuring" after that is one no longer called (an optimizer's first step,
# which creates its state)
SETTLE_STABLE = max(24, 3 * (getattr(dealias_tiers, "SAMPLES", 5) + 1) + 6)
MAX_WARM_SECONDS = 600.0  # (the default and "tiered" settle within seconds of calls, unless the machine is loaded)
ROUND_SECONDS = 0.2  # per variant per round


def own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` on a code object of its own: dynamo keeps its cache entries on the code object, so variants compiled
    from one function would each check the others' guards first on every call."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def compiled(variant: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if variant == "eager":
        return fn
    fn = own_code(fn)
    if variant == "default":
        return dealias.jit(fn)
    if variant == "torch.compile":
        return torch.compile(fn, backend="inductor")
    return dealias.jit(fn, executor=variant)


def make_args(w: Workload) -> tuple[Any, ...]:
    torch.manual_seed(0)
    return w.make()


def call(f: Callable[..., Any], args: tuple[Any, ...], backward: bool) -> Any:
    out = f(*args)
    if backward:
        out.backward()
    return out


# --- the exactness check ----------------------------------------------------------------------------
def _leaf_params(args: Any) -> list[torch.Tensor]:
    """Parameters whose .grad deepcopy does not copy (Parameter.__deepcopy__ leaves it out)."""
    out = []
    for a in args:
        if isinstance(a, torch.nn.Module):
            out += list(a.parameters())
        elif isinstance(a, torch.optim.Optimizer):
            out += [p for g in a.param_groups for p in g["params"]]
    return out


def clone_state(args: tuple[Any, ...]) -> tuple[Any, ...]:
    memo: dict[int, Any] = {}
    copied = copy.deepcopy(args, memo)
    for p in _leaf_params(args):
        if p.grad is not None:
            memo[id(p)].grad = p.grad.clone()
    return copied


def state(obj: Any, depth: int = 0) -> list[Any]:
    """The tensors (and numbers) a call can read or write, in a fixed order: outputs, tensors, module parameters,
    buffers and gradients, optimizer state, and the tensors of plain objects (KV caches)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (int, float, bool)) or obj is None:
        return [obj]
    if isinstance(obj, torch.nn.Module):
        out: list[Any] = []
        for _, p in obj.named_parameters():
            out += [p, p.grad]
        return out + [b for _, b in obj.named_buffers()]
    if isinstance(obj, torch.optim.Optimizer):
        out = []
        for p in (p for g in obj.param_groups for p in g["params"]):
            out += [p, p.grad] + [v for _, v in sorted(obj.state.get(p, {}).items())]
        return out
    if isinstance(obj, (list, tuple)):
        return [x for o in obj for x in state(o, depth)]
    if isinstance(obj, dict):
        return [x for k in sorted(obj, key=str) for x in state(obj[k], depth)]
    if depth < 3 and hasattr(obj, "__dict__"):  # a KV cache object, HF's StaticCache and its layers
        return [x for k in sorted(vars(obj)) for x in state(vars(obj)[k], depth + 1)]
    return []


def differ(a: list[Any], b: list[Any], exact: bool) -> str:
    """The first difference between two states ("" if none): bit for bit, or within the fused tolerance."""
    if len(a) != len(b):
        return f"{len(a)} state values against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            tol = dict(rtol=0, atol=0)
            if not exact:  # atol relative to the tensor's largest value: gradients accumulated over the warm-up grow
                scale = max(1.0, y.detach().abs().max().item()) if y.numel() and y.is_floating_point() else 1.0
                tol = dict(rtol=FUSED_TOLERANCE["rtol"], atol=FUSED_TOLERANCE["atol"] * scale)
            try:
                torch.testing.assert_close(x.detach(), y.detach(), equal_nan=True, **tol)
            except AssertionError as e:
                lines = [line.strip() for line in str(e).splitlines() if line.strip()]
                return f"state value {i}: " + "; ".join(lines[:1] + lines[-2:])
        elif type(x) is not type(y) or (x != y and not isinstance(x, torch.Tensor)):
            return f"state value {i}: {x!r} against {y!r}"
    return ""


def check(f: Callable[..., Any], w: Workload, args: tuple[Any, ...], exact: bool) -> str:
    """One call of `f` against eager's on a copy of the same state: "exact", "exact (dynamo's graph)" or "within
    tolerance" when they agree; "WRONG: ..." (the first difference) when `f`'s results are beyond the fused
    tolerance of eager's; "NOT BIT-EXACT: ..." when an exact tier's are within it but neither eager's bits nor
    those of dynamo's graph run as it is (`backend="eager"`), which are the exact reference where dynamo's graph is
    not eager's op sequence: under dynamo, torch.optim runs code of its own (`torch.compiler.is_compiling()`
    branches; tests/test_real_programs.py)."""
    ref, by_dynamo = clone_state(args), clone_state(args) if exact else None
    expected = call(w.fn, ref, w.backward)
    got = call(f, args, w.backward)
    a, b = state((got, args)), state((expected, ref))
    wrong = differ(a, b, exact=False)
    if wrong:
        return "WRONG: " + wrong
    if not exact:
        return "within tolerance"
    if not differ(a, b, exact=True):
        return "exact"
    graph = torch.compile(own_code(w.fn), backend="eager", dynamic=False)  # (the copy's compile: no symbols)
    c = state((call(graph, by_dynamo, w.backward), by_dynamo))
    if not differ(a, c, exact=True):
        return "exact (dynamo's graph)"
    return f"NOT BIT-EXACT: eager's {differ(a, b, exact=True)}; dynamo's graph's {differ(a, c, exact=True)}"


# --- per call ---------------------------------------------------------------------------------------
def tiers(f: Callable[..., Any]) -> tuple[str, ...]:
    return dealias.cache_info(f).tiers


def warm_up(variant: str, f: Callable[..., Any], w: Workload, args: tuple[Any, ...]) -> dict[str, Any]:
    """Call until warm: MIN_WARM_CALLS; the default and "tiered" until their tiers settle (SETTLE_CALLS calls at
    least, the tiers and their reasons unchanged over the last SETTLE_STABLE)."""
    start, n, seen, stable = time.perf_counter(), 0, None, 0
    settling = variant in ("default", "tiered", "exact")
    while True:
        call(f, args, w.backward)
        n += 1
        if time.perf_counter() - start > MAX_WARM_SECONDS:
            break
        if not settling:
            if n >= MIN_WARM_CALLS:
                break
            continue
        if n == SETTLE_CALLS:
            dealias.wait_compiles(f, timeout=MAX_WARM_SECONDS)  # (fused compiles in the background, torch 2.14)
        info = dealias.cache_info(f)
        now = (info.tiers, info.tier_reasons)
        stable = stable + 1 if now == seen else 0
        seen = now
        if n >= SETTLE_CALLS and stable >= SETTLE_STABLE:
            break
    seconds = time.perf_counter() - start
    if seconds > MAX_WARM_SECONDS:
        print(f"  {w.name} {variant}: not settled after {n} calls ({seconds:.0f} s): {tiers(f)}", flush=True)
    return {"calls": n, "seconds": seconds, "settled": seconds <= MAX_WARM_SECONDS}


def _time(
    f: Callable[..., Any],
    args: tuple[Any, ...],
    backward: bool,
    iters: int,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    start = clock()
    for _ in range(iters):
        call(f, args, backward)
    return (clock() - start) / iters


def timed_rounds(
    row: dict[str, Any],
    impls: dict[str, Any],
    args: dict[str, Any],
    backward: bool,
    timed: list[str],
    rounds: int,
    order: random.Random,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Time the variants `timed` (eager first) in `rounds` rounds of ~ROUND_SECONDS each on `clock`, each round in
    an order drawn from `order`; into `row`: eager's median ms and each other variant's median ratio to eager's time
    in the same round."""
    iters = {v: max(1, int(ROUND_SECONDS / max(_time(impls[v], args[v], backward, 1, clock), 1e-6))) for v in timed}
    times: dict[str, list[float]] = {v: [] for v in timed}
    for _ in range(rounds):
        # each round in another order, so that what one variant leaves behind (the allocator's heap, the caches)
        # does not always fall on the same other one; and each variant's first call of a round untimed: it pays for
        # what the one before left (glibc's heap trimmed by another variant's frees and faulted in again: resnet18's
        # training step, 0 minor faults a call on dealias's tiers alone, 13,000 on torch.compile's), which no user's
        # process, running one of them, pays
        for v in order.sample(timed, len(timed)):
            call(impls[v], args[v], backward)
            times[v].append(_time(impls[v], args[v], backward, iters[v], clock))
    row["eager_ms"] = statistics.median(times["eager"]) * 1e3
    for v in timed[1:]:
        row["ratio"][v] = statistics.median(t / e for t, e in zip(times[v], times["eager"]))


def wrong(e: BaseException) -> str:
    """The verdict of a variant whose warm-up or check raised `e`."""
    return f"WRONG: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def warmed_and_checked(row: dict[str, Any], v: str, f: Callable[..., Any], w: Workload, args: tuple[Any, ...]) -> bool:
    """Warm variant `v` (`f`) up and compare its next call with eager's (`check`); into `row` its warm-up, the tiers
    it settled on and the verdict. Whether it is to be timed (not wrong)."""
    try:
        row["warm"][v] = warm_up(v, f, w, args)
        dealias_tiers = tiers(f) if v != "torch.compile" else ()
        # exact where every program runs on an exact tier and none is still measuring the fused one (a warm-up
        # cut short by MAX_WARM_SECONDS, or a one-off program): its next call may run either
        reasons = dealias.cache_info(f).tier_reasons if v in ("default", "tiered", "exact") else ()
        exact = v == "torch" or (
            v in ("default", "tiered", "exact")
            and {t.split()[0] for t in dealias_tiers} <= EXACT_TIERS
            and not any(r.startswith("measuring") and "fused" in r.split(";")[0] for r in reasons)
        )
        verdict = check(f, w, args, exact)
    except Exception as e:  # noqa: BLE001 - a variant that fails is reported, the others still run
        verdict = wrong(e)
        dealias_tiers = ()
    if v != "torch.compile":
        row["tiers"][v] = list(dealias_tiers)
    row["check"][v] = verdict
    if verdict.startswith(("WRONG", "NOT")):
        print(f"  {w.name} {v}: {verdict}", flush=True)
    return not verdict.startswith("WRONG")


def per_call(w: Workload, variants: list[str], rounds: int) -> dict[str, Any]:
    # Dynamo's automatic dynamic remembers values per code location across compiles: Adam's and AdamW's steps share
    # Adam.step, so AdamW's weight decay, seen changed from Adam's, would be made symbolic, as in no user's process.
    torch._dynamo.reset()
    row: dict[str, Any] = {"workload": w.name, "title": w.title, "ratio": {}, "tiers": {}, "check": {}, "warm": {}}
    impls = {v: compiled(v, w.fn) for v in ["eager", *variants]}
    args = {v: make_args(w) for v in impls}
    timed = ["eager"]
    order = random.Random(w.name)
    # Built and warmed in a shuffled order too: in one process the variant built first ran 3-5 % slower than the
    # same compiled program built after it (resnet18 eval, HF Llama; not dynamo's cache lookup, not page faults),
    # which in column order always fell on the default.
    for v in order.sample(variants, len(variants)):
        if warmed_and_checked(row, v, impls[v], w, args[v]):  # (a benchmark of wrong results is worthless)
            timed.append(v)
    timed = ["eager", *[v for v in variants if v in timed]]  # (back in column order)
    for _ in range(2):
        call(w.fn, args["eager"], w.backward)
    timed_rounds(row, impls, args, w.backward, timed, rounds, order)
    for v in [v for v in variants if v != "torch.compile" and v in timed]:
        row["tiers"][v] = list(tiers(impls[v]))  # (after timing: what the timed calls ran on)
    return row


def per_call_in_a_process(w: Workload, variants: list[str], rounds: int) -> dict[str, Any]:
    """`per_call` in a process of its own (`--per-call-child`): what earlier workloads left in a process skews a
    later one's times. In one process of the whole table, resnet18's training step (the 7th workload) measured
    default 1.28, fused 1.26, torch.compile 1.45 (the heap grown and trimmed by earlier workloads: minor page faults a
    call, alone 0 for dealias's tiers, 13,000 for torch.compile's); in a process of its own, the same commit at the
    same load, 0.96, 1.01 and 1.13. A user's process runs one such program; the variants of a workload still share
    one process, so that their ratios come from the same rounds."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--per-call-child", w.name, "--rounds", str(rounds)]
    p = subprocess.run([*cmd, "--variants", *variants], stdout=subprocess.PIPE, text=True, timeout=3600)
    lines = p.stdout.splitlines()
    rows = [line for line in lines if line.startswith("{")]
    for line in lines:  # (the child's reports of variants that failed their check)
        if not line.startswith("{"):
            print(line, flush=True)
    if p.returncode or not rows:
        row = _empty_row(w)
        row["check"] = {v: f"WRONG: the per-call process failed (exit {p.returncode})" for v in variants}
        return row
    return json.loads(rows[-1])


ALONE_CALLS, ALONE_SECONDS = 10, 1.0  # (`--alone`: timed calls per process, at least this many and this long)


def alone_child(name: str, variant: str) -> None:
    """`--alone`'s process: one variant of one workload, warmed up as `per_call` warms it, then ALONE_SECONDS of
    calls (at least ALONE_CALLS) each timed; prints the median call's seconds, the median of the calls' minor page
    faults and the tiers."""
    import resource

    torch.set_num_threads(1)
    w = next(w for w in WORKLOADS if w.name == name)
    args = make_args(w)
    f = compiled(variant, w.fn) if variant != "eager" else w.fn
    warm_up(variant, f, w, args)
    times, faults, start = [], [], time.perf_counter()
    while len(times) < ALONE_CALLS or time.perf_counter() - start < ALONE_SECONDS:
        before, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        call(f, args, w.backward)
        times.append(time.perf_counter() - t)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    found = list(tiers(f)) if variant not in ("eager", "torch.compile") else []
    record = {"seconds": statistics.median(times), "faults": statistics.median(faults), "tiers": found}
    print(json.dumps(record), flush=True)


def per_call_alone(w: Workload, variants: list[str], rounds: int) -> dict[str, Any]:
    """Each variant in a process of its own (`--alone`), one process after another, `rounds` times in shuffled
    orders; a variant's ratio is the median over rounds of its median call / eager's in the same round. As a user runs
    one of them: in one process the variants' heaps meet (resnet18's training step measured 1.05x eager alone on the
    default's tier, 1.14 fused and 1.68 torch.compile, with 0 / 0 / 13,000 minor page faults a call; interleaved in
    one process 1.5, 1.5 and 1.7). Not checked against eager here (`per_call` checks)."""
    row = _empty_row(w)
    row["alone"] = True
    times: dict[str, list[float]] = {v: [] for v in ["eager", *variants]}
    order = random.Random(w.name)
    for _ in range(rounds):
        for v in order.sample(list(times), len(times)):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--alone-child", w.name, v]
            p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=3600)
            lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
            if p.returncode or not lines:
                row["check"][v] = f"WRONG: the process of {v} failed (exit {p.returncode})"
                continue
            record = json.loads(lines[-1])
            times[v].append(record["seconds"])
            if v != "eager":
                row["tiers"][v] = record["tiers"]
                row["check"][v] = "alone"
    eager = times["eager"]
    row["eager_ms"] = statistics.median(eager) * 1e3 if eager else 0.0
    for v in variants:
        if eager and len(times[v]) == len(eager):
            row["ratio"][v] = statistics.median(t / e for t, e in zip(times[v], eager))
    return row


def _empty_row(w: Workload) -> dict[str, Any]:
    return {"workload": w.name, "title": w.title, "ratio": {}, "tiers": {}, "check": {}, "warm": {}, "eager_ms": 0.0}


# --- first call -------------------------------------------------------------------------------------
def first_call_child(name: str, variant: str, then_settle: bool = False) -> None:
    """In a fresh process: build the workload's arguments, then time the compile's construction and first call;
    `then_settle`: then go on calling as a user's run does (`warm_up`), so that the next process finds on disk
    what a run leaves there, not what a single call does (the tier the default settled on: tier_record.py)."""
    torch.set_num_threads(1)
    w = next(w for w in WORKLOADS if w.name == name)
    args = make_args(w)
    start, cpu = time.perf_counter(), time.process_time()
    f = compiled(variant, w.fn)
    call(f, args, w.backward)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    # (the process's CPU seconds too, every thread's, but not its children's compilers: steadier on a loaded machine;
    # and the hash of dealias's source that keyed its caches, `dealias_source`)
    print(json.dumps({"seconds": seconds, "cpu": cpu, "source": dealias_source()}), flush=True)
    if then_settle:
        warm_up(variant, f, w, args)


def dealias_source() -> str:
    """The hash of dealias's source files that this process keyed its caches on (inductor's FX graph cache entries of
    dealias's graphs, the program cache, the records of copies and partitions: compat/graph_cache.source_hash). A warm
    process whose hash is not the cold one's finds none of them and compiles everything again: a benchmark run from a
    tree edited while it runs (mobilenet_train_bwd's default, 15.6 s warm where its warm first call takes 2.3-2.8 s:
    a file of the editable install saved between its two processes). Read once per process, at its first use."""
    from dealias.compat.graph_cache import source_hash

    return source_hash()


# A warm process whose dealias source is not the cold one's (`dealias_source`): its time is not a warm first call's
SOURCE_CHANGED = "failed: dealias's source changed between the cold and the warm process (its tree edited meanwhile)"


def _verdicts_dir() -> Path:
    return Path(os.environ.get("DEALIAS_CACHE_DIR") or Path.home() / ".cache" / "dealias")


def first_calls(w: Workload, variants: list[str]) -> dict[str, dict[str, float | str]]:
    """Per variant, the first call's seconds in a process with a fresh inductor cache, then in a second process
    with the same one. dealias's cache directory is fresh too, but for what it keeps per machine and install, not per
    program, copied in: the host's keep-ATen verdicts and inductor's per-install keys (compat/inductor_keys.py)."""
    out: dict[str, dict[str, float | str]] = {}
    for v in variants:
        root = Path(tempfile.mkdtemp(prefix="dealias-real-"))
        try:
            (root / "dealias").mkdir()
            for verdicts in [
                *glob.glob(str(_verdicts_dir() / "keep_aten-*.json")),
                _verdicts_dir() / "inductor_keys.json",
            ]:
                if not os.path.exists(verdicts):
                    continue
                shutil.copy(verdicts, root / "dealias")
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"), OMP_NUM_THREADS="1")
            env["DEALIAS_CACHE_DIR"] = str(root / "dealias")
            out[v] = {}
            source: str | None = None  # (the cold process's `dealias_source`)
            for kind in ("cold", "warm"):
                cmd = [sys.executable, str(Path(__file__).resolve()), "--first-call", w.name, v]
                cmd += ["--then-settle"] if kind == "cold" else []  # (the cold process runs on, as a user's run)
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
                lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
                if p.returncode or not lines:
                    out[v][kind] = f"failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}"
                    break
                record = json.loads(lines[-1])
                if kind == "cold":
                    source = record.get("source")
                elif record.get("source") != source:
                    out[v][kind] = SOURCE_CHANGED
                    break
                out[v][kind] = record["seconds"]
                if isinstance(record.get("cpu"), float):  # (the process's CPU s: the JSON rows, not the table)
                    out[v][f"{kind} cpu"] = record["cpu"]
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return out


# --- report -----------------------------------------------------------------------------------------
def _cell(row: dict[str, Any], v: str) -> str:
    if v in row["ratio"]:
        notes: list[str] = []
        if v in ("default", "tiered", "exact", "inductor"):
            ts = sorted(set(row["tiers"].get(v, [])))
            notes += ts if v != "inductor" or ts != ["fused"] else []
        notes += ["not bit-exact"] if row["check"][v].startswith("NOT") else []
        return f"{row['ratio'][v]:.2f}" + (f" ({'; '.join(notes)})" if notes else "")
    verdict = row["check"].get(v, "")
    return "wrong" if verdict.startswith("WRONG") else ("not bit-exact, untimed" if verdict.startswith("NOT") else "")


def _seconds(row: dict[str, Any], v: str, kind: str) -> str:
    value = row.get("first_call", {}).get(v, {}).get(kind)
    return f"{value:.1f}" if isinstance(value, float) else ("failed" if value else "")


def markdown(rows: list[dict[str, Any]], variants: list[str], first: list[str]) -> str:
    names = {"default": "default", "exact": '"exact"', "tiered": '"tiered"', "torch": '"torch"', "inductor": "fused"}
    names["torch.compile"] = "torch.compile"
    head = ["workload", "eager ms", *(names[v] for v in variants)]
    if first:
        short = {"default": "default", "inductor": "fused", "torch.compile": "tc"}
        head += [f"first call s, cold: {' / '.join(short.get(v, v) for v in first)}", "warm cache"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["title"], f"{r['eager_ms']:.2f}" if r["eager_ms"] else "", *(_cell(r, v) for v in variants)]
        if first:
            cells += [
                " / ".join(_seconds(r, v, k) for v in first) if r.get("first_call") else "" for k in ("cold", "warm")
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def merged(files: list[str]) -> list[dict[str, Any]]:
    """The rows of several runs' --json files, one per workload in the table's order: a later file's variants
    replace an earlier one's, its first calls are added."""
    rows: dict[str, dict[str, Any]] = {}
    for name in files:
        for r in json.loads(Path(name).read_text()):
            row = rows.setdefault(r["workload"], r)
            if row is not r and r["eager_ms"]:  # its variants' cells replace the earlier run's (eager's ms stays)
                for k in ("ratio", "tiers", "check", "warm"):
                    row[k].update(r[k])
                row["eager_ms"] = row["eager_ms"] or r["eager_ms"]
            if row is not r and r.get("first_call"):
                row.setdefault("first_call", {}).update(r["first_call"])
    order = [w.name for w in WORKLOADS]
    return sorted(rows.values(), key=lambda r: order.index(r["workload"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="workload names: " + ", ".join(w.name for w in WORKLOADS))
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS, help="besides eager")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--no-first-call", action="store_true", help="skip the first-call processes (slow)")
    ap.add_argument("--first-call-only", action="store_true", help="only the first-call processes")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the table of earlier runs' --json files")
    ap.add_argument("--first-call", nargs=2, metavar=("WORKLOAD", "VARIANT"), help=argparse.SUPPRESS)
    ap.add_argument("--then-settle", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--per-call-child", metavar="WORKLOAD", help=argparse.SUPPRESS)
    ap.add_argument("--alone", action="store_true", help="per call: each variant in a process of its own (slow)")
    ap.add_argument("--alone-child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.first_call:
        first_call_child(*a.first_call, then_settle=a.then_settle)
        return 0
    if a.alone_child:
        alone_child(*a.alone_child)
        return 0
    if a.per_call_child:  # (per_call_in_a_process: the row as JSON, on the last line)
        torch.set_num_threads(1)
        warnings.simplefilter("once")
        w = next(w for w in WORKLOADS if w.name == a.per_call_child)
        print(json.dumps(per_call(w, [v for v in VARIANTS if v in a.variants], a.rounds)), flush=True)
        return 0
    if a.table:
        rows = merged(a.table)
        done = {v for r in rows for v in r["ratio"]}
        fc = {v for r in rows for v in r.get("first_call", {})}
        print(markdown(rows, [v for v in VARIANTS if v in done], [v for v in FIRST_CALL_VARIANTS if v in fc]))
        return 0
    unknown = set(a.only or ()) - {w.name for w in WORKLOADS}
    if unknown:
        ap.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    torch.set_num_threads(1)
    warnings.simplefilter("once")
    variants = [v for v in VARIANTS if v in a.variants]
    first = [] if a.no_first_call else [v for v in FIRST_CALL_VARIANTS if v in variants]
    rows = []
    for w in WORKLOADS:
        if a.only and w.name not in a.only:
            continue
        start = time.perf_counter()
        measure = per_call_alone if a.alone else per_call_in_a_process
        row = measure(w, variants, a.rounds) if not a.first_call_only else _empty_row(w)
        if first:
            row["first_call"] = first_calls(w, first)
        rows.append(row)
        ratios = ", ".join(f"{v} {x:.2f}" for v, x in row["ratio"].items())
        print(
            f"{w.name}: eager {row['eager_ms']:.3f} ms | {ratios} | tiers {row['tiers']} | first call "
            f"{row.get('first_call', {})} ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
        if a.json:  # (written as it goes: a long run that stops keeps its rows)
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            Path(a.json).write_text(json.dumps(rows, indent=1))
    print(markdown(rows, variants, first))
    return 1 if any(c.startswith("WRONG") for r in rows for c in r["check"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
