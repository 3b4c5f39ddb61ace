"""Region writes: the functional form of every write through a view, kept as one node until execution.

Functionalization turns `cache[:, pos] = k` (a write into the view `cache.select(1, pos)`) into

    cache2 = region_write(cache, region, k)      # region = cache.select(1, pos), a node of the graph

"`cache` with the elements of its view `region` replaced by `k`": a new tensor with `cache`'s layout. The
view chain from the base to the region is the graph's own chain of view nodes, so no pass has to guess which
region a write wrote. Write-back lowering reads these nodes to run a write in place (`region.copy_(k)` into the
caller's memory, only the written bytes), and `decompose` turns the ones left into the view inverses of
viewops.py (`select_scatter`, `slice_scatter`, a reshape back, ...) for the executors and for autograd, just
before execution: the graph an executor runs has no region_write.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch._prims_common import is_contiguous_or_false
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

from ..errors import UnsupportedError
from .emitter import Emitter
from .opfacts import is_view_node
from .viewops import ViewStep, inverse, inverse_reads_base

aten = torch.ops.aten


def region_write(base: torch.Tensor, region: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`base` with the elements of `region`, a view of `base`'s memory, replaced by `value` (of region's shape
    and dtype): a new tensor with `base`'s layout.

    Executors never run this (`decompose` replaces it by the view inverses); it is the node's meaning, and
    running a functional graph as it is (for inspection) runs it. `region` is located by its place in `base`'s
    memory: at run time it is a real view of `base`."""
    out = torch.empty_strided(base.shape, base.stride(), dtype=base.dtype, device=base.device)
    out.copy_(base)
    target = out
    if region.dtype != base.dtype:  # a dtype view (`x.view(torch.int32)`, `view_as_real`)
        target = torch.view_as_real(out) if base.is_complex() and not region.is_complex() else out
        target = target.view(region.dtype) if target.dtype != region.dtype else target
    byte_offset = region.storage_offset() * region.element_size() - base.storage_offset() * base.element_size()
    target = target.as_strided(region.shape, region.stride(), byte_offset // region.element_size())
    if region.is_conj():
        target = target.conj()
    if region.is_neg():
        target = torch._neg_view(target)
    # A region whose elements repeat (a uniform write through `expand`) is written once per element.
    for d, (n, st) in enumerate(zip(region.shape, region.stride())):
        if st == 0 and n > 1:
            target, value = target.narrow(d, 0, 1), value.expand(region.shape).narrow(d, 0, 1)
    target.copy_(value)
    return out


def _region_write_meta(base: torch.Tensor, region: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    # The node's fake value: only the layout of the result matters (no op on the fake region, which could add
    # guards on symbolic sizes).
    return torch.empty_strided(base.shape, base.stride(), dtype=base.dtype, device=base.device)


region_write.dealias_meta = _region_write_meta  # type: ignore[attr-defined]  # emitter.Emitter.call


def is_region_write(node: Any) -> bool:
    return getattr(node, "op", None) == "call_function" and node.target is region_write


def step_of(view: fx.Node) -> ViewStep:
    """The view step a view node applies to its first argument."""
    return ViewStep(view.target, tuple(view.args[1:]), tuple(sorted(view.kwargs.items())))


def region_views(node: fx.Node) -> list[fx.Node]:
    """The view nodes from a region write's base to its region, outermost first."""
    base, region, _ = node.args
    views = []
    while region is not base:
        if not is_view_node(region) or not isinstance(region.args[0], fx.Node):
            raise AssertionError(f"{node.name}: its region {region.name} is not a view of its base {base.name}")
        views.append(region)
        region = region.args[0]
    views.reverse()
    return views


def region_chain(node: fx.Node) -> tuple[ViewStep, ...]:
    """A region write's view chain, from its base to its region."""
    return tuple(step_of(v) for v in region_views(node))


def emit_region_write(emit: Emitter, base: fx.Node, views: list[fx.Node], value: fx.Node) -> fx.Node:
    """The node writing `value` into the last of `views` (a chain of views from `base`). It requires grad as its
    decomposition will: with grad on, when the value does, or the base does and some inverse reads it (a
    pure-view inverse, as for a write through `detach()` or `t()`, reads only the value)."""
    node = emit.call(region_write, base, views[-1], value)
    reads_base = any(inverse_reads_base(step_of(v)) for v in views)
    node.meta["rg"] = bool(node.meta["rg"] and (value.meta.get("rg") or (reads_base and base.meta.get("rg"))))
    return node


def restride(emit: Emitter, new: fx.Node, like: torch.Tensor) -> fx.Node:
    """`new` in `like`'s layout (a base keeps its traced layout, so views replayed from it get exactly eager's
    strides)."""
    val = new.meta["val"]
    if all(st == st0 for sz, st, st0 in zip(val.shape, val.stride(), like.stride()) if sz > 1):
        return new
    if new.meta.get("rg"):
        # `copy` has no derivative; a dense layout is a permutation of a contiguous one, reached by
        # permute -> contiguous copy -> permute back, all differentiable.
        if not is_non_overlapping_and_dense(like):
            raise UnsupportedError("a write that autograd must see into a tensor with a gapped layout")
        perm = sorted(range(like.dim()), key=lambda d: (-like.stride()[d], -like.shape[d]))
        inv = [perm.index(d) for d in range(like.dim())]
        permuted = emit.call(aten.permute.default, new, perm)
        dense = emit.call(aten.clone.default, permuted, memory_format=torch.contiguous_format)
        return emit.call(aten.permute.default, dense, inv)
    empty = emit.call(
        aten.empty_strided.default, list(like.shape), list(like.stride()), dtype=like.dtype, device=like.device
    )
    return emit.call(aten.copy.default, empty, new)


def decompose(gm: fx.GraphModule) -> None:
    """Replace every region write by the view inverses that compute it, in place (executors and autograd run
    those). A returned region write whose inverses are pure views (a write through `unsqueeze`) returns a tensor
    of its own, as eager's base is: `_unsafe_view` of the result (the same memory, not an autograd view), so
    views of it made later are views of it, not of the value it was computed from."""
    graph = gm.graph
    for node in list(graph.nodes):
        if not is_region_write(node):
            continue
        base, _, value = node.args
        views = region_views(node)
        emit = Emitter(graph, node.meta["val"].fake_mode)
        emit.stack_trace, emit.grad = node.meta.get("stack_trace"), node.meta.get("grad")
        emit.extra_meta = {"decomposes": node.name}  # (the invariant checks count these as the region write)
        bases = [base, *views]
        with graph.inserting_before(node):
            new = value
            for i in range(len(views) - 1, -1, -1):
                new = inverse(step_of(views[i]), bases[i].meta["val"], views[i].meta["val"], bases[i], new, emit.call)
            new = restride(emit, new, node.meta["val"])
            owning = owning_node(emit, new) if any(u.op == "output" for u in node.users) else new
        node.replace_all_uses_with(new)
        for user in list(new.users):
            if user.op == "output" and owning is not new:
                user.replace_input_with(new, owning)
        graph.erase_node(node)
        for view in reversed(views):  # (a scatter inverse reads the base, not the region)
            if not view.users:
                graph.erase_node(view)
    graph.lint()
    gm.recompile()


def owning_node(emit: Emitter, node: fx.Node) -> fx.Node:
    """`node`, a returned decomposition, as a tensor of its own: `_unsafe_view` of a contiguous view (the same
    memory, no copy); a copy in the same layout of a non-contiguous one (`v.t()[0].add_(1)` on a transposed `v`
    ends in `t()`, and no aten op makes a non-view alias with such strides)."""
    t = node.meta.get("val")
    if not is_view_node(node) or not isinstance(t, torch.Tensor):
        return node
    # Both layout questions are False where a data-dependent size leaves them open, and decided under a guard
    # for other symbols; symbolic sizes of the `_unsafe_view` become graph values (Emitter.symbolic).
    if is_contiguous_or_false(t):
        return emit.call(aten._unsafe_view.default, node, list(t.shape))
    if is_non_overlapping_and_dense(t):
        return emit.call(aten.clone.default, node, memory_format=torch.preserve_format)
    if any(isinstance(n, torch.SymInt) for n in (*t.shape, *t.stride())):
        # Returned as it is, it would be a view where eager's tensor is not one (fuzz --dynamic seed 1100051).
        raise UnsupportedError("a returned tensor written through a view, in a layout its symbolic sizes leave open")
    return node


def covers_without_reading(new: fx.Node, base: fx.Node) -> bool:
    """Whether `new` is a write into `base` through views whose inverses do not read it (they cover all of it:
    `view`, `unsqueeze`, `t()`) of a value the write's op did not compute from the region (`copy_`: the value is its
    source, whatever that was computed from): eager's CopySlices then gives the history of `base` a zero gradient of
    its own (the op's gradient for its `self`), which the functional value, the source reshaped back, has no edge for
    (gradops.rewritten, emitted by autograd_facts.with_history). An op computing from the region (`mul_`) passes its
    gradient for `self` along that edge in eager as here: no second edge (its -0.0 would become 0.0)."""
    if not is_region_write(new) or new.args[0] is not base:
        return False
    if any(inverse_reads_base(step_of(v)) for v in region_views(new)):
        return False  # (a scatter inverse reads the base: its history gets the rest of the gradient)
    value = new.args[2]
    return isinstance(value, fx.Node) and not any(_view_of(x, base) for x in (value, *value.all_input_nodes))


def _view_of(x: Any, base: fx.Node) -> bool:
    """Whether node `x` is `base` or a view of it (a chain of view nodes): the region, or another view of it."""
    while isinstance(x, fx.Node):
        if x is base:
            return True
        if not is_view_node(x):
            return False
        x = x.args[0]
    return False
