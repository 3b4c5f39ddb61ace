"""Autograd facts no aten op states, kept for functionalization (docs/architecture.md, "Autograd facts no aten
op states"): what eager's autograd does with a program's views and writes that the functional graph must
reproduce, or refuse where eager raises.

- history across writes autograd does not see (under no_grad, through `detach()` / a dtype view): joined back
  at the first differentiable use (`keep_history`), and a value written with grad on by one that does not
  require grad (`overwritten`);
- views made under no_grad (leaves that require grad in eager), and the grad mode each view was made in;
- fragile views (made under no_grad, or elements of `split` / `unbind`, and views of them): eager raises
  writing one with grad on, or using or returning one after a write of its storage;
- elements of `unsafe_split`, which autograd does not treat as views;
- write-back at the last write of a caller's tensor under autograd (`write_back_now`), or that last write run
  in place on the caller's tensor, so what backward saves is the caller's tensor itself, as in eager.

`AutogradFacts` owns that state. The functionalizer walks the program and tells it what happens, at these
points: `before_op` (every op, before it runs), `reads_fragile` / `read_fragile` and `replay_for_grad` /
`replayed` (reads), `with_history` / `after_write` / `version_counter_moves` (writes), `saves_caller_result` /
`run_in_place_on_caller` (the last write of a caller's tensor), `before_output`, `output_slot`,
`written_with_grad` and `written_back` (the output). It asks the functionalizer only what `Walk` lists:

- `emit`: the emitter, to add nodes and to read and set the grad mode and source line they are made with;
- `info`: the alias facts (which storage, view chain and tensor object each captured node is);
- `current(s)`: storage `s`'s current base (None before it has one). A caller's storage's is its placeholder
  until its first write: every later base is a node made since;
- `advance(s, node)`: `s` now holds `node` (its version moves, so its views are replayed from it);
- `materialize(v)`, `read(a)`: the current contents of a value, of captured arguments;
- `replay(v, on)`: `v`'s view chain replayed on the node `on`;
- `caller_placeholder(s)`: the placeholder of a caller's storage (its tensor, or its alias group's base).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..errors import EagerRaisesError, UnsupportedError, located, node_location, with_location
from ..ir.emitter import Emitter
from ..ir.gradops import caller_after, caller_tensor, grad_leaf, keep_history, overwritten, rewritten, write_back_now
from ..ir.opfacts import data_node, facts, is_view_node, written_nodes
from ..ir.plan import MultiOutputStep, OutputSlot, RefKind, StorageKind
from ..ir.regions import covers_without_reading
from ..ir.viewops import chain_args, internal_overlap
from .alias import AliasInfo, Storage, Value
from .hidden_writes import hidden_write_after_a_read, last_writes, moves_counter
from .unsafe_split import UnsafeSplitFacts
from .view_grad_modes import GradViews, made_stale, not_autograd_view, steps_mode, tensor_of_its_own


class Walk(Protocol):
    """What AutogradFacts may ask of the functionalization walk (see the module's docstring)."""

    emit: Emitter
    info: AliasInfo
    requires_grad: list[bool]  # per tensor input

    def current(self, s: Storage) -> fx.Node | None: ...

    def advance(self, s: Storage, node: fx.Node) -> None: ...

    def materialize(self, v: Value) -> fx.Node: ...

    def read(self, a: Any) -> Any: ...

    def replay(self, v: Value, on: fx.Node) -> fx.Node: ...

    def caller_placeholder(self, s: Storage) -> fx.Node: ...


class AutogradFacts(UnsafeSplitFacts):
    def __init__(self, walk: Walk, gm: fx.GraphModule, under_autograd: bool) -> None:
        self.walk = walk
        self.emit = walk.emit
        self.info = walk.info
        # Storages whose base required grad and was then written invisibly to autograd (under no_grad, or
        # through `detach()` / a dtype view): eager's tensor keeps its history, the functional value computed by
        # the write has none. `history` holds the base from before the first such write; a differentiable use
        # joins the two (gradops.keep_history, see _restore_history).
        self.history: dict[Storage, fx.Node] = {}
        self.grad_writes: set[Storage] = set()  # storages written with grad mode on
        self.writes: dict[Storage, int] = {}  # writes of each storage, as eager's version counter counts them
        # Views of a tensor that requires grad whose grad_fn eager cannot rebuild after a write (see _Fragile).
        self.fragile: dict[int, _Fragile] = {}  # by tensor object
        self.not_autograd_views: set[int] = set()  # views eager's autograd does not track (see _track_fragile)
        self.init_unsafe_split()  # (unsafe_split.py)
        self.made_with_grad: dict[int, bool] = {}  # view object -> grad mode it was made in
        self.grad_views = GradViews()  # views made with grad on: stale when returned after a write (as eager's)
        self.replayed_without_grad: set[Value] = set()  # cached views materialized under no_grad
        # Caller storages written back where their last write is, under autograd (see _write_back_now).
        self.last_write = last_writes(gm, self.info) if under_autograd else {}
        self.last_input_write = last_writes(gm, self.info, read_later=False) if under_autograd else {}
        # Caller tensors written invisibly to autograd after a read with grad on since their last recorded write,
        # the anchor (hidden_writes.py): they receive their value there, their hidden writes after it in place.
        self.hidden_after = hidden_write_after_a_read(gm, self.info, walk.requires_grad) if under_autograd else {}
        for s, anchor in self.hidden_after.items():
            self.last_write[s] = anchor
            self.last_input_write.pop(s, None)
        self.back_at: dict[Storage, fx.Node] = {}  # the last write-back inside the graph of each caller storage
        self.written_back: set[Storage] = set()
        # Intermediate storages -> their last write, when autograd recorded it and the written value, which an op
        # like relu_ saves as its result, is not the storage's new base (a write of a part of it): see
        # refuse_saved_result_returned.
        self.result_apart: dict[Storage, fx.Node] = {}
        # Caller storages -> the first in-place layout change of a caller's tensor of them autograd did not record
        # (`x.t_()` under no_grad): x's grad_fn stays made for the old layout (see layout_changed).
        self.unrecorded_layout: dict[Storage, fx.Node] = {}

    def restricted_input(self, node: fx.Node, why: str) -> None:
        """The caller's tensor of placeholder `node` is a view eager restricts (made under no_grad, a split's
        element) and requires grad: tracked as a fragile view made before the call. Written with grad on, eager
        raises; after a write of its memory, reading its grad_fn raises. Unlike a no_grad view made inside the
        program, it is itself the leaf its gradient reaches (the caller's tensor), so reads are not cut from it;
        except where it shares an alias group with its base (see read_fragile)."""
        value = self.info.value(node)
        self.fragile[value.obj] = _Fragile(node, 0, False, why, False, input_leaf=why == "made under no_grad")

    # -- before each op ------------------------------------------------------------------------------
    def before_op(self, node: fx.Node) -> None:
        """Before `node` runs: restore eager's history of what it reads with grad on (see history), record the
        views it makes, and refuse a write with grad on through a fragile view (eager raises)."""
        if self.emit.grad:
            self.grad_views.read(self.info, node.all_input_nodes, self.writes)
        if self.emit.grad and self.history:
            for a in node.all_input_nodes:
                value = self.info.values.get(a)
                if isinstance(value, Value) and value.storage in self.history:
                    self._restore_history(value.storage)
        if is_view_node(node):
            self._on_view(node)
            return
        if self.emit.grad and self.unsafe_recorded:
            for a in node.all_input_nodes:
                self.refuse_other_unsafe_member(a, f"{node.target} with grad on reads", node)
        if self.emit.grad and self.fragile and any(self._raises_writing(node, a) for a in written_nodes(node)):
            f = next(self._fragile_of(a) for a in written_nodes(node) if self._raises_writing(node, a))
            raise EagerRaisesError(
                f"{node.target} with grad on writes through a view {f.why} (at "
                f"{node_location(f.root) or f.root}); eager raises"
            )

    def _on_view(self, view: fx.Node) -> None:
        value = self.info.values.get(view)
        if isinstance(value, Value) and self.emit.grad is not None:
            self.made_with_grad[value.obj] = self.emit.grad
        if isinstance(value, Value) and self.unrecorded_layout and self.requires_grad(view):
            self.refuse_use_after_unrecorded_layout(value.storage, "a view made")
        self._track_fragile(view)
        self.track_unsafe(view)

    def _raises_writing(self, node: fx.Node, a: fx.Node) -> bool:
        """Whether eager raises when `node` writes the fragile view `a` with grad on: always, unless the view's
        base did not require grad and nothing the write reads does (then no autograd is involved)."""
        f = self._fragile_of(a)
        if f is None:
            return False
        return f.base_rg or any(self.requires_grad(x) for x in node.all_input_nodes)

    def _track_fragile(self, view: fx.Node) -> None:
        value = self.info.values.get(view)
        if not isinstance(value, Value):
            return  # the list a split returns: its elements are tracked
        source = view.args[0] if view.target is operator.getitem else view  # `split(..)[i]`: split's inputs
        if not_autograd_view(self.info, self.not_autograd_views, view, source):
            self.not_autograd_views.add(value.obj)  # (never stale, never requires grad)
            return
        if tensor_of_its_own(view, source, bool(self.emit.grad)):
            return  # (no view: never stale; its views are tracked as views of it)
        parent = next((f for a in source.all_input_nodes if (f := self._fragile_of(a)) is not None), None)
        if parent is not None:
            nograd = parent.nograd or not self.emit.grad
            split = view.target is operator.getitem and isinstance(source.target, torch._ops.OpOverload)
            split_since = view if split and facts(source.target).multi_output_view else parent.split_since
            made_at = self.writes.get(value.storage, 0)
            self.fragile[value.obj] = replace(
                parent, nograd=nograd, made_with_grad=bool(self.emit.grad), made_at=made_at, split_since=split_since
            )
            return
        epoch = self.writes.get(value.storage, 0)
        if not any(self.requires_grad(a) for a in source.all_input_nodes):
            # (A split's element is a view as any other, made under no_grad; unsafe_split's are not autograd views:
            # fuzz seed 964875.)
            op = source.target
            view_of_it = (
                view.target is not operator.getitem or isinstance(op, torch._ops.OpOverload) and facts(op).autograd_view
            )
            if not self.emit.grad and view_of_it:
                self.fragile[value.obj] = _Fragile(view, epoch, True, "made under no_grad", False, False, epoch)
            elif self.emit.grad and view.target is operator.getitem and isinstance(op, torch._ops.OpOverload):
                # Eager restricts a split's element made with grad on (a multi-output view) whether or not its base
                # requires grad yet; once a write with grad on makes the base require grad, reading the element's
                # grad_fn raises (fuzz seed 1040242).
                if facts(op).multi_output_view and facts(op).autograd_view:
                    self.fragile[value.obj] = _Fragile(view, epoch, False, f"returned by {op}", True, False, epoch)
            return
        if not self.emit.grad:
            self.fragile[value.obj] = _Fragile(view, epoch, True, "made under no_grad", False, made_at=epoch)
        elif view.target is operator.getitem and isinstance(source.target, torch._ops.OpOverload):
            if facts(source.target).multi_output_view and facts(source.target).autograd_view:
                self.fragile[value.obj] = _Fragile(
                    view, epoch, False, f"returned by {source.target}", True, made_at=epoch
                )
        else:
            self.grad_views.made(value, epoch)

    def _stale(self, a: fx.Node) -> bool:
        """Whether eager raises reading the fragile view `a`'s grad_fn: its storage was written since it was made
        (or, for a view of a tensor that did not require grad, its base has come to require grad)."""
        v = self.info.value(a)
        f = self.fragile[v.obj]
        return self.requires_grad(a) if not f.base_rg else self.writes.get(v.storage, 0) != f.epoch

    def _fragile_of(self, a: fx.Node) -> _Fragile | None:
        v = self.info.values.get(a)
        return self.fragile.get(v.obj) if isinstance(v, Value) else None

    def requires_grad(self, a: fx.Node) -> bool:
        """Whether eager's tensor requires grad: its storage's base does, or did before a write invisible to
        autograd (which leaves requires_grad as it was; the functional value computed there has none)."""
        value = self.info.values.get(a)
        if not isinstance(value, Value):
            return False
        base = self.walk.current(value.storage)
        return bool(base is not None and base.meta.get("rg")) or value.storage in self.history

    # -- reads ---------------------------------------------------------------------------------------
    def reads_fragile(self, v: Value) -> bool:
        """Whether a read of `v` now is a read of a fragile view with grad on (see read_fragile)."""
        return bool(self.emit.grad and self.fragile and v.obj in self.fragile)

    def read_fragile(self, a: fx.Node) -> fx.Node:
        """Reading a fragile view with grad on: made under no_grad, eager's is a leaf that requires grad. Its
        storage written since the view was made, eager raises (reading the view's grad_fn): the graph runs
        eagerly."""
        f = self.fragile[self.info.value(a).obj]
        if self._stale(a):
            raise EagerRaisesError(
                with_location(
                    f"a view {f.why} is used with grad on after its base was written; eager raises",
                    node_location(f.root),
                )
            )
        v = self.info.value(a)
        node = self.walk.materialize(v)
        # A caller's tensor made under no_grad, in an alias group with its base: its views are replayed from the
        # group's base, which is made from the members' common `_base`, a history eager's gradient of such a view
        # never reaches (fuzz seed 1040411).
        cut = f.nograd or f.input_leaf and v.storage.kind is StorageKind.GROUP
        return self.emit.call(grad_leaf, node) if cut and f.base_rg else node

    def replay_for_grad(self, v: Value) -> bool:
        """Whether the view `v`, last replayed under no_grad, is read with grad on: eager's view was made with
        grad on, so it is replayed again (a cached one is not differentiable)."""
        return bool(v in self.replayed_without_grad and self.emit.grad)

    def replayed(self, v: Value) -> None:
        """`v` was replayed from its base, in the current grad mode."""
        if v.chain and self.emit.grad is False:
            self.replayed_without_grad.add(v)
        else:
            self.replayed_without_grad.discard(v)

    # -- layout changes in place -------------------------------------------------------------------
    def layout_changed(self, s: Storage, node: fx.Node, recorded: bool) -> None:
        """`node` changed the layout of a caller's tensor of `s` in place (`x.t_()`), recorded by autograd or
        not (under no_grad, or while `x` required no grad). dealias replays the change once, after the
        write-backs, recorded or not. Eager's unrecorded change leaves x's grad_fn made for the old layout,
        which takes gradients of the new layout as they come (for a square x, silently transposed): a
        differentiable use of the memory after it (a read, a write autograd records, a view made, a view returned:
        eager regenerates its grad_fn from the new layout) cannot
        be given that grad_fn, and runs the graph eagerly (see refuse_use_after_unrecorded_layout)."""
        if not recorded:
            self.unrecorded_layout.setdefault(s, node)

    def refuse_use_after_unrecorded_layout(self, s: Storage, what: str, grad: bool | None = None) -> None:
        """(`grad`: the mode of the use, the current one by default.)"""
        change = self.unrecorded_layout.get(s)
        if change is not None and (self.emit.grad if grad is None else grad):
            raise UnsupportedError(
                f"{what} with grad on, after an in-place layout change autograd did not record ({change.target} at "
                f"{node_location(change)}, under no_grad or before the tensor required grad): eager's grad_fn then "
                "maps gradients by the old layout"
            )

    # -- writes --------------------------------------------------------------------------------------
    def with_history(self, s: Storage, new: fx.Node, hidden: bool) -> fx.Node:
        """The value `new` a write leaves in storage `s`, as eager's tensor has it: a write autograd does not see
        (`hidden`: through detach or a dtype view; or under no_grad) keeps the base's history for later
        (history); one it sees of values that do not require grad into a base that does is `overwritten`."""
        base = self.walk.current(s)
        if (hidden or not self.emit.grad) and base.meta.get("rg"):
            self.history.setdefault(s, base)
        if self.emit.grad and not hidden and base.meta.get("rg") and not new.meta.get("rg"):
            new = self.emit.call(overwritten, base, new)
        elif self.emit.grad and not hidden and base.meta.get("rg") and covers_without_reading(new, base):
            new = self.emit.call(rewritten, base, new)
        return new

    def after_write(self, s: Storage, node: fx.Node, hidden: bool, result: fx.Node | None = None) -> None:
        """`node` has written storage `s` (with its value `result`): eager's version counter moves; at the last
        write of a caller's tensor that autograd reads later, the caller's tensor receives its value now."""
        self.result_apart.pop(s, None)
        if s.kind is StorageKind.INTERMEDIATE and self.emit.grad and not hidden and result is not None:
            if result.meta.get("rg") and self.walk.current(s) is not result:
                self.result_apart[s] = node
        if not _through_data(node, s, self.info):  # (`x.data.mul_(2)`: a counter of its own moves, not s's)
            self.version_counter_moves(s)
        self.refuse_unsafe_split_write(s, node)
        if self.emit.grad and not hidden:
            self.grad_views.read(self.info, written_nodes(node), self.writes)  # (a view written so is rebased)
            if self.walk.current(s).meta.get("rg"):  # (recorded by autograd)
                self.refuse_use_after_unrecorded_layout(s, "a write")
                self._recorded_unsafe_write(s, node)
            self.grad_writes.add(s)
        if self.writes_back_at(s, node):
            self._write_back_now(s)
        elif s in self.hidden_after and s in self.written_back:
            if not (hidden or not self.emit.grad):  # (hidden_writes.py saw no recorded write after the anchor)
                raise UnsupportedError(f"{node.target}: a recorded write after a hidden one's anchor; not compiled yet")
            self.hidden_write_back(s, node)

    def hidden_write_back(self, s: Storage, write: fx.Node) -> None:
        """A write autograd does not see of the caller's tensor of `s` (`write`), after its anchor (hidden_writes.py)
        wrote it back: written into it now, under no_grad, as eager's write, moving its version counter if eager's
        does (not through `x.data`). Its grad_fn stays the anchor's write-back, through which the reads since went,
        as eager's stays the anchor's node; later reads read it."""
        ph = self.walk.caller_placeholder(s)
        self.history.pop(s, None)  # (the caller's tensor carries the history)
        grad, self.emit.grad = self.emit.grad, False
        keep = not moves_counter(write, s, self.info)
        node = self.emit.call(write_back_now, ph, self.walk.current(s), keep_counter=keep)
        self.emit.grad = grad
        node.meta["rg"] = True
        self.walk.advance(s, node)
        self.back_at[s] = node

    def writes_back_at(self, s: Storage, node: fx.Node) -> bool:
        """Whether the caller's tensor of `s` receives its value at `node`, its last write, because autograd reads
        it later (an expanded caller tensor keeps its write-back of one of each repeat, at the end)."""
        return self.last_write.get(s) is node and internal_overlap(s.root_meta) == "no"

    def version_counter_moves(self, s: Storage) -> None:
        """Eager's version counter of `s` moves (a write, or `x.copy_(x)`, which writes nothing)."""
        self.writes[s] = self.writes.get(s, 0) + 1

    def saves_caller_result(self, node: fx.Node, v: Value) -> bool:
        """The last write of a caller's tensor that requires grad, by an in-place op whose backward saves its
        result (`relu_`, `sigmoid_`): eager saves the caller's tensor itself, so a write after the call makes
        backward raise. Asked of eager (saved.py)."""
        s = v.storage
        if self.last_input_write.get(s) is not node or not self.emit.grad or internal_overlap(s.root_meta) != "no":
            return False
        ph = self.walk.caller_placeholder(s)
        if not ph.meta.get("rg"):
            return False
        from .saved import saves_its_result

        return saves_its_result(node)

    def run_in_place_on_caller(self, node: fx.Node, v: Value, bound: dict[str, Any]) -> None:
        """Run the last write as eager does, in place on the caller's tensor (holding its value before the
        write), so its backward saves the caller's tensor; later reads read it."""
        s = v.storage
        self.refuse_unsafe_split_write(s, node)
        self.refuse_use_after_unrecorded_layout(s, "a write")
        ph = self.walk.caller_placeholder(s)
        if self.walk.current(s) is ph:  # not written yet
            caller = self.emit.call(caller_tensor, ph)
            caller.meta["rg"] = True
        else:  # it first receives its value before this write
            self._write_back_now(s)
            caller = self.walk.current(s)
        view = self.walk.replay(v, caller)
        op = node.target
        values = {n: (view if n == "self" else self.walk.read(a)) for n, a in bound.items()}
        args = [values[a.name] for a in op._schema.arguments if not a.kwarg_only and a.name in values]
        kwargs = {a.name: values[a.name] for a in op._schema.arguments if a.kwarg_only and a.name in values}
        written = self.emit.call(op, *args, **kwargs)
        after = self.emit.call(caller_after, caller, written)
        after.meta["rg"] = True
        self.walk.advance(s, after)
        self.version_counter_moves(s)
        self.grad_writes.add(s)
        self.written_back.add(s)

    def _write_back_now(self, s: Storage) -> None:
        """The caller's tensor of input storage `s` receives its final value here, at its last write, and later
        reads read it: ops that save it for backward save the caller's tensor itself, as eager's do, so an
        in-place write after the call (in a later graph, or in eager code) makes backward raise as in eager.
        Reads before read it through a clone (functionalize/inputs.py, protect_written_inputs)."""
        ph = self.walk.caller_placeholder(s)
        if s in self.history and s in self.grad_writes:
            self._restore_history(s)
        self.history.pop(s, None)  # the caller's tensor has eager's history from here on
        grad, self.emit.grad = self.emit.grad, s in self.grad_writes
        node = self.emit.call(write_back_now, ph, self.walk.current(s))
        self.emit.grad = grad
        node.meta["rg"] = bool(ph.meta.get("rg") or node.meta.get("rg"))
        self.walk.advance(s, node)
        self.written_back.add(s)
        self.back_at[s] = node

    def _restore_history(self, s: Storage) -> None:
        """Give storage `s` eager's history again: its current values, the gradient of its base from before the
        writes autograd did not see."""
        grad, self.emit.grad = self.emit.grad, True
        # At the output (no line of its own), the line of the last write, whose value it returns or writes back.
        stack_trace = self.emit.stack_trace
        base = self.walk.current(s)
        self.emit.stack_trace = stack_trace or base.meta.get("stack_trace")
        joined = self.emit.call(keep_history, self.history.pop(s), base)
        self.emit.grad, self.emit.stack_trace = grad, stack_trace
        self.walk.advance(s, joined)  # views read from here on are replayed from the base with history

    # -- the output ----------------------------------------------------------------------------------
    def before_output(self, storages: list[Storage], returned: list[Storage]) -> None:
        """A caller's tensor written with grad on is written back with its history, a returned intermediate is
        returned with it: eager's history, if writes invisible to autograd came since. (`storages`: every
        storage, in the order of their first values.)"""
        # Each write from the anchor on went into the caller's tensor (hidden_writes.py), or the graph runs eagerly.
        for s in self.hidden_after:
            if self.walk.current(s) is not self.back_at.get(s):
                raise UnsupportedError("a caller's tensor written after its hidden writes' anchor; not compiled yet")
        for s in [*(s for s in storages if s in self.grad_writes), *returned]:
            if s in self.history and (s in self.grad_writes or s.kind is StorageKind.INTERMEDIATE):
                self._restore_history(s)
        for s in dict.fromkeys(returned):
            self.refuse_saved_result_returned(s)

    def refuse_saved_result_returned(self, s: Storage) -> None:
        """The graph returns intermediate memory `s` whose last write (`v[:, 1].relu_()`) saves its result for
        backward. Eager's saved result is a view of that memory: a write of it after the graph (in the caller's
        code, or in the code after a graph break) makes backward raise. dealias's saved result is the value the
        op computed, apart from the memory it returns, so the graph runs eagerly."""
        node = self.result_apart.get(s)
        if node is None:
            return
        from .saved import saves_its_result

        if saves_its_result(node):
            with located(node_location(node)):
                raise UnsupportedError(
                    f"{node.target} writes part of a tensor the graph returns, with grad on, and autograd saves its "
                    "result: eager's backward raises if the tensor is written after the graph; dealias's would not"
                )

    def written_with_grad(self, s: Storage) -> bool:
        """Whether `s` was written with grad on (its write-back carries the written values' history)."""
        return s in self.grad_writes

    def output_slot(self, arg: fx.Node, slot: OutputSlot, full: tuple[Any, ...]) -> OutputSlot:
        """The output `slot` of the returned `arg`, with how eager made it: the grad mode of a returned view, a
        fragile view's or an `unsafe_split` element's own way of being rebuilt. (`full`: the chain from the
        storage's base that the slot's chain ends.)"""
        self.returns_unsafe_member(arg, slot)
        made = self.made_with_grad.get(getattr(self.info.values.get(arg), "obj", None))
        if made is not None and slot.chain:
            slot = replace(slot, grad=made)
        if self._fragile_of(arg) is not None:
            return self._fragile_output(arg, slot, full)
        if self.grad_views.stale(self.info, arg, slot, self.writes) and self._unsafe_of(arg) is None:
            return replace(slot, stale=True)
        if self._unsafe_of(arg) is not None and slot.same_as is None:
            multi = self._multi_output_step(self._unsafe_of(arg), full, slot)
            if multi is None:
                raise UnsupportedError("an element of unsafe_split is returned in a way not rebuilt exactly yet")
            return replace(slot, multi_output=multi)
        return slot

    def _fragile_output(self, arg: fx.Node, slot: OutputSlot, full: tuple[Any, ...]) -> OutputSlot:
        """A returned fragile view. Made under no_grad, eager's is a leaf that requires grad: replayed under
        no_grad it is one too. Written since, eager's raises when its grad_fn is read: a view of a caller's
        tensor is then made before the graph runs (OutputSlot.early), and the call's writes make it raise too.
        Of other memory, or a view made with grad on of a no_grad view (eager's has a grad_fn that ends at
        that leaf), the graph runs eagerly."""
        f = self.fragile[self.info.value(arg).obj]
        stale = self._stale(arg)
        start = self._step_in_slot(f.root, full, slot)
        # A view made with grad on right after the no_grad view it is taken of: eager's has a grad_fn ending at
        # that leaf; replayed as made, step by step, it has the same (stale, eager's error names its own op).
        next_to_root = start is not None and start == len(slot.chain) - 2
        as_stale = False
        if stale and not (f.nograd and f.made_with_grad) and slot.same_as is None and self._made_early(arg, slot, f):
            slot = replace(slot, early=True)
        elif stale and made_stale(self.info, arg, slot, f, next_to_root, self._unsafe_of(arg) is not None):
            as_stale = True
        elif stale or (f.nograd and f.made_with_grad and not next_to_root):
            raise UnsupportedError(
                with_location(
                    f"a view {f.why} is returned after its base was written or a view of it was made with grad "
                    "on; not compiled exactly yet",
                    node_location(f.root),
                )
            )
        if slot.same_as is not None:
            return slot
        unsafe = self._unsafe_of(arg)  # (a view made under no_grad of an unsafe_split element)
        # One multi-output step per output is replayed as made: the last one, which made the view's autograd facts
        # (its grad_fn, the op eager's errors name); earlier ones replay as plain views of the same memory.
        multi = self._multi_output_step(f.split_since or f.root, full, slot)
        by_unsafe = unsafe and self._multi_output_step(unsafe, full, slot)
        if multi and by_unsafe and by_unsafe != multi:
            # A split of an element: the element is a tensor of its own, the view's base (OutputSlot.unsafe_output)
            if by_unsafe.step > multi.step:
                raise UnsupportedError("a split of an unsafe_split element is returned; not rebuilt exactly yet")
            slot = replace(slot, unsafe_output=by_unsafe)
        multi = multi or by_unsafe
        if not f.nograd:
            if (slot.early or as_stale) and multi is None:  # (made as a plain view, its error would not be eager's)
                raise UnsupportedError(f"a view {f.why} is returned after its base was written; not compiled yet")
            return replace(slot, multi_output=multi, stale=as_stale)
        # Under no_grad from the view eager made there on (a copy before it, `flatten()` of an expanded
        # tensor, was made with grad on and requires grad).
        until = start + 1 if f.made_with_grad and start is not None else None
        before = steps_mode(self.info, f.root, start or 0)
        slot = replace(slot, grad=False, grad_from=start or 0, grad_before=before, grad_until=until, stale=as_stale)
        return replace(slot, multi_output=multi)

    def _made_early(self, arg: fx.Node, slot: OutputSlot, f: _Fragile) -> bool:
        """Whether the stale fragile view `arg`, returned as `slot`, can be made from the caller's tensor before
        the graph runs with eager's autograd state: a view of the caller's memory by a chain known before the
        graph runs, whose base required grad when the view was made and when the call began. The view itself
        was made before the first write since its fragile root was (one made after it is not stale in eager), no
        split came after that root (eager's error would name that split), and no unsafe_split between the caller's
        tensor and it."""
        if slot.source.kind not in (RefKind.INPUT, RefKind.GROUP) or not f.base_rg:
            return False
        if f.made_at != f.epoch or f.split_since is not None:
            return False
        if self._unsafe_of(arg) is not None:  # (an unsafe_split element has a version counter of its own)
            return False
        v, root = self.info.value(arg), self.info.value(f.root)
        if v.obj == root.obj and v.chain != root.chain:  # the root itself, changed in place since (`v.t_()`): eager's
            return False  # error names the split that made it, a replayed chain's would name its last step
        if any(isinstance(a, (fx.Node, torch.SymInt)) for a in chain_args(slot.chain)):
            return False
        return bool(self.walk.caller_placeholder(self.info.value(arg).storage).meta.get("rg"))

    def _multi_output_step(self, root: fx.Node, full: tuple[Any, ...], slot: OutputSlot) -> MultiOutputStep | None:
        """Where the output's chain has the split step of `root` (a split's element), and how eager made it."""
        if root.target is not operator.getitem or not isinstance(root.args[0].target, torch._ops.OpOverload):
            return None
        source = root.args[0]
        args = tuple(source.args[1:])
        if source.kwargs or any(isinstance(a, fx.Node) for a in pytree.tree_leaves(args)):
            return None
        k = self._step_in_slot(root, full, slot)
        return None if k is None else MultiOutputStep(k, source.target, args, root.args[1])

    def _step_in_slot(self, root: fx.Node, full: tuple[Any, ...], slot: OutputSlot) -> int | None:
        """The position in `slot`'s chain (the end of `full`) of the step that made `root`: by position, not by
        equality (`x.narrow(0, 0, 1).unsafe_chunk(2)[0]` is two equal slices)."""
        own = self.info.value(root).chain
        n = len(full) - len(slot.chain)  # the steps to the caller's tensor the slot starts from
        if not own or n < 0 or tuple(full[: len(own)]) != own or tuple(full[n:]) != slot.chain:
            return None
        k = len(own) - 1 - n
        return k if 0 <= k < len(slot.chain) else None


def _through_data(node: fx.Node, s: Storage, info: AliasInfo) -> bool:
    """Whether `node` writes storage `s` only through `x.data` (or views of it): eager's `.data` has a version
    counter of its own, so views of x do not go stale (fuzz seed 2476980: a view of a no_grad view, read after
    `v.data.mul_(-2)`, raised reading its grad_fn where eager's did not)."""
    # (not a reshape's copy, another counter of its own: a write through it makes that counter's views stale)
    written = [a for a in written_nodes(node) if getattr(info.values.get(a), "storage", None) is s]
    return bool(written) and all(data_node(a) is not None for a in written)


@dataclass(frozen=True)
class _Fragile:
    """A view of a tensor that requires grad, made under no_grad or taken from a multi-output view (split,
    unbind), or a view of one. Eager raises when it is written with grad on, and when its grad_fn is read after
    its storage was written (any write, since `epoch` writes). Made under no_grad (`nograd`), eager's is a leaf
    that requires grad: no gradient goes through it to its base."""

    root: fx.Node
    epoch: int
    nograd: bool
    why: str
    made_with_grad: bool  # this view itself (a view of a no_grad view made with grad on has a grad_fn)
    # Whether its base required grad when it was made. A view made under no_grad of one that did not is an
    # ordinary tensor until a write with grad on makes its base require grad; then eager raises reading its grad_fn.
    base_rg: bool = True
    made_at: int = 0  # the storage's writes when this view itself was made (`epoch`: when the root was)
    split_since: fx.Node | None = None  # the last split's element this view was made from, since the root
    # Its root is a caller's tensor made under no_grad: eager's is a leaf without an accumulator, and so is the
    # history of every view of it (no gradient goes anywhere from them).
    input_leaf: bool = False
