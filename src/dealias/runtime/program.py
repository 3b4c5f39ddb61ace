"""A compiled program: the functional graph plus the run-time epilogue that writes mutations back into
the caller's tensors and rebuilds outputs that alias inputs or each other.

The epilogue runs only after the whole graph has run, so a call that fails inside the graph leaves every
input as it was.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..ir.plan import TENSOR_SLOT, Captured, FunctionalProgram, MultiOutputStep, Ref, RefKind, Restride, ResultArg
from ..ir.viewops import chain_args, map_chain_args, repeated_dims, replay_chain


class _StrEnum(str, enum.Enum):
    """A kind that is also its string (enum.StrEnum is 3.11+): options given as strings and comparisons with
    strings keep working, and it prints as its value, in a repr too (`cache_info(f).tiers` shows `('fused',)`)."""

    __str__ = str.__str__
    __format__ = str.__format__
    __repr__ = str.__repr__


class Executor(_StrEnum):
    """What runs a compiled program (`dealias.jit(executor=...)`)."""

    TORCH = "torch"  # eager's kernels op by op, region writes in place
    INDUCTOR = "inductor"  # the fused executor (fused.py, fused_autograd.py)
    TIERED = "tiered"  # torch first, fused once a program has run often (frontend)


class Tier(_StrEnum):
    """The executor a compiled program ended up on (the inductor executor falls back to torch's for a graph it
    cannot fuse)."""

    TORCH = "torch"
    FUSED = "fused"


def _restore_sizes(spec: pytree.TreeSpec, value: Any) -> Any:
    """pytree rebuilds a torch.Size as a plain tuple; eager returned a torch.Size (`return x.shape`)."""
    if spec.type is torch.Size:
        return torch.Size(value)
    if spec.type in (tuple, list):
        return spec.type(_restore_sizes(c, v) for c, v in zip(spec.children(), value))
    if spec.type is dict:
        return {k: _restore_sizes(c, value[k]) for k, c in zip(spec.context, spec.children())}
    return value


def _torch_call(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return op(*args, **kwargs)


def _replay_output(chain: tuple[Any, ...], t: torch.Tensor, multi: MultiOutputStep | None, start: int = 0) -> Any:
    """`chain[start:]` replayed on `t`, its step k as the multi-output view eager made (OutputSlot.multi_output)."""
    for i in range(start, len(chain)):
        if multi is not None and i == multi.step:
            t = multi.op(t, *multi.args)[multi.index]
        else:
            t = replay_chain(chain[i : i + 1], t, _torch_call)
    return t


# A caller's tensor, or a graph's result, from a call's tensors, its alias groups' bases and the graph's results.
Getter = Callable[[list[torch.Tensor], list[torch.Tensor], Any], torch.Tensor]


# The plan resolved for calls (CompiledProgram.__post_init__). Named tuples: a call unpacks them as fast as plain
# tuples, and the few reads by name are outside the per-output loop of a cache hit.
class _WriteBackStep(NamedTuple):
    """WriteBack: `target` receives graph result `output`, in grad mode `grad`."""

    target: Getter
    output: int
    grad: bool


class _OutputStep(NamedTuple):
    """OutputSlot: `source`'s tensor, or the view `chain` of it replayed in the grad modes eager made it in."""

    source: Getter
    chain: tuple[Any, ...]
    same_as: int | None
    grad: bool | None
    grad_from: int
    grad_until: int | None
    multi: MultiOutputStep | None


