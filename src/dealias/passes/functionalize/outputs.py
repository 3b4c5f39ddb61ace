"""The output plan, made at the captured graph's output: the write-backs of the caller's memory, the metadata
write-backs (in-place layout changes, `detach_`), and one OutputSlot per returned value, from the tensor objects
the walk followed."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from ...errors import UnsupportedError, node_location
from ...ir.opfacts import RESHAPE_KEY, data_node, facts, is_view_node
from ...ir.plan import (
    FromOutput,
    MetadataWriteBack,
    OutputSlot,
    Ref,
    RefKind,
    Restride,
    ResultArg,
    StorageKind,
    WriteBack,
)
from ...ir.regions import owning_node
from ...ir.viewops import ViewStep, chain_args, map_chain_args
from ..alias import Storage, Value
from .counters import plan_unmoved_counters

if TYPE_CHECKING:
    from .walk import Functionalizer

aten = torch.ops.aten


@dataclass
class TensorObjects:
    """Python tensor objects (Value.obj) as the walk met them: an output is the caller's tensor itself, or a tensor
    as it was made, and a caller's tensor whose layout changed in place is changed back by a metadata write-back."""

    latest: dict[int, Value] = field(default_factory=dict)  # tensor object -> its latest value (metadata mutations)
    first: dict[int, Value] = field(default_factory=dict)  # caller's tensor object -> its value on entry
    born: dict[int, Value] = field(default_factory=dict)  # tensor object made inside the graph -> its value when made
    caller_objs: dict[int, Ref] = field(default_factory=dict)  # caller's tensor objects (inputs, constants)
    detached: set[int] = field(default_factory=set)  # tensor objects that ran detach_()
    # Caller's tensor object -> whether autograd recorded its in-place layout changes ({True}, {False}): they
    # are replayed as one change after the write-backs, recorded or not, as eager's were.
    meta_recorded: dict[int, set[bool]] = field(default_factory=dict)


def _results_from(changed: fx.Node, output: fx.Node, w: Functionalizer) -> bool:
    """Whether a result requiring grad is computed from `changed` (the captured node of a caller's tensor after its
    layout change), through the ops that use it."""
    seen, todo = set(), [changed]
    while todo:
        n = todo.pop()
        for user in n.users:
            if user not in seen and user is not output:
                seen.add(user)
                todo.append(user)
    return any(
        isinstance(a, fx.Node) and (a in seen or a is changed) and w.autograd.requires_grad(a) for a in output.args[0]
    )


