"""View steps: replaying a view on a (new) base, and inverting it to write a mutated view back into
its base.

A view chain is a tuple of `ViewStep`s from a storage's base to a value. Multi-output views are
normalized when the chain is built: `split(..)[i]` becomes one `slice` and `unbind(..)[i]` one `select`,
so replaying a single output never replays the whole split (PyTorch's N² regeneration, #194037).

Inverses come in three kinds (see docs/architecture.md):
- pure-view inverses, that rebuild the base by viewing the mutated value back (view/reshape, t, permute,
  squeeze/unsqueeze, dtype and complex views, alias/detach);
- scatter inverses: select, slice, diagonal -> their `*_scatter`;
- a generic `as_strided_scatter` for any other non-overlapping view (as_strided, unfold with gaps, ...)
  whose base is contiguous, computed from the exact sizes/strides/offsets seen at trace time.
Views with internal overlap (expand, overlapping unfold) cannot be written through: eager raises, so do we.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch._ops import OpOverload
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils import _pytree as pytree

from ..errors import UnsupportedError
from .opfacts import bind_args, op_name

aten = torch.ops.aten


@dataclass(frozen=True)
class ViewStep:
    """One view op applied to the previous value of a chain: `op(prev, *args, **kwargs)`."""

    op: OpOverload | Callable[..., Any]  # an aten view op, or as_strided_rel
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()

    def describe(self) -> str:
        args = ", ".join(repr(a) for a in self.args)
        return f"{op_name(self.op)}({args})"


def normalize_multi_output(op: OpOverload, args: tuple[Any, ...], index: int, parent: torch.Tensor) -> ViewStep:
    """`op(parent, *args)[index]` as a single-output view step."""
    name = op._schema.name
    dim = bind_args(op._schema, (parent, *args), {}, defaults=True).get("dim")
    if name == "aten::unbind":
        return ViewStep(aten.select.int, (dim, index))
    if name in ("aten::split", "aten::split_with_sizes", "aten::unsafe_split", "aten::unsafe_split_with_sizes"):
        dim = dim % parent.dim()
        size = parent.shape[dim]
        if name in ("aten::split", "aten::unsafe_split"):
            chunk = args[0]
            sizes = [min(chunk, size - s) for s in range(0, size, chunk)] if chunk > 0 else [size]
        else:
            sizes = list(args[0])
        start = sum(sizes[:index])
        return ViewStep(aten.slice.Tensor, (dim, start, start + sizes[index]))
    raise UnsupportedError(f"multi-output view {op} is not supported")


def as_strided_rel(t: torch.Tensor, size: list[int], stride: list[int], rel: int) -> torch.Tensor:
    """`as_strided` with the offset counted from `t`'s own first element, not from its storage's start.

    Functional values do not keep their traced storage offsets (a scatter result has its own storage, and
    fake tensors do not always agree with eager about its offset), so every as_strided in dealias's graphs
    is relative: correct wherever the value lives."""
    return torch.ops.aten.as_strided.default(t, size, stride, t.storage_offset() + rel)


as_strided_rel.dealias_view = True  # opfacts.is_view_node


def as_strided_scatter_rel(t: torch.Tensor, src: torch.Tensor, size: list[int], stride: list[int], rel: int):
    """`as_strided_scatter` with a relative offset (see `as_strided_rel`). Its result keeps `t`'s layout and
    offset, so the view written is `t.as_strided(size, stride, t.storage_offset() + rel)`."""
    return torch.ops.aten.as_strided_scatter.default(t, src, size, stride, t.storage_offset() + rel)


def strided_positions(size: list[int], stride: list[int], rel: int) -> torch.Tensor:
    """Flat element positions of the view `as_strided(size, stride, rel)` of a contiguous tensor."""
    pos = torch.full((), rel, dtype=torch.long)
    for d, (n, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        pos = pos + (torch.arange(n) * st).view(shape)
    return pos.expand(size).reshape(-1)


def index_scatter_rel(t: torch.Tensor, src: torch.Tensor, size: list[int], stride: list[int], rel: int):
    """`as_strided_scatter_rel` for a contiguous `t`, through `index_put` (whose backward is right). The result
    is a tensor of its own, as a scatter's is (`_unsafe_view`, not an autograd view of the flat one): returned,
    eager's written tensor is no view."""
    flat = t.reshape(-1).index_put((strided_positions(size, stride, rel),), src.reshape(-1))
    return torch.ops.aten._unsafe_view.default(flat, list(t.shape))


