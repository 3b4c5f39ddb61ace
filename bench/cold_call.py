"""The per-call cost of a compiled call, warm and cold: each layer of dealias's call path, dynamo's frame alone and
torch.compile's call, timed on tiny tensors (their kernels take nothing) right after the previous call and right
after an eager call that streams a large buffer through the caches (as a memory-bound program's own kernel does:
the EMA of bench/real.py streams 25 MB a call).

Why (issue 38, the `_foreach_lerp_` EMA row, 1.10x eager): its fused kernel is one kernel over the 12 tensors, stored
into the averages in place, as fast as eager's `_foreach_lerp_` (0.96x); what is left is the call's own cost, which
is ~15 us warm but ~70 us after the kernel evicted the interpreter's and dynamo's data from the core's caches,
three quarters of it dynamo's frame (its guards over 12 tensors: 60 `hasattr` checks of dynamic-dimension marks
among them), which torch.compile pays too.

    python bench/cold_call.py            # medians / minima over 400 calls, one thread
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

import dealias
import dealias.runtime.fused as fused


def ema_update(ema, params):
    torch._foreach_lerp_(ema, params, 0.001)


def _compile_capturing(fn: Any, args: tuple[Any, ...]) -> tuple[Any, dict[str, Any]]:
    """`dealias.jit(fn, executor="inductor")` called on `args`, with its fused program's compiled graph and runner."""
    seen: dict[str, Any] = {}
    runner = fused.runner

    def capture(gm: Any, compiled: Any, *rest: Any, **kwargs: Any) -> Any:
        seen["compiled"] = compiled
        seen["run"] = runner(gm, compiled, *rest, **kwargs)
        return seen["run"]

    fused.runner = capture
    try:
        jf = dealias.jit(fn, executor="inductor")
        jf(*args)
    finally:
        fused.runner = runner
    return jf, seen


def measure(call: Any, evict: Any, calls: int = 400) -> tuple[float, float, float, float]:
    """(median, min) us of `call()` right after another `call()`, then right after `evict()`."""
    out = []
    for before in (call, evict):
        times = []
        for _ in range(calls):
            before()
            t = time.perf_counter_ns()
            call()
            times.append(time.perf_counter_ns() - t)
        out += [statistics.median(times) / 1e3, min(times) / 1e3]
    return tuple(out)  # type: ignore[return-value]


def main() -> None:
    torch.set_num_threads(1)
    tiny = ([torch.randn(10) for _ in range(6)], [torch.randn(10) for _ in range(6)])
    flat = [*tiny[0], *tiny[1]]
    big = ([torch.randn(1 << 20) for _ in range(2)], [torch.randn(1 << 20) for _ in range(2)])  # 16 MB streamed

    jf, seen = _compile_capturing(ema_update, tiny)
    graph = dealias.api._handle(jf).stats.graphs[0]
    kernel = getattr(seen["compiled"], "current_callable", seen["compiled"])

    def empty_ema(ema, params):
        torch._foreach_lerp_(ema, params, 0.001)

    frame = torch.compile(empty_ema, backend=lambda gm, example: lambda *args: [])  # dynamo's frame and guards alone
    compiled = torch.compile(ema_update)
    rows = {
        "eager _foreach_lerp_": lambda: ema_update(*tiny),
        "inductor's call alone": lambda: kernel(list(flat)),
        "dealias: fused runner": lambda: seen["run"](*flat),
        "dealias: graph's lookup + runner": lambda: graph(*flat),
        "dealias: whole call": lambda: jf(*tiny),
        "dynamo's frame, empty graph": lambda: frame(*tiny),
        "torch.compile": lambda: compiled(*tiny),
    }
    for f in rows.values():
        for _ in range(20):
            f()
    print(f"{'us per call (median / min)':34s} {'warm':>14s} {'after 16 MB':>14s}")
    for name, f in rows.items():
        warm_med, warm_min, cold_med, cold_min = measure(f, lambda: ema_update(*big))
        print(f"{name:34s} {warm_med:7.1f} /{warm_min:5.1f} {cold_med:7.1f} /{cold_min:5.1f}")


if __name__ == "__main__":
    main()
