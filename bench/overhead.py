"""Cached-call cost of each front end on µs-scale calls, in one process, interleaved, best of N rounds:
eager; dynamo with a backend that returns the graph's own forward (dynamo's cost alone); dealias.jit;
dealias's compiled graph called directly with the graph's inputs (dealias's own part, without dynamo in the
way); torch.compile(backend="dealias"); torch.compile with inductor. Ratios are to eager.

    python bench/overhead.py [--rounds 9]
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


def kv_write(kc, vc, k, v, pos):
    kc.index_copy_(2, pos, k)
    vc.index_copy_(2, pos, v)


def _kv_args() -> tuple[Any, ...]:
    shape, token = (1, 16, 4096, 64), (1, 16, 1, 64)
    return torch.zeros(shape), torch.zeros(shape), torch.randn(token), torch.randn(token), torch.tensor([7])


WORKLOADS = {"tiny": (tiny, lambda: (torch.zeros(8),)), "kv_write": (kv_write, _kv_args)}


def _graph_forward(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    return gm.forward


def _graph_program(jf: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The one dynamo graph of `jf`, compiled by dealias, as a function of `fn`'s arguments."""
    (program,) = jf.stats.graphs
    params = fn.__code__.co_varnames[: fn.__code__.co_argcount]
    order = [params.index(name) for name in program.names]  # the graph takes its inputs in its own order
    return lambda *args: program(*(args[i] for i in order))


def _best_us(fn: Callable[..., Any], args: tuple[Any, ...], iters: int, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            fn(*args)
        times.append((time.perf_counter() - start) / iters * 1e6)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--iters", type=int, default=2000)
    a = parser.parse_args(argv)
    torch.set_num_threads(1)
    columns = ["eager", "dynamo alone", "dealias.jit", "dealias without dynamo", "backend=dealias", "inductor"]
    print(f"| workload | {' | '.join(columns)} |")
    print("|---|" + "---|" * len(columns))
    for name, (fn, make) in WORKLOADS.items():
        impls = {
            "eager": fn,
            "dynamo alone": torch.compile(fn, backend=_graph_forward, dynamic=False),
            "dealias.jit": dealias.jit(fn),
            "backend=dealias": torch.compile(fn, backend="dealias", dynamic=False),
            "inductor": torch.compile(fn, dynamic=False),
        }
        args = make()
        for impl in impls.values():  # compile, warm up
            for _ in range(3):
                impl(*args)
        impls = {
            **dict(list(impls.items())[:3]),
            "dealias without dynamo": _graph_program(impls["dealias.jit"], fn),
            **dict(list(impls.items())[3:]),
        }
        best = {k: float("inf") for k in impls}
        for _ in range(a.rounds):  # interleaved: machine noise hits every implementation alike
            for k, impl in impls.items():
                best[k] = min(best[k], min(_best_us(impl, args, a.iters, 1)))
        eager = best["eager"]
        cells = [f"{eager:.1f} µs"] + [f"{best[k]:.1f} µs ({best[k] / eager:.2f}×)" for k in list(impls)[1:]]
        print(f"| {name} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
