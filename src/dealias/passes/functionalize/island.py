"""Where a write refused as order-dependent (writecheck's OverlapError) can run as an eager island
(ir/island.py: eager's own kernel on a copy of the base laid out as the caller's memory), and its lowering.

Exact only where eager's kernel, run on that copy, computes what it computed on the caller's memory: the same
op and arguments, the same dtype, the same layout of every argument relative to the base (its sizes, strides and
offset from the base's first element, all static), and a run eager itself repeats bit for bit: one thread. A
TensorIterator kernel runs one thread under ATen's grain size (writecheck.SINGLE_THREAD_ELEMENTS); other kernels
split their work between threads far below it (`index_put_`'s cpu_index_kernel from 3000 elements, softmax's rows
at any size), and with two threads their result is a race eager wins its own way (`x[:, 1:].index_put_((i,),
x[:, :-1])` of 8000 elements: the island differed from eager in 19 calls of 20), so such an op is an island only
when eager runs one intra-op thread. Anything else keeps the OverlapError: the graph runs eagerly with an
OverlapFallbackWarning.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

from ...errors import user_location
from ...ir.checks import NoProbe, probe
from ...ir.island import WARN_AT, island
from ...ir.opfacts import OpKind, bind_args
from ...ir.plan import StorageKind
from ...ir.sharing import has_symbols
from ...ir.viewops import extent, internal_overlap, strided_positions
from ..alias import Value
from ..writecheck import _single_threaded
from .timeline import write

if TYPE_CHECKING:
    from .walk import Functionalizer

aten = torch.ops.aten


def lower_island(
    w: Functionalizer, node: fx.Node, f: Any, bound: dict[str, Any], targets: list[Value], counted: list[bool]
) -> bool:
    """Record `node` (an in-place or out= op writing one tensor, refused as order-dependent) as an island writing
    its target's storage. False, with nothing emitted, where that would not be exact."""
    if why_not(w, node, f, bound, targets) is not None:
        return False
    target = targets[0]
    s = target.storage
    root = s.root_meta
    base = w.timeline.base[s]
    views: list[tuple[int | str, list[int], list[int], int, int]] = []
    same: dict[int, int] = {}  # (id of the analysis's Value: an in-place op's result is its self's)
    args = list(node.args)
    kwargs = dict(node.kwargs)
    for key, a in [*enumerate(node.args), *node.kwargs.items()]:
        v = w.info.values.get(a) if isinstance(a, fx.Node) else None
        if isinstance(v, Value) and v.storage is s:
            m = v.meta
            # (and which of the call's tensors: one given twice is one tensor object in eager, two tensors of one
            # layout, `x.index_copy_(1, i, x.detach())`, are two: eager's overlap check raises for the first alone)
            tensor = same.setdefault(id(v), len(same))
            views.append((key, list(m.shape), list(m.stride()), m.storage_offset() - root.storage_offset(), tensor))
            if isinstance(key, int):
                args[key] = None
            else:
                kwargs[key] = None
        elif isinstance(key, int):
            args[key] = w.read(a)
        else:
            kwargs[key] = w.read(a)
    where = _expanded_write_location(node, views)
    if where is not None:
        kwargs[WARN_AT] = where
    new = w.emit.call(island, node.target, base, list(root.shape), list(root.stride()), views, *args, **kwargs)
    # The whole base written: a write with no chain, counted on the tensor eager wrote through.
    write(w, replace(target, chain=(), meta=root), new, node, counted[0])
    return True


def _expanded_write_location(node: fx.Node, views: list[Any]) -> list[Any] | None:
    """The user's ["file", line] of an island writing a tensor that repeats its memory (a stride 0 of a dimension
    above 1, `x.expand(..).index_put_(..)`), where eager's kernel may warn (a deprecation); None for the others,
    which run the op as they did (its Python binding and the warnings caught cost a few microseconds)."""
    if not any(st == 0 and n > 1 for _, size, stride, _, _ in views for n, st in zip(size, stride)):
        return None
    location = user_location(node.meta.get("stack_trace"))
    if location is None:
        return None
    path, _, rest = location.partition("  ")[0].rpartition(":")
    return [path, int(rest)] if rest.isdigit() else None


