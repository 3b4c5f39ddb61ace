"""Per-call cost of the guard check, and of its storage-sharing part, for 1, 10 and 100 tensor arguments
(disjoint tensors, and all of them views of one buffer). Also the cost of a whole cache hit.

    python bench/guards.py
"""

from __future__ import annotations

import time

import torch

import dealias
from dealias.frontend.guards import lookup_key, sharing_pattern, tensor_check


def _best(f, n: int = 2000, rounds: int = 7) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


def _args(n: int, shared: bool) -> list[torch.Tensor]:
    if shared:
        buf = torch.randn(n * 4)
        return [buf[4 * i : 4 * i + 4] for i in range(n)]
    return [torch.randn(4) for _ in range(n)]


def _measure(n: int, shared: bool) -> tuple[float, float, float, float]:
    args = _args(n, shared)

    def f(*xs):
        return xs[0] + 1

    jf = dealias.jit(f)
    jf(*args)
    _, tensors = lookup_key(args, len(args))
    check = tensor_check(tensors)
    return (
        _best(lambda: sharing_pattern(args)),
        _best(lambda: lookup_key(args, len(args))),
        _best(lambda: check(*tensors)),
        _best(lambda: jf(*args), n=500),
    )


def main() -> None:
    print(f"{'tensors':>8} {'layout':>10} | {'sharing us':>10} {'key us':>8} {'tensor check us':>16} {'hit us':>8}")
    for n in (1, 10, 100):
        for shared in (False, True):
            sharing, key, check, hit = _measure(n, shared)
            layout = "one buffer" if shared else "disjoint"
            print(f"{n:>8} {layout:>10} | {sharing:>10.2f} {key:>8.2f} {check:>16.2f} {hit:>8.2f}")


if __name__ == "__main__":
    main()
