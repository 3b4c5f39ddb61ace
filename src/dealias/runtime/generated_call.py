"""A compiled program's call as Python source, generated once from the plan, compiled with `exec`, run on every call
and printed as it is in the execution trace (`dealias.last_traces`): what a reader sees is what runs.

The call binds the caller's tensors, makes the alias groups' bases, runs the graph (`execute`, the function the
trace prints above it) and then the epilogue: write-backs into the caller's tensors (each in the grad mode its
writes were made in), the outputs (picked from the results or the caller's tensors, or views replayed on them in
the grad modes eager made them in), layouts set in place, metadata write-backs, version counters set back, and the
returned structure. Ops are called as eager's aten ops (`aten_select_int(x, 0, 1)`), as the plan's view chains
name them; steps with more to them than a line (a layout set without moving the version counter, an alias group's
base) are helpers named for what they do.

Grad mode is keyed (frontend/guards.py), so a program is called in the mode it was compiled in: the source is
written for that mode, with a `with torch.no_grad():` (`enable_grad`) only around the steps eager made in the
other one. When the source for the other mode would differ, the call first checks the mode and hands a call in
the other mode to that source (a piece of a split graph, a direct call).
"""

from __future__ import annotations

import contextlib
import itertools
import keyword
import linecache
import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _pytree as pytree

from ..compat.internals import set_version_counters, version_counters_missing
from ..errors import UnsupportedError
from ..ir.gradops import attach_history
from ..ir.opfacts import facts
from ..ir.plan import TENSOR_SLOT, Captured, FunctionalProgram, OutputSlot, Ref, RefKind, ResultArg
from ..ir.viewops import ViewStep, repeated_dims
from .executor import binding_for_call


def as_strided_keeping_version(t: torch.Tensor, size: Any, stride: Any, rel: int) -> None:
    """`t.as_strided_(size, stride, t.storage_offset() + rel)` without moving t's version counter: the graph moved
    it where eager's in-place layout change did (bump_version), before what autograd saved after it, and eager's
    outputs made after the change (a split's element, a no_grad view) would raise at their grad_fn, what the graph
    saved would be stale at backward (fuzz seed 1310504)."""
    version = t._version
    t.as_strided_(size, stride, t.storage_offset() + rel)
    set_version_counters((t,), (version,))


def reshaped_view(t: torch.Tensor, size: Any) -> torch.Tensor:
    """`t.view(size)` made as the user's `reshape` made it (OutputSlot.reshaped): by reshape itself, whose view of a
    tensor that is not contiguous is eager's `_reshape_alias` (its grad_fn, and the errors naming it). The trace
    made a view of this layout; were reshape's result a copy, it is the view as before (view raises where it
    cannot make one), not a tensor apart from the caller's memory."""
    out = t.reshape(size)
    return out if out.data_ptr() == t.data_ptr() else t.view(size)


# (OutputSlot.stale: a view's recorded version that no later write of a counter at 0 reaches; counters are uint32)
STALE_FAR_AHEAD = 1 << 31


def counter_from(slot: OutputSlot) -> int:
    """Where in `slot`'s chain the steps sharing the view's version counter begin: after the last step that makes a
    tensor with a counter of its own (opfacts' own_counter: `_unsafe_view`, an `unsafe_split` element made as
    eager's), 0 when none does."""
    own = [k + 1 for k, step in enumerate(slot.chain) if isinstance(step.op, OpOverload) and facts(step.op).own_counter]
    if slot.data_step is not None:  # (`.data`: OutputSlot.data_step)
        own.append(slot.data_step + 1)
    if slot.unsafe_output is not None:
        own.append(slot.unsafe_output.step + 1)
    return max(own, default=0)


def set_version_counter(t: torch.Tensor, version: int) -> None:
    """Set the version counter `t` shares with its base and views (OutputSlot.stale)."""
    set_version_counters((t,), (version,))


# A call in inference mode may be handed inference tensors (a training BatchNorm's buffers made or copied inside
# `torch.inference_mode()`), which have no version counter: reading one raises, where eager's call reads none.
# Their counters are neither read nor set (0 stands for one); normal tensors' are, as outside inference mode.
def versions_of(tensors: tuple[torch.Tensor, ...]) -> tuple[int, ...]:
    return tuple(0 if t.is_inference() else t._version for t in tensors)


