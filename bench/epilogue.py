"""Cached-call cost of dealias's generated call (runtime/generated_call.py) on µs-scale programs whose epilogue
does something: an alias group's base, views returned, a grad-mode switch, outputs of several kinds. Per workload,
best of N rounds (CPU time of this thread: the machine's other load does not count): the compiled program called
directly with its inputs, the graph's program (with dealias's cache lookup), and `dealias.jit`.

    python bench/epilogue.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

import dealias


def tiny(x):
    x.add_(1)
    return x * 2 + 1


def alias_group(a, b):
    a.add_(1)
    b.mul_(2)
    return a.sum()


def view_outputs(x):
    x.add_(1)
    return x.t()[0], x.view(-1)


def grad_switch(x, y):
    with torch.no_grad():
        x.add_(1)
    return x * y


def mixed_outputs(x, y):
    x.add_(1)
    return x, x[0], y + 1, x.view(-1), None, 3


def _overlapping() -> tuple[torch.Tensor, ...]:
    base = torch.zeros(10)
    return base[:6], base[2:]


WORKLOADS: dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]] = {
    "tiny": (tiny, lambda: (torch.zeros(8),)),
    "alias_group": (alias_group, _overlapping),
    "view_outputs": (view_outputs, lambda: (torch.zeros(3, 4),)),
    "grad_switch": (grad_switch, lambda: (torch.zeros(4), torch.ones(4, requires_grad=True))),
    "mixed_outputs": (mixed_outputs, lambda: (torch.zeros(3, 4), torch.ones(4))),
}


def _best_us(fn: Callable[..., Any], args: tuple[Any, ...], iters: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(iters):
            fn(*args)
        best = min(best, (time.thread_time() - start) / iters * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iters", type=int, default=3000)
    a = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("| workload | program | graph program | dealias.jit |")
    print("|---|---|---|---|")
    for name, (fn, make) in WORKLOADS.items():
        jf = dealias.jit(fn)
        args = make()
        for _ in range(3):
            jf(*args)
        (graph,) = jf.stats.graphs
        params = fn.__code__.co_varnames[: fn.__code__.co_argcount]
        leaves = [args[params.index(n)] for n in graph.names]  # the graph takes its inputs in its own order
        program = jf.last
        cells = [
            _best_us(program, (leaves,), a.iters, a.rounds),
            _best_us(graph, tuple(leaves), a.iters, a.rounds),
            _best_us(jf, args, a.iters, a.rounds),
        ]
        print(f"| {name} | {' | '.join(f'{c:.2f} µs' for c in cells)} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
