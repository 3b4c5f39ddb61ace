"""Eager islands: an in-place or out= op whose result is its kernel's visiting order, run by eager's own kernel.

Some writes cannot be functionalized with eager's bits: the op reads memory it writes through another view
(`x[:, 1:].add_(x[:, :-1])`, `v.mul_(v.narrow(0, 1, 1))`), writes a tensor whose elements share memory
(`x.expand(2, n).index_fill_(..)`, `masked_fill_`, `bernoulli_` of an `unfold`), or writes an out= tensor sharing
memory with an input (`torch.sum(v, 0, out=v[16])`). Eager's result there is what its kernel computes visiting
the memory in its order, reading what it already wrote; a functional op computes from copies.

`island(op, base, size, stride, views, *args, **kwargs)` runs that very kernel on memory laid out as the
caller's: a fresh buffer with the base's sizes and strides (so as big as the base, no more) holding the base's
current value, the op's arguments of that memory rebuilt on it by `as_strided` with their traced sizes, strides
and offsets relative to the base's first element (`views`: (argument position or name, size, stride, offset, which
of the call's tensors it is)),
then `op` in place there; the buffer is the base's new value. From outside it is a functional op (a base
value in, a new one out, nothing else touched), so write-back, the other views of the memory and the outputs go
as for any write. Same kernel, dtype, relative layout and thread count: the same visiting order, the same bits.
The functionalizer decides where it is exact (passes/functionalize/island.py).
"""

from __future__ import annotations

from typing import Any

import torch


def island(
    op: torch._ops.OpOverload,
    base: torch.Tensor,
    size: list[int],
    stride: list[int],
    views: list[tuple[int | str, list[int], list[int], int, int]],
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """`op(*args, **kwargs)` with `views`' arguments rebuilt on a copy of `base` laid out by `size`/`stride`;
    returns that copy after the op (the base's new value)."""
    buf = torch.empty_strided(size, stride, dtype=base.dtype, device=base.device)
    buf.copy_(base)
    call_args, call_kwargs = list(args), dict(kwargs)
    made: dict[int, torch.Tensor] = {}
    for key, vsize, vstride, offset, tensor in views:
        # One tensor object per tensor of the call's: an argument given twice (`x.mul_(x)`) is one tensor in eager
        # too, and two of one layout are two (`x.index_copy_(1, i, x.detach())`: eager's overlap check raises for
        # one tensor given twice, not for two).
        view = made.setdefault(tensor, buf.as_strided(vsize, vstride, buf.storage_offset() + offset))
        if isinstance(key, int):
            call_args[key] = view
        else:
            call_kwargs[key] = view
    op(*call_args, **call_kwargs)
    return buf


# Never dropped or merged: its kernel may draw random numbers (in program order with the graph's other draws) or
# raise eager's error on the values it gets; the fused executor leaves such a graph to the torch executor.
island._dealias_effect = True  # type: ignore[attr-defined]
island.dealias_island = True  # type: ignore[attr-defined]  # runtime.fused.unfusable