def set_counted_versions(tensors: tuple[torch.Tensor, ...], versions: tuple[int, ...]) -> None:
    kept = [(t, v) for t, v in zip(tensors, versions) if not t.is_inference()]
    if kept:
        set_version_counters(tuple(t for t, _ in kept), tuple(v for _, v in kept))


def restore_sizes(spec: pytree.TreeSpec, value: Any) -> Any:
    """pytree rebuilds a torch.Size as a plain tuple; eager returned a torch.Size (`return x.shape`)."""
    if spec.type is torch.Size:
        return torch.Size(value)
    if spec.type in (tuple, list):
        return spec.type(restore_sizes(c, v) for c, v in zip(spec.children(), value))
    if spec.type is dict:
        return {k: restore_sizes(c, value[k]) for k, c in zip(spec.context, spec.children())}
    return value


def _op_name(op: Any) -> str:
    """The name an op is called by in the source: `aten_select_int` for `aten.select.int`, a helper's own name."""
    if isinstance(op, torch._ops.OpOverload):
        name = f"{op.namespace}_{op._schema.name.split('::')[-1]}"
        return name if op._overloadname == "default" else f"{name}_{op._overloadname}"
    return getattr(op, "__name__", "helper")


class _Source:
    """The lines and the namespace of one generated call: every name in it, local or global, is distinct."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.env: dict[str, Any] = {}
        self.bound: dict[int, str] = {}  # id(object) -> its global name
        self.taken = set(keyword.kwlist) | {"leaves"}
        self.indent = 1

    def fresh(self, name: str) -> str:
        base, n = (name if name.isidentifier() else "v"), 0
        while name in self.taken or not name.isidentifier():
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    def bind(self, obj: Any, name: str) -> str:
        """A global name for `obj` (the same object, the same name)."""
        if id(obj) not in self.bound:
            self.bound[id(obj)] = self.fresh(name)
            self.env[self.bound[id(obj)]] = obj
        return self.bound[id(obj)]

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def literal(self, a: Any, results: Callable[[int], str]) -> str:
        """`a` as source: a literal where one is exact, a graph result's name, else a bound constant."""
        if a is None or type(a) in (bool, int, str) or type(a) is float and math.isfinite(a):
            return repr(a)
        if isinstance(a, ResultArg):
            return results(a.index)
        if isinstance(a, list) or type(a) in (tuple, torch.Size):  # (fx's immutable_list; sizes: any int sequence)
            inner = ", ".join(self.literal(x, results) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' * (len(a) == 1)})"
        if isinstance(a, torch.dtype):
            return f"{self.bind(torch, 'torch')}.{str(a).removeprefix('torch.')}"
        return self.bind(a, "constant")


class _Out:
    """An output's expression among the returned structure's constant leaves (which may be strings too)."""

    def __init__(self, text: str) -> None:
        self.text = text


class _Call:
    """One call's source for grad mode `grad`: the caller's tensors bound, the alias groups' bases, the counters kept,
    the outputs made early, the graph run, the write-backs, the other outputs, layouts, counters set back, return."""

    def __init__(self, cap: Captured, fp: FunctionalProgram, run: Callable[..., Any], grad: bool) -> None:
        self.cap, self.fp, self.grad = cap, fp, grad
        s = self.s = _Source()
        s.bind(torch, "torch")
        self.run = s.bind(run, "execute")
        placeholders = [n.name for n in fp.gm.graph.find_nodes(op="placeholder")]
        positions, symbols = list(cap.tensor_positions), list(cap.sym_positions)
        if len(placeholders) != len(positions) + len(symbols) + len(cap.groups):
            placeholders = [f"input{i}" for i in range(len(positions) + len(symbols) + len(cap.groups))]
        self.inputs = [s.fresh(name) for name in placeholders]
        self.tensors, rest = self.inputs[: len(positions)], self.inputs[len(positions) :]
        self.symbols, self.bases = rest[: len(symbols)], rest[len(symbols) :]
        self.leaf_positions = positions + symbols
        results = fp.gm.graph.output_node().args[0]
        results = results if isinstance(results, (list, tuple)) else (results,)
        self.results = [s.fresh(getattr(r, "name", f"result{i}")) for i, r in enumerate(results)]
        self.result_nodes = list(results)
        self.used: set[int] = set()  # the results the epilogue reads (the others are unpacked as `_`)
        self.outs: list[str] = []  # each output's expression

    def result(self, i: int) -> str:
        self.used.add(i)
        return self.results[i]

    def ref(self, ref: Ref) -> str:
        if ref.kind is RefKind.INPUT:
            return self.tensors[ref.key]
        if ref.kind is RefKind.GROUP:
            return self.bases[ref.key]
        if ref.kind is RefKind.CONSTANT:
            return f"{self.s.bind(self.fp.constants, 'constants')}[{ref.key!r}]"
        return self.result(ref.key)

    def in_mode(self, grad: bool, lines: list[str]) -> None:
        """`lines` run in grad mode `grad`: as they are in the call's mode, else with the mode switched around them
        and set back to the call's (`self.grad`, the mode every step between the graph's switches runs in). Not
        `with torch.no_grad():`, whose Python context manager cost a GPT-2 call ~8 us around the view of its logits."""
        s = self.s
        if grad != self.grad:
            set_grad = s.bind(torch._C._set_grad_enabled, "set_grad_enabled")
            s.emit(f"{set_grad}({grad})")
            s.emit("try:")
            s.indent += 1
        for line in lines:
            s.emit(line)
        if grad != self.grad:
            s.indent -= 1
            s.emit("finally:")
            s.emit(f"    {set_grad}({self.grad})")

    def step(self, step: ViewStep, t: str, fake: torch.Tensor | None = None) -> str:
        """`step` replayed on `t`: as the Tensor method dispatching to exactly its aten overload with exactly its
        arguments where one does (`t.view([64, 4, 256])`, asked of `fake`, the value it is applied to: a C binding,
        half the time of the aten call's Python dispatch (9 -> 4 us warm; MultiheadAttention's output, more after its
        kernels), else as the aten call."""
        args = [self.s.literal(a, self.result) for a in step.args]
        args += [f"{k}={self.s.literal(v, self.result)}" for k, v in step.kwargs]
        method = _view_method(step, fake)
        if method is not None:
            return f"{t}.{method}({', '.join(args)})"
        return f"{self.s.bind(step.op, _op_name(step.op))}({', '.join([t, *args])})"

    def step_fakes(self, slot: OutputSlot) -> list[torch.Tensor | None]:
        """The fake value each step of `slot`'s chain is applied to (None where not known)."""
        fakes: list[torch.Tensor | None] = [None] * len(slot.chain)
        if slot.source.kind is RefKind.RESULT:
            node = self.result_nodes[slot.source.key]
            fake = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        elif slot.source.kind is RefKind.INPUT:
            fake = self.cap.fakes[slot.source.key]
        else:
            return fakes
        for k, step in enumerate(slot.chain):
            if not isinstance(fake, FakeTensor):
                break
            fakes[k] = fake
            fake = _applied(step, fake)
        return fakes

    def chain(self, t: str, slot: OutputSlot, start: int, end: int) -> str:
        """Steps `start:end` of `slot`'s view chain replayed on `t`, step k as the multi-output view eager made."""
        made = {m.step: m for m in (slot.unsafe_output, slot.multi_output) if m is not None}
        fakes = self.step_fakes(slot)
        for k in range(start, end):
            multi = made.get(k)
            if multi is not None:
                args = ", ".join([t, *(self.s.literal(a, self.result) for a in multi.args)])
                t = f"{self.s.bind(multi.op, _op_name(multi.op))}({args})[{multi.index}]"
            else:
                t = self.view_step(slot, k, t, fakes[k])
        return t

    def view_step(self, slot: OutputSlot, k: int, t: str, fake: torch.Tensor | None) -> str:
        """Step k of `slot`'s chain replayed on `t`; the last, where the user's reshape made it, by reshape."""
        if k == slot.data_step:  # (OutputSlot.data_step: a counter of its own, as eager's)
            return f"{t}.data"
        if slot.reshaped and k == len(slot.chain) - 1:
            (size,) = slot.chain[k].args
            return f"{self.s.bind(reshaped_view, 'reshaped_view')}({t}, {self.s.literal(size, self.result)})"
        return self.step(slot.chain[k], t, fake)

    def output(self, i: int, slot: OutputSlot) -> str:
        """Output `i` made as eager made it: its source, or the view of it (the steps before `grad_from` in the
        call's mode or `grad_before`, then in the mode eager made the view in up to `grad_until`, the rest with grad
        on)."""
        t = self.ref(slot.source)
        if not slot.chain:
            return t
        if slot.stale:
            # (OutputSlot.stale: made with the counter one behind, which is then set back. Behind, not ahead: the
            # counter only grows, so a later write of the memory, by the caller, never makes the view's recorded
            # version its memory's again, as eager's never does; one ahead, the first such write did, and its
            # grad_fn read as None. A counter at 0, a result the fused executor made, is set far ahead instead.)
            # The counter set back is the one the view shares: that of the tensor after the chain's last step
            # making a tensor with a counter of its own (`_unsafe_view`, a reshape's copy: fuzz seed 2301728), made
            # first; the source's would leave the view current.
            own = counter_from(slot)
            if own:
                t = self.made(i, slot, t, 0, own)
            version, set_versions = self.s.fresh("version"), self.s.bind(set_version_counter, "set_version_counter")
            self.s.emit(f"{version} = {t}._version")
            self.s.emit(f"{set_versions}({t}, {version} - 1 if {version} else {STALE_FAR_AHEAD})")
            name = self.made(i, slot, t, own)
            self.s.emit(f"{set_versions}({t}, {version})")
            return name
        return self.made(i, slot, t)

    def made(self, i: int, slot: OutputSlot, t: str, start: int = 0, end: int | None = None) -> str:
        """Steps `start:end` of `slot`'s chain (to its end by default) replayed on `t`, each in its mode."""
        n = len(slot.chain) if end is None else end
        made = self.grad if slot.grad is None else slot.grad
        until = len(slot.chain) if slot.grad_until is None else slot.grad_until
        before = self.grad if slot.grad_before is None else slot.grad_before
        parts = [(0, slot.grad_from, before), (slot.grad_from, until, made), (until, len(slot.chain), True)]
        parts = [(max(a, start), min(b, n), g) for a, b, g in parts if max(a, start) < min(b, n)]
        name = self.s.fresh(f"out{i}")
        if all(g == self.grad for _, _, g in parts):
            self.s.emit(f"{name} = {self.chain(t, slot, start, n)}")
            return name
        for a, b, g in parts:
            self.in_mode(g, [f"{name} = {self.chain(t, slot, a, b)}"])
            t = name
        return name

    def generate(self, other: str | None) -> str:
        cap, fp, s = self.cap, self.fp, self.s
        if other is not None:  # (the source for the other grad mode differs: a call in that mode runs it)
            grad_enabled = s.bind(torch.is_grad_enabled, "grad_enabled")
            s.emit(f"if {grad_enabled}() is not {self.grad}:")
            s.emit(f"    return {other}(leaves)")
        if self.leaf_positions and tuple(self.leaf_positions) == tuple(range(cap.in_spec.num_leaves)):
            s.emit(f"{', '.join(self.tensors + self.symbols)}{',' * (len(self.leaf_positions) == 1)} = leaves")
        else:
            for name, p in zip(self.tensors + self.symbols, self.leaf_positions):
                s.emit(f"{name} = leaves[{p}]")
        # Each alias group's base, a view of its members' memory. Made with grad on when a member requires grad,
        # whatever the call's mode (a piece of a split graph may start inside a no_grad region): a view made under
        # no_grad could not be written with grad on by the graph.
        for g, (group, name) in enumerate(zip(cap.groups, self.bases)):
            members = ", ".join(self.tensors[m] for m in group.members)
            helper = s.bind(_group_base(group), f"base_of_group{g}")
            self.in_mode(self.grad or any(cap.requires_grad), [f"{name} = {helper}({members})"])
        # (in a fixed order: the plan's comes from a set, and the printed source should not change between runs)
        unmoved = [self.ref(r) for r in sorted(fp.unmoved_counters, key=_order)]
        inference = torch.is_inference_mode_enabled()  # (a guard of the program: its calls run in this mode)
        if unmoved:  # (FunctionalProgram.unmoved_counters: set back at the end, whatever the writes moved them by)
            kept, versions = s.fresh("kept"), s.fresh("versions")
            s.emit(f"{kept} = {_tuple(unmoved)}")
            if inference:
                s.emit(f"{versions} = {s.bind(versions_of, 'versions_of')}({kept})")
            else:
                s.emit(f"{versions} = {_tuple(f'{t}._version' for t in unmoved)}")
        self.outs = [""] * len(fp.outputs)
        for i, slot in enumerate(fp.outputs):  # (OutputSlot.early: views made before the graph's writes)
            if slot.early and slot.same_as is None and slot.from_output is None:
                self.outs[i] = self.output(i, slot)
        call_line = f"{self.run}({', '.join(self.inputs)})"
        switches = bool(fp.gm.graph.find_nodes(op="call_function", target=torch._C._set_grad_enabled))
        if switches:  # the graph switches grad mode around no_grad regions: the call's mode is set back
            s.emit("try:")
        at = len(s.lines)  # (the graph's call goes here: its results' names are known once the epilogue read them)
        if switches:
            s.emit("finally:")
            s.emit(f"    {s.bind(torch._C._set_grad_enabled, 'set_grad_enabled')}({self.grad})")
        if fp.writebacks:
            s.emit("# write-back into the caller's tensors")
        for wb in fp.writebacks:
            target, value = self.ref(wb.target), self.result(wb.output)
            # A caller's tensor that repeats its memory (expanded): one of each repeat is copied (writeback._apply).
            dims = repeated_dims(cap.fakes[wb.target.key]) if wb.target.kind is RefKind.INPUT else []
            narrow = "".join(f".narrow({d}, 0, 1)" for d in dims)
            self.in_mode(wb.grad, [f"{target}{narrow}.copy_({value}{narrow})"])
        # The counters set back before the outputs are made: a view records its base's version when made, and
        # eager's, made before a write hidden from autograd (`x.data.mul_`) or after it, recorded the counter the
        # write did not move. Made before the set-back, a view recorded the write-back's version, which a later
        # eager write of its base (after a graph break) then reached: its grad_fn was not remade through that
        # write, a silent wrong gradient (fuzz seed 2190143, `x.random_` after the graph).
        if unmoved:
            moved = [self.ref(r) for r in sorted(fp.moved_counters, key=_order)]
            if inference:
                set_versions = s.bind(set_counted_versions, "set_counted_versions")
            else:
                set_versions = s.bind(set_version_counters, "set_version_counters")
            if moved and inference:  # (the moved counters read before the kept are set back)
                finals = s.fresh("finals")
                s.emit(f"{finals} = {s.bind(versions_of, 'versions_of')}({_tuple(moved)})")
            elif moved:
                finals = s.fresh("finals")
                s.emit(f"{finals} = {_tuple(f'{t}._version' for t in moved)}")
            s.emit(f"{set_versions}({kept}, {versions})")
            if moved:
                s.emit(f"{set_versions}({_tuple(moved)}, {finals})")
        self.make_outputs()
        self.set_layouts()
        s.emit(f"return {self.packed()}")
        names = [r if i in self.used else "_" for i, r in enumerate(self.results)]
        unpack = f"{', '.join(names)}{',' * (len(names) == 1)} = " if self.used else ""
        s.lines.insert(at, "    " * (1 + switches) + unpack + call_line)
        return "def call(leaves):\n" + "\n".join(s.lines) + "\n"

    def make_outputs(self) -> None:
        fp = self.fp
        for i, slot in enumerate(fp.outputs):
            if slot.same_as is None and slot.from_output is None and not self.outs[i]:
                self.outs[i] = self.output(i, slot)
            if slot.history is not None:  # (OutputSlot.history)
                attach = self.s.bind(attach_history, "attach_history")
                self.s.emit(f"{self.outs[i]} = {attach}({self.outs[i]}, {self.result(slot.history)})")
        # Outputs that are views of another output's tensor (OutputSlot.from_output), by chain length: the output
        # one is made from has a shorter chain, a prefix of its own, so it is made first.
        made = sorted((len(s.chain), i) for i, s in enumerate(fp.outputs) if s.from_output and s.same_as is None)
        for _, i in made:
            slot = fp.outputs[i]
            k, n = slot.from_output
            name = self.s.fresh(f"out{i}")
            source = self.outs[k] if fp.outputs[k].same_as is None else self.outs[fp.outputs[k].same_as]
            made_with = self.grad if slot.grad is None else slot.grad
            view, fakes = source, self.step_fakes(slot)
            for k in range(n, len(slot.chain)):
                view = self.view_step(slot, k, view, fakes[k])
            self.in_mode(made_with, [f"{name} = {view}"])
            self.outs[i] = name
        for i, slot in enumerate(fp.outputs):
            if slot.same_as is not None:
                self.outs[i] = self.outs[slot.same_as]

    def set_layouts(self) -> None:
        s, fp = self.s, self.fp
        keeping = lambda: s.bind(as_strided_keeping_version, "as_strided_keeping_version")  # noqa: E731
        for i, slot in enumerate(fp.outputs):  # once every output is made: other outputs may view it
            if slot.restride is not None:
                size, stride, rel = slot.restride
                s.emit(f"{keeping()}({self.outs[i]}, {list(size)}, {list(stride)}, {rel})")
        if fp.metadata_writebacks:
            s.emit("# the caller's tensors' layouts (in-place metadata changes)")
        for m in fp.metadata_writebacks:
            t = self.ref(m.target)
            self.in_mode(m.grad, [f"{keeping()}({t}, {list(m.size)}, {list(m.stride)}, {m.rel})"])
            if m.detach:
                s.emit(f"{t}.detach_()")

    def packed(self) -> str:
        """The returned structure, as a literal where pytree would rebuild it as one."""
        cap, outs = self.cap, iter(self.outs)
        leaves = [_Out(next(outs)) if t is TENSOR_SLOT else t for t in cap.out_template]
        text = self.structure(cap.out_spec, iter(leaves))
        if text is not None:
            return text
        pack = self.s.bind(_unflatten(cap), "pack")
        return f"{pack}([{', '.join(self.outs)}])"

    def structure(self, spec: pytree.TreeSpec, leaves: Any) -> str | None:
        """A tuple of outputs and constants (what dynamo's graphs return) as a literal; None for another structure
        (fx's immutable containers, a torch.Size, a named tuple: pytree rebuilds those)."""
        if spec.is_leaf():
            leaf = next(leaves)
            if isinstance(leaf, _Out):
                return leaf.text
            # (a returned constant: a literal only where it is a scalar, else the very object, as pytree would)
            scalar = leaf is None or type(leaf) in (bool, int, str) or type(leaf) is float and math.isfinite(leaf)
            return repr(leaf) if scalar else self.s.bind(leaf, "constant")
        if spec.type is not tuple:
            return None
        parts = [self.structure(c, leaves) for c in spec.children()]
        if any(p is None for p in parts):
            return None
        return f"({', '.join(parts)}{',' * (len(parts) == 1)})"


def _applied(step: ViewStep, fake: FakeTensor) -> FakeTensor | None:
    """`step` applied to `fake` (its guards suppressed: asking must not pin a symbol), None where it cannot be."""
    leaves = pytree.tree_leaves([step.args, step.kwargs])
    if not isinstance(step.op, torch._ops.OpOverload) or any(isinstance(a, ResultArg) for a in leaves):
        return None
    shape_env = fake.fake_mode.shape_env
    quiet = shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()
    try:
        with quiet:
            out = step.op(fake, *step.args, **dict(step.kwargs))
    except Exception:  # noqa: BLE001 - not known: the later steps stay aten calls
        return None
    return out if isinstance(out, FakeTensor) else None


def _view_method(step: ViewStep, fake: torch.Tensor | None) -> str | None:
    """The Tensor method that makes `step` on `fake` by exactly its aten call (executor.binding_for_call)."""
    if fake is None or _applied(step, fake) is None:  # (and no ResultArg: its value is the graph's at runtime)
        return None
    binding = binding_for_call(step.op, (fake, *step.args), dict(step.kwargs))
    return binding[1] if binding is not None and binding[0] == "method" else None


def generate_call(cap: Captured, fp: FunctionalProgram, run: Callable[..., Any], grad: bool) -> tuple[str, Any]:
    """The call of program (`cap`, `fp`) whose graph `run` runs, generated for grad mode `grad`: its source and the
    compiled function. Where the source for the other mode differs, the call hands calls in that mode to it."""
    other_call, main = _Call(cap, fp, run, not grad), _Call(cap, fp, run, grad)
    other_source, source = other_call.generate(None), main.generate(None)
    if source == other_source:
        return source, _compile(source, main)
    other = _compile(other_source, other_call)
    main = _Call(cap, fp, run, grad)
    name = main.s.bind(other, f"call_with_grad_{'off' if grad else 'on'}")
    source = main.generate(name)
    return source, _compile(source, main)


def returned_as_views_only(fp: FunctionalProgram, grad: bool) -> frozenset[int]:
    """The graph's results the call (generated_call.py, in grad mode `grad`) hands the caller only as views it
    makes of them with grad on (`addmm(..)` returned as `.view(..).transpose(1, 0)`, MultiheadAttention's output),
    and writes into no caller's tensor: each such view has a backward node of its own, so the result needs no
    _OwnNode (a hook on the view runs only when a gradient comes into it)."""
    out: dict[int, bool] = {}
    for wb in fp.writebacks:
        out[wb.output] = False
    for slot in fp.outputs:
        if slot.same_as is not None or slot.from_output is not None or slot.source.kind is not RefKind.RESULT:
            continue  # (the view of another output: made from that output, whose own slot is checked)
        before = grad if slot.grad_before is None else slot.grad_before
        first = before if slot.grad_from > 0 or slot.grad is None else slot.grad  # (the first step's mode)
        i = slot.source.key
        out[i] = out.get(i, True) and bool(slot.chain) and first and slot.restride is None
    return frozenset(i for i, only in out.items() if only)


_numbers = itertools.count()


def _compile(source: str, call: _Call) -> Callable[[list[Any]], Any]:
    """`source` compiled in `call`'s namespace, under a file name of its own that linecache knows while the function
    lives: a traceback through it shows the generated lines, and `inspect.getsource` gives the source back."""
    if _SETS_COUNTERS & call.s.bound.keys() and (why := version_counters_missing()):
        raise UnsupportedError(why)  # (a torch without it: the program is refused, not run without)
    filename = f"<dealias generated call {next(_numbers)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    env = dict(call.s.env)
    exec(compile(source, filename, "exec"), env)  # noqa: S102 - generated from the plan only
    weakref.finalize(env["call"], linecache.cache.pop, filename, None)
    return env["call"]


# What a generated call may bind that sets version counters.
_SETS_COUNTERS = {
    id(f)
    for f in (
        set_version_counters,
        set_version_counter,
        set_counted_versions,
        as_strided_keeping_version,
        attach_history,
    )
}


def _order(ref: Ref) -> tuple[str, str]:
    return ref.kind.value, str(ref.key)


def _tuple(items: Any) -> str:
    items = list(items)
    return f"({', '.join(items)}{',' * (len(items) == 1)})"


def _group_base(group: Any) -> Callable[..., torch.Tensor]:
    members = group.members

    def base(*tensors: torch.Tensor) -> torch.Tensor:
        return group.base_of(dict(zip(members, tensors)))

    return base


def _unflatten(cap: Captured) -> Callable[[list[Any]], Any]:
    spec, template = cap.out_spec, cap.out_template
    has_size = "TreeSpec(Size" in repr(spec)

    def pack(outs: list[Any]) -> Any:
        it = iter(outs)
        out = pytree.tree_unflatten([next(it) if t is TENSOR_SLOT else t for t in template], spec)
        return restore_sizes(spec, out) if has_size else out

    return pack
