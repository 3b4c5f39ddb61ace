"""The caller's tensors in the functional graph: a placeholder per input (alias group members, then each group's
base), constants as attributes, and, at the end, written inputs read through a clone under autograd."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from ...ir.gradops import bump_version, caller_tensor, stale_saved, write_back_now
from ...ir.opfacts import is_view_node
from ...ir.plan import Ref, RefKind, StorageKind, group_placeholder
from ...ir.viewops import ViewStep, as_strided_rel
from ..alias import Storage, Value

if TYPE_CHECKING:
    from .walk import Functionalizer

aten = torch.ops.aten


@dataclass
class CallerInputs:
    """The placeholders of the caller's memory: the graph reads a storage's base from `placeholder_ref`'s keys, and
    an alias group member reads as its own placeholder until the group is first written."""

    placeholder_ref: dict[fx.Node, Ref] = field(default_factory=dict)  # caller base placeholders
    member_steps: dict[Ref, list[tuple[fx.Node, ViewStep]]] = field(default_factory=dict)  # group -> member views
    member_ph: dict[int, fx.Node] = field(default_factory=dict)  # alias group member (object) -> its placeholder
    nograd_members: set[fx.Node] = field(default_factory=set)  # members made under no_grad (restricted inputs)

    def placeholder(self, s: Storage) -> fx.Node:
        """The placeholder of caller storage `s`: the caller's tensor itself, or its alias group's base (a view of
        the members' memory, sharing one member's version counter)."""
        return next(p for p, ref in self.placeholder_ref.items() if ref == s.ref())


def caller_root(w: Functionalizer, v: Value, node: fx.Node, ref: Ref) -> None:
    """`v` is a caller's tensor object, read as `node` until its storage is written."""
    w.timeline.cache[v] = (node, 0)
    w.objects.first[v.obj] = w.objects.latest[v.obj] = v
    w.objects.caller_objs.setdefault(v.obj, ref)


def placeholder(w: Functionalizer, node: fx.Node) -> None:
    if w.info.values[node] is None:  # a symbolic scalar input
        ph = w.graph.placeholder(node.name)
        ph.meta["val"] = node.meta["val"]
        w.scalars[node] = w.emitted[node] = ph
        return
    v = w.info.value(node)
    ph = w.graph.placeholder(node.name)
    ph.meta["val"] = node.meta["val"]
    ph.meta["rg"] = w.requires_grad[w.info.input_index[node]]
    if v.storage.kind is StorageKind.INPUT:
        w.timeline.start(v.storage, ph)
        w.callers.placeholder_ref[ph] = Ref(RefKind.INPUT, v.storage.index)
    else:
        w.callers.member_steps.setdefault(Ref(RefKind.GROUP, v.storage.index), []).append((ph, v.chain[0]))
        w.callers.member_ph[v.obj] = ph
    # A member of an alias group reads as its own placeholder until the group is first written.
    caller_root(w, v, ph, Ref(RefKind.INPUT, w.info.input_index[node]))
    if w.info.input_index[node] in w.detached_inputs:
        w.objects.detached.add(v.obj)
    why = w.restricted_inputs.get(w.info.input_index[node])
    if why is not None:
        w.autograd.restricted_input(node, why)
        if why == "made under no_grad" and v.storage.kind is StorageKind.GROUP:
            w.callers.nograd_members.add(ph)


def group_placeholders(w: Functionalizer) -> None:
    """Each alias group's synthetic base, a placeholder after the tensor inputs."""
    for s in w.info.storages:
        if s.kind is StorageKind.GROUP:
            ph = group_placeholder(w.graph, s.index)
            ph.meta["val"] = s.root_meta
            # Requires grad as the base the call makes does (AliasGroup.base_of): when a member does. Not when
            # only another input does: a layout change of a member before a write brings it grad is then not
            # recorded by autograd, as eager's was not (fuzz seed 1808283).
            members = [
                i
                for n, i in w.info.input_index.items()
                if w.info.values.get(n) is not None and w.info.value(n).storage is s
            ]
            ph.meta["rg"] = any(w.requires_grad[i] for i in members)
            w.callers.placeholder_ref[ph] = Ref(RefKind.GROUP, s.index)
            w.timeline.start(s, ph)


