"""The pipeline, one graph at a time: capture -> alias analysis -> functionalize -> optimize -> write-back
lowering -> executor. Its input is a graph from dynamo and the real inputs of one call; its output is a
`CompiledProgram` that runs calls with the same input layout."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import re
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx
from torch._dynamo.source import LocalSource
from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP
from torch.utils import _pytree as pytree

from ..compat.fx_lazy import graph_module, lazy_graph_modules
from ..compat.gc_freeze import older_objects_frozen
from ..errors import InvariantError, UnsupportedError
from ..ir.gradops import caller_tensor, write_back_now
from ..ir.plan import Captured, FunctionalProgram, Ref, RefKind, Symbolic, WriteBackReport, root_node, writes_caller
from ..ir.traces import Trace, format_graph
from ..ir.viewops import symbolic_layout
from ..runtime.executor import torch_executor
from ..runtime.fused import AUTOGRAD, Unfusable, fused_executor, unfusable
from ..runtime.fused_autograd import fused_autograd_executor
from ..runtime.fused_outputs import outputs_in_graph
from ..runtime.generated_call import returned_as_views_only
from ..runtime.program import CompiledProgram, Executor, Tier
from . import program_cache
from .alias import analyze, writes_caller_memory
from .capture import capture
from .functionalize import functionalize
from .invariants import checker
from .optimize import optimize
from .saved import refuse_saved_then_written
from .writeback import lower
from .writeback_autograd import whole_writes_in_graph


def _execution_trace(
    fp: FunctionalProgram, reports: list[WriteBackReport], header: str, passes: list[tuple[str, float]], source: str
) -> Trace:
    return Trace("execution", lambda: _execution_text(fp, reports, header, source), passes, fp.gm)


def _execution_text(fp: FunctionalProgram, reports: list[WriteBackReport], header: str, source: str) -> str:
    """The graph the executor runs, then the call around it as it runs: the program's generated source (its
    epilogue writes back into the caller's tensors and makes the outputs)."""
    for r in reports:
        header += f"\n# write-back to {r.target}: {r.mode}, {r.nbytes} bytes: {', '.join(r.regions)}"
    graph = format_graph(fp.gm, "execute", header)
    return f"{graph}\n# the call, generated from the plan (this source runs)\n{source.rstrip()}"


class _Clock:
    """The time each pass of one compile takes, for the traces' provenance."""

    def __init__(self) -> None:
        self.passes: list[tuple[str, float]] = []
        self._taken = 0

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.passes.append((name, time.perf_counter() - start))

    def take(self) -> list[tuple[str, float]]:
        """The passes timed since the last take."""
        out, self._taken = self.passes[self._taken :], len(self.passes)
        return out


def _copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})  # the copy's own nodes for the output values
    graph.output(out)
    return graph_module(gm, graph)  # (lazy: lowering rewrites it, and only the executors read its code)


def _alias_placeholders(gm: fx.GraphModule, captured: Any) -> dict[fx.Node, list[fx.Node]]:
    """Each alias group's base placeholder -> the member placeholders that alias its memory."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    return {
        root_node(gm, Ref(RefKind.GROUP, g)): [placeholders[m] for m in group.members]
        for g, group in enumerate(captured.groups)
    }


def compile_program(
    gm: fx.GraphModule,
    leaves: list[Any],
    names: list[str],
    executor: Executor | str = Executor.TORCH,
    symbolic: Symbolic | None = None,
    front: Front | None = None,
) -> CompiledProgram:
    """`_compile_program`, its graph modules generating their code when it is read (compat/fx_lazy.py), the
    collector's full collections walking only the objects it makes (compat/gc_freeze.py)."""
    with lazy_graph_modules(), older_objects_frozen():
        return _compile_program(gm, leaves, names, executor, symbolic, front)