def relative_as_strided(args: tuple[Any, ...], kwargs: dict[str, Any], parent: torch.Tensor) -> ViewStep:
    """The step for a traced `parent.as_strided(size, stride, offset)` (absolute offset)."""
    bound = bind_args(aten.as_strided.default._schema, (parent, *args), kwargs)
    size, stride, offset = bound["size"], bound["stride"], bound.get("storage_offset")
    if offset is None:
        offset = parent.storage_offset()
    return ViewStep(as_strided_rel, (list(size), list(stride), offset - parent.storage_offset()))


def chain_args(chain: tuple[ViewStep, ...]) -> list[Any]:
    """Every argument leaf of a view chain's steps (positions, sizes, symbolic values)."""
    return [a for step in chain for a in pytree.tree_leaves((step.args, step.kwargs))]


def map_chain_args(chain: tuple[ViewStep, ...], cls: type | tuple[type, ...], fn: Callable[[Any], Any]):
    """`chain` with `fn` applied to each argument leaf of type `cls` (a symbolic position, a graph result)."""
    return tuple(ViewStep(step.op, *pytree.tree_map_only(cls, fn, (step.args, step.kwargs))) for step in chain)


def replay(step: ViewStep, base: Any, call: Callable[..., Any]) -> Any:
    """Apply `step` to `base` through `call(op, *args, **kwargs)` (a graph builder or plain torch)."""
    return call(step.op, base, *step.args, **dict(step.kwargs))


def replay_chain(chain: tuple[ViewStep, ...], base: Any, call: Callable[..., Any]) -> Any:
    for step in chain:
        base = replay(step, base, call)
    return base


def chain_text(base: str, chain: tuple[ViewStep, ...]) -> str:
    """`x.select(1, 2).t()`: a view chain as Python."""
    for step in chain:
        base = f"{base}.{step.describe()}"
    return base


# Views whose inverse reshapes the mutated value back to the base's shape: they keep the logical
# (row-major) element order and, when they have no internal overlap, cover every element of the base.
_RESHAPE_BACK = {
    "aten::view",
    "aten::_unsafe_view",
    "aten::_reshape_alias",
    "aten::squeeze",
    "aten::unsqueeze",
    "aten::expand",
    "aten::alias",
    "aten::detach",
    "aten::lift_fresh",
}


def inverse(
    step: ViewStep,
    base: torch.Tensor,
    view: torch.Tensor,
    base_node: Any,
    value_node: Any,
    call: Callable[..., Any],
) -> Any:
    """Emit the new base after `value_node` was written into the view `step(base)`.

    `base`/`view` are the fake tensors seen at trace time (their exact sizes, strides and offsets);
    `base_node`/`value_node` are the graph values of the current base and the mutated view's new value.
    """
    name = getattr(step.op, "_schema", None) and step.op._schema.name
    args = step.args
    if name == "aten::view" and step.op is aten.view.dtype:
        return call(aten.view.dtype, value_node, base.dtype)
    if name in _RESHAPE_BACK:
        return call(aten.reshape.default, value_node, list(base.shape))
    if name in ("aten::t", "aten::transpose"):
        return call(step.op, value_node, *args)
    if name == "aten::permute":
        dims = [d % base.dim() for d in args[0]]
        inv = [0] * len(dims)
        for i, d in enumerate(dims):
            inv[d] = i
        return call(aten.permute.default, value_node, inv)
    if name == "aten::view_as_real":
        return call(aten.view_as_complex.default, value_node)
    if name == "aten::view_as_complex":
        return call(aten.view_as_real.default, value_node)
    if name in ("aten::_conj", "aten::_neg_view"):
        return call(step.op, value_node)
    grad = getattr(base_node, "meta", {}).get("rg") or getattr(value_node, "meta", {}).get("rg")
    if name in ("aten::select", "aten::slice") and base.is_complex() and grad:
        # (select_scatter and slice_scatter have no complex derivative: autograd raises where eager's write of a
        # complex slice does not, fuzz seed 2400360; scattered by positions, as a view of any other layout)
        return _as_strided_inverse(step, base, view, base_node, value_node, call)
    if name == "aten::select":
        return call(aten.select_scatter.default, base_node, value_node, *args)
    if name == "aten::slice":
        return call(aten.slice_scatter.default, base_node, value_node, *args)
    if name == "aten::diagonal":
        return call(aten.diagonal_scatter.default, base_node, value_node, *args)
    if name in _LOGICAL and not base.is_contiguous():
        check_inverse(step, base, view)
        return call(index_scatter_rel, base_node, value_node, *_logical_layout(step, base))
    return _as_strided_inverse(step, base, view, base_node, value_node, call)


