"""First-call (compile) time against program size: dealias (the default, which starts on the torch executor)
beside torch.compile's aot_eager, on straight-line in-place programs of N statements (row writes, in-place updates,
reads through views); with --fused also dealias's fused executor beside torch.compile(backend="inductor"), each
after a first compile of a small program (inductor's import and probes not counted), in a fresh inductor cache.

    python bench/compile_time.py                # N = 100, 300, 1000
    python bench/compile_time.py --sizes 100 3000
    python bench/compile_time.py --sizes 50 100 200 --fused
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
import torch._dynamo

import dealias


def make_program(n: int):
    """A function of (buf, row) with `n` statements, cycling through writes of rows, in-place updates of the
    whole buffer and reads of written rows."""
    lines = ["def program(buf, row):", "    acc = row.clone()"]
    for i in range(n):
        k = i % 4
        r = i % 16
        if k == 0:
            lines.append(f"    buf[{r}] = acc")
        elif k == 1:
            lines.append(f"    buf[{r}].add_(row)")
        elif k == 2:
            lines.append(f"    acc = acc + buf[{(r + 3) % 16}]")
        else:
            lines.append("    buf.mul_(0.5)")
    lines.append("    return acc")
    scope: dict = {}
    exec("\n".join(lines), scope)  # noqa: S102 - the benchmark's own generated source
    return scope["program"]


def first_call(fn, args) -> float:
    torch._dynamo.reset()
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="*", default=[100, 300, 1000])
    ap.add_argument("--fused", action="store_true", help='also executor="inductor" against torch.compile\'s inductor')
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.fused:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile_time_")  # (no entry of an earlier run)
        for compiled in (dealias.jit(make_program(4), executor="inductor"), torch.compile(make_program(4))):
            compiled(torch.randn(16, 64), torch.randn(64))  # (imports and per-process probes, before timing)

    def args():
        return torch.randn(16, 64), torch.randn(64)

    for n in a.sizes:
        program = make_program(n)
        times = {
            "dealias": first_call(dealias.jit(program), args()),
            "aot_eager": first_call(torch.compile(program, backend="aot_eager"), args()),
        }
        text = f"dealias {times['dealias']:.2f} s | aot_eager {times['aot_eager']:.2f} s | ratio "
        text += f"{times['dealias'] / times['aot_eager']:.2f}"
        if a.fused:
            times["fused"] = first_call(dealias.jit(program, executor="inductor"), args())
            times["inductor"] = first_call(torch.compile(program, backend="inductor"), args())
            text += f" || fused {times['fused']:.2f} s | inductor {times['inductor']:.2f} s | ratio "
            text += f"{times['fused'] / times['inductor']:.2f}"
        print(f"{n:>6} statements: {text}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