def _compile_program(
    gm: fx.GraphModule,
    leaves: list[Any],
    names: list[str],
    executor: Executor | str,
    symbolic: Symbolic | None,
    front: Front | None,
) -> CompiledProgram:
    """capture -> alias analysis -> functionalize -> optimize -> write-back lowering -> executor, for dynamo's
    graph `gm` called with `leaves`, whose inputs are called `names`; what `symbolic` names stays symbolic (the
    program's `shape_guard` says for which calls it holds). `front`: another program's `front`, compiled from the
    same graph and the same call's leaves, whose passes up to optimize are taken instead of run again."""
    grad = torch.is_grad_enabled()  # the mode calls enter with (keyed): the executor's baseline
    clock = _Clock()
    # The program cache's key (program_cache.py): of the front, loaded or kept here, and of the fused retrace
    kept_key = program_cache.key(gm, leaves, names) if not symbolic else None
    if front is None:
        front = _loaded_front(program_cache.load(kept_key, leaves))
        loaded = front is not None
    else:
        loaded = True  # (another compile's: kept by that one)
    if front is not None:
        writes = front.writes
        captured, fp, functional, captured_passes = front.take()
        functional_gm = functional.graph
        check = checker(captured)
    else:
        try:
            with clock("capture"):
                captured = capture(gm, leaves, names, symbolic)
        finally:
            # Tracing runs the graph's grad-mode switches; a piece of a split graph (segments.py) may end in
            # another mode than it began.
            torch._C._set_grad_enabled(grad)
        captured_passes = clock.take()
        with clock("alias analysis"):
            info = analyze(captured.gm, captured.groups)
            symbolic_sizes = captured.symbols or any(
                isinstance(d, torch.SymInt) for f in captured.fakes for d in f.shape
            )
            tensors = None if symbolic_sizes else [leaves[p] for p in captured.tensor_positions]
            refuse_saved_then_written(captured.gm, info, captured.requires_grad, tensors)
        check = checker(captured)  # post-conditions of each pass (DEALIAS_CHECK=1), a no-op otherwise
        with clock("functionalize"):
            fp = functionalize(captured, info)
        check("functionalize", fp)
        with clock("optimize"):
            fp.gm = optimize(fp.gm, first_output=fp.first_output)
        check("optimize", fp)
        functional_gm = _copy_graph_module(fp.gm)
        functional = Trace(
            "functional",
            lambda: format_graph(functional_gm, "functional", "functional trace (no mutation)"),
            clock.take(),
            functional_gm,
        )
        # Whether a call changes a caller tensor: from the captured graph's ops, and the plan (before lowering moves
        # write-backs into the graph); either one saying so is enough. (A front's compile takes its first's.)
        writes = writes_caller(fp, captured) or writes_caller_memory(captured.gm, info)
    kept = Front(captured, _fp_copy(fp, functional_gm), functional, captured_passes, writes)
    if not loaded:  # (compiled here: kept for the next process, before lowering rewrites anything)
        program_cache.save(kept_key, captured, kept.parts[1], writes)
    run, tier, name = None, Tier.TORCH, "execution trace (torch executor)"
    unfused = ""  # why a graph the fused executor was asked for runs on the torch executor
    if executor == Executor.INDUCTOR and not torch.is_inference_mode_enabled():
        if any(isinstance(x, torch.Tensor) and x.is_inference() for x in leaves):
            # Eager raises at a write of an inference tensor outside inference mode; the torch executor's ops
            # raise it, inductor's kernels would write (a write through a view of one: found in review).
            executor, name = Executor.TORCH, "execution trace (torch executor: not fused, an inference tensor input)"
            unfused = "an inference tensor input"
        elif any(isinstance(x, torch.Tensor) and (x.is_neg() or x.is_conj()) for x in leaves):
            # Inductor's kernels read an input's memory as it is, without its negative bit: `z.conj().imag` (a real
            # tensor whose values are its memory's negated) read as `-x` (as torch.compile's own: upstream's bug).
            why = "an input with a negative or conjugate bit (inductor reads its memory without it)"
            executor, name = Executor.TORCH, f"execution trace (torch executor: not fused, {why})"
            unfused = why
    why = unfusable(fp.gm) if executor == Executor.INDUCTOR else None
    if why == AUTOGRAD and _hidden_writes_only(fp, captured):
        why = None
    if executor == Executor.INDUCTOR and why == AUTOGRAD:
        try:
            trial = dataclasses.replace(fp, gm=_copy_graph_module(fp.gm))
            aliases = _alias_placeholders(trial.gm, captured)
            with clock("write-back lowering"):
                trial, reports = lower(trial, aliases)  # (a graph autograd records stays functional)
            check("lower", trial, functional_gm, aliases)
            trial, in_graph = whole_writes_in_graph(trial)  # (stores in the kernel, as torch.compile's)
            placeholders = trial.gm.graph.find_nodes(op="placeholder")
            written = frozenset(placeholders.index(root_node(trial.gm, wb.target)) for wb in trial.writebacks)
            written |= in_graph
            with clock("AOTAutograd and inductor"):
                call = [leaves[p] for p in (*captured.tensor_positions, *captured.sym_positions)]
                viewed = returned_as_views_only(trial, grad)
                run = fused_autograd_executor(trial.gm, _examples(captured, leaves), written, call, viewed)
            fp, shown, tier = trial, trial, Tier.FUSED
            name = "execution trace (fused with autograd: AOTAutograd and inductor compile this graph)"
        except Unfusable as e:
            name, unfused = f"execution trace (torch executor: not fused, {e})", str(e)
    elif executor == Executor.INDUCTOR:
        try:
            if why is not None:
                raise Unfusable(why)
            # Lowering and the fused executor rewrite the graph: a copy of it; a front's `fp` is one already
            # (`Front.take`), and the torch executor's fallback copies the functional graph only if this fails.
            trial = fp if front is not None else dataclasses.replace(fp, gm=_copy_graph_module(fp.gm))
            fp = _fp_copy(fp, functional_gm) if front is not None else fp  # (lists and slots its own)
            aliases = _alias_placeholders(trial.gm, captured)
            with clock("write-back lowering (fused)"):
                trial, reports = lower(trial, aliases, fused=True)
            check("lower", trial, functional_gm, aliases)
            trial = outputs_in_graph(trial)  # (a reshape of a result, as returned: made by the graph, no replay)
            with clock("inductor"):
                retraces = {"kept": program_cache.Retraces(kept_key)} if kept_key is not None else {}
                run = fused_executor(trial.gm, _examples(captured, leaves), **retraces)
            fp, shown, tier = trial, dataclasses.replace(trial, gm=run.graph), Tier.FUSED
            name = "execution trace (fused: inductor compiles this graph, writes into the caller's memory included)"
            if hasattr(run, "raises"):  # (runtime/kernel_checks.py: eager's kernel rejects these dtypes or sizes)
                name = f"execution trace (fused: {run.raises})"
        except Unfusable as e:
            name, unfused = f"execution trace (torch executor: not fused, {e})", str(e)
            if fp.gm is functional_gm:  # (the trace's graph: the torch executor lowers a copy)
                fp = dataclasses.replace(fp, gm=_copy_graph_module(functional_gm))
    if run is None:
        aliases = _alias_placeholders(fp.gm, captured)
        with clock("write-back lowering"):
            fp, reports = lower(fp, aliases, autograd_in_place=True)
        check("lower", fp, functional_gm, aliases)
        with clock("torch executor"):
            run = torch_executor(fp.gm, grad)
        check("torch executor", fp)
        shown = fp
    _no_loose_symbols(fp.gm)
    # Name each caller tensor as the captured graph does (after the user's argument or attribute).
    inputs = [n.name for n in captured.gm.graph.find_nodes(op="placeholder")]
    reports = [
        dataclasses.replace(r, target=inputs[r.ref.key] if r.ref.kind is RefKind.INPUT else str(r.ref)) for r in reports
    ]
    captured_header = "captured trace (aten, mutations and views kept)"
    traces = [
        Trace("dynamo", lambda: f"# dynamo graph (torch level)\n{gm.code.strip()}"),
        Trace("captured", lambda: format_graph(captured.gm, "captured", captured_header), captured_passes, captured.gm),
        functional,
    ]
    with clock("call generation"):
        guard, layouts = _shape_guard(captured), tensor_layouts(captured)
        program = CompiledProgram(captured, fp, run, traces, functional_gm, reports, guard, layouts, tier, grad)
        program.unfused = unfused
        program.writes = writes
    program.front = kept if tier is Tier.TORCH else None
    traces.append(_execution_trace(shown, reports, name, clock.take(), program.source))
    return program


