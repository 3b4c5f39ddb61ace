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

from .capture import node_location
from .errors import InternalError, UnsupportedError, with_location
from .opfacts import OpKind, facts
from .viewops import ViewStep, normalize_multi_output

aten = torch.ops.aten


@dataclass(eq=False)
class Storage:
    id: int
    kind: str  # "input" | "constant" | "intermediate"
    index: int | None = None  # input position, for kind == "input"
    constant: str | None = None  # attribute name of the tensor constant, for kind == "constant"
    root_meta: torch.Tensor | None = None  # fake tensor of the base as traced
    root_obj: int = -1  # the tensor object that is the base


@dataclass(eq=False)
class Value:
    """One tensor as the program sees it at one point: which storage, which chain, which object."""

    storage: Storage
    chain: tuple[ViewStep, ...]
    obj: int  # identity of the Python tensor object
    meta: torch.Tensor  # fake tensor: exact sizes, strides and offset
    node: fx.Node  # the captured node that produced this value


@dataclass
class AliasInfo:
    values: dict[fx.Node, Any] = field(default_factory=dict)  # Value, or a tuple of them for multi-outputs
    storages: list[Storage] = field(default_factory=list)

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


def analyze(gm: fx.GraphModule) -> AliasInfo:
    info = AliasInfo()
    ids = itertools.count()

    def root(node: fx.Node, kind: str, meta: torch.Tensor, **kw: Any) -> Value:
        s = Storage(len(info.storages), kind, root_meta=meta, root_obj=next(ids), **kw)
        info.storages.append(s)
        return Value(s, (), s.root_obj, meta, node)

    def fresh(node: fx.Node, meta: Any) -> Any:
        if isinstance(meta, torch.Tensor):
            return root(node, "intermediate", meta)
        if isinstance(meta, (list, tuple)):
            return tuple(fresh(node, m) for m in meta)
        return None

    constants: dict[int, Value] = {}
    inputs = 0
    for node in gm.graph.nodes:
        meta = node.meta.get("val")
        if node.op == "placeholder":
            info.values[node] = root(node, "input", meta, index=inputs)
            inputs += 1
        elif node.op == "get_attr":
            real = getattr(gm, node.target)
            if not isinstance(real, torch.Tensor):
                raise UnsupportedError(with_location(f"non-tensor attribute {node.target}", node_location(node)))
            # The same tensor constant may be fetched by several get_attr nodes: one object, one value.
            if id(real) not in constants:
                constants[id(real)] = root(node, "constant", meta, constant=node.target)
            info.values[node] = constants[id(real)]
        elif node.op == "call_function":
            info.values[node] = _call_value(node, info, fresh, ids)
    _verify_storages(gm, info)
    return info


def _tensor_arg(node: fx.Node, name: str) -> fx.Node:
    schema = node.target._schema
    for i, a in enumerate(schema.arguments):
        if a.name == name:
            return node.args[i] if i < len(node.args) else node.kwargs[name]
    raise KeyError(name)


def _call_value(node: fx.Node, info: AliasInfo, fresh: Any, ids: Any) -> Any:
    meta = node.meta.get("val")
    if node.target is operator.getitem:
        parent, index = node.args
        pv = info.values[parent]
        if isinstance(pv, _MultiView):
            step = normalize_multi_output(pv.op, pv.args, index, pv.parent.meta)
            return Value(pv.parent.storage, pv.parent.chain + (step,), next(ids), meta, node)
        return pv[index]
    op = node.target
    if not isinstance(op, torch._ops.OpOverload):
        raise UnsupportedError(with_location(f"unsupported call {op}", node_location(node)))
    f = facts(op)
    if f.kind is OpKind.VIEW:
        parent = info.value(node.args[0])
        if f.multi_output_view:
            return _MultiView(op, tuple(node.args[1:]), parent)
        step = ViewStep(op, tuple(node.args[1:]), tuple(sorted(node.kwargs.items())))
        return Value(parent.storage, parent.chain + (step,), next(ids), meta, node)
    if f.kind is OpKind.INPLACE:
        # foreach ops write a list and return nothing; the others return `self` itself.
        return info.value(node.args[0]) if isinstance(node.args[0], fx.Node) else None
    if f.kind is OpKind.INPLACE_VIEW:
        name = op._schema.name
        if name == "aten::squeeze_":
            view_op = _squeeze_view(op)
        elif name in _INPLACE_VIEW_AS:
            view_op = _INPLACE_VIEW_AS[name]
        else:
            raise UnsupportedError(
                with_location(
                    f"{op} (it changes which memory a tensor refers to) is not supported", node_location(node)
                )
            )
        self_v = info.value(node.args[0])
        step = ViewStep(view_op, tuple(node.args[1:]), tuple(sorted(node.kwargs.items())))
        return Value(self_v.storage, self_v.chain + (step,), self_v.obj, meta, node)
    if f.kind is OpKind.OUT:
        outs = tuple(info.value(_tensor_arg(node, n)) for n in f.mutated)
        return outs[0] if len(outs) == 1 and not isinstance(meta, (list, tuple)) else outs
    # FUNCTIONAL and MUTABLE ops return fresh tensors.
    return fresh(node, meta)


@dataclass(eq=False)
class _MultiView:
    """The list returned by split/unbind; each getitem of it becomes a single view step."""

    op: torch._ops.OpOverload
    args: tuple[Any, ...]
    parent: Value


def _verify_storages(gm: fx.GraphModule, info: AliasInfo) -> None:
    """The schema-derived storages must partition the values exactly as the fake tensors' storages do."""
    mine_to_fake: dict[int, StorageWeakRef] = {}
    fake_to_mine: dict[StorageWeakRef, int] = {}
    for node, v in info.values.items():
        if not isinstance(v, Value) or not isinstance(v.meta, torch.Tensor):
            continue
        ref = StorageWeakRef(v.meta.untyped_storage())
        sid = v.storage.id
        if v.storage.kind == "input":
            # Inputs that share memory share one fake storage; they are grouped by the caller (guards).
            fake_to_mine.setdefault(ref, sid)
            mine_to_fake.setdefault(sid, ref)
            continue
        if mine_to_fake.setdefault(sid, ref) != ref or fake_to_mine.setdefault(ref, sid) != sid:
            raise InternalError(
                with_location(
                    f"alias analysis disagrees with the fake tensors about {node.target}: an op aliases memory "
                    "in a way its schema does not declare",
                    node_location(node),
                )
            )
