"""The walk over the captured graph, in program order: each node dispatched (placeholders and constants to
inputs.py, writes to lowering.py, the output to outputs.py), and a value read from its storage's current base,
its view chain replayed when a write made it stale. `Functionalizer` is the `Walk` AutogradFacts asks."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from ...errors import UnsupportedError, located, node_location
from ...ir.emitter import Emitter
from ...ir.gradops import bump_version, caller_tensor, stale_saved, write_back_now
from ...ir.opfacts import OpKind, facts, is_view_target, writes_nothing
from ...ir.plan import Captured, FunctionalProgram, StorageKind
from ...ir.viewops import ViewStep, map_chain_args, replay_chain
from ..alias import AliasInfo, Storage, Value, resizes_nothing
from ..autograd_facts import AutogradFacts
from ..saved import STALE_KEY
from . import inputs
from .counters import VersionCounters, move_counter
from .inputs import CallerInputs
from .lowering import lower_mutation
from .outputs import TensorObjects, plan_outputs
from .timeline import Timeline

aten = torch.ops.aten


class Functionalizer:
    def __init__(self, captured: Captured, info: AliasInfo) -> None:
        self.src = captured.gm
        self.info = info
        self.requires_grad = captured.requires_grad
        self.detached_inputs = captured.detached
        self.restricted_inputs = captured.restricted
        self.graph = fx.Graph()
        self.emit = Emitter(self.graph, captured.fake_mode)
        self.program = FunctionalProgram(fx.GraphModule({}, fx.Graph()))
        # The walk's state, one record per responsibility (each documented where it is defined).
        self.timeline = Timeline()
        self.objects = TensorObjects()
        self.callers = CallerInputs()
        self.counters = VersionCounters()
        self.emitted: dict[fx.Node, fx.Node] = {}  # captured multi-output node -> its functional node
        self.scalars: dict[fx.Node, fx.Node] = {}  # captured symbolic scalar -> its node here
        self.stale_done: set[fx.Node] = set()  # ops whose result raises eager's error at backward (saved.STALE_KEY)
        self.fake_symbolic = captured.fake_mode.shape_env is not None  # the program has symbols
        # Eager's autograd facts no aten op states: told of every op, read, write and output (see Walk for what it
        # asks of this walk).
        self.autograd = AutogradFacts(self, captured.gm, any(self.requires_grad))

    # -- reading -------------------------------------------------------------------------------------
    def materialize(self, v: Value) -> fx.Node:
        """The node holding `v`'s current contents, replaying its view chain if a write made it stale."""
        timeline = self.timeline
        hit = timeline.cache.get(v)
        if hit is not None and hit[1] == timeline.version[v.storage] and not self.autograd.replay_for_grad(v):
            return hit[0]
        node = self.replay(v, timeline.base[v.storage])
        timeline.cache[v] = (node, timeline.version[v.storage])
        self.autograd.replayed(v)
        return node

    def replay(self, v: Value, on: fx.Node) -> fx.Node:
        """`v`'s view chain replayed on `on` (its storage's base, or another value of its layout)."""
        return replay_chain(self.steps(v.chain), on, self.emit.call)

    def current(self, s: Storage) -> fx.Node | None:
        """Storage `s`'s current base, None before it has one."""
        return self.timeline.base.get(s)

    def advance(self, s: Storage, node: fx.Node) -> None:
        """Storage `s` now holds `node`: its views are replayed from it when next read."""
        self.timeline.advance(s, node)

    def caller_placeholder(self, s: Storage) -> fx.Node:
        """The placeholder of caller storage `s` (CallerInputs.placeholder)."""
        return self.callers.placeholder(s)

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

    def steps(self, chain: tuple[ViewStep, ...]) -> tuple[ViewStep, ...]:
        """`chain` with its symbolic arguments (captured nodes: `select(1, pos)`) as this graph's nodes."""
        if not self.scalars:
            return chain
        return map_chain_args(chain, fx.Node, self.scalars.__getitem__)

    def bind_fresh(self, v: Value, node: fx.Node) -> None:
        """`v` is a new tensor object, `node` its value: the first of its storage unless that has one."""
        self.timeline.start(v.storage, node)
        self.timeline.cache[v] = (node, 0)
        self.objects.latest[v.obj] = v

    def raise_at_backward(self, node: fx.Node, out: fx.Node) -> fx.Node:
        """`out`, the functional result of captured op `node`, behind a node raising eager's error at backward if
        eager's node for `node` reads a saved tensor the program writes afterwards (saved.STALE_KEY)."""
        stale = node.meta.get(STALE_KEY)
        if stale is None:
            return out
        if node.op == "call_function" and all(u.target is operator.getitem for u in node.users):
            # A multi-output functional op (`topk`, `linalg_cholesky_ex`): eager's one node is reached through any
            # result, so each result read (an element of the tuple, above) goes behind the raising node.
            self.stale_done.add(node)
        if not isinstance(out.meta.get("val"), torch.Tensor):
            return out
        self.stale_done.add(node)
        caller = stale[2]
        if caller is not None:
            ph = self.caller_placeholder(caller[0])
            # (a write of the caller's tensor emitted before the op would move its counter before it is read)
            if not any(u.target in (write_back_now, bump_version, caller_tensor) for u in ph.users):
                return self.emit.call(stale_saved, out, stale[0], ph, caller[1])
        return self.emit.call(stale_saved, out, stale[0])

    # -- the walk ------------------------------------------------------------------------------------
    def run(self) -> FunctionalProgram:
        groups_done = False
        for node in self.src.graph.nodes:
            self.emit.stack_trace = node.meta.get("stack_trace")
            self.emit.grad = node.meta.get("grad")
            if node.op == "placeholder":
                inputs.placeholder(self, node)
                continue
            if not groups_done:  # alias-group bases are placeholders after the tensor inputs
                inputs.group_placeholders(self)
                groups_done = True
            with located(node_location(node)):  # (every error below names the op's line)
                if node.op == "get_attr":
                    inputs.get_attr(self, node)
                elif node.op == "call_function":
                    self._call(node)
                elif node.op == "output":
                    plan_outputs(self, node)
        for node in self.src.graph.nodes:
            stale = node.meta.get(STALE_KEY)
            if stale is not None and node not in self.stale_done:
                raise stale[1]  # (its result is made another way: the graph runs eagerly, raising as eager does)
        inputs.protect_written_inputs(self)
        self.program.gm = fx.GraphModule(self.program.constants, self.graph)
        return self.program

    def _call(self, node: fx.Node) -> None:
        op = node.target
        v = self.info.values.get(node)
        if isinstance(v, Value):
            self.objects.born.setdefault(v.obj, v)
        self.autograd.before_op(node)
        if v is None and isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool, torch.SymFloat)):
            # Arithmetic on symbols or a tensor's symbolic size (`pos + 1`, `x.size(0)`): computed in the graph.
            self.scalars[node] = self.emitted[node] = self.emit.call(
                op, *self.read(node.args), **self.read(node.kwargs)
            )
            return
        if op is operator.getitem:
            if isinstance(v, Value) and v.storage not in self.timeline.base:  # an element of a functional tuple
                item = self.emit.call(operator.getitem, self.emitted[node.args[0]], node.args[1])
                self.bind_fresh(v, self.raise_at_backward(node.args[0], item))
            return
        f = facts(op)
        if is_view_target(op):
            return  # materialized from its base when read
        if f.kind is OpKind.INPLACE_VIEW:
            self._layout_change(node, v)
            return
        if f.kind is OpKind.FUNCTIONAL or writes_nothing(op, node.args, node.kwargs, f.mutated):
            out = self.raise_at_backward(node, self.emit.call(op, *self.read(node.args), **self.read(node.kwargs)))
            if isinstance(v, Value):
                self.bind_fresh(v, out)
            else:
                self.emitted[node] = out
            return
        lower_mutation(self, node, f)

    def _layout_change(self, node: fx.Node, v: Value) -> None:
        """An in-place change of a tensor's layout (`t_()`, `as_strided_()`, `resize_()`, `detach_()`): nothing is
        emitted; the tensor object's latest value is its new layout, and its version counter moves."""
        op = node.target
        self.objects.latest[v.obj] = v
        resize = op in (aten.resize_.default, aten.resize_as_.default)
        if resize and resizes_nothing(node, self.info.value(node.args[0]).meta):
            return  # (eager's version counter stays)
        if op is aten.detach_.default:  # (which leaves the version counter alone)
            self.objects.detached.add(v.obj)
            return
        # Eager's version counter moves: a split's element goes stale, what autograd saved of the memory too.
        self.autograd.version_counter_moves(v.storage)
        requires_grad = self.autograd.requires_grad(node.args[0])
        recorded = bool(self.emit.grad) and requires_grad
        if v.storage.kind is StorageKind.INTERMEDIATE and not recorded and requires_grad:
            # Of memory the program made, too: eager's grad_fn keeps the old layout (fuzz seed 965515:
            # `where(..)` transposed under no_grad, then squeezed; eager's backward raises on the shapes).
            self.autograd.layout_changed(v.storage, node, recorded)
        if v.storage.kind is not StorageKind.INTERMEDIATE:  # (of a caller's tensor: moved on it too)
            move_counter(self, v)
            # A member of an alias group whose memory requires no grad yet has no grad_fn the change could leave
            # stale: the write that brings grad goes back through the group's base, another tensor object, and
            # the member's grad_fn is regenerated from its new layout when read, as eager's (fuzz seed 1808283).
            # A caller's tensor of its own is written back itself, in its old layout: its grad_fn would be made
            # for that layout, as the refusal says.
            if requires_grad or v.storage.kind is not StorageKind.GROUP:
                self.autograd.layout_changed(v.storage, node, recorded)
            kinds = self.objects.meta_recorded.setdefault(v.obj, set())
            if kinds and recorded not in kinds:
                raise UnsupportedError(
                    f"{op}: in-place layout changes of one tensor, some recorded by autograd and some not "
                    "(under no_grad): eager's grad_fn maps gradients through the recorded ones only"
                )
            kinds.add(recorded)