def _fp_copy(fp: FunctionalProgram, gm: fx.GraphModule) -> FunctionalProgram:
    """`fp` over `gm`, with lists and output slots of its own (lowering may change them in place)."""
    return dataclasses.replace(
        fp,
        gm=gm,
        writebacks=list(fp.writebacks),
        metadata_writebacks=list(fp.metadata_writebacks),
        outputs=[copy.copy(slot) for slot in fp.outputs],
        constants=dict(fp.constants),
        unmoved_counters=list(fp.unmoved_counters),
        moved_counters=list(fp.moved_counters),
    )


class Front:
    """What a compile made up to optimize, for a second compile of the same graph from the same call (executor
    "tiered" builds its fused program in the first call, right after the torch executor's: capture and the
    passes, a second or more on a large graph, are not run twice). `take()` once: the functional program on a copy
    of the functional graph, which the first compile's trace keeps unchanged."""

    def __init__(
        self, captured: Captured, fp: FunctionalProgram, functional: Trace, passes: list[Any], writes: bool
    ) -> None:
        self.parts: tuple[Any, ...] | None = (captured, fp, functional, passes)
        self.writes = writes  # (CompiledProgram.writes: the same graph and plan, the same answer)

    def take(self) -> tuple[Captured, FunctionalProgram, Trace, list[Any]]:
        if self.parts is None:
            raise InvariantError("a compile's front taken twice")
        (captured, fp, functional, passes), self.parts = self.parts, None
        return captured, _fp_copy(fp, _copy_graph_module(fp.gm)), functional, passes