@dataclass
class CompiledProgram:
    captured: Captured
    functional: FunctionalProgram
    run_graph: Callable[..., Any]  # the executor's callable for `functional.gm`
    traces: list[Any]
    functional_gm: fx.GraphModule  # the functional graph before write-back lowering (for inspection)
    reports: list[Any]  # WriteBackReport per caller tensor written
    shape_guard: Callable[[list[Any]], bool] | None = None  # the calls its symbolic sizes and scalars hold for
    layouts: list[tuple[list[Any], list[Any]]] | None = None  # per tensor input: static sizes, strides (or None)
    tier: Tier = Tier.TORCH  # the executor running it

    def __post_init__(self) -> None:
        # Everything a call does beyond running the graph is resolved here once: a cache hit only indexes.
        cap, fp = self.captured, self.functional
        self._positions = tuple(cap.tensor_positions)
        self._all_tensors = self._positions == tuple(range(cap.in_spec.num_leaves))
        self._symbols = tuple(cap.sym_positions)  # symbolic scalars: graph inputs after the tensors
        self._switches_grad = bool(fp.gm.graph.find_nodes(op="call_function", target=torch._C._set_grad_enabled))
        self._writebacks = [_WriteBackStep(self._getter(wb.target), wb.output, wb.grad) for wb in fp.writebacks]
        # A caller tensor that repeats its memory (expanded): copy one of each repeat (see writeback._apply).
        repeated = [
            repeated_dims(cap.fakes[wb.target.key]) if wb.target.kind is RefKind.INPUT else [] for wb in fp.writebacks
        ]
        self._repeated = {k: dims for k, dims in enumerate(repeated) if dims}
        self._outputs = [
            _OutputStep(
                self._getter(slot.source),
                slot.chain,
                slot.same_as,
                slot.grad,
                slot.grad_from,
                slot.grad_until,
                slot.multi_output,
            )
            for slot in fp.outputs
        ]
        self._early = [i for i, slot in enumerate(fp.outputs) if slot.early]
        self._from_output = {i: slot.from_output for i, slot in enumerate(fp.outputs) if slot.from_output}
        # (the output a slot is made from has a shorter chain, a prefix of the slot's: by length, it comes first)
        self._from_output_order = sorted(self._from_output.items(), key=lambda item: len(fp.outputs[item[0]].chain))
        self._restrides: list[tuple[int, Restride]] = [
            (i, slot.restride) for i, slot in enumerate(fp.outputs) if slot.restride is not None
        ]
        # Output chains with symbolic arguments take them from the graph's results on each call.
        self._computed = any(isinstance(a, ResultArg) for slot in fp.outputs for a in chain_args(slot.chain))
        self._metadata = [(self._getter(m.target), m) for m in fp.metadata_writebacks]
        self._unmoved = [self._getter(ref) for ref in fp.unmoved_counters]
        self._moved = [self._getter(ref) for ref in fp.moved_counters]
        n = len(cap.out_template)
        all_tensors = all(t is TENSOR_SLOT for t in cap.out_template)
        if all_tensors and cap.out_spec == pytree.tree_structure(tuple(range(n))):
            self._pack: Callable[[list[Any]], Any] = tuple
        elif all_tensors and n == 1 and cap.out_spec == pytree.tree_structure(0):
            self._pack = operator.itemgetter(0)
        elif n == 1 and cap.out_spec == pytree.tree_structure(0) and not isinstance(cap.out_template[0], list):
            constant = cap.out_template[0]  # a single non-tensor result (None, a number): the same each call
            self._pack = lambda outs: constant
        else:
            self._pack = self._unflatten
        self._has_size = "TreeSpec(Size" in repr(cap.out_spec)
        self.lean_call: Callable[[list[Any]], Any] = self._lean() or self.__call__

    def _lean(self) -> Callable[[list[Any]], Any] | None:
        """`__call__` as one generated function, for a program whose epilogue only copies whole results into the
        caller's tensors and picks its outputs (no alias group, no grad-mode switch, no metadata change, outputs
        without view chains): a cache hit then costs the graph's run, the copies and a few indexings. None for
        other programs."""
        fp = self.functional
        if self.captured.groups or self._switches_grad or fp.metadata_writebacks or self._repeated or self._early:
            return None
        if any(slot.chain or slot.restride for slot in fp.outputs):
            return None
        refs = (*(wb.target for wb in fp.writebacks), *fp.unmoved_counters, *fp.moved_counters)
        if any(ref.kind is not RefKind.INPUT for ref in refs):
            return None
        env: dict[str, Any] = {"run": self.run_graph, "pack": self._pack, "constants": fp.constants}
        inputs = [f"leaves[{p}]" for p in (*self._positions, *self._symbols)]
        # The copies, in the grad mode each write-back needs (dynamo guards the call's mode: the other mode, which
        # a piece of a split graph may run in, takes the general call).
        modes = {wb.grad for wb in fp.writebacks}
        targets = [self._positions[wb.target.key] for wb in fp.writebacks]
        copies = "".join(f"    leaves[{t}].copy_(r[{wb.output}])\n" for t, wb in zip(targets, fp.writebacks))
        if len(modes) > 1:
            return None
        mode = ""
        if modes:
            env.update(grad_enabled=torch.is_grad_enabled, general=self.__call__)
            mode = f"    if grad_enabled() is not {modes.pop()}:\n        return general(leaves)\n"
        outs: list[str] = []
        for slot in fp.outputs:
            kind, key = slot.source.kind, slot.source.key
            if slot.same_as is not None:
                outs.append(outs[slot.same_as])
            elif kind is RefKind.RESULT:
                outs.append(f"r[{key}]")
            elif kind is RefKind.INPUT:
                outs.append(f"leaves[{self._positions[key]}]")
            else:
                outs.append(f"constants[{key!r}]")
        listed = ", ".join(outs)
        packed = f"({listed}{',' * (len(outs) == 1)})" if self._pack is tuple else f"pack([{listed}])"
        keep = restore = ""
        if fp.unmoved_counters:  # (FunctionalProgram.unmoved_counters)
            env.update(set_versions=torch._C._autograd._unsafe_set_version_counter)
            unmoved = [f"leaves[{self._positions[ref.key]}]" for ref in fp.unmoved_counters]
            moved = [f"leaves[{self._positions[ref.key]}]" for ref in fp.moved_counters]
            # (each read written out: a generator costs more than the reads on a µs-scale call)
            versions = "".join(f"{t}._version, " for t in unmoved)
            keep = f"    kept = ({', '.join(unmoved)},)\n    versions = ({versions})\n"
            # (the moved counters read before the kept are set back, as __call__ does)
            restore = f"    finals = ({''.join(f'{t}._version, ' for t in moved)})\n" if moved else ""
            restore += "    set_versions(kept, versions)\n"
            if moved:
                restore += f"    set_versions(({', '.join(moved)},), finals)\n"
        src = f"def call(leaves):\n{mode}{keep}    r = run({', '.join(inputs)})\n{copies}{restore}    return {packed}\n"
        exec(compile(src, "<dealias lean program call>", "exec"), env)  # noqa: S102 - generated from the plan only
        return env["call"]

    def symbolic_inputs(self) -> list[str]:
        """What this program holds symbolic, in the user's names: `pos`, `x.size(1)`."""
        cap = self.captured
        if cap.fake_mode is None or cap.fake_mode.shape_env is None:
            return []
        out = [cap.names[p] for p in cap.sym_positions]
        for p, fake in zip(cap.tensor_positions, cap.fakes):
            out += [f"{cap.names[p]}.size({d})" for d, s in enumerate(fake.shape) if isinstance(s, torch.SymInt)]
        return out

    def _getter(self, ref: Ref) -> Getter:
        key = ref.key
        if ref.kind is RefKind.INPUT:
            return lambda tensors, bases, results: tensors[key]
        if ref.kind is RefKind.GROUP:
            return lambda tensors, bases, results: bases[key]
        if ref.kind is RefKind.CONSTANT:
            constant = self.functional.constants[key]
            return lambda tensors, bases, results: constant
        return lambda tensors, bases, results: results[key]

    def _output(self, i: int, tensors: list[Any], bases: list[Any], results: Any, grad: bool) -> Any:
        """Output `i`: its source, or the view of it eager returned, made in the grad modes eager made it in."""
        get, chain, _, made_with_grad, grad_from, until, multi = self._outputs[i]
        t = get(tensors, bases, results)
        if chain and self._computed:
            chain = map_chain_args(chain, ResultArg, lambda r: results[r.index])
        if chain and (multi or until is not None or (made_with_grad is not None and made_with_grad != grad)):
            head = chain[:grad_from]
            t = _replay_output(head, t, multi) if head else t
            with torch.set_grad_enabled(grad if made_with_grad is None else made_with_grad):
                t = _replay_output(chain[:until], t, multi, grad_from)
            if until is not None:  # (OutputSlot.grad_until)
                with torch.enable_grad():
                    t = _replay_output(chain, t, multi, until)
        elif chain:
            t = replay_chain(chain, t, _torch_call)
        return t

    def _group_bases(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each alias group's base, a view of its members' memory. Made with grad on when a member requires
        grad, whatever the call's mode (a piece of a split graph may start inside a no_grad region): a view
        made under no_grad could not be written with grad on by the graph."""
        if torch.is_grad_enabled() or not any(self.captured.requires_grad):
            return [g.base_of(tensors) for g in self.captured.groups]
        with torch.enable_grad():
            return [g.base_of(tensors) for g in self.captured.groups]

    def _unflatten(self, outs: list[Any]) -> Any:
        it = iter(outs)
        leaves = [next(it) if t is TENSOR_SLOT else t for t in self.captured.out_template]
        out = pytree.tree_unflatten(leaves, self.captured.out_spec)
        return _restore_sizes(self.captured.out_spec, out) if self._has_size else out

    def __call__(self, leaves: list[Any]) -> Any:
        tensors = leaves if self._all_tensors else [leaves[p] for p in self._positions]
        bases = self._group_bases(tensors) if self.captured.groups else []
        # The graph's inputs: the tensors, the symbols' values, the alias groups' bases (`bases` stays the groups'
        # alone: a GROUP ref indexes it).
        symbols = [leaves[p] for p in self._symbols]
        grad = torch.is_grad_enabled()
        # (FunctionalProgram.unmoved_counters: set back at the end, whatever the executor's writes moved them by)
        unmoved = [get(tensors, bases, ()) for get in self._unmoved]
        versions = tuple(t._version for t in unmoved)
        early = {i: self._output(i, tensors, bases, (), grad) for i in self._early}  # (OutputSlot.early)
        if self._switches_grad:
            try:
                results = self.run_graph(*tensors, *symbols, *bases)
            finally:
                torch._C._set_grad_enabled(grad)  # the graph switches it around no_grad regions
        else:
            results = self.run_graph(*tensors, *symbols, *bases)
        for i, (get, k, with_grad) in enumerate(self._writebacks):
            target, value = get(tensors, bases, results), results[k]
            for d in self._repeated.get(i, ()):
                target, value = target.narrow(d, 0, 1), value.narrow(d, 0, 1)
            if with_grad == grad:
                target.copy_(value)
            else:  # written with grad on (off) while the call runs with it off (on), as a split piece may
                with torch.set_grad_enabled(with_grad):
                    target.copy_(value)
        outs: list[Any] = []
        for i, step in enumerate(self._outputs):
            if step.same_as is not None:
                outs.append(outs[step.same_as])
            elif i in self._from_output:
                outs.append(None)  # (made below: the output it is a view of may come after it)
            else:
                outs.append(early[i] if i in early else self._output(i, tensors, bases, results, grad))
        if self._from_output:
            for i, (k, n) in self._from_output_order:  # (one made from one made so comes after it)
                chain = self._outputs[i].chain
                if self._computed:
                    chain = map_chain_args(chain, ResultArg, lambda r: results[r.index])
                made_with_grad = self._outputs[i].grad
                with torch.set_grad_enabled(grad if made_with_grad is None else made_with_grad):
                    outs[i] = replay_chain(chain[n:], outs[k], _torch_call)
            outs = [outs[s.same_as] if s.same_as is not None else o for o, s in zip(outs, self._outputs)]
        for i, (size, stride, rel) in self._restrides:  # once every output is made: other outputs may view outs[i]
            # Without moving the version counter: eager's moved at the change itself (for a caller's memory, the
            # graph's bump_version moved it there), before the outputs made after it, whose grad_fn would raise
            # (a split's element, a no_grad view) and what the graph saved stale at backward (fuzz seed 1310504).
            version = outs[i]._version
            outs[i].as_strided_(size, stride, outs[i].storage_offset() + rel)
            torch._C._autograd._unsafe_set_version_counter((outs[i],), (version,))
        for get, m in self._metadata:
            t = get(tensors, bases, results)
            # The graph moved the version counter where eager's in-place metadata change did (bump_version), before
            # what autograd saved after it; `as_strided_` moves it once more, which eager's program does not.
            version = t._version
            with torch.set_grad_enabled(m.grad):  # (as eager's changes were recorded by autograd, or not)
                t.as_strided_(m.size, m.stride, t.storage_offset() + m.rel)
            torch._C._autograd._unsafe_set_version_counter((t,), (version,))
            if m.detach:
                t.detach_()
        if unmoved:
            moved = tuple(get(tensors, bases, ()) for get in self._moved)
            finals = tuple(t._version for t in moved)
            torch._C._autograd._unsafe_set_version_counter(tuple(unmoved), versions)
            torch._C._autograd._unsafe_set_version_counter(moved, finals)
        return self._pack(outs)