# Views whose elements are picked by the base's indices, whatever its strides: written through one of a
# non-contiguous base, each element lands at the same index of the base as in a contiguous stand-in of its shape
# (`x[::2].unfold(1, 2, 2)`), where the generic as_strided inverse reads storage positions, right only for a
# contiguous base. (An `expand` reaches functionalization as `as_strided_rel`, which stays refused.)
_LOGICAL = {"aten::unfold"}


def _logical_layout(step: ViewStep, base: torch.Tensor) -> tuple[list[int], list[int], int]:
    """The sizes, strides and offset of `step` (an unfold) taken of a contiguous tensor of `base`'s static sizes."""
    shape = list(base.shape)
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * max(shape[d + 1], 1)
    bound = bind_args(step.op._schema, (base, *step.args), dict(step.kwargs))
    size, at = bound["size"], bound["step"]
    if not shape:
        return [size], [1], 0
    d = bound["dimension"] % len(shape)
    n = (shape[d] - size) // at + 1
    return [*shape[:d], n, *shape[d + 1 :], size], [*strides[:d], strides[d] * at, *strides[d + 1 :], strides[d]], 0


_PURE_INVERSE = {"aten::t", "aten::transpose", "aten::permute", "aten::view_as_real", "aten::view_as_complex"}
_PURE_INVERSE |= {"aten::_conj", "aten::_neg_view", *_RESHAPE_BACK}


def inverse_reads_base(step: ViewStep) -> bool:
    """Whether `inverse` of `step` reads the old base (a scatter), or only the written value (a view of it back:
    the view covers every element of its base)."""
    name = getattr(step.op, "_schema", None) and step.op._schema.name
    return name not in _PURE_INVERSE


_SCATTER_INVERSE = {"aten::select", "aten::slice", "aten::diagonal"}


def check_inverse(step: ViewStep, base: torch.Tensor, view: torch.Tensor) -> None:
    """Raise UnsupportedError if a write through `step(base)` (the fake tensors seen at trace time) cannot be
    pushed back into `base` by `inverse`; functionalization asks before it records the write."""
    name = getattr(step.op, "_schema", None) and step.op._schema.name
    if name in _PURE_INVERSE or name in _SCATTER_INVERSE:
        return
    if name in _LOGICAL and not base.is_contiguous():
        if symbolic_layout(base) or internal_overlap(base) != "no":
            raise UnsupportedError(f"writing through {step.describe()} of a symbolic or self-overlapping tensor")
        return  # (`inverse`: by the base's indices)
    # The generic as_strided inverse. The write is visible through the base only where the view stays inside
    # the base's elements: guaranteed here for a contiguous base. Offsets are relative to the base's first
    # element (see as_strided_rel).
    if not base.is_contiguous():
        raise UnsupportedError(
            f"writing through {step.describe()} of a non-contiguous tensor is not supported; "
            "call .contiguous() first or write through slicing"
        )
    low, high = extent(view)
    first = _fake_value(offset_in_base(step, base, view))
    last = first + (high - low)
    if view.numel() > 0 and (first < 0 or last >= base.numel()):
        raise UnsupportedError(f"writing through {step.describe()} that reaches outside its base is not supported")


def offset_in_base(step: ViewStep, base: torch.Tensor, view: torch.Tensor) -> Any:
    """Where the view `step(base)` starts, in elements from `base`'s first element. An `as_strided_rel` step
    carries it (its `rel`, what runs). The fake values' storage offsets may disagree with it: a region write
    replaced by its decomposition (`regions.decompose`) may have another fake offset than the value its views'
    fakes were computed from (fake `as_strided_scatter` keeps its input's offset on a fake-tensor cache miss, not
    on a hit), and a write into an alias group whose base does not start its storage landed `start` elements
    early (fuzz --dynamic seed 1230072, diagnosed by a helper)."""
    if step.op is as_strided_rel:
        return step.args[2]
    return view.storage_offset() - base.storage_offset()


