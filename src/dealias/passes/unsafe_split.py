"""Autograd facts of `unsafe_split` / `unsafe_chunk` (part of AutogradFacts, autograd_facts.py): their results share
their input's memory but are not autograd views. Eager's autograd then sees a write through one of them on that
tensor only: the input keeps its history (or its lack of one), the other elements theirs, and each element has a
version counter of its own. The functional graph has one value for the memory; where that would give another
tensor eager's history, the graph runs eagerly, named.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from ..errors import UnsupportedError, node_location, with_location
from ..ir.emitter import Emitter
from ..ir.opfacts import facts, is_view_node, written_nodes
from ..ir.plan import OutputSlot, StorageKind
from .alias import AliasInfo, Storage, Value


class UnsafeSplitFacts:
    """The state and rules for `unsafe_split`'s elements, a part of AutogradFacts, which calls them from its walk
    points and gives them its `emit`, `info` and `requires_grad`."""

    emit: Emitter
    info: AliasInfo
    walk: Any
    writes: dict[Storage, int]
    requires_grad: Callable[[fx.Node], bool]

    def init_unsafe_split(self) -> None:
        # Elements of `unsafe_split` (and views of them), by tensor object -> the element's getitem node: eager's
        # are not autograd views, so a returned one is rebuilt by `unsafe_split` itself (OutputSlot.multi_output).
        self.unsafe: dict[int, fx.Node] = {}
        # Storages split by `unsafe_split` with grad on while they required grad -> the split: a later write of
        # one runs the graph eagerly (eager's autograd does not see a write through an element as one of its input).
        self.unsafe_split_rg: dict[Storage, fx.Node] = {}
        # Storages split by `unsafe_split` while they required no grad -> the split; and those of them a write
        # autograd records went into -> (the element it went through, None for the split's input, and the write).
        # Eager's write makes only that tensor (and its views) require grad: see refuse_other_unsafe_member.
        self.unsafe_split_plain: dict[Storage, fx.Node] = {}
        self.unsafe_recorded: dict[Storage, tuple[fx.Node | None, fx.Node]] = {}
        self.returned_elements: dict[int, fx.Node] = {}  # unsafe_split element object -> the result made from it
        # Elements only returned, split with grad on from a tensor that requires grad -> (their value at the split,
        # the memory's writes then): see returned_history.
        self.split_history: dict[int, tuple[fx.Node, int]] = {}

    def track_unsafe(self, view: fx.Node) -> None:
        """Record an element of `unsafe_split` (or a view of one). Autograd does not treat the elements as views:
        eager's does not see a write through one as a write of its input, and one made under no_grad does not
        require grad. A split of a tensor that requires grad compiles with grad on if nothing writes its memory
        afterwards (each element's gradient flows to the input as through split's views; a returned element is
        rebuilt by `unsafe_split`, with its own grad_fn); under no_grad, or written later, it runs eagerly."""
        source = view.args[0] if view.target is operator.getitem else view
        op = source.target
        if isinstance(op, torch._ops.OpOverload) and not facts(op).autograd_view and _elements_only_returned(source):
            value = self.info.values.get(view)
            if self.requires_grad(source.args[0]):
                # Returned and nothing else (not written, not read): the element is rebuilt after the graph by
                # `unsafe_split` (under no_grad as made, a tensor without history), or, made with grad on, with the
                # history its value had here (attach_history), whatever writes its memory since.
                if isinstance(value, Value):  # (the list itself is not a tensor)
                    self.unsafe[value.obj] = view
                    if self.emit.grad:
                        # (a copy: a view of the caller's tensor, returned, would take the history of its write-back)
                        now = self.emit.call(torch.ops.aten.clone.default, self.walk.materialize(value))
                        self.split_history[value.obj] = (now, self.writes.get(value.storage, 0))
                return
        if isinstance(op, torch._ops.OpOverload) and not facts(op).autograd_view and not _elements_unused(source):
            value = self.info.values.get(view)
            if self.requires_grad(source.args[0]):
                if not self.emit.grad:
                    raise UnsupportedError(
                        with_location(
                            f"{op} under no_grad of a tensor that requires grad is not compiled yet",
                            node_location(view),
                        )
                    )
                if isinstance(value, Value):
                    self.unsafe_split_rg.setdefault(value.storage, view)
            elif isinstance(value, Value):
                self.unsafe_split_plain.setdefault(value.storage, view)
            if isinstance(value, Value):  # (the list itself is not a tensor)
                self.unsafe[value.obj] = view
            return
        value = self.info.values.get(view)
        # (`split(..)[i]` of an element: the split's input is the element)
        parent = next((r for a in source.all_input_nodes if (r := self._unsafe_of(a)) is not None), None)
        if parent is not None and isinstance(value, Value):
            self.unsafe[value.obj] = parent

    def returned_history(self, arg: fx.Node) -> fx.Node | None:
        """The value whose history the returned element `arg` is given (OutputSlot.history): its value at the
        split, if its memory was written since (else the element rebuilt from its input has that history)."""
        v = self.info.values.get(arg)
        if not isinstance(v, Value) or v.obj not in self.split_history:
            return None
        node, writes = self.split_history[v.obj]
        return node if self.writes.get(v.storage, 0) != writes else None

    def _unsafe_of(self, a: fx.Node) -> fx.Node | None:
        v = self.info.values.get(a)
        return self.unsafe.get(v.obj) if isinstance(v, Value) else None

    def read_unsafe_element(self, v: Value, node: fx.Node) -> fx.Node:
        """`node`, the replayed value of `v`, as an op reads it. Eager's element of `unsafe_split` (or a view of
        one) has a version counter of its own, so what an op saves of it for backward (`e.sin()` saves e) is not
        made stale by a write of its base after the graph (in a later graph, or by the caller). The replayed
        view shares the base's counter, and backward raised where eager's goes on (fuzz seed 1040427). Read with
        grad on, it is `_unsafe_view` to its own sizes: the same memory and strides, a gradient reaching the
        base, and a counter of its own. (A write of that memory inside the graph runs it eagerly:
        refuse_unsafe_split_write.)"""
        if not (self.emit.grad and node.meta.get("rg") and v.obj in self.unsafe):
            return node
        return self.emit.call(torch.ops.aten._unsafe_view.default, node, list(node.meta["val"].shape))

    def refuse_unsafe_split_write(self, s: Storage, node: fx.Node) -> None:
        """Raise if `node` writes memory that `unsafe_split` split from a tensor that requires grad."""
        if s in self.unsafe_split_rg:
            split = self.unsafe_split_rg[s]
            raise UnsupportedError(
                with_location(
                    f"{node.target} writes memory split by unsafe_split from a tensor that requires grad (at "
                    f"{node_location(split) or split}); not compiled yet",
                    node_location(node),
                )
            )

    def _recorded_unsafe_write(self, s: Storage, node: fx.Node) -> None:
        """`node`, a write autograd records, went into `s`: if `unsafe_split` split `s` from a tensor that required no
        grad, note which of the tensors on that memory it went through."""
        if s not in self.unsafe_split_plain:
            return
        if s.kind is not StorageKind.INTERMEDIATE:
            # A caller's tensor split in the graph: its write-back would carry the write's history to the caller's
            # tensor, which eager's leaves without grad (and an element read after it lost its gradient).
            split = self.unsafe_split_plain[s]
            raise UnsupportedError(
                with_location(
                    f"{node.target} with grad on writes a caller's tensor through unsafe_split (at "
                    f"{node_location(split) or split}): eager's autograd sees the write on the element only; not "
                    "compiled yet",
                    node_location(node),
                )
            )
        for a in written_nodes(node):
            value = self.info.values.get(a)
            if isinstance(value, Value) and value.storage is s:
                self.unsafe_recorded.setdefault(s, (self._unsafe_of(a), node))

    def refuse_other_unsafe_member(self, a: fx.Node, what: str, where: fx.Node | None = None) -> None:
        """Raise if `a` is on memory `unsafe_split` split from a tensor that required no grad, after a write autograd
        recorded through another of the tensors on it. Eager's autograd saw that write on the tensor written only
        (`e.mul_(w)` through an element leaves the split's input without grad; `x.mul_(w)` leaves the elements
        without), where the functional graph has one value for the memory: reading another of them with grad on,
        writing it with grad on or returning it runs the graph eagerly (fuzz seed 5200115)."""
        value = self.info.values.get(a)
        if not isinstance(value, Value) or value.storage not in self.unsafe_recorded:
            return
        member, write = self.unsafe_recorded[value.storage]
        if self._unsafe_of(a) is not member:
            raise UnsupportedError(
                with_location(
                    f"{what} a tensor on memory unsafe_split split after {write.target} with grad on wrote another "
                    f"tensor on it (at {node_location(write) or write}): eager's autograd saw that write on the tensor "
                    "written only; not compiled yet",
                    node_location(where) if where is not None else None,
                )
            )

    def returns_unsafe_member(self, arg: fx.Node, slot: OutputSlot) -> None:
        """Before the program returns `arg` in `slot`: refuse what eager's autograd keeps apart (see
        refuse_other_unsafe_member), and a second result made from one element."""
        self.refuse_other_unsafe_member(arg, "the program returns")
        element = self._unsafe_of(arg)
        if element is not None and slot.same_as is None:
            # Eager's element is its own base (unsafe_split makes no autograd views), with a version counter of its
            # own: two returned tensors of one element, rebuilt by a split each, would be views of two elements,
            # and a write of one would leave the other's grad_fn readable. Without autograd too: the caller sees
            # their `_base`s and counters, and once the element is made to require grad (`e.requires_grad_()`
            # after the call), eager's view of it requires grad through its base, where the other element's
            # would not.
            obj = self.info.value(element).obj
            if self.returned_elements.setdefault(obj, arg) is not arg:
                raise UnsupportedError("two results are views of one unsafe_split element; not rebuilt as one yet")


def _elements_unused(split: fx.Node) -> bool:
    """Whether no element of `split` (an `unsafe_split`) is used: not returned, written, nor read by an op whose
    result is used (views of one count as it; ops that read only its metadata, `new_zeros`, do not read it).
    Its values and autograd are then nobody's, and the program is as eager's would be without it (fuzz seed
    1201151: `torch.where(.., e, ..)` whose result nothing reads)."""
    memo: dict[fx.Node, bool] = {}
    return not any(_used(u, memo) for u in split.users)


def _elements_only_returned(split: fx.Node) -> bool:
    """Whether every element of `split` that is used at all is returned as it is, and nothing else."""
    users = [u for g in split.users for u in g.users] if all(g.target is operator.getitem for g in split.users) else []
    return bool(users) and all(u.op == "output" for u in users)


def _used(n: fx.Node, memo: dict[fx.Node, bool]) -> bool:
    """Whether what `n` computes from a tensor it reads reaches the program's results or memory."""
    if n in memo:
        return memo[n]
    memo[n] = True  # (a cycle cannot happen in a graph; assumed used while being decided)
    op = n.target
    if n.op != "call_function":
        used = True
    elif op is operator.getitem or is_view_node(n):
        used = any(_used(u, memo) for u in n.users)
    elif not isinstance(op, torch._ops.OpOverload) or facts(op).mutated:
        used = True  # (a write, or a call dealias cannot look into)
    elif _reads_metadata_only(n):
        used = False
    elif torch.Tag.nondeterministic_seeded in op.tags:
        used = True  # (it draws from the generator)
    else:
        used = any(_used(u, memo) for u in n.users)
    memo[n] = used
    return used


def _reads_metadata_only(n: fx.Node) -> bool:
    """A factory taking a tensor for its metadata (`zeros_like`, `new_ones`): its schema has `layout` and
    `pin_memory` (`_to_copy` too, but it is a cast that reads the values)."""
    schema = getattr(n.target, "_schema", None)
    if schema is None or n.target is torch.ops.aten._to_copy.default:
        return False
    return {"layout", "pin_memory"} <= {a.name for a in schema.arguments}
