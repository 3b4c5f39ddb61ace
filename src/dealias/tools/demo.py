"""Built-in examples for `dealias demo`: each is compiled, its traces printed, and its results (outputs and
mutated inputs, first and cached call) compared with eager PyTorch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import dealias


def seed_program(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c = torch.exp(a)
    d = torch.tanh(b)
    e = c.flatten()
    e += d.flatten()
    d.div_(a)
    return c, d


def kv_cache_write(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int):
    k_cache[:, :, pos] = k
    v_cache[:, :, pos] = v
    scores = k_cache[:, :, : pos + 1] @ k.unsqueeze(-1)
    return scores.squeeze(-1)


def decode_step(k_cache: torch.Tensor, k: torch.Tensor, pos: int) -> torch.Tensor:
    k_cache.narrow(2, pos, 1).copy_(k)  # this step's slot; `pos` changes every call
    return (k_cache[:, :, : pos + 1] @ k.transpose(-1, -2)).squeeze(-1)


def _decode_loop() -> bool:
    """A decode loop whose position changes every step: compiled twice (the second time with `pos` a symbol),
    every step equal to eager."""
    print("=== decode loop (pos changes every step) ===")
    jf = dealias.jit(decode_step)
    cache, eager_cache = torch.zeros(1, 2, 16, 4), torch.zeros(1, 2, 16, 4)
    ok = True
    for pos in range(8):
        k = torch.randn(1, 2, 1, 4)
        ok &= _equal(decode_step(eager_cache, k, pos), jf(cache, k, pos)) and _equal(eager_cache, cache)
    print(f"8 steps: outputs and the cache {'match' if ok else 'DIFFER FROM'} eager")
    print(dealias.last_traces(jf)[-1])
    print(dealias.cache_info(jf))
    print()
    return ok


EXAMPLES: list[tuple[str, Callable[..., Any], Callable[[], tuple[Any, ...]]]] = [
    ("seed program", seed_program, lambda: (torch.randn(4, 4), torch.randn(4, 4))),
    (
        "KV-cache write",
        kv_cache_write,
        lambda: (torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4), torch.randn(1, 2, 4), torch.randn(1, 2, 4), 3),
    ),
]


def _clone(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.allclose(a, b, equal_nan=True)
    return a == b


def run() -> int:
    torch.manual_seed(0)
    ok = True
    for name, fn, make in EXAMPLES:
        print(f"=== {name} ===")
        jf = dealias.jit(fn)
        for call in (1, 2):
            args = make()
            eager_args, jit_args = _clone(args), _clone(args)
            expected = fn(*eager_args)
            got = jf(*jit_args)
            same = _equal(expected, got) and _equal(eager_args, jit_args)
            ok &= same
            print(f"call {call}: outputs and mutated inputs {'match' if same else 'DIFFER FROM'} eager")
        for trace in dealias.last_traces(jf):
            print(trace)
            print()
        print(dealias.cache_info(jf))
        print()
    ok &= _decode_loop()
    print("demo: all examples match eager" if ok else "demo: MISMATCH")
    from ..report import records

    if records.ACTIVE is not None:  # DEALIAS_REPORT=DIR (make demo sets it): the run's HTML report
        print(f"demo: report written to {dealias.report(records.ACTIVE.dir)}")
    return 0 if ok else 1
