"""Loops whose ints and sizes change every call (issue 11): compiles, total compile time, and the per-step time
as a ratio to eager, for dynamo alone (a backend returning the graph's own forward: the front end's cost),
dealias.jit (torch executor, and `executor="inductor"`: fused) and torch.compile (inductor), in one process.

- decode_int: a gpt-fast style decode step, 2 layers of k/v caches written at a Python-int position
  (`narrow(2, pos, 1).copy_`) and attention over the prefix `[:, :, :pos + 1]`, 200 steps.
- decode_index: decode_int written as plain indexing, `kc[:, :, pos] = k[:, :, 0]` (dynamo alone specializes
  the int there: torch.compile compiles per position until its recompile limit, then runs eagerly).
- decode_tensor: the same with `index_copy_(2, input_pos, k)` and a tensor position over the whole cache.
- adamw_int: a hand-written AdamW over 20 parameters with the step count a Python int, 100 steps.
- seq_len: a small attention block over sequence lengths 1..64.

    python bench/dynamic.py [--steps 200]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import dealias

H, D, MAX = 8, 64, 256


def decode_int(caches, q, k, v, pos):
    out = q
    for kc, vc in caches:
        kc.narrow(2, pos, 1).copy_(k)
        vc.narrow(2, pos, 1).copy_(v)
        out = out + F.scaled_dot_product_attention(out, kc[:, :, : pos + 1], vc[:, :, : pos + 1])
    return out


def decode_index(caches, q, k, v, pos):
    out = q
    for kc, vc in caches:
        kc[:, :, pos] = k[:, :, 0]
        vc[:, :, pos] = v[:, :, 0]
        out = out + F.scaled_dot_product_attention(out, kc[:, :, : pos + 1], vc[:, :, : pos + 1])
    return out


def decode_tensor(caches, q, k, v, pos):
    out = q
    mask = (torch.arange(MAX) <= pos).view(1, MAX)
    for kc, vc in caches:
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, v)
        out = out + F.scaled_dot_product_attention(out, kc, vc, attn_mask=mask)
    return out


def _decode_calls(steps: int, tensor_pos: bool) -> tuple[list[tuple[Any, ...]], Callable[[], Any]]:
    g = torch.Generator().manual_seed(0)
    caches = [(torch.zeros(1, H, MAX, D), torch.zeros(1, H, MAX, D)) for _ in range(2)]
    tok = [torch.randn(1, H, 1, D, generator=g) for _ in range(3)]
    pos = (lambda i: torch.tensor([i])) if tensor_pos else (lambda i: i)
    return [(caches, *tok, pos(i)) for i in range(steps)], lambda: [t.zero_() for c in caches for t in c]


def adamw_int(params, grads, ms, vs, step):
    b1, b2, lr, wd = 0.9, 0.999, 1e-3, 1e-2
    bc1, bc2 = 1 - b1**step, 1 - b2**step
    for p, g, m, v in zip(params, grads, ms, vs):
        p.mul_(1 - lr * wd)
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        p.addcdiv_(m, (v / bc2).sqrt_().add_(1e-8), value=-lr / bc1)


def _adam_calls(steps: int) -> tuple[list[tuple[Any, ...]], Callable[[], Any]]:
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(4096, generator=g) for _ in range(20)]
    grads = [torch.randn(4096, generator=g) for _ in range(20)]
    ms, vs = [torch.zeros(4096) for _ in params], [torch.zeros(4096) for _ in params]
    return [(params, grads, ms, vs, s) for s in range(1, steps + 1)], lambda: None


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)
        self.out = torch.nn.Linear(64, 64)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        x = x + self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x.relu_()


def _seq_calls(steps: int) -> tuple[list[tuple[Any, ...]], Callable[[], Any]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, n, 64, generator=g),) for n in range(1, 65)], lambda: None


WORKLOADS = {
    "decode_int": (lambda: decode_int, lambda n: _decode_calls(n, False)),
    "decode_index": (lambda: decode_index, lambda n: _decode_calls(n, False)),
    "decode_tensor": (lambda: decode_tensor, lambda n: _decode_calls(n, True)),
    "adamw_int": (lambda: adamw_int, lambda n: _adam_calls(n // 2)),
    "seq_len": (lambda: Block().eval(), _seq_calls),
}


def _pass(fn: Callable[..., Any], calls: list[tuple[Any, ...]], reset: Callable[[], Any]) -> float:
    """Seconds for one pass over `calls`."""
    reset()
    start = time.perf_counter()
    with torch.no_grad():
        for args in calls:
            fn(*args)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-inductor", action="store_true")
    a = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(
        "| workload | eager µs/step | dynamo alone: ratio | dealias: compiles, first pass s, ratio "
        "| dealias fused: compiles, first pass s, ratio | inductor: compiles, first pass s, ratio |"
    )
    print("|---|---|---|---|---|---|")
    for name, (make_fn, make_calls) in WORKLOADS.items():
        fn = make_fn()
        calls, reset = make_calls(a.steps)
        makers = {
            "alone": lambda fn=fn: torch.compile(fn, backend=lambda gm, example_inputs: gm.forward),
            "dealias": lambda fn=fn: dealias.jit(fn),
        }
        if not a.no_inductor:
            makers["fused"] = lambda fn=fn: dealias.jit(fn, executor="inductor")
            makers["inductor"] = lambda fn=fn: torch.compile(fn)
        cells, eager_best = {}, float("inf")
        for key, make in makers.items():
            # Each front end from a fresh dynamo (its automatic-dynamic state is per code object, so a variant
            # compiled earlier would make the next one start dynamic), timed interleaved with eager.
            torch._dynamo.reset()
            graphs = torch._dynamo.utils.counters["stats"]
            before = graphs["unique_graphs"]
            compiled = make()
            first = _pass(compiled, calls, reset)
            count = graphs["unique_graphs"] - before
            _pass(compiled, calls, reset)
            best, eager = float("inf"), float("inf")
            for _ in range(a.rounds):
                eager = min(eager, _pass(fn, calls, reset))
                best = min(best, _pass(compiled, calls, reset))
            eager_best = min(eager_best, eager)
            if key in ("dealias", "fused"):
                count = dealias.cache_info(compiled).misses
            cells[key] = f"{count}, {first:.1f}, {best / eager:.2f}" if key != "alone" else f"{best / eager:.2f}"
        row = f"| {name} | {eager_best / len(calls) * 1e6:.0f} | " + " | ".join(cells.values()) + " |"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