def _loaded_front(loaded: tuple[Captured, FunctionalProgram, bool, float] | None) -> Front | None:
    """A front from the program cache (an earlier process's capture and passes up to optimize), or None."""
    if loaded is None:
        return None
    captured, fp, writes, seconds = loaded
    functional_gm = _copy_graph_module(fp.gm)
    passes = [("loaded from the program cache", seconds)]
    functional = Trace(
        "functional",
        lambda: format_graph(functional_gm, "functional", "functional trace (no mutation)"),
        passes,
        functional_gm,
    )
    return Front(captured, _fp_copy(fp, functional_gm), functional, passes, writes)


def _hidden_writes_only(fp: FunctionalProgram, captured: Captured) -> bool:
    """A graph autograd records whose results require no grad, writing a caller's tensor that requires grad (a
    hand-written step `p.data.add_(g, alpha=-lr)`, which reads p through a clone that requires grad): what it
    records is observable nowhere, and fused_autograd refuses the write; the fused executor runs it unrecorded.
    Not so when the graph runs an op in place on a caller's tensor (`caller_tensor`, `write_back_now`): autograd
    records that op on the caller's own tensor, as eager's `x.relu_()` (the fused executor would drop it)."""
    graph = fp.gm.graph
    if graph.find_nodes(op="call_function", target=caller_tensor) or graph.find_nodes(
        op="call_function", target=write_back_now
    ):
        return False
    results = graph.output_node().args[0]
    if any(isinstance(r, fx.Node) and r.meta.get("rg", True) for r in pytree.tree_leaves(results)):
        return False
    return any(wb.target.kind is RefKind.INPUT and captured.requires_grad[wb.target.key] for wb in fp.writebacks)


def _examples(captured: Any, leaves: list[Any]) -> list[Any]:
    """What the fused executor compiles the graph for: the call's tensors; for a program over symbols, the fake
    tensors and symbols it was captured with (inductor then generates code for every value of them, and the guards
    its decisions add go into the program's `shape_guard`)."""
    if captured.fake_mode.shape_env is None:
        return [leaves[p] for p in captured.tensor_positions]
    return [*captured.fakes, *captured.symbols]