def plan_outputs(w: Functionalizer, node: fx.Node) -> None:
    """The captured graph's output `node`: the functional graph's output and the program's plan."""
    program, objects, timeline = w.program, w.objects, w.timeline
    outs: list[fx.Node] = []
    # Write-backs first: every caller-visible storage whose version moved.
    returned = [w.info.value(a).storage for a in node.args[0] if isinstance(w.info.values.get(a), Value)]
    w.autograd.before_output(list(timeline.base), returned)
    for s in list(timeline.base):
        if s.kind is not StorageKind.INTERMEDIATE and timeline.version[s] > 0 and s not in w.autograd.written_back:
            grad = w.autograd.written_with_grad(s)
            program.writebacks.append(WriteBack(s.ref(), len(outs), grad))
            outs.append(timeline.base[s])
    plan_unmoved_counters(w)
    for obj, ref in objects.caller_objs.items():
        first, last = objects.first[obj], objects.latest[obj]
        if _layout(last.meta) != _layout(first.meta) or obj in objects.detached:
            # Replayed after the write-backs as eager made the changes: recorded by autograd, or not (then no
            # write autograd records came after them, see AutogradFacts.layout_changed).
            grad = objects.meta_recorded.get(obj) != {False}
            write = MetadataWriteBack(ref, *_layout_change(first.meta, last.meta), obj in objects.detached, grad)
            program.metadata_writebacks.append(write)
            if grad and w.autograd.requires_grad(last.node) and _results_from(last.node, node, w):
                # Replayed after the graph, the change gives the caller's tensor a grad_fn of its own, which the
                # results the graph computed from it do not go through, where eager's do: a hook registered on the
                # tensor after the call would not see their gradients (fuzz seed 2090444: a silent wrong gradient).
                raise UnsupportedError(
                    f"{ref} changes layout in place with grad on ({last.node.target} at {node_location(last.node)}) "
                    "and results requiring grad are computed in the same graph: eager's go through its new grad_fn"
                )
    results: dict[Storage, int] = {}
    seen: dict[int, int] = {}  # tensor object -> its first output position
    made_from: dict[int, tuple[Any, ...]] = {}  # output position -> the full chain its slot's chain ends
    for position, arg in enumerate(node.args[0]):
        if w.info.values.get(arg) is None and arg in w.scalars:  # a symbolic scalar: computed
            program.outputs.append(OutputSlot(Ref(RefKind.RESULT, len(outs))))
            outs.append(w.scalars[arg])
            continue
        v = w.info.value(arg)
        s = v.storage
        if v.obj in seen:  # eager returns that very object again (`flatten()` of a 1-D tensor is itself)
            program.outputs.append(OutputSlot(Ref(RefKind.RESULT, -1), same_as=seen[v.obj]))
            continue
        seen[v.obj] = position
        # A tensor eager made as no view (`y = x * 2`, a reshape's copy, an unsafe_split element) whose layout
        # changed in place (`y.t_()`): replaying its chain would return a view. It is returned as it was made,
        # then re-strided.
        born = objects.born.get(v.obj, v)
        remade = born.chain != v.chain and not _made_as_view(w, born)
        restride = _layout_change(born.meta, v.meta) if remade else None
        made_from[position] = born.chain if remade else v.chain
        if v.obj in objects.caller_objs:  # the caller's tensor itself (even after `x.t_()`)
            program.outputs.append(OutputSlot(objects.caller_objs[v.obj]))
        elif s.kind is not StorageKind.INTERMEDIATE:
            if w.autograd.unrecorded_layout and w.autograd.requires_grad(arg):
                # (made before the change or after it: eager's grad_fn is regenerated from the new layout)
                made_with = w.autograd.made_with_grad.get(v.obj, True)
                w.autograd.refuse_use_after_unrecorded_layout(s, "a view returned", made_with)
            view = _caller_view(w, born if remade else v, arg)
            program.outputs.append(replace(view, restride=restride))
        else:
            if w.autograd.unrecorded_layout and w.autograd.requires_grad(arg):
                # Memory the program made, changed in layout under no_grad (`y = x.sin(); y.t_()` there): eager
                # returns it with the grad_fn made for the old layout, which takes the new layout's gradients
                # as they come; re-strided or replayed here, autograd would map them back (fuzz seed 1975263).
                made_with = w.autograd.made_with_grad.get(v.obj, True)
                w.autograd.refuse_use_after_unrecorded_layout(s, "a tensor returned", made_with)
            saved = None if remade else _graphs_own_copy(w, v, arg, node.args[0])
            if saved is not None:  # (the very tensor the graph's ops read: _graphs_own_copy)
                program.outputs.append(OutputSlot(Ref(RefKind.RESULT, len(outs))))
                made_from[position] = ()
                outs.append(saved)
                continue
            if s not in results:
                results[s] = len(outs)
                outs.append(_owning(w, timeline.base[s]))
            chain = born.chain if remade else v.chain
            program.outputs.append(OutputSlot(Ref(RefKind.RESULT, results[s]), chain, restride=restride))
    for position, arg in enumerate(node.args[0]):
        slot = program.outputs[position]
        slot = w.autograd.output_slot(arg, slot, made_from.get(position, ()))
        if _reshaped(arg, slot):
            slot = replace(slot, reshaped=True)
        data_step = _data_step(w, arg, slot, made_from.get(position, ()))
        if data_step is not None:
            slot = replace(slot, data_step=data_step)
        history = w.autograd.returned_history(arg)
        if history is not None and slot.same_as is None:
            slot = replace(slot, history=len(outs))
            outs.append(history)
        program.outputs[position] = slot
    if w.fake_symbolic:
        program.outputs = [_computed_chain(w, slot, outs) for slot in program.outputs]
    _views_of_outputs(w, node.args[0])
    w.graph.output(tuple(outs))


