"""An index the fused graph computes, checked by its range: the least and the greatest value its ops can give,
computed in Python from the one-element inputs it reads, and the graph left to compute the index itself.

HF's static cache computes each layer's write position as `torch.arange(n) + self.cumulative_length`: the prologue
computed it with aten calls from Python and handed it to the graph (an `arange` and four `add`s, ~65 us of a Llama
decode step between its kernels, where torch.compile's kernels compute it). Its range is `c .. c + n - 1` for
`c = cumulative_length.item()`: a read and two comparisons. Where the range is not inside the bounds (an index out of
range, or a range wider than the values), the index is computed with torch's ops from the call's inputs and checked
entry by entry (`bounds_check`: eager's error, naming the first entry out of range, or no error).

The range is exact arithmetic over Python ints; the graph's is an integer dtype's, which wraps. Every node of the
index's computation has the index's dtype (int32 or int64: no promotion, no conversion), and its ops are ring
operations (add, sub, mul, neg) or views taking some of their input's elements: each entry is then congruent,
modulo 2**bits, to the exact value the range bounds. A range inside the bounds (at most 2**31 for int32) lies
inside the dtype, where congruent values are equal: no entry wrapped to a value out of range. A remainder by a
positive int `c` (a ring buffer's write position, `(ptr + torch.arange(n)) % capacity`) is in 0 .. c - 1 whatever its
dividend: its range is that, its dividend not followed, and the ops above it are followed from there as from an input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from ..ir.viewops import symbolic_layout

aten, prims = torch.ops.aten, torch.ops.prims

# Views whose elements, in row-major order, are their input's in row-major order (prologue.py checks such a view of
# an input as the input itself).
RESHAPES = frozenset(
    (
        aten.view.default,
        aten._unsafe_view.default,
        aten.reshape.default,
        aten.unsqueeze.default,
        aten.squeeze.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.flatten.using_ints,
        aten.unflatten.int,
        aten.alias.default,
    )
)
# Views whose entries are some of their input's (a reshape, a broadcast, a slice...): the input's range bounds them.
# (Not a dtype view, which reinterprets bits, nor `as_strided`, which may reach memory its input does not cover.)
_SUBSET_VIEWS = RESHAPES | {
    aten.expand.default,
    aten.permute.default,
    aten.transpose.int,
    aten.t.default,
    aten.slice.Tensor,
    aten.select.int,
    aten.clone.default,
}
_ARANGES = (aten.arange.default, aten.arange.start, aten.arange.start_step)
_LIMITS = {torch.int32: 1 << 31, torch.int64: 1 << 63}


@dataclass
class Ranged:
    """An index the graph computes, checked by its range: `lines` (Python source reading `args`) set `lo` and `hi`
    (names or int literals); `compute(*args)` computes the index itself (the check's slow path). `lo`, `hi` are
    literals where the index reads nothing of the call's (`constant`)."""

    index: fx.Node
    lines: list[str]
    lo: str
    hi: str
    limit: int  # the dtype's: a range inside the bounds must also be inside (-limit, limit)
    compute: Any = None

    @property
    def constant(self) -> bool:
        return not self.lines


class _No(Exception):
    """The computation has an op the range does not follow."""


def index_range(index: fx.Node, placeholders: list[fx.Node]) -> Ranged | None:
    """The range of `index` (computed by the graph) as Python source over the call's inputs, or None where an op of
    its computation is not followed (module doc)."""
    val = index.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype not in _LIMITS:
        return None
    lines: list[str] = []
    env: dict[fx.Node, tuple[Any, Any]] = {}  # node -> (lo, hi): ints, or names of the source's variables
    read: set[int] = set()

    def operand(a: Any) -> tuple[Any, Any]:
        if isinstance(a, fx.Node):
            return value(a)
        if type(a) is int:
            return a, a
        raise _No

    def named(n: fx.Node, lo: str, hi: str) -> tuple[str, str]:
        lines.append(f"l_{n.name} = {lo}; h_{n.name} = {hi}")
        return f"l_{n.name}", f"h_{n.name}"

    def value(n: fx.Node) -> tuple[Any, Any]:
        if n not in env:
            env[n] = _value(n)
        return env[n]

    def _value(n: fx.Node) -> tuple[Any, Any]:
        v = n.meta.get("val")
        if n.op == "placeholder":
            i = placeholders.index(n)
            if isinstance(v, torch.SymInt):  # an int input: its value
                expr = f"args[{i}]"
            elif isinstance(v, torch.Tensor) and v.dtype == val.dtype and not symbolic_layout(v) and v.numel() == 1:
                expr = f"args[{i}].item()"
            else:
                raise _No
            if i not in read:
                read.add(i)
                lines.append(f"v{i} = {expr}")
            return f"v{i}", f"v{i}"
        if n.op != "call_function" or not isinstance(v, torch.Tensor) or v.dtype != val.dtype:
            raise _No
        op, args, kwargs = n.target, n.args, n.kwargs
        if op in _SUBSET_VIEWS:
            return value(args[0])
        if op in _ARANGES or op is prims.iota.default:
            if symbolic_layout(v) or v.numel() == 0:
                raise _No
            if op is prims.iota.default:
                start, step = kwargs.get("start", 0), kwargs.get("step", 1)
            else:
                start = args[0] if op is not aten.arange.default else 0
                step = args[2] if op is aten.arange.start_step else 1
            if type(start) is not int or type(step) is not int:
                raise _No
            first, last = start, start + (v.numel() - 1) * step
            return min(first, last), max(first, last)
        if op in (aten.add.Tensor, aten.sub.Tensor, aten.add.Scalar, aten.sub.Scalar):
            alpha = kwargs.get("alpha", 1)
            if type(alpha) is not int or len(args) != 2:
                raise _No
            a, b = (
                operand(args[0]),
                _scaled(operand(args[1]), alpha if op in (aten.add.Tensor, aten.add.Scalar) else -alpha),
            )
            return _fold(n, named, _add, a, b)
        if op in (aten.mul.Tensor, aten.mul.Scalar):
            return _fold(n, named, _mul, operand(args[0]), operand(args[1]))
        if op is aten.remainder.Scalar and type(args[1]) is int and args[1] > 0:
            # (a ring buffer's position, `(ptr + torch.arange(n)) % capacity`: whatever the dividend, wrapped or
            # not, each entry of the result is in 0 .. c - 1, the divisor's sign: no need to follow the dividend)
            return 0, args[1] - 1
        if op is aten.neg.default:
            lo, hi = value(args[0])
            return _fold(n, named, lambda x, _: (f"-({x[1]})", f"-({x[0]})"), (lo, hi), (0, 0))
        raise _No

    try:
        lo, hi = value(index)
    except _No:
        return None
    return Ranged(index, lines, str(lo), str(hi), _LIMITS[val.dtype])


def _scaled(x: tuple[Any, Any], k: int) -> tuple[Any, Any]:
    if k == 1:
        return x
    if isinstance(x[0], int):
        return (x[0] * k, x[1] * k) if k >= 0 else (x[1] * k, x[0] * k)
    return (f"{x[0]} * {k}", f"{x[1]} * {k}") if k >= 0 else (f"{x[1]} * {k}", f"{x[0]} * {k}")


def _add(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[str, str]:
    if a == (0, 0) or b == (0, 0):  # (`arange(1) + c`: c's own range)
        return str(b[0] if a == (0, 0) else a[0]), str(b[1] if a == (0, 0) else a[1])
    return f"{a[0]} + {b[0]}", f"{a[1]} + {b[1]}"


def _mul(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[str, str]:
    if isinstance(b[0], int) and b[0] == b[1]:
        return tuple(map(str, _scaled(a, b[0])))  # type: ignore[return-value]
    if isinstance(a[0], int) and a[0] == a[1]:
        return tuple(map(str, _scaled(b, a[0])))  # type: ignore[return-value]
    products = f"({a[0]} * {b[0]}, {a[0]} * {b[1]}, {a[1]} * {b[0]}, {a[1]} * {b[1]})"
    return f"min({products})", f"max({products})"


def _fold(n: fx.Node, named: Any, op: Any, a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
    """`op`'s range of `a` and `b`: ints where both are (computed now), else names the source sets."""
    lo, hi = op(a, b)
    if all(isinstance(x, int) for x in (*a, *b)):
        return eval(lo), eval(hi)  # noqa: S307 - an expression of int literals made above
    return named(n, lo, hi)
