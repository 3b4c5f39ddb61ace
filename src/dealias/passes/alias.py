"""Alias analysis of a captured graph: the storage and view chain of every tensor value.

Vocabulary: a *storage* is one block of memory; its *base* is the value that owns it (an input, a tensor
constant, or the result of a non-view op). Every other value of the storage is a *view*, reached from
the base by its *view chain*. A tensor *object* keeps its identity across in-place ops (`x.add_(1)` returns
`x`) and metadata mutations (`x.t_()` changes x's chain, not x).

The facts come from op schemas (`opfacts`); they are cross-checked against the fake tensors' own storages,
so an aliasing op the schemas do not describe raises InternalError instead of producing a wrong program.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from ..errors import InternalError, UnsupportedError, located, node_location, with_location
from ..ir.opfacts import OWN_COUNTER_KEY, OpKind, bind_args, facts, is_view_target, returned_args
from ..ir.plan import Ref, RefKind, StorageKind
from ..ir.sharing import AliasGroup
from ..ir.viewops import (
    ViewStep,
    as_strided_rel,
    contiguous_strides,
    extent,
    normalize_multi_output,
    relative_as_strided,
)

aten = torch.ops.aten


@dataclass(eq=False)
class Storage:
    id: int
    kind: StorageKind
    index: int | None = None  # input position (INPUT) or alias group number (GROUP)
    constant: str | None = None  # attribute name of the tensor constant (CONSTANT)
    root_meta: torch.Tensor | None = None  # fake tensor of the base as traced
    root_obj: int = -1  # the tensor object that is the base

    def ref(self) -> Ref:
        """How the plan names a caller's storage."""
        if self.kind is StorageKind.CONSTANT:
            return Ref(RefKind.CONSTANT, self.constant)
        return Ref(RefKind(self.kind.value), self.index)


@dataclass(eq=False)
class Value:
    """One tensor as the program sees it at one point: which storage, which chain, which object."""

    storage: Storage
    chain: tuple[ViewStep, ...]
    obj: int  # identity of the Python tensor object
    meta: torch.Tensor  # fake tensor: exact sizes, strides and offset
    node: fx.Node  # the captured node that produced this value
    # Of a caller's memory: the caller's tensor (its object; in an alias group, the member) whose version counter
    # this tensor shares; None for a tensor with a counter of its own made in the graph (an unsafe_chunk element,
    # a view of one) and for memory the program made. Members of a group need not share one (an unsafe_chunk
    # element passed with its base), and the group's base has one member's.
    counter: int | None = None


@dataclass
class AliasInfo:
    values: dict[fx.Node, Any] = field(default_factory=dict)  # Value, or a tuple of them for multi-outputs
    storages: list[Storage] = field(default_factory=list)
    input_index: dict[fx.Node, int] = field(default_factory=dict)  # placeholder -> tensor input position

    def value(self, node: fx.Node) -> Value:
        v = self.values[node]
        assert isinstance(v, Value), node
        return v


# In-place metadata ops and the view op whose step they append to their tensor's chain.
_INPLACE_VIEW_AS = {
    "aten::t_": aten.t.default,
    "aten::transpose_": aten.transpose.int,
    "aten::swapdims_": aten.transpose.int,
    "aten::swapaxes_": aten.transpose.int,
    "aten::unsqueeze_": aten.unsqueeze.default,
    "aten::as_strided_": aten.as_strided.default,
    "aten::detach_": aten.detach.default,
}