def why_not(w: Functionalizer, node: fx.Node, f: Any, bound: dict[str, Any], targets: list[Value]) -> str | None:
    """Why `node` cannot run as an island, or None."""
    if f.kind not in (OpKind.INPLACE, OpKind.OUT) or len(targets) != 1:
        return "not an in-place or out= op writing one tensor"
    s = targets[0].storage
    root = s.root_meta
    base = w.timeline.base.get(s)
    if base is None or root is None or has_symbols(root) or internal_overlap(root) != "no":
        return "the written memory's base is symbolic, or its elements may share memory"
    if tuple(base.meta["val"].shape) != tuple(root.shape) or base.meta["val"].dtype != root.dtype:
        return "the base's value is not in its traced layout"
    if s.kind is StorageKind.CONSTANT:
        return "a constant of the graph"
    for a in [*node.args, *node.kwargs.values()]:
        if isinstance(a, (list, tuple)) and any(_of(w, x, s) for x in a):
            return "an argument list holds a tensor of the written memory"
        if not isinstance(a, fx.Node):
            continue
        read = w.read(a)
        if w.autograd.requires_grad(a) or (isinstance(read, fx.Node) and read.meta.get("rg")):
            return "autograd records it"
        v = w.info.values.get(a)
        if isinstance(v, Value) and v.storage is s and (v.meta.dtype != root.dtype or has_symbols(v.meta)):
            return "an argument views the memory in another dtype, or symbolically"
    if base.meta.get("rg"):
        return "autograd records it"
    if not _inside_base(w, node, s, root):
        return "an argument reaches memory between the base's elements"
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or tuple(val.shape) != tuple(targets[0].meta.shape):
        return "the op resizes its out= tensor"
    if not _single_threaded(node):
        return "more elements than one thread runs: eager's own result varies"
    if torch.get_num_threads() > 1 and not _one_thread_kernel(node):
        return "eager's kernel may split the elements between threads: its result is a race"
    try:
        if probe(node) is not None:  # (eager raises on this layout: its fallback raises it too)
            return "eager's kernel raises on this layout"
    except NoProbe:
        return "eager's kernel cannot be asked"
    return None


# Kernels that run one thread under ATen's grain size whatever the thread count, beside pointwise ops (TensorIterator
# loops with the default grain): no schema or tag tells a kernel's grain size. TensorIterator loops (`index_fill_`,
# `masked_fill_`, `copy_`, `where`'s out=), reductions with out= (`parallel_reduce`: its grain size), serial kernels
# (`masked_scatter_`, `uniform_`, `normal_`) and `bernoulli_` (its chunks' draws skip ahead to their place: the same
# numbers in every split; its copy into a non-contiguous tensor a TensorIterator loop).
_DEFAULT_GRAIN = {
    aten.index_fill_,
    aten.masked_fill_,
    aten.copy_,
    aten.fill_,
    aten.where,
    aten.sum,
    aten.prod,
    aten.mean,
    aten.amax,
    aten.amin,
    aten.masked_scatter_,
    aten.uniform_,
    aten.normal_,
    aten.bernoulli_,
}
# cpu_index_kernel (`index_put_` without accumulate, `index`'s out=) splits its elements between threads from 3000.
_INDEX_KERNELS = {aten.index_put_, aten._index_put_impl_, aten.index}
INDEX_GRAIN_ELEMENTS = 3000


def _one_thread_kernel(node: fx.Node) -> bool:
    """Whether eager's CPU kernel of `node`'s op runs one thread whatever the thread count (its tensors are under
    ATen's grain size)."""
    op = node.target
    if not isinstance(op, torch._ops.OpOverload):
        return False
    if torch.Tag.pointwise in op.tags or op.overloadpacket in _DEFAULT_GRAIN:
        return True
    if op.overloadpacket in _INDEX_KERNELS:
        # Its elements: the indices' broadcast shape by self's sizes on the dims not indexed.
        bound = bind_args(op._schema, node.args, node.kwargs)
        vals = [t.meta.get("val") if isinstance(t, fx.Node) else t for t in [bound.get("self"), *bound["indices"]]]
        self_val, indices = vals[0], vals[1:]
        given = [self_val, *(t for t in indices if t is not None)]
        if not all(isinstance(t, torch.Tensor) and not has_symbols(t) for t in given):
            return False
        if any(t is not None and (t.dtype in (torch.bool, torch.uint8) or t.dim() != 1) for t in indices):
            return False  # (masks, and indices of several dims: not counted here)
        elements = math.prod(len(t) for t in indices if t is not None)
        elements *= math.prod(n for d, n in enumerate(self_val.shape) if d >= len(indices) or indices[d] is None)
        return elements < INDEX_GRAIN_ELEMENTS
    return False


def _inside_base(w: Functionalizer, node: fx.Node, s: Any, root: torch.Tensor) -> bool:
    """Every element of the memory's arguments is an element of its base: the buffer holds the base's elements only
    (an `as_strided` view of a caller's tensor may reach past it, into memory the caller's storage holds; in a
    base with gaps, `x[:, :5]` of rows of 6, into the gaps)."""
    lo, hi = extent(root)
    dense = is_non_overlapping_and_dense(root)
    elements = None if dense else strided_positions(list(root.shape), list(root.stride()), 0)
    for a in [*node.args, *node.kwargs.values()]:
        v = w.info.values.get(a) if isinstance(a, fx.Node) else None
        if not (isinstance(v, Value) and v.storage is s) or v.meta.numel() == 0:
            continue
        first, last = extent(v.meta)
        if first < lo or last > hi:
            return False
        if elements is not None:
            m = v.meta
            at = strided_positions(list(m.shape), list(m.stride()), first - lo)
            if not bool(torch.isin(at, elements).all()):
                return False
    return True


def _of(w: Functionalizer, a: Any, s: Any) -> bool:
    v = w.info.values.get(a) if isinstance(a, fx.Node) else None
    return isinstance(v, Value) and v.storage is s
