"""Returned views made under no_grad (autograd_facts._fragile_output): the grad mode the steps of a returned view's
chain were made in, before the view made under no_grad that the chain ends in (the call replays each step in it:
OutputSlot.grad_before); whether a stale one can be made stale after the graph (OutputSlot.stale); which views
eager's autograd does not track at all (never fragile); and which view nodes are eager's tensors of their own (an
`unsafe_split` element made under no_grad)."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from ..errors import UnsupportedError, node_location, with_location
from ..ir.opfacts import facts
from ..ir.plan import OutputSlot
from .alias import AliasInfo, Value

if TYPE_CHECKING:
    from .autograd_facts import _Fragile


def steps_mode(info: AliasInfo, root: fx.Node, k: int) -> bool | None:
    """The grad mode the `k` view steps before the fragile view `root` were made in, when the graph switched to it
    before them (None: the call's mode). A piece of a graph split inside a no_grad region is called with grad off
    and switches it on: `v.reshape(-1)` of a transposed tensor there is a copy and its `_unsafe_view`, made with
    grad on, which replayed in the call's mode would not require grad, and neither would the no_grad view of it
    returned (fuzz seed 2300095). Steps made in different modes, or not traced back to their nodes: run eagerly."""
    call = torch.is_grad_enabled()  # (the passes run in the mode of the call they compile for)
    modes, node, chain = set(), root, info.value(root).chain
    for j in range(1, k + 1):
        node = _source(_source(node) if node.target is operator.getitem else node)  # (`unbind(v)[i]`: v)
        value = info.values.get(node) if node is not None else None
        if not isinstance(value, Value) or value.chain != chain[: len(chain) - j]:
            modes.add(None)  # (a step eager made not traced back to its node: its mode is not known)
            break
        modes.add(node.meta.get("grad"))
    if modes <= {call}:
        return None
    if len(modes) == 1 and None not in modes:
        return modes.pop()
    raise UnsupportedError(
        with_location(
            "a view made under no_grad is returned of views made in other grad modes than the call's; not compiled "
            "exactly yet",
            node_location(root),
        )
    )


def _source(node: fx.Node | None) -> fx.Node | None:
    return node.args[0] if node is not None and node.args and isinstance(node.args[0], fx.Node) else None


def made_stale(info: AliasInfo, arg: fx.Node, slot: OutputSlot, f: _Fragile, next_to_root: bool, unsafe: bool) -> bool:
    """Whether the stale view `arg`, made under no_grad (fragile `f`), can be returned made stale after the graph
    (OutputSlot.stale): eager's reading of its grad_fn raises because its recorded version is not its memory's,
    whatever wrote the memory, so its chain replayed as made, with the counter one behind, gives eager's tensor.
    Only a view made under no_grad of a tensor that required grad, before any write since its root was made (one
    made after is not stale in eager), by steps replayed in the modes eager made them in (a split after the root
    too, as made: eager's error then names it, fuzz seed 1201372), of memory with one version counter (not an
    unsafe_split element's)."""
    split = not f.nograd and f.why.startswith("returned by")  # (a split's element, made with grad on)
    if not (split or f.nograd and f.why == "made under no_grad") or not f.base_rg or f.input_leaf:
        return False
    if f.made_at != f.epoch or unsafe:
        return False
    if f.nograd and f.made_with_grad and not next_to_root:  # (the modes of the steps between are not replayed)
        return False
    if not slot.chain or slot.restride is not None or slot.from_output is not None:
        return False
    v, root = info.value(arg), info.value(f.root)
    return not (v.obj == root.obj and v.chain != root.chain)  # (the root changed in place since: `v.t_()`)


def not_autograd_view(info: AliasInfo, known: set[int], view: fx.Node, source: fx.Node) -> bool:
    """Whether eager's `view` (made by `source`, itself or a split) is no autograd view of the memory it shares:
    made by detach, or as a dtype view from or to a dtype autograd does not differentiate, or a view of such a
    tensor (an object in `known`). Eager's shares the memory but not its autograd: it never goes stale, and does
    not require grad (`x.detach()` under no_grad, then a write of x: fuzz seeds 1200744, 1201955); nor can it come
    to (a write that requires grad through one runs eagerly: functionalize/timeline.py)."""
    first = source.all_input_nodes[:1]
    if any(isinstance(v := info.values.get(a), Value) and v.obj in known for a in first):
        return True
    if view.target is operator.getitem or not first:
        return False
    val, arg = view.meta.get("val"), first[0].meta.get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(arg, torch.Tensor):
        return False
    if view.target is torch.ops.aten.detach.default:
        return True
    return not all(t.dtype.is_floating_point or t.dtype.is_complex for t in (val, arg))


def tensor_of_its_own(view: fx.Node, source: fx.Node, grad: bool) -> bool:
    """Whether eager's `view` is a tensor of its own in autograd, no view (never stale, no fragile view; its views are
    tracked as views of it): an element of `unsafe_split` made under no_grad. Unlike a detached tensor, a write with
    grad on through it is compiled and makes it require grad, and a view of it is then an autograd view of it as any
    other: a no_grad view of it, returned after a later write, is stale in eager. (Made with grad on, unsafe_split.py
    tracks the element. `_unsafe_view`'s result, a tensor of its own in eager too, is tracked as a fragile view made
    under no_grad: a returned view of it returned with it is made from it only so, as OutputSlot.from_output asks.)"""
    op = source.target
    return (
        view.target is operator.getitem
        and not grad
        and isinstance(op, torch._ops.OpOverload)
        and not facts(op).autograd_view
    )


class GradViews:
    """Views made with grad on of memory that required grad, by tensor object: the storage's writes (eager's version
    counter) when each was made or last had its grad_fn read, and its value when made. One returned after a later
    write of its memory is stale in eager: its grad_fn is made afresh from its base's when read (an
    AsStridedBackward0, or its view's replay). dealias's, made from the caller's tensor after the graph, would be
    current and keep its own; where the base is detached in place before that read (`v = x.t(); x.mul_(2);
    x.detach_()`, in the program or by the caller: fuzz seeds 2476014, 2476161), eager's reaches nothing where
    dealias's gradient went on into the base's history. So it is made stale (OutputSlot.stale), as eager's."""

    def __init__(self) -> None:
        self.views: dict[int, tuple[int, Value]] = {}

    def made(self, value: Value, writes: int) -> None:
        self.views[value.obj] = (writes, value)

    def read(self, info: AliasInfo, nodes: list[fx.Node], writes: dict[Any, int]) -> None:
        """An op with grad on reads the grad_fn of each of `nodes` (its edges), or writes it with grad on (which
        rebases it): eager's view, made afresh from its base there where it was stale, is current from then on."""
        for a in nodes if self.views else ():
            value = info.values.get(a)
            made = self.views.get(value.obj) if isinstance(value, Value) else None
            if made is not None:
                self.views[value.obj] = (writes.get(value.storage, 0), made[1])

    def stale(self, info: AliasInfo, arg: fx.Node, slot: OutputSlot, writes: dict[Any, int]) -> bool:
        """Whether the returned `arg` (as `slot`) is such a view, written since: one chain of plain steps, not
        changed in place since it was made."""
        value = info.values.get(arg)
        made = self.views.get(value.obj) if isinstance(value, Value) else None
        if made is None or writes.get(value.storage, 0) == made[0] or made[1].chain != value.chain:
            return False
        plain = slot.restride is None and slot.from_output is None and slot.multi_output is None
        plain = plain and slot.unsafe_output is None and slot.history is None and not slot.early
        return bool(slot.chain) and slot.same_as is None and plain