def _squeeze_view(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    return getattr(aten.squeeze, op._overloadname)


def analyze(gm: fx.GraphModule, groups: list[AliasGroup] = ()) -> AliasInfo:
    """Storages and view chains of every value of `gm`. Inputs in one of `groups` (they overlap in memory)
    share one storage whose base is the group's synthetic base; each is an as_strided view of it."""
    info = AliasInfo()
    group_of = {m: g for g, group in enumerate(groups) for m in group.members}
    group_storage: dict[int, Storage] = {}
    ids = itertools.count()

    def root(node: fx.Node, kind: StorageKind, meta: torch.Tensor, **kw: Any) -> Value:
        s = Storage(len(info.storages), kind, root_meta=meta, root_obj=next(ids), **kw)
        info.storages.append(s)
        counter = None if kind is StorageKind.INTERMEDIATE else s.root_obj  # (a caller's tensor: its own counter)
        return Value(s, (), s.root_obj, meta, node, counter)

    def fresh(node: fx.Node, meta: Any) -> Any:
        if isinstance(meta, torch.Tensor):
            return root(node, StorageKind.INTERMEDIATE, meta)
        if isinstance(meta, (list, tuple)):
            return tuple(fresh(node, m) for m in meta)
        return None

    constants: dict[int, Value] = {}
    inputs = 0
    for node in gm.graph.nodes:
        meta = node.meta.get("val")
        if node.op == "placeholder" and not isinstance(meta, torch.Tensor):
            info.values[node] = None  # a symbolic scalar (a position, a size): no memory
        elif node.op == "placeholder":
            info.input_index[node] = inputs
            if inputs in group_of:
                g = group_of[inputs]
                info.values[node] = _group_member(node, groups[g], g, group_storage, info, next(ids))
            else:
                info.values[node] = root(node, StorageKind.INPUT, meta, index=inputs)
            inputs += 1
        elif node.op == "get_attr":
            real = getattr(gm, node.target)
            if isinstance(real, torch.Generator):
                info.values[node] = None  # a generator the draws take (compat/dynamo_rng.py): no memory
                continue
            if not isinstance(real, torch.Tensor):
                raise UnsupportedError(with_location(f"non-tensor attribute {node.target}", node_location(node)))
            # The same tensor constant may be fetched by several get_attr nodes: one object, one value.
            if id(real) not in constants:
                constants[id(real)] = root(node, StorageKind.CONSTANT, meta, constant=node.target)
            info.values[node] = constants[id(real)]
        elif node.op == "call_function":
            with located(node_location(node)):  # (every error below names the op's line)
                info.values[node] = _call_value(node, info, fresh, ids)
    _verify_storages(gm, info)
    return info


def _group_member(
    node: fx.Node, group: AliasGroup, gid: int, storages: dict[int, Storage], info: AliasInfo, obj: int
) -> Value:
    meta = node.meta["val"]
    if gid not in storages:
        with meta.fake_mode:
            base = meta.as_strided((group.extent,), (1,), group.start)
        storages[gid] = Storage(len(info.storages), StorageKind.GROUP, index=gid, root_meta=base)
        info.storages.append(storages[gid])
    step = ViewStep(as_strided_rel, (list(meta.shape), list(meta.stride()), meta.storage_offset() - group.start))
    return Value(storages[gid], (step,), obj, meta, node, counter=obj)


def _resize_size(node: fx.Node) -> list[Any]:
    """The size `x.resize_(size)` or `x.resize_as_(template)` resizes to."""
    if node.target is aten.resize_as_.default:
        return list(node.args[1].meta["val"].shape)
    return list(node.args[1])


def resizes_nothing(node: fx.Node, meta: torch.Tensor) -> bool:
    """A resize to the tensor's own size without a memory format: eager changes nothing, not even its strides
    or its version counter (`out=` wrappers resize their outputs so: `lu(A, out=(LU, piv))`)."""
    return node.kwargs.get("memory_format") is None and len(node.args) == 2 and _resize_size(node) == list(meta.shape)


def _resize_step(node: fx.Node, v: Value) -> ViewStep:
    """`x.resize_(size)` within x's memory: a contiguous view of it at x's offset (eager keeps the storage).
    Growing past the storage reallocates it in eager, with uninitialized new memory: refused."""
    size = _resize_size(node)
    numel = 1
    for n in size:
        numel *= n
    if node.kwargs.get("memory_format") not in (None, torch.contiguous_format) or len(node.args) > 2:
        raise UnsupportedError("resize_ with a memory format is not supported")
    # The memory known to be there: what the storage's base covers (fake storages grow with the resize).
    root = v.storage.root_meta
    covered = extent(root)[1] + 1
    if numel and v.meta.storage_offset() + numel > covered * root.element_size() // v.meta.element_size():
        raise UnsupportedError("resize_ that grows a tensor past its memory is not supported")
    return ViewStep(as_strided_rel, (size, list(contiguous_strides(size)), 0))


def _step(op: torch._ops.OpOverload, node: fx.Node, parent: Value) -> ViewStep:
    if op is aten.as_strided.default:
        return relative_as_strided(tuple(node.args[1:]), dict(node.kwargs), parent.meta)
    return ViewStep(op, tuple(node.args[1:]), tuple(sorted(node.kwargs.items())))


def _call_value(node: fx.Node, info: AliasInfo, fresh: Any, ids: Any) -> Any:
    meta = node.meta.get("val")
    if node.target is operator.getitem:
        parent, index = node.args
        pv = info.values[parent]
        if isinstance(pv, _MultiView):
            step = normalize_multi_output(pv.op, pv.args, index, pv.parent.meta)
            counter = None if facts(pv.op).own_counter else pv.parent.counter
            return Value(pv.parent.storage, pv.parent.chain + (step,), next(ids), meta, node, counter)
        return pv[index]
    op = node.target
    if not isinstance(op, torch._ops.OpOverload) and isinstance(meta, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        return None  # arithmetic on symbols (`pos + 1`): no memory
    if not isinstance(op, torch._ops.OpOverload):
        raise UnsupportedError(f"unsupported call {op}")
    f = facts(op)
    if is_view_target(op):
        parent = info.value(node.args[0])
        if f.multi_output_view:
            return _MultiView(op, tuple(node.args[1:]), parent)
        step = _step(op, node, parent)
        counter = None if f.own_counter or node.meta.get(OWN_COUNTER_KEY) else parent.counter
        return Value(parent.storage, parent.chain + (step,), next(ids), meta, node, counter)
    if f.kind is OpKind.INPLACE:
        # foreach ops write a list and return nothing; the others return `self` itself.
        return info.value(node.args[0]) if isinstance(node.args[0], fx.Node) else None
    if f.kind is OpKind.INPLACE_VIEW:
        name = op._schema.name
        self_v = info.value(node.args[0])
        if name in ("aten::resize_", "aten::resize_as_"):
            if resizes_nothing(node, self_v.meta):  # (eager keeps the strides too, and its version counter)
                return Value(self_v.storage, self_v.chain, self_v.obj, meta, node, self_v.counter)
            step = _resize_step(node, self_v)
            return Value(self_v.storage, self_v.chain + (step,), self_v.obj, meta, node, self_v.counter)
        if name == "aten::squeeze_":
            view_op = _squeeze_view(op)
        elif name in _INPLACE_VIEW_AS:
            view_op = _INPLACE_VIEW_AS[name]
        else:
            raise UnsupportedError(f"{op} (it changes which memory a tensor refers to) is not supported")
        step = _step(view_op, node, self_v)
        return Value(self_v.storage, self_v.chain + (step,), self_v.obj, meta, node, self_v.counter)
    if f.kind is OpKind.OUT:
        bound = bind_args(op._schema, node.args, node.kwargs)
        written = [bound[n] for n in f.mutated]
        if any(isinstance(w, (list, tuple)) for w in written):  # out= a list of tensors (`unbind_copy`)
            return None  # returns nothing: the written tensors keep their own values
        outs = tuple(info.value(w) for w in written)
        return outs[0] if len(outs) == 1 and not isinstance(meta, (list, tuple)) else outs
    if f.kind is OpKind.MUTABLE and any(returned_args(op._schema)):
        # Results that are out= arguments (`native_batch_norm.out`): those tensors; the others fresh.
        bound = bind_args(op._schema, node.args, node.kwargs)
        return tuple(info.value(bound[a]) if a else fresh(node, m) for a, m in zip(returned_args(op._schema), meta))
    # FUNCTIONAL and MUTABLE ops return fresh tensors.
    return fresh(node, meta)


@dataclass(eq=False)
class _MultiView:
    """The list returned by split/unbind; each getitem of it becomes a single view step."""

    op: torch._ops.OpOverload
    args: tuple[Any, ...]
    parent: Value


def _verify_storages(gm: fx.GraphModule, info: AliasInfo) -> None:
    """The schema-derived storages must partition the values exactly as the fake tensors' storages do.
    Only caller storages may share a fake storage (inputs that share memory without overlapping)."""
    callers = {s.id for s in info.storages if s.kind in (StorageKind.INPUT, StorageKind.GROUP)}
    mine_to_fake: dict[int, StorageWeakRef] = {}
    fake_to_mine: dict[StorageWeakRef, set[int]] = {}
    for node, v in info.values.items():
        if not isinstance(v, Value) or not isinstance(v.meta, torch.Tensor):
            continue
        ref = StorageWeakRef(v.meta.untyped_storage())
        owners = fake_to_mine.setdefault(ref, set())
        owners.add(v.storage.id)
        if mine_to_fake.setdefault(v.storage.id, ref) != ref or (len(owners) > 1 and not owners <= callers):
            raise InternalError(
                with_location(
                    f"alias analysis disagrees with the fake tensors about {node.target}: an op aliases memory "
                    "in a way its schema does not declare",
                    node_location(node),
                )
            )


def writes_caller_memory(gm: fx.GraphModule, info: AliasInfo) -> bool:
    """Whether any op of the captured graph `gm` may write memory of the caller's (an input, an alias group, a
    constant), its data or its metadata (`t_`, `detach_`): an argument its schema marks written (`Tensor(a!)`) whose
    value is not memory the program made. Any call that is not an aten op (except `getitem`) counts as a write: the
    answer errs on the side of "writes" (frontend/guards.lean_check keeps the storage check then)."""
    for n in gm.graph.nodes:
        if n.op in ("call_method", "call_module"):
            return True  # (not in make_fx's graphs; were one there, what it writes is not read here)
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        op = n.target
        if not isinstance(op, torch._ops.OpOverload):
            return True
        if not op._schema.is_mutable:
            continue
        given = bind_args(op._schema, n.args, n.kwargs)
        for a in op._schema.arguments:
            if a.alias_info is None or not a.alias_info.is_write or given.get(a.name) is None:
                continue
            written = given[a.name]
            for x in written if isinstance(written, (list, tuple)) else [written]:
                value = info.values.get(x) if isinstance(x, fx.Node) else None
                if not isinstance(value, Value) or value.storage.kind is not StorageKind.INTERMEDIATE:
                    return True
    return False
