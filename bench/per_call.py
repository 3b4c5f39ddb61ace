"""Per call, from the first: a real workload (bench/real_workloads.py) on dealias's default (executor "tiered"),
each call's time as a ratio to eager's median call, and what each program of it did in that call: the tier it ran
on (a call of a tier being measured is marked with `*`), the fused compile (in the promoting call on a torch whose
FX tracing flag is the process's, 2.13; in a background thread on 2.14, adopted by a later call).

Eager and the default alternate call by call in one process on one thread (each on its own copy of the arguments),
so that the machine's load falls on both alike; eager's median is over all its calls. Two ratios per call: wall time
(what a user waits), then the calling thread's CPU time (what the machine's other processes do not change; the
compile in a background thread, torch 2.14, is not in it). Issue 38's bound: no call
after the first above eager x 1.10, which the summary line checks. On a loaded machine single calls vary by 2x:
--repeat R traces R times (dynamo reset, compiled afresh; inductor's caches warm after the first) and prints per call
the median of the R ratios.

    python bench/per_call.py --only adamw_foreach gpt2 --calls 60
    python bench/per_call.py --only hf_llama_decode --calls 80 --variant exact
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

import dealias
from dealias.frontend import tiers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real import call, compiled, make_args  # noqa: E402 - bench/ is not a package
from real_workloads import WORKLOADS, Workload  # noqa: E402

BOUND = 1.10  # issue 38: no call after the first above eager x 1.10


class Events:
    """What the programs of the compiled function did in the current call: the tiers run (via `tiers.measure`, on
    calls not yet settled) and the fused compiles started, ended in the background and adopted."""

    def __init__(self) -> None:
        self.now: list[str] = []
        self.ids: dict[int, int] = {}  # Tiered entry -> its number, in order of first appearance

    def of(self, entry: Any) -> str:
        return f"p{self.ids.setdefault(id(entry), len(self.ids))}"

    def install(self) -> None:
        measure, promote, adopt = tiers.measure, tiers.Tiered._promote, tiers.Tiered._adopt
        events = self

        def timed(tier: str, run: Any, leaves: list[Any]) -> Any:
            out = measure(tier, run, leaves)
            events.now.append(tier)
            return out

        def promoting(entry: Any, leaves: list[Any], **kwargs: Any) -> None:
            start = time.perf_counter()
            promote(entry, leaves, **kwargs)
            where = "background" if entry.pending is not None else "in this call"
            events.now.append(f"{events.of(entry)} fused compile {where} ({time.perf_counter() - start:.2f} s here)")

        def adopting(entry: Any, program: Any, note: str) -> None:
            adopt(entry, program, note)
            events.now.append(f"{events.of(entry)} fused adopted" + (f" ({note})" if note else ""))

        tiers.measure, tiers.Tiered._promote, tiers.Tiered._adopt = timed, promoting, adopting


EVENTS = Events()  # (installed once, by main)


def tiers_now(f: Any) -> tuple[str, bool]:
    """The programs' tiers now, and whether a fused compile runs in the background (torch 2.14)."""
    info = dealias.cache_info(f)
    return ", ".join(info.tiers), any("compiling in the background" in r for r in info.tier_reasons)


def trace(w: Workload, variant: str, calls: int) -> list[dict[str, Any]]:
    torch._dynamo.reset()
    events = EVENTS
    f = compiled(variant, w.fn)
    mine, theirs = make_args(w), make_args(w)
    for _ in range(2):  # eager's lazily built paths
        call(w.fn, theirs, w.backward)
    rows: list[dict[str, Any]] = []
    for i in range(calls):
        start, cpu = time.perf_counter(), time.thread_time()
        call(w.fn, theirs, w.backward)
        eager, eager_cpu = time.perf_counter() - start, time.thread_time() - cpu
        events.now = []
        start, cpu = time.perf_counter(), time.thread_time()
        call(f, mine, w.backward)
        seconds, seconds_cpu = time.perf_counter() - start, time.thread_time() - cpu
        now, background = tiers_now(f)
        rows.append({"call": i + 1, "seconds": seconds, "eager": eager, "events": events.now, "tiers": now})
        rows[-1].update(cpu=seconds_cpu, eager_cpu=eager_cpu)
        rows[-1]["background"] = background
    return rows


def report(w: Workload, traces: list[list[dict[str, Any]]]) -> list[int]:
    """Per call: the median over the traces of its ratio to eager's median call in the same trace; the events of
    the first trace."""
    medians = [statistics.median(r["eager"] for r in rows) for rows in traces]
    cpus = [statistics.median(r["eager_cpu"] for r in rows) for rows in traces]
    rows = traces[0]
    print(f"\n{w.name}: eager median {statistics.median(medians) * 1e3:.3f} ms per call ({len(traces)} traces)")
    over = []
    for i, r in enumerate(rows):
        ratio = statistics.median(t[i]["seconds"] / e for t, e in zip(traces, medians))
        cpu = statistics.median(t[i]["cpu"] / e for t, e in zip(traces, cpus))
        beside = ["beside the fused compile (background)"] if any(t[i]["background"] for t in traces) else []
        mark = " >" if r["call"] > 1 and ratio > BOUND else "  "
        if mark == " >":
            over.append(r["call"])
        ran = [e for e in r["events"] if " " not in e]
        notes = [e for e in r["events"] if " " in e] + beside
        what = "measured " + "+".join(ran) if ran else f"settled: {r['tiers']}"
        print(f"{mark}{r['call']:4d} {ratio:7.2f}x {cpu:7.2f}x  {what}" + (f"  [{'; '.join(notes)}]" if notes else ""))
    for k, t in enumerate(traces):  # (the events above are the first trace's)
        marks = [f"call {r['call']}: {e}" for r in t for e in r["events"] if " " in e]
        beside = [r["call"] for r in t if r["background"]]
        if beside:
            marks.append(f"calls {beside[0]}-{beside[-1]} beside the background compile")
        print(f"  trace {k + 1}: " + ("; ".join(marks) or "no fused compile"))
    print(f"{w.name}: calls after the first above eager x {BOUND}: {over or 'none'} ({len(over)} of {len(rows) - 1})")
    over_cpu = [
        i + 1 for i in range(1, len(rows)) if statistics.median(t[i]["cpu"] / e for t, e in zip(traces, cpus)) > BOUND
    ]
    print(f"{w.name}: by CPU time: {over_cpu or 'none'} ({len(over_cpu)} of {len(rows) - 1})")
    return over


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="workload names: " + ", ".join(w.name for w in WORKLOADS))
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--variant", default="default", choices=("default", "tiered", "exact"))
    ap.add_argument("--repeat", type=int, default=1, help="traces per workload (compiled afresh), median per call")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    EVENTS.install()
    for w in WORKLOADS:
        if a.only and w.name not in a.only:
            continue
        report(w, [trace(w, a.variant, a.calls) for _ in range(a.repeat)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
