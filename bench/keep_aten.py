"""The fused executor's keep-ATen verdicts on this host (`dealias.runtime.keep_aten`), for every candidate op:
ATen's kernel against the code inductor generates for it alone, on 1M floats, at each thread count. An op whose
ratio is at least the threshold stays ATen's kernel inside fused graphs (the fused executor measures each op the
first time a graph uses it, and keeps the verdict on disk; this measures them all at once).

    python bench/keep_aten.py [--threads 1 2]
"""

from __future__ import annotations

import argparse
import sys

import torch

from dealias.runtime.keep_aten import CANDIDATES, THRESHOLD, measure


def _rest(op: torch._ops.OpOverload) -> tuple[int, tuple[tuple[object, ...], dict[str, object]]]:
    """The rank and other arguments an op is measured with: softmax over rows of 1,024."""
    if any(a.name == "dim" for a in op._schema.arguments):
        return 2, ((-1, False), {})
    return 1, ((), {})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    a = parser.parse_args(argv)
    ops = sorted(CANDIDATES, key=str)
    measured = {}
    for threads in a.threads:
        torch.set_num_threads(threads)
        measured[threads] = {op: measure(op, torch.float32, *_rest(op)) for op in ops}
    print("| op | " + " | ".join(f"{t} thread(s): ATen µs, inductor µs, ratio" for t in a.threads) + " |")
    print("|---|" + "---|" * len(a.threads))
    kept = {t: [] for t in a.threads}
    for op in ops:
        cells = [measured[t][op] for t in a.threads]
        print(f"| {op} | " + " | ".join(f"{x * 1e6:.0f}, {y * 1e6:.0f}, {y / x:.2f}" for x, y in cells) + " |")
        for t, (x, y) in zip(a.threads, cells):
            if y >= THRESHOLD * x:
                kept[t].append(str(op).split(".")[1])
    for t in a.threads:
        print(f"keep ATen at {t} thread(s) (inductor at least {THRESHOLD}x slower): {', '.join(kept[t]) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
