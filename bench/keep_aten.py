"""The keep-ATen list of the fused executor (`dealias.runtime.fused.KEEP_ATEN`), measured: each op alone on 1M floats,
ATen's kernel against the code inductor generates for it, best of 7 rounds. Ops whose ratio is at least
--threshold at every thread count measured belong on the list.

    python bench/keep_aten.py [--threads 1 2] [--threshold 1.15]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch._inductor.compile_fx import compile_fx_inner
from torch._inductor.decomposition import select_decomp_table
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.view(1024, -1)


OPS: dict[str, Callable[[torch.Tensor], Any]] = {
    **{
        name: getattr(aten, name).default
        for name in (
            "tanh exp log sigmoid erf sin cos sqrt rsqrt gelu silu log1p expm1 reciprocal abs relu atan asin "
            "lgamma digamma"
        ).split()
    },
    "softmax": lambda x: aten._softmax.default(_rows(x), -1, False),
    "log_softmax": lambda x: aten._log_softmax.default(_rows(x), -1, False),
    "sum": lambda x: aten.sum.dim_IntList(_rows(x), [1]),
    "layer_norm": lambda x: aten.native_layer_norm.default(_rows(x), [1024], None, None, 1e-5)[0],
    "pow_2.5": lambda x: aten.pow.Tensor_Scalar(x, 2.5),
}


def _best(fn: Callable[[], Any], iters: int = 50, rounds: int = 7) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - start) / iters)
    return min(times)


def _returning_tuple(op: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], tuple[Any]]:
    return lambda x: (op(x),)  # inductor compiles graphs that return a tuple


def ratios(threads: int) -> dict[str, tuple[float, float]]:
    """Per op: (ATen's time, inductor's time) in seconds."""
    torch.set_num_threads(threads)
    x = torch.rand(1 << 20) * 0.9 + 0.05  # inside every op's domain
    out = {}
    for name, op in OPS.items():
        with torch.no_grad():
            gm = make_fx(_returning_tuple(op), decomposition_table=select_decomp_table())(x)
            compiled = compile_fx_inner(gm, [x])
            compiled([x])
            out[name] = (_best(lambda op=op: op(x)), _best(lambda c=compiled: c([x])))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--threshold", type=float, default=1.15)
    a = parser.parse_args(argv)
    measured = {t: ratios(t) for t in a.threads}
    print("| op | " + " | ".join(f"{t} thread(s): ATen µs, inductor µs, ratio" for t in a.threads) + " |")
    print("|---|" + "---|" * len(a.threads))
    keep = []
    for name in OPS:
        cells = [measured[t][name] for t in a.threads]
        print(f"| {name} | " + " | ".join(f"{x * 1e6:.0f}, {y * 1e6:.0f}, {y / x:.2f}" for x, y in cells) + " |")
        if all(y / x >= a.threshold for x, y in cells):
            keep.append(name)
    print(f"keep ATen (inductor at least {a.threshold}x slower at every thread count): {', '.join(keep) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