def _fake_value(x: Any) -> Any:
    """A graph node (a symbolic offset the graph computes) as its fake value; anything else as it is."""
    return x.meta["val"] if isinstance(getattr(x, "meta", None), dict) and "val" in x.meta else x


def _as_strided_inverse(
    step: ViewStep, base: torch.Tensor, view: torch.Tensor, base_node: Any, value_node: Any, call: Callable[..., Any]
) -> Any:
    check_inverse(step, base, view)
    args = (list(view.shape), list(view.stride()), offset_in_base(step, base, view))
    grad = getattr(base_node, "meta", {}).get("rg") or getattr(value_node, "meta", {}).get("rg")
    if grad or internal_overlap(view) != "no":
        # as_strided_scatter's backward returns zero gradients when its source is computed from a view of
        # its input (torch 2.13, reproduced in tests), and it refuses views whose elements share memory
        # (a uniform write through `expand`): scatter by explicit positions instead.
        return call(index_scatter_rel, base_node, value_node, *args)
    return call(as_strided_scatter_rel, base_node, value_node, *args)


def surely(cond: Any) -> bool:
    """True only if `cond` holds for every value of its symbols (no guard is added); plain bools as they are."""
    return statically_known_true(cond) if isinstance(cond, torch.SymBool) else bool(cond)


def symbolic_layout(t: torch.Tensor) -> bool:
    """Whether any of `t`'s sizes, strides or its storage offset is a symbol."""
    return any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride(), t.storage_offset()))


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors have the same sizes, strides and storage offset, for every value of their symbols."""
    la, lb = (*a.shape, *a.stride(), a.storage_offset()), (*b.shape, *b.stride(), b.storage_offset())
    return a.dim() == b.dim() and all(surely(x == y) for x, y in zip(la, lb))


def extent(t: torch.Tensor) -> tuple[Any, Any]:
    """The storage positions, in elements of `t`'s dtype, of the first and the last element of memory `t` covers
    (symbolic where its sizes are; strides are never negative). Only meaningful for a non-empty `t`: its dims of
    size 0 are skipped. Byte ranges are these times `t.element_size()`, the last one's end included."""
    first = t.storage_offset()
    return first, first + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)


def contiguous_strides(shape: Any) -> tuple[Any, ...]:
    """The strides of a contiguous tensor of `shape` (a dim of size 0 steps as one of size 1, as torch's)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def repeated_dims(t: torch.Tensor) -> list[int]:
    """Dimensions along which `t` repeats the same memory (stride 0, size > 1: an expanded tensor)."""
    return [d for d, (n, st) in enumerate(zip(t.shape, t.stride())) if st == 0 and n > 1]


def internal_overlap(t: torch.Tensor) -> str:
    """How eager sees a write into `t`: "no" overlap; "yes" (a stride-0 dim of size > 1, e.g. expand:
    eager raises, so must we); or "maybe" (eager writes element by element in an order we do not model:
    overlapping unfold/as_strided; dealias refuses those rather than guess).

    Not `torch._debug_has_internal_overlap`: it agrees on "yes" and on dense layouts, but answers "maybe" for
    every non-dense one (`x[:, ::2]`, `x[1:, 1:]`, symbolic sizes included), where writes are exact and common.
    Checked on 3,000 random layouts (0-size dims, size-1 dims with odd strides, fakes, dynamic shapes): it never
    says "yes" or "no" where this says otherwise; only "maybe" where this says "no"."""
    if t.numel() <= 1:
        return "no"
    dims = sorted((st, s) for s, st in zip(t.shape, t.stride()) if s > 1)
    if any(st == 0 for st, _ in dims):
        return "yes"
    # Sufficient test for non-overlap: with strides sorted, each stride exceeds the span of the dims
    # inside it. The rare non-overlapping layouts failing it are reported as "maybe".
    span = 0
    for st, s in dims:
        if st <= span:
            return "maybe"
        span += st * (s - 1)
    return "no"
