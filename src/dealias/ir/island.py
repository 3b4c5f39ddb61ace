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

import functools
import sys
import types
from typing import Any

import torch

# A reserved keyword of `island` (no aten argument is named so): where eager's kernel warns, the user's line
# ["file", line] its warnings are given at (passes/functionalize/island.py decides, at compile time).
WARN_AT = "_dealias_warn_at"


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
    warn_at = kwargs.pop(WARN_AT, None)
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
    if warn_at is None:
        op(*call_args, **call_kwargs)
    else:
        _warning_as_eager(op, call_args, call_kwargs, warn_at)
    return buf


def _warning_as_eager(op: torch._ops.OpOverload, args: list[Any], kwargs: dict[str, Any], where: list[Any]) -> None:
    """`op` run by its Python binding (`Tensor.index_put_`, `torch.sum(.., out=)`), the one eager's program called:
    an OpOverload's call gives its kernel's C++ warnings to stderr, the binding to Python's warnings, where eager's
    go ("Use of index_put_ on expanded tensors is deprecated"). Called from a frame at the user's line with the
    user's module's globals, as eager's call is: the warning is given at that line, in that module's registry, and
    the warning filters decide as for eager's (the default: once per line). Nothing caught and given again: a
    `catch_warnings` would reset every module's registry on each call."""
    name = op._schema.name.split("::")[-1]
    # (C bindings only: torch's Python wrappers, `torch.norm`, take their arguments in another order)
    binding = getattr(torch.Tensor if name.endswith("_") else torch._C._VariableFunctions, name, None)
    if binding is None:
        op(*args, **kwargs)
        return
    try:
        _caller_at(*where)(binding, args, kwargs)
    except TypeError:  # (the binding's argument parser refused them, before the kernel ran: the op as it is)
        op(*args, **kwargs)


@functools.lru_cache(maxsize=64)
def _caller_at(filename: str, lineno: int) -> Any:
    """A function calling `f(*args, **kwargs)` from line `lineno` of `filename`, in the globals of the module of
    that file (a fresh namespace where none is loaded)."""
    scratch: dict[str, Any] = {}
    source = "\n" * (max(lineno, 1) - 1) + "call = lambda f, args, kwargs: f(*args, **kwargs)\n"
    exec(compile(source, filename, "exec"), scratch)
    module = next((m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == filename), None)
    namespace = module.__dict__ if module is not None else {"__name__": filename.rsplit("/", 1)[-1].removesuffix(".py")}
    return types.FunctionType(scratch["call"].__code__, namespace)


# Never dropped or merged: its kernel may draw random numbers (in program order with the graph's other draws) or
# raise eager's error on the values it gets; the fused executor leaves such a graph to the torch executor.
island._dealias_effect = True  # type: ignore[attr-defined]
island.dealias_island = True  # type: ignore[attr-defined]  # runtime.fused.unfusable
