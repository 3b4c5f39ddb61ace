"""User-style programs (bench/user_workloads.py: a replay buffer, EMAs, message passing, a diffusion sampler,
hand-written optimizer steps, GAN and QAT losses, a KV-cache decode step...), per call, timed as users run them:
eager; dealias's default (`dealias.jit(f)`, executor="tiered", DEALIAS_FUSE_FIRST as the user has it: 1 unless set);
the fused executor (`executor="inductor"`); torch.compile(backend="inductor").

bench/real.py's method and helpers: each variant on its own copy of the arguments, warmed up (the default until its
tiers settle), checked against eager's call on a copy of the same state (outputs and every mutated argument, module,
buffer and gradient) before timing, then timed on one thread in rounds of shuffled order; the cell is the median
over rounds of the ratio to eager's time in the same round, on the thread's CPU clock (a loaded machine's other
processes left out; --wall for the wall clock). Besides, for the default: the tiers it settled on
(`dealias.cache_info(f).tiers`); and for the default, torch.compile and eager, the worst call after the first among
the first CALLS calls, each timed on the thread's CPU clock (the machine's other load left out), as a ratio to eager's
median call on the same clock (a call right after a compile finds the caches cold, torch.compile's as the default's).
That worst call is one sample of a cold call, which swings by 2x between runs on the same machine (torch.compile's
call 2 of the RL replay buffer: 2.4x to 5.1x eager's median in four runs); `--repeats R` times the first CALLS calls
of R compiled functions (the first the one timed after; the others fresh ones, each with its own compile and
arguments, the on-disk caches warm from the first's) and reports the median of their worst calls, and all of them
(`ratios`). (R up to 5: torch.compile's functions share the code objects of the functions they call, where dynamo
counts recompiles up to its limit, 8.)

    python bench/user_programs.py                       # everything (~15 min on a quiet 2-core machine)
    python bench/user_programs.py --only ema_foreach gnn --rounds 5 --json /tmp/out.json
    python bench/user_programs.py --only replay decode --repeats 5   # each worst call 2..48 the median of 5
    python bench/user_programs.py --table /tmp/out.json

Issue 38's targets: default at most min(eager, tc) x 1.05 once warm, no call after the first above eager x 1.10
(microsecond calls: at or below tc); fused at or below tc.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # (before torch is imported)

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

import dealias  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real  # noqa: E402 - bench/ is not a package
from user_workloads import WORKLOADS, Workload  # noqa: E402

VARIANTS = ("default", "inductor", "torch.compile")
CALLS = 48  # the default's calls timed one by one from its first (its fused compile and tier measurement)
# The rounds' clock: the thread's CPU time (torch on one thread runs a CPU call's kernels, its backward included, on
# the calling thread; the other processes of a loaded machine then add little to it), or the wall clock (--wall).
CLOCK = time.thread_time


def _thread_seconds(f, args, backward: bool) -> float:
    start = time.thread_time()
    real.call(f, args, backward)
    return time.thread_time() - start


def _worst(calls: list[float], eager_call: float) -> dict[str, Any]:
    """The slowest of calls 2..N (1-based) as a ratio to eager's median call."""
    worst = max(range(1, len(calls)), key=calls.__getitem__)
    return {"call": worst + 1, "ratio": calls[worst] / eager_call}


