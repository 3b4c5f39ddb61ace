"""Functionalize: turn a captured graph (in-place ops, views, out= ops) into a graph with no mutation, plus
a write-back plan for the caller's tensors and an alias plan for the outputs.

Per op, in program order (docs/architecture.md has the long version):
- a view records nothing: its value is regenerated from its storage's current base when read;
- a write to a value computes the functional op, pushes the result down the value's view chain with the
  view inverses to get the storage's new base, and bumps the storage's version;
- a read of a value whose version is behind replays its view chain on the current base.
Intermediate storages need no copy at all: their final contents are just the last SSA value.
"""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..errors import EagerSemanticsError, UnsupportedError, located, node_location
from ..ir.draws import draw_like
from ..ir.emitter import Emitter
from ..ir.gradops import bump_version, caller_tensor, write_back_now
from ..ir.opfacts import (
    OpKind,
    bind_args,
    facts,
    is_view_node,
    is_view_target,
    returned_args,
    writes_nothing,
)
from ..ir.plan import (
    Captured,
    FunctionalProgram,
    MetadataWriteBack,
    OutputSlot,
    Ref,
    RefKind,
    ResultArg,
    StorageKind,
    WriteBack,
    group_placeholder,
)
from ..ir.regions import emit_region_write, owning_node, restride
from ..ir.viewops import (
    ViewStep,
    as_strided_rel,
    chain_args,
    internal_overlap,
    map_chain_args,
    replay,
    replay_chain,
)
from .alias import AliasInfo, Storage, Value, resizes_nothing
from .autograd_facts import AutogradFacts
from .writecheck import check_invertible, check_writable, eager_metadata_error

aten = torch.ops.aten


def functionalize(captured: Captured, info: AliasInfo) -> FunctionalProgram:
    return _Functionalizer(captured, info).run()