def _views_of_outputs(w: Functionalizer, args: Any) -> None:
    """OutputSlot.from_output: an output that is a view of another output, a tensor of its own the graph made
    (`v2 = x[:, ::3].flatten()`, a copy; `v2.view(-1)`), is made from that output's tensor, as eager's is. Each
    replayed its chain from the graph's result, so the view was one of a second, hidden copy: a write through
    it after the call changed that copy's history, not v2's (fuzz seed 1840127: sin_'s gradient lost)."""
    slots = w.program.outputs

    def plain(slot: OutputSlot) -> bool:  # (a chain replayed whole, in one grad mode)
        same = OutputSlot(slot.source, slot.chain, grad=slot.grad, reshaped=slot.reshaped)
        return slot == same and slot.source.kind is RefKind.RESULT

    own: dict[int, int] = {}  # object of a returned tensor of its own (made by the graph) -> its position
    for k, arg in enumerate(args):
        v = w.info.values.get(arg)
        if isinstance(v, Value) and plain(slots[k]) and slots[k].chain and not _makes_view(slots[k].chain):
            own.setdefault(v.obj, k)
    for p, arg in enumerate(args):
        v = w.info.values.get(arg)
        if not (own and isinstance(v, Value) and plain(slots[p])):
            continue
        n = v.node
        while is_view_node(n):  # (eager's views of views are views of the first tensor of its own)
            n = n.args[0]
            of = w.info.values.get(n)
            if isinstance(of, Value) and of.obj in own:
                k = own[of.obj]
                if k != p and slots[p].chain[: len(slots[k].chain)] == slots[k].chain:
                    slots[p] = replace(slots[p], from_output=FromOutput(k, len(slots[k].chain)))
                break


def _reshaped(arg: Any, slot: OutputSlot) -> bool:
    """Whether output `slot`'s last step is the view the user's reshape made as `arg` (OutputSlot.reshaped)."""
    if not isinstance(arg, fx.Node) or not arg.meta.get(RESHAPE_KEY) or arg.target is not aten.view.default:
        return False
    if slot.same_as is not None or slot.restride is not None or not slot.chain:
        return False
    last = slot.chain[-1]
    return last.op is arg.target and len(last.args) == 1 and not last.kwargs


def _data_step(w: Functionalizer, arg: Any, slot: OutputSlot, full: tuple[Any, ...]) -> int | None:
    """The step of output `slot`'s chain (`full`: the chain from the storage's base it ends) that `x.data` made in
    the chain of view nodes ending at `arg` (OutputSlot.data_step); None where there is none, or it is not one step
    of the slot's chain."""
    node, value = data_node(arg), w.info.values.get(arg)
    data = w.info.values.get(node) if node is not None else None
    if not isinstance(data, Value) or not isinstance(value, Value):
        return None
    if slot.same_as is not None or value.chain[: len(data.chain)] != data.chain or tuple(full) != value.chain:
        return None
    k = len(data.chain) - 1 - (len(full) - len(slot.chain))
    return k if 0 <= k < len(slot.chain) and slot.chain[k].op is aten.detach.default else None


def _graphs_own_copy(w: Functionalizer, v: Value, arg: fx.Node, args: Any) -> fx.Node | None:
    """The graph's node of the returned `v` (memory the program made, requiring grad), where eager's is a tensor
    with a version counter of its own (a reshape's copy: `_unsafe_view` the chain's last step) that the graph's ops
    read as that node, current, and no other output is of its memory. Made afresh from the graph's buffer after
    the call, it was another tensor than the one those ops saved: a write of it by the caller moved no counter
    their backward checks, where eager's raises (fuzz seed 2477619: `v2 = x.movedim(0, -1).flatten(); return
    v2.sin(), v2`, then `v2.mul_(2)`). Returned itself, it is the tensor they saved, as eager's."""
    last = v.chain[-1].op if v.chain else None
    if not (isinstance(last, torch._ops.OpOverload) and facts(last).own_counter) or not w.autograd.requires_grad(arg):
        return None
    if v.obj in w.autograd.fragile or v.obj in w.autograd.unsafe:  # (made under no_grad, a split's element: rebuilt)
        return None
    hit = w.timeline.cache.get(v)
    if hit is None or hit[1] != w.timeline.version[v.storage]:
        return None
    others = [o for o in args if o is not arg and isinstance(o, fx.Node)]
    if any(getattr(w.info.values.get(o), "storage", None) is v.storage for o in others):
        return None
    return hit[0]