def get_attr(w: Functionalizer, node: fx.Node) -> None:
    if w.info.values.get(node) is None:  # a generator the draws take (alias.py): the same object, no memory
        w.program.constants[node.target] = generator = getattr(w.src, node.target)
        attr = w.emitted[node] = w.graph.get_attr(node.target)
        attr.meta["val"] = generator
        return
    v = w.info.value(node)
    if v.storage in w.timeline.base:
        return
    name = v.storage.constant
    w.program.constants[name] = getattr(w.src, node.target)
    attr = w.graph.get_attr(name)
    val = node.meta["val"]
    if getattr(val, "fake_mode", w.emit.fake_mode) is not w.emit.fake_mode:
        # A constant dynamo lifted (`v[7] = -2.0` makes a tensor of -2.0) came with a fake value of dynamo's
        # mode: ops on it in this graph's mode would raise ("Mixing fake modes").
        val = w.emit.fake_mode.from_tensor(w.program.constants[name], static_shapes=True)
    attr.meta["val"] = val
    attr.meta["rg"] = bool(getattr(w.program.constants[name], "requires_grad", False))
    w.timeline.start(v.storage, attr)
    caller_root(w, v, attr, Ref(RefKind.CONSTANT, name))


def protect_written_inputs(w: Functionalizer) -> None:
    """Under autograd, the graph reads a written input through a clone. Ops that save their inputs for
    backward then save the clone, and the write-back into the caller's tensor after the graph cannot
    invalidate them ("modified by an inplace operation"); gradients still reach the input's history."""
    graph = w.graph
    placeholders = graph.find_nodes(op="placeholder")
    targets = [wb.target for wb in w.program.writebacks] + [s.ref() for s in w.autograd.written_back]
    for target in targets:
        ph = next((p for p in placeholders if w.callers.placeholder_ref.get(p) == target), None)
        # An input that does not require grad can still be saved for backward by an op that does record
        # it (batch norm saves its running stats): protect it whenever a reader of it is differentiable.
        if ph is None or not (ph.meta.get("rg") or any(u.meta.get("rg") for u in ph.users)):
            continue
        if not _read_with_grad(ph):  # only ops run with grad on save (an optimizer step saves nothing)
            continue
        with graph.inserting_after(placeholders[-1]):
            clone = graph.call_function(aten.clone.default, (ph,))
        clone.meta.update(val=ph.meta["val"], rg=bool(ph.meta.get("rg")), grad=True)
        for user in list(ph.users):
            # (stale_saved reads the caller's version counter, not its values)
            if user is not clone and user.target not in (write_back_now, caller_tensor, bump_version, stale_saved):
                user.replace_input_with(ph, clone)
        for member, step in w.callers.member_steps.get(target, []):  # members of the alias group
            own = member in w.callers.nograd_members
            with graph.inserting_after(clone):
                if own:
                    # A view made under no_grad is a leaf of its own in eager: as a view of the base's clone it
                    # would send its gradient into the base's history (fuzz seed 994811). Cloned on its own.
                    view = graph.call_function(aten.clone.default, (member,))
                else:
                    view = graph.call_function(as_strided_rel, (clone, *w.emit.symbolic(step.args)))
            rg = member.meta.get("rg") if own else ph.meta.get("rg")
            view.meta.update(val=member.meta["val"], rg=bool(rg), grad=True)
            for user in list(member.users):
                # (not the clone itself; bump_version moves the caller's tensor's counter, not the clone's)
                if user is not view and user.target is not bump_version:
                    user.replace_input_with(member, view)


def _read_with_grad(node: fx.Node) -> bool:
    """Whether an op running with grad on reads `node`'s memory (through views)."""
    todo, seen = [node], set()
    while todo:
        for u in todo.pop().users:
            if u in seen:
                continue
            seen.add(u)
            if is_view_node(u):
                todo.append(u)
            elif u.op == "call_function" and u.meta.get("grad", True) and u.target is not stale_saved:
                return True
    return False