class _Functionalizer:
    def __init__(self, captured: Captured, info: AliasInfo) -> None:
        self.src = captured.gm
        self.info = info
        self.requires_grad = captured.requires_grad
        self.detached_inputs = captured.detached
        self.restricted_inputs = captured.restricted
        self.graph = fx.Graph()
        self.emit = Emitter(self.graph, captured.fake_mode)
        self.base: dict[Storage, fx.Node] = {}  # current base value of each storage
        self.roots: dict[Storage, fx.Node] = {}  # each storage's first value: the caller's tensor for theirs
        self.version: dict[Storage, int] = {}
        self.cache: dict[Value, tuple[fx.Node, int]] = {}  # value -> (materialized node, storage version)
        self.emitted: dict[fx.Node, fx.Node] = {}  # captured multi-output node -> its functional node
        self.latest: dict[int, Value] = {}  # tensor object -> its latest value (metadata mutations)
        self.first: dict[int, Value] = {}  # caller's tensor object -> its value on entry
        self.born: dict[int, Value] = {}  # tensor object made inside the graph -> its value when made
        self.caller_objs: dict[int, Ref] = {}  # caller's tensor objects (inputs, constants)
        self.detached: set[int] = set()  # tensor objects that ran detach_()
        # Caller's tensor object -> whether autograd recorded its in-place layout changes ({True}, {False}): they
        # are replayed as one change after the write-backs, recorded or not, as eager's were.
        self.meta_recorded: dict[int, set[bool]] = {}
        self.placeholder_ref: dict[fx.Node, Ref] = {}  # caller base placeholders
        self.member_steps: dict[Ref, list[tuple[fx.Node, ViewStep]]] = {}  # alias group -> member views
        self.member_ph: dict[int, fx.Node] = {}  # alias group member (object) -> its placeholder
        self.nograd_members: set[fx.Node] = set()  # placeholders of members made under no_grad (restricted inputs)
        self.counters_moved: set[int] = set()  # members whose version counter the graph moves (move_counter)
        # Caller memories, and alias group members (objects), whose version counters eager's program moves
        # (record_counter_move): the others keep theirs (FunctionalProgram.unmoved_counters).
        self.counter_written: set[Storage] = set()
        self.members_moved: set[int] = set()
        self.program = FunctionalProgram(fx.GraphModule({}, fx.Graph()))
        self.scalars: dict[fx.Node, fx.Node] = {}  # captured symbolic scalar -> its node here
        self.fake_symbolic = captured.fake_mode.shape_env is not None  # the program has symbols
        # Eager's autograd facts no aten op states: told of every op, read, write and output (see Walk for what it
        # asks of this walk).
        self.autograd = AutogradFacts(self, captured.gm, any(self.requires_grad))

    # -- reading -------------------------------------------------------------------------------------
    def materialize(self, v: Value) -> fx.Node:
        """The node holding `v`'s current contents, replaying its view chain if a write made it stale."""
        hit = self.cache.get(v)
        if hit is not None and hit[1] == self.version[v.storage] and not self.autograd.replay_for_grad(v):
            return hit[0]
        node = self.replay(v, self.base[v.storage])
        self.cache[v] = (node, self.version[v.storage])
        self.autograd.replayed(v)
        return node

    def replay(self, v: Value, on: fx.Node) -> fx.Node:
        """`v`'s view chain replayed on `on` (its storage's base, or another value of its layout)."""
        return replay_chain(self._steps(v.chain), on, self.emit.call)

    def current(self, s: Storage) -> fx.Node | None:
        """Storage `s`'s current base, None before it has one."""
        return self.base.get(s)

    def advance(self, s: Storage, node: fx.Node) -> None:
        """Storage `s` now holds `node`: its views are replayed from it when next read."""
        self.base[s] = node
        self.version[s] += 1

    def read(self, a: Any) -> Any:
        """Map captured-graph arguments (nodes, lists of nodes) to current functional nodes."""
        if isinstance(a, fx.Node):
            v = self.info.values[a]
            if isinstance(v, Value):
                if self.autograd.unrecorded_layout and self.autograd.requires_grad(a):
                    self.autograd.refuse_use_after_unrecorded_layout(v.storage, "a read")
                if self.autograd.reads_fragile(v):
                    return self.autograd.read_fragile(a)
                return self.autograd.read_unsafe_element(v, self.materialize(v))
            return self.emitted[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.read(x) for x in a)
        if isinstance(a, dict):
            return {k: self.read(x) for k, x in a.items()}
        return a

    # -- writing -------------------------------------------------------------------------------------
    def write(self, v: Value, new: fx.Node, node: fx.Node, counted: bool = True) -> None:
        """`v` now holds `new`: rebuild its storage's base through the inverses of v's view chain."""
        meta = v.meta
        new_meta = new.meta["val"]
        s = v.storage
        if tuple(new_meta.shape) != tuple(meta.shape) and self._fresh_out(v):
            # An empty tensor made inside the program as an out= argument (composites do this: linalg.inv,
            # msort, log_sigmoid) is resized by eager to the result, contiguous: nothing else sees its memory, so
            # the result simply becomes that tensor.
            if new_meta.dtype != meta.dtype:
                new = self.emit.call(aten._to_copy.default, new, dtype=meta.dtype)
            self.advance(s, new)
            return
        if tuple(new_meta.shape) != tuple(meta.shape):
            raise UnsupportedError(
                f"{node.target} would resize its {tuple(meta.shape)} argument to {tuple(new_meta.shape)}; "
                "pass an argument of the result's shape"
            )
        if new_meta.dtype != meta.dtype:
            if not torch.can_cast(new_meta.dtype, meta.dtype):
                # Eager's in-place and out= kernels refuse to cast their result down a kind (`int.mul_(2.5)`);
                # fake tensors do not check it for every op, and the cast below would write the truncated value.
                error = eager_metadata_error(node)  # (in eager's words, where its kernel can be asked)
                if error is not None:
                    raise error
                raise EagerSemanticsError(
                    f"{node.target}: result type {_scalar_name(new_meta.dtype)} can't be cast to the desired "
                    f"output type {_scalar_name(meta.dtype)}"
                )
            new = self.emit.call(aten._to_copy.default, new, dtype=meta.dtype)
        # Eager writes through a dtype or detached view without touching the base's autograd history.
        detached = self._through_detached(v)
        hidden = detached and self.base[s].meta.get("rg")
        if detached and new.meta.get("rg"):
            # ...but the view itself then has the history of the value written into it, which a view replayed
            # from the base cannot have.
            raise UnsupportedError(
                f"{node.target} writes a value that requires grad through a non-differentiable view (detach, "
                "an integer dtype view)"
            )
        # bases[i] is the value the i-th step of the chain applies to; bases[-1] is v itself.
        chain = self._steps(v.chain)
        bases = [self.base[s]]
        for step in chain:
            bases.append(replay(step, bases[-1], self.emit.call))
        overlapping = [k for k in range(1, len(bases)) if internal_overlap(bases[k].meta["val"]) != "no"]
        if overlapping and self.emit.grad and not hidden and self.base[s].meta.get("rg"):
            # Eager writes it, and its backward (copying the gradient into the overlapping view) raises "more than
            # one element of the written-to tensor refers to a single memory location": run eagerly.
            raise UnsupportedError(f"{node.target} writes an overlapping view of a tensor that requires grad")
        if overlapping:
            # A view in the chain overlaps itself (`x.expand(2, n)[0] = 1`, `x.expand(2, n).fill_(1)`): its
            # values cannot stand in for memory. Write the rest of the chain, from the last base before it
            # that has the view's dtype, as one strided region of that base (every alias of a location
            # receives the same value: see writecheck.UNIFORM_WRITES).
            view = bases[-1].meta["val"]
            starts = [
                i
                for i in range(overlapping[0])
                if all(b.meta["val"].dtype == view.dtype for b in bases[i:])
                and internal_overlap(bases[i].meta["val"]) == "no"
            ]
            if not starts:
                raise UnsupportedError(f"{node.target} writes through an overlapping view of another dtype")
            i = starts[-1]
            rel = view.storage_offset() - bases[i].meta["val"].storage_offset()
            step = ViewStep(as_strided_rel, (list(view.shape), list(view.stride()), rel))
            chain = (*chain[:i], step)
            bases = [*bases[: i + 1], self.emit.call(as_strided_rel, bases[i], *step.args)]
        result = new
        if chain:
            check_invertible(chain, bases, node)
            new = emit_region_write(self.emit, bases[0], bases[1:], new)
        else:
            new = restride(self.emit, new, s.root_meta)
        self.advance(s, self.autograd.with_history(s, new, bool(hidden)))
        self.autograd.after_write(s, node, bool(hidden), result)
        # (`counted`: False for a write eager's kernel makes without moving the counter, OpFacts.counted)
        if counted and s.kind is StorageKind.GROUP:  # (a caller's own tensor: its write-back moves its counter)
            self.move_counter(v)
        elif counted:
            self.record_counter_move(v)

    def move_counter(self, v: Value) -> None:
        """Eager's write of a caller's tensor through `v` moves the version counter `v` shares: what autograd
        saved of that tensor before is stale. Members of an alias group need not share one counter (an
        unsafe_chunk element passed with its base: fuzz seed 971090), and the write-back into the group's base
        moves one member's, so the member a write went through is moved here, once per graph; a tensor with a
        counter of its own made in the graph (an unsafe_chunk element of any caller's tensor: its `unsqueeze_`
        moves the element's counter alone, fuzz seed 1760323) moves no caller's."""
        s = v.storage
        if v.counter is None:
            return
        self.record_counter_move(v)
        if s.kind is not StorageKind.GROUP:
            self.emit.call(bump_version, self.roots[s])
        elif v.counter is not None and v.counter not in self.counters_moved:
            self.counters_moved.add(v.counter)
            self.emit.call(bump_version, self.member_ph[v.counter])

    def record_counter_move(self, v: Value) -> None:
        """Eager's program moves the version counter `v` shares (a write through `v`, an in-place layout change,
        `x.copy_(x)`), if `v` is of a caller's memory and shares one of the caller's counters."""
        if v.counter is not None and v.storage.kind is not StorageKind.INTERMEDIATE:
            self.counter_written.add(v.storage)
            if v.storage.kind is StorageKind.GROUP:
                self.members_moved.add(v.counter)

    def caller_placeholder(self, s: Storage) -> fx.Node:
        """The placeholder of caller storage `s`: the caller's tensor itself, or its alias group's base (a view of
        the members' memory, sharing one member's version counter)."""
        return next(p for p, ref in self.placeholder_ref.items() if ref == s.ref())

    def _fresh_out(self, v: Value) -> bool:
        """`v` is a whole tensor with no elements, made inside the program and not seen by the caller, so an
        out= write may resize it as eager does: to the result's shape, with the layout its kernel gives it (linalg
        kernels restride their outputs column-major, as their functional forms return them)."""
        s = v.storage
        return s.kind is StorageKind.INTERMEDIATE and not v.chain and v.meta.numel() == 0 and v.obj == s.root_obj

    def copy_value(self, dst: fx.Node, src: fx.Node) -> fx.Node:
        """The functional `copy(dst, src)`, differentiable when autograd needs it: src cast to dst's dtype and
        broadcast to its shape, as a tensor of its own. When dst's old value has a history, eager's copy_ sends it
        a zero gradient (a custom Function's backward then runs with zeros, a hook on it sees them, and a leaf
        behind it gets zeros, not None: fuzz seed 1032924); `where` with a false condition keeps that edge and
        takes every element from src, exactly (a NaN or inf in dst stays out of the result). A view's region
        write scatters the value into its base, whose backward already gives the region zeros."""
        d, v = dst.meta["val"], src.meta["val"]
        if v.dtype != d.dtype:
            src = self.emit.call(aten._to_copy.default, src, dtype=d.dtype)
        if dst.meta.get("rg") and not is_view_node(dst):
            never = self.emit.call(aten.zeros.default, [], dtype=torch.bool, device=d.device)
            return self.emit.call(aten.where.self, never, dst, src)
        if tuple(v.shape) != tuple(d.shape):
            src = self.emit.call(aten.expand.default, src, list(d.shape))
        return self.emit.call(aten.clone.default, src)

    # -- the walk ------------------------------------------------------------------------------------
    def run(self) -> FunctionalProgram:
        groups_done = False
        for node in self.src.graph.nodes:
            self.emit.stack_trace = node.meta.get("stack_trace")
            self.emit.grad = node.meta.get("grad")
            if node.op == "placeholder":
                self._placeholder(node)
                continue
            if not groups_done:  # alias-group bases are placeholders after the tensor inputs
                self._group_placeholders()
                groups_done = True
            with located(node_location(node)):  # (every error below names the op's line)
                if node.op == "get_attr":
                    self._get_attr(node)
                elif node.op == "call_function":
                    self._call(node)
                elif node.op == "output":
                    self._output(node)
        self._protect_written_inputs()
        self.program.gm = fx.GraphModule(self.program.constants, self.graph)
        return self.program

    def _protect_written_inputs(self) -> None:
        """Under autograd, the graph reads a written input through a clone. Ops that save their inputs for
        backward then save the clone, and the write-back into the caller's tensor after the graph cannot
        invalidate them ("modified by an inplace operation"); gradients still reach the input's history."""
        placeholders = self.graph.find_nodes(op="placeholder")
        targets = [wb.target for wb in self.program.writebacks] + [s.ref() for s in self.autograd.written_back]
        for target in targets:
            ph = next((p for p in placeholders if self.placeholder_ref.get(p) == target), None)
            # An input that does not require grad can still be saved for backward by an op that does record
            # it (batch norm saves its running stats): protect it whenever a reader of it is differentiable.
            if ph is None or not (ph.meta.get("rg") or any(u.meta.get("rg") for u in ph.users)):
                continue
            if not _read_with_grad(ph):  # only ops run with grad on save (an optimizer step saves nothing)
                continue
            with self.graph.inserting_after(placeholders[-1]):
                clone = self.graph.call_function(aten.clone.default, (ph,))
            clone.meta.update(val=ph.meta["val"], rg=bool(ph.meta.get("rg")), grad=True)
            for user in list(ph.users):
                if user is not clone and user.target not in (write_back_now, caller_tensor, bump_version):
                    user.replace_input_with(ph, clone)
            for member, step in self.member_steps.get(target, []):  # members of the alias group
                own = member in self.nograd_members
                with self.graph.inserting_after(clone):
                    if own:
                        # A view made under no_grad is a leaf of its own in eager: as a view of the base's clone it
                        # would send its gradient into the base's history (fuzz seed 994811). Cloned on its own.
                        view = self.graph.call_function(aten.clone.default, (member,))
                    else:
                        view = self.graph.call_function(as_strided_rel, (clone, *self.emit.symbolic(step.args)))
                rg = member.meta.get("rg") if own else ph.meta.get("rg")
                view.meta.update(val=member.meta["val"], rg=bool(rg), grad=True)
                for user in list(member.users):
                    # (not the clone itself; bump_version moves the caller's tensor's counter, not the clone's)
                    if user is not view and user.target is not bump_version:
                        user.replace_input_with(member, view)

    def _new_storage(self, s: Storage, node: fx.Node) -> None:
        if s not in self.base:
            self.base[s] = node
            self.roots[s] = node
            self.version[s] = 0

    def _caller_root(self, v: Value, node: fx.Node, ref: Ref) -> None:
        self.cache[v] = (node, 0)
        self.first[v.obj] = self.latest[v.obj] = v
        self.caller_objs.setdefault(v.obj, ref)

    def _steps(self, chain: tuple[ViewStep, ...]) -> tuple[ViewStep, ...]:
        """`chain` with its symbolic arguments (captured nodes: `select(1, pos)`) as this graph's nodes."""
        if not self.scalars:
            return chain
        return map_chain_args(chain, fx.Node, self.scalars.__getitem__)

    def _placeholder(self, node: fx.Node) -> None:
        if self.info.values[node] is None:  # a symbolic scalar input
            ph = self.graph.placeholder(node.name)
            ph.meta["val"] = node.meta["val"]
            self.scalars[node] = self.emitted[node] = ph
            return
        v = self.info.value(node)
        ph = self.graph.placeholder(node.name)
        ph.meta["val"] = node.meta["val"]
        ph.meta["rg"] = self.requires_grad[self.info.input_index[node]]
        if v.storage.kind is StorageKind.INPUT:
            self._new_storage(v.storage, ph)
            self.placeholder_ref[ph] = Ref(RefKind.INPUT, v.storage.index)
        else:
            self.member_steps.setdefault(Ref(RefKind.GROUP, v.storage.index), []).append((ph, v.chain[0]))
            self.member_ph[v.obj] = ph
        # A member of an alias group reads as its own placeholder until the group is first written.
        self._caller_root(v, ph, Ref(RefKind.INPUT, self.info.input_index[node]))
        if self.info.input_index[node] in self.detached_inputs:
            self.detached.add(v.obj)
        why = self.restricted_inputs.get(self.info.input_index[node])
        if why is not None:
            self.autograd.restricted_input(node, why)
            if why == "made under no_grad" and v.storage.kind is StorageKind.GROUP:
                self.nograd_members.add(ph)

    def _group_placeholders(self) -> None:
        for s in self.info.storages:
            if s.kind is StorageKind.GROUP:
                ph = group_placeholder(self.graph, s.index)
                ph.meta["val"] = s.root_meta
                ph.meta["rg"] = any(self.requires_grad)
                self.placeholder_ref[ph] = Ref(RefKind.GROUP, s.index)
                self._new_storage(s, ph)

    def _get_attr(self, node: fx.Node) -> None:
        v = self.info.value(node)
        if v.storage in self.base:
            return
        name = v.storage.constant
        self.program.constants[name] = getattr(self.src, node.target)
        attr = self.graph.get_attr(name)
        val = node.meta["val"]
        if getattr(val, "fake_mode", self.emit.fake_mode) is not self.emit.fake_mode:
            # A constant dynamo lifted (`v[7] = -2.0` makes a tensor of -2.0) came with a fake value of dynamo's
            # mode: ops on it in this graph's mode would raise ("Mixing fake modes").
            val = self.emit.fake_mode.from_tensor(self.program.constants[name], static_shapes=True)
        attr.meta["val"] = val
        attr.meta["rg"] = bool(getattr(self.program.constants[name], "requires_grad", False))
        self._new_storage(v.storage, attr)
        self._caller_root(v, attr, Ref(RefKind.CONSTANT, name))

    def _call(self, node: fx.Node) -> None:
        op = node.target
        v = self.info.values.get(node)
        if isinstance(v, Value):
            self.born.setdefault(v.obj, v)
        self.autograd.before_op(node)
        if v is None and isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool, torch.SymFloat)):
            # Arithmetic on symbols or a tensor's symbolic size (`pos + 1`, `x.size(0)`): computed in the graph.
            self.scalars[node] = self.emitted[node] = self.emit.call(
                op, *self.read(node.args), **self.read(node.kwargs)
            )
            return
        if op is operator.getitem:
            if isinstance(v, Value) and v.storage not in self.base:  # an element of a functional tuple
                item = self.emit.call(operator.getitem, self.emitted[node.args[0]], node.args[1])
                self._bind_fresh(v, item)
            return
        f = facts(op)
        if is_view_target(op):
            return  # materialized from its base when read
        if f.kind is OpKind.INPLACE_VIEW:
            self.latest[v.obj] = v
            resize = op in (aten.resize_.default, aten.resize_as_.default)
            if resize and resizes_nothing(node, self.info.value(node.args[0]).meta):
                return  # (eager's version counter stays)
            if op is aten.detach_.default:  # (which leaves the version counter alone)
                self.detached.add(v.obj)
                return
            # Eager's version counter moves: a split's element goes stale, what autograd saved of the memory too.
            self.autograd.version_counter_moves(v.storage)
            recorded = bool(self.emit.grad) and self.autograd.requires_grad(node.args[0])
            if (
                v.storage.kind is StorageKind.INTERMEDIATE
                and not recorded
                and self.autograd.requires_grad(node.args[0])
            ):
                # Of memory the program made, too: eager's grad_fn keeps the old layout (fuzz seed 965515:
                # `where(..)` transposed under no_grad, then squeezed; eager's backward raises on the shapes).
                self.autograd.layout_changed(v.storage, node, recorded)
            if v.storage.kind is not StorageKind.INTERMEDIATE:  # (of a caller's tensor: moved on it too)
                self.move_counter(v)
                self.autograd.layout_changed(v.storage, node, recorded)
                kinds = self.meta_recorded.setdefault(v.obj, set())
                if kinds and recorded not in kinds:
                    raise UnsupportedError(
                        f"{op}: in-place layout changes of one tensor, some recorded by autograd and some not "
                        "(under no_grad): eager's grad_fn maps gradients through the recorded ones only"
                    )
                kinds.add(recorded)
            return
        if f.kind is OpKind.FUNCTIONAL or writes_nothing(op, node.args, node.kwargs, f.mutated):
            self._functional(node, op, self.read(node.args), self.read(node.kwargs), v)
            return
        self._mutation(node, f)

    def _bind_fresh(self, v: Value, node: fx.Node) -> None:
        self._new_storage(v.storage, node)
        self.cache[v] = (node, 0)
        self.latest[v.obj] = v

    def _functional(self, node: fx.Node, op: Any, args: Any, kwargs: Any, v: Any) -> fx.Node:
        out = self.emit.call(op, *args, **kwargs)
        if isinstance(v, Value):
            self._bind_fresh(v, out)
        else:
            self.emitted[node] = out
        return out

    def _mutation(self, node: fx.Node, f: Any) -> None:
        op = node.target
        bound = bind_args(op._schema, node.args, node.kwargs)
        outs = [a.name for a in op._schema.arguments if a.is_out]
        if f.out_only is not None and all(bound.get(m) is None for m in f.mutated if m not in outs):
            # `native_batch_norm(.., out=..)` without running stats: an out= op of native_batch_norm.default.
            f = replace(f, kind=OpKind.OUT, mutated=tuple(outs), functional=f.out_only)
        if f.functional is None:
            raise UnsupportedError(f"{op} has no functional counterpart known to dealias")
        if op is aten.copy_.default and bound["self"] is bound["src"] and not self._recorded_self_copy(bound["self"]):
            # `x.copy_(x)`: eager returns at once, touching no value; its version counter moves. Autograd records it
            # (the copy's backward): through a view whose elements overlap (`x.unfold(0, 2, 1)`), that gathers the
            # gradient once per alias of an element, which no functional program here reproduces: run eagerly.
            if self.emit.grad and internal_overlap(self.info.value(bound["self"]).meta) != "no":
                if self.autograd.requires_grad(bound["self"]):
                    raise UnsupportedError(f"{op} of an overlapping view onto itself, recorded by autograd")
            v = self.info.value(bound["self"])
            s = v.storage
            # The last write of a caller's tensor read later with grad on (autograd_facts.after_write): eager's
            # tensor has the copy's grad_fn from here, and later reads (and a hook registered later) go through it.
            # The write-back of its value now stands for it, moving the version counter once, as eager's copy.
            now = self.autograd.writes_back_at(s, node)
            hidden = self._through_detached(v) and self.base[s].meta.get("rg")
            self.autograd.after_write(s, node, bool(hidden))  # (refuses a write of an unsafe_split element too)
            self.record_counter_move(v)  # (with `now`, by the write-back that stands for the copy)
            if s.kind is StorageKind.GROUP or (s.kind is not StorageKind.INTERMEDIATE and not now):
                self.move_counter(v)  # what autograd saved of it is stale
            return
        lists = [n for n, a in bound.items() if isinstance(a, (list, tuple)) and a and isinstance(a[0], fx.Node)]
        foreach = op._schema.name.startswith("aten::_foreach_")  # the i-th result depends on the i-th inputs only
        if foreach and lists and self._crosses_indices(bound, lists, f.mutated):
            # A foreach op whose i-th write is read at another index (`_foreach_mul_([a, b], [b, a])`): eager
            # applies it tensor by tensor, so the later elements see the earlier writes. Do the same.
            for i in range(len(bound[lists[0]])):
                self._mutate(node, f, {n: [a[i]] if n in lists else a for n, a in bound.items()})
            return
        self._mutate(node, f, bound)

    def _through_detached(self, v: Value) -> bool:
        """Whether `v` is reached from its base through a view autograd does not follow (`detach()`, a dtype view):
        eager writes through it without touching the base's history."""
        return any(_hides_grad(step, self.base[v.storage]) for step in v.chain)

    def _recorded_self_copy(self, a: fx.Node) -> bool:
        """`x.copy_(x)` with grad on, of a caller's tensor that requires grad, through no view whose elements
        overlap: autograd records it, and eager's x has the copy's grad_fn from here (a hook registered later
        hooks it; what was computed from x before does not go through it). It is written as any write is: the
        caller's tensor receives its own value, with that history, and its version counter moves."""
        v = self.info.value(a)
        s = v.storage
        if not self.emit.grad or s.kind is StorageKind.INTERMEDIATE or s in self.autograd.unsafe_split_rg:
            return False
        return bool(self.caller_placeholder(s).meta.get("rg")) and internal_overlap(v.meta) == "no"

    def _crosses_indices(self, bound: dict[str, Any], lists: list[str], mutated: tuple[str, ...]) -> bool:
        written = [self.info.value(a).storage for n in lists if n in mutated for a in bound[n]]
        for n in lists:
            for j, a in enumerate(bound[n]):
                s = self.info.value(a).storage
                if any(w is s for i, w in enumerate(written) if i != j):
                    return True
        return False

    def _mutate(self, node: fx.Node, f: Any, bound: dict[str, Any]) -> None:
        op = node.target
        schema = op._schema
        targets: list[Value] = []  # every written tensor, list arguments (foreach ops) flattened
        counted: list[bool] = []  # ...and whether eager moves its version counter (OpFacts.counted)
        for name in f.mutated:
            arg = bound.get(name)
            if isinstance(arg, fx.Node):
                targets.append(self.info.value(arg))
                counted.append(name in f.counted)
            elif isinstance(arg, (list, tuple)):
                targets.extend(self.info.value(a) for a in arg)
                counted += [name in f.counted] * len(arg)
        others = [
            self.info.values[a]
            for name, arg in bound.items()
            if name not in f.mutated
            for a in (arg if isinstance(arg, (list, tuple)) else [arg])
            if isinstance(a, fx.Node) and isinstance(self.info.values.get(a), Value)
        ]
        check_writable(node, targets, others)
        if f.kind is OpKind.INPLACE and len(targets) == 1 and self.autograd.saves_caller_result(node, targets[0]):
            self.autograd.run_in_place_on_caller(node, targets[0], bound)
            self.record_counter_move(targets[0])  # (in place on the caller's tensor itself)
            return
        # out= arguments are dropped; the functional schema lists the rest in the same order.
        kept = [a.name for a in schema.arguments if not (a.is_out and a.name in f.mutated)]
        defaults = bind_args(schema, (), {}, defaults=True)
        args, kwargs = _to_call(f.functional._schema, kept, {n: self.read(a) for n, a in bound.items()}, defaults)
        factory = "dtype" in {a.name for a in f.functional._schema.arguments} and "dtype" not in kept
        if f.kind is OpKind.OUT and factory:
            out_meta = targets[0].meta  # a factory: makes a tensor of the out= tensor's dtype, on its device
            kwargs.update(dtype=out_meta.dtype, device=out_meta.device)
        elif f.computes_in_out_dtype and kwargs.get("dtype") is None:
            args, kwargs = self._in_out_dtype(f, args, kwargs, targets[0].meta.dtype)
        if f.functional is aten.copy.default and any(isinstance(a, fx.Node) and a.meta.get("rg") for a in args[:2]):
            out = self.copy_value(args[0], args[1])  # aten.copy has no derivative
        elif f.nondeterministic and f.kind in (OpKind.INPLACE, OpKind.MUTABLE) and _draws_into_tensors(f, bound):
            # (ir.draws) Every argument given, so that all go by position where the schema allows (a name may be a
            # Python keyword: `uniform_(self, from, to)`).
            full = {n: self.read(a) for n, a in bind_args(schema, node.args, node.kwargs, defaults=True).items()}
            draw_args, draw_kwargs = _to_call(schema, list(full), full, {})
            out = self.emit.call(draw_like, op, *draw_args, **draw_kwargs)
        elif f.functional is aten.zero.default:  # (aten.zero has no derivative for complex results; fill has)
            out = self.emit.call(aten.fill.Scalar, *args, 0)
        else:
            out = self.emit.call(f.functional, *args, **kwargs)
        if f.kind is OpKind.MUTABLE:
            # The functional form returns the op's own results, then the new value of each written argument that
            # is not an out= argument; an out= argument's new value is the result returned as it.
            n = len(schema.returns)
            returns = returned_args(schema)
            rest = [m for m in f.mutated if m not in returns]
            results = [self.emit.call(operator.getitem, out, i) for i in range(n + len(rest))]
            returned = self.info.values[node]
            for rv, res, arg in zip(returned if isinstance(returned, tuple) else (returned,), results, returns):
                if isinstance(rv, Value) and arg is None:
                    self._bind_fresh(rv, res)
            new_values = [
                results[returns.index(name)] if name in returns else results[n + rest.index(name)]
                for name in f.mutated
                if isinstance(bound.get(name), fx.Node)
            ]
        elif isinstance(out.meta["val"], (list, tuple)):
            new_values = [self.emit.call(operator.getitem, out, k) for k in range(len(targets))]
        else:
            new_values = [out]
        if f.kind is OpKind.OUT and any(n.meta["val"].dtype != t.meta.dtype for t, n in zip(targets, new_values)):
            error = eager_metadata_error(node)  # (a cast would write it; some kernels refuse instead)
            if error is not None:
                raise error
        for target, new, moves in zip(targets, new_values, counted, strict=True):
            self.write(target, new, node, moves)

    def _in_out_dtype(
        self, f: Any, args: list[Any], kwargs: dict[str, Any], dtype: torch.dtype
    ) -> tuple[list[Any], dict[str, Any]]:
        """The functional call of an out= reduction computing in its out= tensor's `dtype`
        (opfacts.COMPUTES_IN_OUT_DTYPE): given that `dtype`, or, for an op without the argument (`std`), its input
        cast to it first (what the argument does). Unchanged where the op cannot compute in that dtype (`mean`
        into an integer tensor): eager raises the cast error the write then raises too."""
        if not args or not isinstance(args[0], fx.Node) or args[0].meta["val"].dtype == dtype:
            return args, kwargs
        if "dtype" in {a.name for a in f.functional._schema.arguments}:
            new_args, new_kwargs = args, {**kwargs, "dtype": dtype}
        else:
            new_args, new_kwargs = [self.emit.call(aten._to_copy.default, args[0], dtype=dtype), *args[1:]], kwargs
        fargs, fkwargs = pytree.tree_map_only(fx.Node, lambda n: n.meta["val"], (new_args, new_kwargs))
        try:
            with self.emit.fake_mode:
                f.functional(*fargs, **fkwargs)
        except RuntimeError:
            return args, kwargs  # (a cast node left unused is dropped by dead-code elimination)
        return new_args, new_kwargs

    def _counters(self) -> None:
        """FunctionalProgram.unmoved_counters: the caller's tensors whose memory the graph writes back though
        eager's writes left their version counters (every write went through a tensor with a counter of its own,
        an unsafe_chunk element or `x.data`, or was one a kernel makes without moving it, OpFacts.counted), and,
        when there are any, the tensors whose counters eager moved (they may share a counter with one of the
        former, which is set back first)."""
        written = {s for s in self.base if s.kind is not StorageKind.INTERMEDIATE and self.version[s] > 0}
        kept = [s for s in written if s.kind is not StorageKind.GROUP and s not in self.counter_written]
        unmoved = [s.ref() for s in kept]
        for obj in self.member_ph:  # (the write-back into a group's base moves the counter of one member)
            if self.first[obj].storage in written and obj not in self.members_moved:
                unmoved.append(self.caller_objs[obj])
        if unmoved:
            moved = [s.ref() for s in self.counter_written if s.kind is not StorageKind.GROUP]
            moved += [self.caller_objs[obj] for obj in self.members_moved]
            self.program.unmoved_counters, self.program.moved_counters = unmoved, moved
        # A write-back inside the graph (AutogradFacts._write_back_now: the tensor is read with grad on after its
        # last write) of such memory goes through an alias with a counter of its own: what autograd saves of the
        # tensor after it must not be stale at the end of the call, when the counter is set back.
        moved_groups = {self.first[obj].storage for obj in self.members_moved}
        keep = {s.ref() for s in kept}
        keep |= {s.ref() for s in written if s.kind is StorageKind.GROUP and s not in moved_groups}
        for n in self.graph.find_nodes(op="call_function", target=write_back_now):
            if self.placeholder_ref.get(n.args[0]) in keep:
                n.kwargs = {**n.kwargs, "keep_counter": True}

    def _output(self, node: fx.Node) -> None:
        outs: list[fx.Node] = []
        # Write-backs first: every caller-visible storage whose version moved.
        returned = [self.info.value(a).storage for a in node.args[0] if isinstance(self.info.values.get(a), Value)]
        self.autograd.before_output(list(self.base), returned)
        for s in list(self.base):
            if s.kind is not StorageKind.INTERMEDIATE and self.version[s] > 0 and s not in self.autograd.written_back:
                grad = self.autograd.written_with_grad(s)
                self.program.writebacks.append(WriteBack(s.ref(), len(outs), grad))
                outs.append(self.base[s])
        self._counters()
        for obj, ref in self.caller_objs.items():
            first, last = self.first[obj], self.latest[obj]
            if _layout(last.meta) != _layout(first.meta) or obj in self.detached:
                # Replayed after the write-backs as eager made the changes: recorded by autograd, or not (then no
                # write autograd records came after them, see AutogradFacts.layout_changed).
                grad = self.meta_recorded.get(obj) != {False}
                write = MetadataWriteBack(ref, *_layout_change(first.meta, last.meta), obj in self.detached, grad)
                self.program.metadata_writebacks.append(write)
        results: dict[Storage, int] = {}
        seen: dict[int, int] = {}  # tensor object -> its first output position
        made_from: dict[int, tuple[Any, ...]] = {}  # output position -> the full chain its slot's chain ends
        for position, arg in enumerate(node.args[0]):
            if self.info.values.get(arg) is None and arg in self.scalars:  # a symbolic scalar: computed
                self.program.outputs.append(OutputSlot(Ref(RefKind.RESULT, len(outs))))
                outs.append(self.scalars[arg])
                continue
            v = self.info.value(arg)
            s = v.storage
            if v.obj in seen:  # eager returns that very object again (`flatten()` of a 1-D tensor is itself)
                self.program.outputs.append(OutputSlot(Ref(RefKind.RESULT, -1), same_as=seen[v.obj]))
                continue
            seen[v.obj] = position
            # A tensor eager made as no view (`y = x * 2`, a reshape's copy, an unsafe_split element) whose layout
            # changed in place (`y.t_()`): replaying its chain would return a view. It is returned as it was made,
            # then re-strided.
            born = self.born.get(v.obj, v)
            remade = born.chain != v.chain and not self._made_as_view(born)
            restride = _layout_change(born.meta, v.meta) if remade else None
            made_from[position] = born.chain if remade else v.chain
            if v.obj in self.caller_objs:  # the caller's tensor itself (even after `x.t_()`)
                self.program.outputs.append(OutputSlot(self.caller_objs[v.obj]))
            elif s.kind is not StorageKind.INTERMEDIATE:
                if self.autograd.unrecorded_layout and self.autograd.requires_grad(arg):
                    # (made before the change or after it: eager's grad_fn is regenerated from the new layout)
                    made_with = self.autograd.made_with_grad.get(v.obj, True)
                    self.autograd.refuse_use_after_unrecorded_layout(s, "a view returned", made_with)
                view = self._caller_view(born if remade else v, arg)
                self.program.outputs.append(replace(view, restride=restride))
            else:
                if s not in results:
                    results[s] = len(outs)
                    outs.append(self._owning(self.base[s]))
                chain = born.chain if remade else v.chain
                self.program.outputs.append(OutputSlot(Ref(RefKind.RESULT, results[s]), chain, restride=restride))
        for position, arg in enumerate(node.args[0]):
            slot = self.program.outputs[position]
            self.program.outputs[position] = self.autograd.output_slot(arg, slot, made_from.get(position, ()))
        if self.fake_symbolic:
            self.program.outputs = [self._computed_chain(slot, outs) for slot in self.program.outputs]
        self._views_of_outputs(node.args[0])
        self.graph.output(tuple(outs))

    def _views_of_outputs(self, args: Any) -> None:
        """OutputSlot.from_output: an output that is a view of another output, a tensor of its own the graph made
        (`v2 = x[:, ::3].flatten()`, a copy; `v2.view(-1)`), is made from that output's tensor, as eager's is. Each
        replayed its chain from the graph's result, so the view was one of a second, hidden copy: a write through
        it after the call changed that copy's history, not v2's (fuzz seed 1840127: sin_'s gradient lost)."""
        slots = self.program.outputs

        def plain(slot: OutputSlot) -> bool:  # (a chain replayed whole, in one grad mode)
            return slot == OutputSlot(slot.source, slot.chain, grad=slot.grad) and slot.source.kind is RefKind.RESULT

        own: dict[int, int] = {}  # object of a returned tensor of its own (made by the graph) -> its position
        for k, arg in enumerate(args):
            v = self.info.values.get(arg)
            if isinstance(v, Value) and plain(slots[k]) and slots[k].chain and not _makes_view(slots[k].chain):
                own.setdefault(v.obj, k)
        for p, arg in enumerate(args):
            v = self.info.values.get(arg)
            if not (own and isinstance(v, Value) and plain(slots[p])):
                continue
            n = v.node
            while is_view_node(n):  # (eager's views of views are views of the first tensor of its own)
                n = n.args[0]
                of = self.info.values.get(n)
                if isinstance(of, Value) and of.obj in own:
                    k = own[of.obj]
                    if k != p and slots[p].chain[: len(slots[k].chain)] == slots[k].chain:
                        slots[p] = replace(slots[p], from_output=(k, len(slots[k].chain)))
                    break

    def _made_as_view(self, born: Value) -> bool:
        """Whether eager made this tensor as a view: by a view op, not `_unsafe_view` (a reshape's copy) nor as an
        element of `unsafe_split` (autograd_facts tracks those)."""
        element = self.autograd.unsafe.get(born.obj)
        if element is not None and self.info.value(element).obj == born.obj:
            return False
        return _makes_view(born.chain)

    def _computed_chain(self, slot: OutputSlot, outs: list[fx.Node]) -> OutputSlot:
        """An output view whose chain has symbolic arguments (`cache[:, :pos + 1]`): each becomes a result of the
        graph, read by the epilogue when it replays the chain on the caller's tensor."""
        chain = self.emit.symbolic(self._steps(slot.chain))
        if not any(isinstance(a, fx.Node) for a in chain_args(chain)):
            return slot

        def result(node: fx.Node) -> ResultArg:
            outs.append(node)
            return ResultArg(len(outs) - 1)

        return replace(slot, chain=map_chain_args(chain, fx.Node, result))

    def _owning(self, base: fx.Node) -> fx.Node:
        """The returned base of memory the program made, as a tensor of its own as eager's is. A whole write with grad
        on, restrided to eager's layout by a differentiable permute -> clone -> permute (regions.restride), is a
        view of that clone (fuzz seed 996463: `v = x.t().clone(); v.masked_fill_(..)` came back a view); it is
        owned as a returned region write's decomposition is (regions.decompose), in the mode it was made in."""
        if not is_view_node(base):
            return base
        grad, trace = self.emit.grad, self.emit.stack_trace
        self.emit.grad, self.emit.stack_trace = base.meta.get("grad"), base.meta.get("stack_trace")
        try:
            return owning_node(self.emit, base)
        finally:
            self.emit.grad, self.emit.stack_trace = grad, trace

    def _caller_view(self, v: Value, node: fx.Node) -> OutputSlot:
        """A view of a caller's tensor (captured node `node`): replayed on the input it was taken from, so it is a
        real view of it. Inputs that share memory may have the same layout and differ for autograd (`x` and a view
        of it made under no_grad, after a graph break: fuzz seed 964718): the one `node`'s views start from is
        tried first."""
        while is_view_node(node) and isinstance(node.args[0], fx.Node):
            node = node.args[0]
        source = self.info.values.get(node)
        first = source.obj if isinstance(source, Value) else None
        # (sorted stably: the input it was taken from, then the others in their order)
        for obj, ref in sorted(self.caller_objs.items(), key=lambda item: item[0] != first):
            root = self.first[obj]
            n = len(root.chain)
            if root.storage is v.storage and v.chain[:n] == root.chain:
                return OutputSlot(ref, v.chain[n:])
        return OutputSlot(v.storage.ref(), v.chain)