def _no_loose_symbols(gm: fx.GraphModule) -> None:
    """Every symbolic size a graph uses must be a value of the graph (a node); a SymInt object left in an op's
    arguments would be printed as its symbol's name and fail when run. Refuse instead (the backend then
    compiles with sizes specialized)."""
    for node in gm.graph.nodes:
        loose = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, _SYM_TYPES)]
        if loose:
            raise UnsupportedError(f"{node.target} takes the symbolic size {loose[0]} as a constant")


_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _shape_guard(captured: Any) -> Any:
    """For a program over symbols: `guard(leaves) -> bool`, whether this call satisfies every assumption the
    compile made about its symbolic sizes and scalars (`0 <= pos <= 13`, `x.size(0) >= 2`), from the program's
    ShapeEnv; None if the program has no symbols. Generated once as a Python function of the inputs. Static
    sizes and strides are left to the tensor check (`tensor_layouts`)."""
    shape_env = captured.fake_mode.shape_env
    if shape_env is None:
        return None
    tensors = [(p, f) for p, f in zip(captured.tensor_positions, captured.fakes) if symbolic_layout(f)]
    positions = [p for p, _ in tensors] + captured.sym_positions
    placeholders = [f for _, f in tensors] + captured.symbols
    names = [f"t{i}" for i in range(len(positions))]
    # torch's produce_guards_expression joins its guards with a bare " and ": a guard that is a disjunction
    # (`a == 1 or b == c`) then swallows the guards before it. Each guard is parenthesized here.
    guards = shape_env.produce_guards(placeholders, [LocalSource(name) for name in names])
    guards += _pinned(shape_env, placeholders, names)
    code = " and ".join(f"({g})" for g in guards)
    for name in names:
        code = code.replace(f"L['{name}']", name)
    check = eval(f"lambda {', '.join(names)}: {code or True}", dict(SYMPY_INTERP))  # noqa: S307 - torch's guard
    guard = lambda leaves: check(*(leaves[p] for p in positions))
    guard.text = code or "True"  # for explaining a miss, in the user's names
    # (no guard at all: a program over symbols that assumed nothing of them, which a call need not check, ~0.4 us)
    guard.always = not code
    for name, p in zip(names, positions):
        guard.text = re.sub(rf"\b{name}\b", captured.names[p], guard.text)
    return guard


def _pinned(shape_env: Any, placeholders: list[Any], names: list[str]) -> list[str]:
    """A guard per symbolic size, stride, storage offset or scalar that a compile pinned to a constant (inductor's
    compile of a program over symbols may replace `s0` by 2): produce_guards leaves it out (its guard `Eq(s0, 2)`
    simplifies to True once the replacement applies), and the tensor check (`tensor_layouts`) sees a symbol: no check
    at all, and a call with `x.size(0) == 3` ran the fused program compiled for 2 (inductor's assert_size_stride)."""
    pinned = []
    for name, p in zip(names, placeholders):
        parts = [(name, p)]
        if isinstance(p, torch.Tensor):
            parts = [(f"{name}.size()[{i}]", s) for i, s in enumerate(p.shape)]
            parts += [(f"{name}.stride()[{i}]", s) for i, s in enumerate(p.stride())]
            parts.append((f"{name}.storage_offset()", p.storage_offset()))
        for text, value in parts:
            if isinstance(value, torch.SymInt):
                expr = shape_env.replace(value.node.expr)
                if expr.is_number:
                    pinned.append(f"{text} == {int(expr)}")
    return pinned


def tensor_layouts(captured: Any) -> list[tuple[list[Any], list[Any]]]:
    """Per tensor input, the sizes and strides the program is specialized to (None where symbolic)."""

    def static(xs: Any) -> list[Any]:
        return [None if isinstance(x, torch.SymInt) else x for x in xs]

    return [(static(f.shape), static(f.stride())) for f in captured.fakes]