def _median_worst(worsts: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of several compiled functions' worst calls (`_worst`; the lower middle one of an even number),
    with every one's ratio."""
    middle = sorted(worsts, key=lambda x: x["ratio"])[(len(worsts) - 1) // 2]
    return {**middle, "ratios": [round(x["ratio"], 2) for x in worsts]} if len(worsts) > 1 else middle


def _fresh_worst(v: str, w: Workload, eager_call: float) -> dict[str, Any]:
    """The worst of the first CALLS calls of a fresh compiled function of variant `v` on fresh arguments."""
    f, args = real.compiled(v, w.fn), real.make_args(w)
    return _worst([_thread_seconds(f, args, w.backward) for _ in range(CALLS)], eager_call)


def per_call(w: Workload, variants: list[str], rounds: int, repeats: int = 1) -> dict[str, Any]:
    torch._dynamo.reset()
    row: dict[str, Any] = {"workload": w.name, "title": w.title, "ratio": {}, "tiers": {}, "check": {}, "warm": {}}
    impls = {v: real.compiled(v, w.fn) for v in ["eager", *variants]}
    args = {v: real.make_args(w) for v in impls}
    order = random.Random(w.name)
    # eager's calls on the thread's clock from its first, the reference of the others' worst calls (eager's own
    # second call is slower than its median too: caches cold)
    calls = [_thread_seconds(w.fn, args["eager"], w.backward) for _ in range(CALLS)]
    eager_call = statistics.median(calls[CALLS // 2 :])
    row["worst"] = {"eager": _worst(calls, eager_call)}
    timed = ["eager"]
    for v in order.sample(variants, len(variants)):
        f = impls[v]
        if v in ("default", "torch.compile"):
            try:
                calls = [_thread_seconds(f, args[v], w.backward) for _ in range(CALLS)]
            except Exception as e:  # noqa: BLE001 - a variant that fails is reported, the others still run
                row["check"][v] = real.wrong(e)
                if v != "torch.compile":
                    row["tiers"][v] = []
                print(f"  {w.name} {v}: {row['check'][v]}", flush=True)
                continue
            worsts = [_worst(calls, eager_call), *(_fresh_worst(v, w, eager_call) for _ in range(repeats - 1))]
            row["worst"][v] = _median_worst(worsts)
            row.setdefault("first_call_s", {})[v] = calls[0]
        if real.warmed_and_checked(row, v, f, w, args[v]):
            timed.append(v)
            if v == "default":
                row["reasons"] = list(dealias.cache_info(f).tier_reasons)
    timed = ["eager", *[v for v in variants if v in timed]]
    real.timed_rounds(row, impls, args, w.backward, timed, rounds, order, CLOCK)
    for v in [v for v in variants if v != "torch.compile" and v in timed]:
        row["tiers"][v] = list(real.tiers(impls[v]))
    return row


def misses(r: dict[str, Any]) -> list[str]:
    """Where the row misses issue 38's targets."""
    out = []
    ratio = r["ratio"]
    tc = ratio.get("torch.compile")
    if "default" in ratio:
        bound = min(1.0, tc if tc is not None else 1.0) * 1.05
        if ratio["default"] > bound:
            out.append(f"default {ratio['default']:.2f} > {bound:.2f}")
        worst = r.get("worst", {})
        if "default" in worst:
            # A call 2..N above 1.10 x eager's median, above eager's own worst call x 1.10 and above torch.compile's
            # worst: on a loaded machine eager's own worst call is 2-6x its median (caches cold after another
            # process ran), as is a call right after a compile, torch.compile's as the default's.
            bound = max(
                1.10, 1.10 * worst.get("eager", {}).get("ratio", 1.0), worst.get("torch.compile", {}).get("ratio", 0)
            )
            if worst["default"]["ratio"] > bound:
                out.append(f"call {worst['default']['call']} at {worst['default']['ratio']:.2f}x eager")
    if "inductor" in ratio and tc is not None and ratio["inductor"] > tc * 1.10:
        out.append(f"fused {ratio['inductor']:.2f} > tc {tc:.2f} x 1.10")
    return out


def _cell(r: dict[str, Any], v: str) -> str:
    if v in r["ratio"]:
        return f"{r['ratio'][v]:.2f}" + (" (not bit-exact)" if r["check"][v].startswith("NOT") else "")
    return "wrong" if r["check"].get(v, "").startswith("WRONG") else ""


def markdown(rows: list[dict[str, Any]]) -> str:
    head = [
        "program",
        "eager ms",
        "default",
        "default's tiers",
        "fused",
        "torch.compile",
        f"worst call 2..{CALLS}: default / tc / eager",
        "misses",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cell = functools.partial(_cell, r)

        worst = r.get("worst", {})
        fused_tiers = sorted(set(r["tiers"].get("inductor", [])) - {"fused"})
        lines.append(
            "| "
            + " | ".join(
                [
                    r["title"],
                    f"{r['eager_ms']:.3f}",
                    cell("default"),
                    ", ".join(r["tiers"].get("default", [])),
                    cell("inductor") + (f" ({', '.join(fused_tiers)})" if fused_tiers else ""),
                    cell("torch.compile"),
                    " / ".join(
                        f"{worst[v]['ratio']:.1f} (#{worst[v]['call']})" if v in worst else "-"
                        for v in ("default", "torch.compile", "eager")
                    ),
                    "; ".join(misses(r)),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="programs: " + ", ".join(w.name for w in WORKLOADS))
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS, help="besides eager")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument(
        "--repeats", type=int, default=1, help="compiled functions whose worst call 2..48 is timed (their median)"
    )
    ap.add_argument("--json", help="write the rows here (as it goes)")
    ap.add_argument("--wall", action="store_true", help="time the rounds on the wall clock, not the thread's CPU time")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the table of earlier runs' --json files")
    a = ap.parse_args(argv)
    if a.table:
        rows = [r for name in a.table for r in json.loads(Path(name).read_text())]
        print(markdown(rows))
        return 0
    unknown = set(a.only or ()) - {w.name for w in WORKLOADS}
    if unknown:
        ap.error(f"unknown programs: {', '.join(sorted(unknown))}")
    global CLOCK
    CLOCK = time.perf_counter if a.wall else time.thread_time
    torch.set_num_threads(1)
    warnings.simplefilter("once")
    rows = []
    for w in WORKLOADS:
        if a.only and w.name not in a.only:
            continue
        start = time.perf_counter()
        row = per_call(w, [v for v in VARIANTS if v in a.variants], a.rounds, a.repeats)
        rows.append(row)
        ratios = ", ".join(f"{v} {x:.2f}" for v, x in row["ratio"].items())
        print(
            f"{w.name}: eager {row['eager_ms']:.3f} ms | {ratios} | tiers {row['tiers']} | worst "
            f"{row.get('worst')} | {'; '.join(misses(row))} ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
        if a.json:
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            Path(a.json).write_text(json.dumps(rows, indent=1))
    print(markdown(rows))
    return 1 if any(c.startswith("WRONG") for r in rows for c in r["check"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
