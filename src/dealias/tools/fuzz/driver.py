"""The fuzzing run the command line (`dealias fuzz`) and the tests drive: programs generated from consecutive
seeds, run, counted by outcome, and each mismatch shrunk and printed as runnable Python."""

from __future__ import annotations

import sys
import time
from typing import Any

from .generator import generate
from .runner import run_program
from .shrink import shrink


def fuzz(
    seed: int,
    count: int,
    seconds: float | None = None,
    out: Any = sys.stdout,
    progress: bool = True,
    autograd: bool | None = None,
    executor: str = "torch",
    dynamic: bool = False,
    wide: bool = False,
) -> dict[str, Any]:
    """Run `count` programs from `seed` (or until `seconds` pass); `autograd` True makes every program an
    autograd one (None: one in five). Returns a summary; mismatches are shrunk and printed. With the fused
    executor (`executor="inductor"`), float values compare with a tolerance (verify's). `dynamic`: every size
    symbolic from the first call (the same programs through the passes' and executors' symbolic paths). `wide`: the
    generator's wider statements too (statements.wide)."""
    start = time.monotonic()
    summary: dict[str, Any] = {
        "ok": 0,
        "fallback": 0,
        "overlap": 0,
        "eager-raises": 0,
        "graph-break": 0,
        "split": 0,
        "error-matched": 0,
        "refused": 0,
        "mismatch": 0,
        "programs": 0,
        "failures": [],
    }
    for i in range(count):
        if seconds is not None and time.monotonic() - start > seconds:
            break
        prog = generate(seed + i, autograd=autograd, wide=wide)
        outcome = run_program(prog, executor, dynamic)
        summary[outcome.status] += 1
        summary["programs"] += 1
        if outcome.status == "mismatch":
            small = shrink(prog, lambda p: run_program(p, executor, dynamic).status == "mismatch")
            detail = run_program(small, executor, dynamic).detail
            summary["failures"].append((small, detail))
            print(f"\nMISMATCH (seed {prog.seed}): {detail}\n{small.source()}", file=out)
        if progress:
            done = int(30 * (i + 1) / count)
            print(f"\r[{'#' * done}{' ' * (30 - done)}] {i + 1}/{count}", end="", file=out, flush=True)
    if progress:
        print(file=out)
    summary["seconds"] = round(time.monotonic() - start, 1)
    return summary