def _made_as_view(w: Functionalizer, born: Value) -> bool:
    """Whether eager made this tensor as a view: by a view op, not `_unsafe_view` (a reshape's copy) nor as an
    element of `unsafe_split` (autograd_facts tracks those)."""
    element = w.autograd.unsafe.get(born.obj)
    if element is not None and w.info.value(element).obj == born.obj:
        return False
    return _makes_view(born.chain)


def _computed_chain(w: Functionalizer, slot: OutputSlot, outs: list[fx.Node]) -> OutputSlot:
    """An output view whose chain has symbolic arguments (`cache[:, :pos + 1]`): each becomes a result of the
    graph, read by the epilogue when it replays the chain on the caller's tensor."""
    chain = w.emit.symbolic(w.steps(slot.chain))
    if not any(isinstance(a, fx.Node) for a in chain_args(chain)):
        return slot

    def result(node: fx.Node) -> ResultArg:
        outs.append(node)
        return ResultArg(len(outs) - 1)

    return replace(slot, chain=map_chain_args(chain, fx.Node, result))


def _owning(w: Functionalizer, base: fx.Node) -> fx.Node:
    """The returned base of memory the program made, as a tensor of its own as eager's is. A whole write with grad
    on, restrided to eager's layout by a differentiable permute -> clone -> permute (regions.restride), is a
    view of that clone (fuzz seed 996463: `v = x.t().clone(); v.masked_fill_(..)` came back a view); it is
    owned as a returned region write's decomposition is (regions.decompose), in the mode it was made in."""
    if not is_view_node(base):
        return base
    emit = w.emit
    grad, trace = emit.grad, emit.stack_trace
    emit.grad, emit.stack_trace = base.meta.get("grad"), base.meta.get("stack_trace")
    try:
        return owning_node(emit, base)
    finally:
        emit.grad, emit.stack_trace = grad, trace


def _caller_view(w: Functionalizer, v: Value, node: fx.Node) -> OutputSlot:
    """A view of a caller's tensor (captured node `node`): replayed on the input it was taken from, so it is a
    real view of it. Inputs that share memory may have the same layout and differ for autograd (`x` and a view
    of it made under no_grad, after a graph break: fuzz seed 964718): the one `node`'s views start from is
    tried first."""
    while is_view_node(node) and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    source = w.info.values.get(node)
    first = source.obj if isinstance(source, Value) else None
    # (sorted stably: the input it was taken from, then the others in their order)
    for obj, ref in sorted(w.objects.caller_objs.items(), key=lambda item: item[0] != first):
        root = w.objects.first[obj]
        n = len(root.chain)
        if root.storage is v.storage and v.chain[:n] == root.chain:
            return OutputSlot(ref, v.chain[n:])
    return OutputSlot(v.storage.ref(), v.chain)


def _layout_change(first: torch.Tensor, last: torch.Tensor) -> Restride:
    """What `t_()`, `unsqueeze_()`, `as_strided_()`... left of a tensor laid out as `first`: its sizes, strides and
    how far its storage offset moved."""
    rel = last.storage_offset() - first.storage_offset()
    if any(isinstance(x, torch.SymInt) for x in (*last.shape, *last.stride(), rel)):
        raise UnsupportedError("an in-place metadata change (`t_()`, `unsqueeze_()`...) to a symbolic layout")
    return Restride(tuple(last.shape), tuple(last.stride()), rel)


def _makes_view(chain: tuple[ViewStep, ...]) -> bool:
    """Whether replaying `chain` on a base gives an autograd view of it (`_unsafe_view` gives a tensor of its own,
    on the same memory: a reshape's copy; so does `detach`)."""
    return bool(chain) and chain[-1].op not in (aten._unsafe_view.default, aten.detach.default)


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    return tuple(t.shape), t.stride(), t.storage_offset()