def _layout_change(first: torch.Tensor, last: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """What `t_()`, `unsqueeze_()`, `as_strided_()`... left of a tensor laid out as `first`: its sizes, strides and
    how far its storage offset moved."""
    rel = last.storage_offset() - first.storage_offset()
    if any(isinstance(x, torch.SymInt) for x in (*last.shape, *last.stride(), rel)):
        raise UnsupportedError("an in-place metadata change (`t_()`, `unsqueeze_()`...) to a symbolic layout")
    return tuple(last.shape), tuple(last.stride()), rel


def _makes_view(chain: tuple[ViewStep, ...]) -> bool:
    """Whether replaying `chain` on a base gives an autograd view of it (`_unsafe_view` gives a tensor of its own,
    on the same memory: a reshape's copy; so does `detach`)."""
    return bool(chain) and chain[-1].op not in (aten._unsafe_view.default, aten.detach.default)


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
            elif u.op == "call_function" and u.meta.get("grad", True):
                return True
    return False


def _hides_grad(step: ViewStep, base: fx.Node) -> bool:
    """A view autograd does not differentiate through: detach, or a dtype view leaving floating point."""
    if step.op is aten.detach.default:
        return True
    return step.op is aten.view.dtype and not step.args[0].is_floating_point and not step.args[0].is_complex


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    return tuple(t.shape), t.stride(), t.storage_offset()


def _draws_into_tensors(f: Any, bound: dict[str, Any]) -> bool:
    """A random op whose written arguments are all given, single tensors, and positional (what draw_like runs)."""
    args = {a.name: a for a in f.op._schema.arguments}
    return all(isinstance(bound.get(m), fx.Node) and not args[m].kwarg_only for m in f.mutated)


def _to_call(
    schema: torch.FunctionSchema, names: list[str], values: dict[str, Any], defaults: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Arguments for `schema` from the mutating op's arguments `names` (in its schema order, matched to the
    functional schema by position: their types match even where names differ), their `values`, and the
    mutating op's `defaults` for those not given (`bernoulli_(p=0.5)` -> `bernoulli.p(p)` needs it)."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    positional = True
    if sorted(names) == sorted(a.name for a in schema.arguments) and names != [a.name for a in schema.arguments]:
        names = [a.name for a in schema.arguments]  # the same arguments in the functional schema's order
    for name, a in zip(names, schema.arguments):
        if name in values:
            value = values[name]
        elif name in defaults and not a.has_default_value():
            value = defaults[name]
        else:
            positional = False  # a default is used: name everything after it
            continue
        if positional and not a.kwarg_only:
            args.append(value)
        else:
            kwargs[a.name] = value
    return args, kwargs


def _scalar_name(dtype: torch.dtype) -> str:
    """Eager's name of a dtype in its messages: `Float`, `Int`, `ComplexFloat`."""
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")
