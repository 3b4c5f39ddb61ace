"""Eager's kernel checks the fused executor would skip: errors that depend on dtypes, shapes and devices only.

Fake tensors run an op's meta kernel, and some meta kernels check less than eager's (`buf[idx] = v` with `v` float64
into float32 memory: eager's `index_put_` raises "Index put requires the source and destination dtypes match",
fake tensors accept it; `index_copy_` with an int32 index; `index_add_` of another dtype...). The torch executor
runs eager's kernels, which raise; inductor's kernels cast and write. These errors depend only on what every call
of a program shares (its inputs' dtypes, sizes, strides and devices, and the constants of the graph), so they are
decided when compiling: each op of the lowered graph runs once on zero-filled memory laid out like its traced
arguments (checks.probe, eager's own kernel), and an op that raises there is asked again on other values (ones;
random floats and large integers; rising integers: checks.metadata_error): an error every run raises alike depends
on no value (zeros alone would decide an integer division by zero, or pivots `lu_unpack` refuses), and every call
raises it. The
program then raises it at every call, before writing anything: after the index checks of the ops before it (an
index out of range there is eager's first error), with eager's exception (type and message). A graph over
symbols, whose sizes change between calls, is left to the torch executor instead (what eager checks of its sizes
at other values is not known here), as is a graph AOTAutograd would compile (fused_autograd.py): its write-backs
run after the graph, so eager's kernels raise before anything is written.

Not probed: views (fake tensors run the view functions eager runs), ops of other namespaces (a user's custom op
may have effects), ops that may raise on their values and are no index reads or writes (the prologue keeps those
graphs on the torch executor), and ops on memory larger than the probe's limit (checks._PROBE_LIMIT), unless they
take positions from an index (`buf[idx] = v`, `index_copy_`, `embedding`): those run on such memory unfilled.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

from ..errors import mark_refused
from ..ir.checks import NoProbe, index_args, is_bounds_check, metadata_error
from ..ir.gradops import bump_version
from ..ir.opfacts import facts, is_view_node, may_raise
from . import kernel_verdicts
from .hazards import Unfusable
from .prologue import make_prologue


def first_metadata_error(gm: fx.GraphModule, at_hints: bool = False) -> tuple[fx.Node, BaseException] | None:
    """The first op of `gm` (in program order) whose eager kernel raises for its arguments' metadata whatever
    their values (checks.metadata_error), and eager's exception; None if there is none (or none can be asked).
    `at_hints`: symbolic sizes at their values in the compiling call."""
    try:
        for n in gm.graph.nodes:
            if not _probed(n):
                continue
            # (an op whose kernel accepted these metadata in an earlier probe, in this process or on disk, is not
            # probed again: kernel_verdicts.py says what its key holds)
            key = kernel_verdicts.key_of(n) if not at_hints else None
            if kernel_verdicts.accepted(key):
                continue
            try:
                error = metadata_error(n, at_hints=at_hints)
            except NoProbe:
                continue
            if error is not None:
                return n, error
            kernel_verdicts.remember(key)
        return None
    finally:
        kernel_verdicts.flush()


def _probed(n: fx.Node) -> bool:
    op = n.target
    if n.op != "call_function" or not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return False
    if is_view_node(n) or op.name().startswith("aten::sym_") or facts(op).nondeterministic:
        return False
    return not may_raise(op) or bool(index_args(n))


def check_kernels(gm: fx.GraphModule, example: list[Any]) -> Callable[..., Any] | None:
    """For the fused executor's lowered graph `gm`: None if no op's eager kernel raises for these metadata; else
    the program that raises eager's error at every call (`raising_program`), or Unfusable for a graph over symbols
    (the torch executor's kernels then raise)."""
    symbolic = any(isinstance(e, FakeTensor) for e in example)
    found = first_metadata_error(gm, at_hints=symbolic)
    if found is None:
        return None
    if symbolic:
        _refuse(*found)
    return raising_program(gm, *found)


def refuse_raising(gm: fx.GraphModule, example: list[Any]) -> None:
    """For a functional graph AOTAutograd would compile: Unfusable if an op's eager kernel raises for these
    metadata (the torch executor's kernels raise it, before the epilogue writes anything back)."""
    found = first_metadata_error(gm, at_hints=any(isinstance(e, FakeTensor) for e in example))
    if found is not None:
        _refuse(*found)


def _refuse(node: fx.Node, error: BaseException) -> None:
    raise Unfusable(f"eager's {node.target} raises {type(error).__name__} for these dtypes, sizes or devices")


def raising_program(gm: fx.GraphModule, failing: fx.Node, error: BaseException) -> Callable[..., Any]:
    """A call of `gm` that raises `error` (eager's, at `failing`) before writing anything: first the index checks
    eager meets before `failing` (the prologue of the graph cut there, without its version bumps), then the
    error. Raises Unfusable where that prologue cannot be made (the torch executor runs the graph)."""
    before = copy.deepcopy(gm)
    cut = next(n for n in before.graph.nodes if n.name == failing.name)
    order = {n: i for i, n in enumerate(before.graph.nodes)}
    dropped = [n for n in before.graph.nodes if n.op not in ("placeholder", "output") and order[n] >= order[cut]]
    # A bounds check stands before the first write, for every indexed write: one guarding only writes from the
    # failing op on is not met in eager (its version bumps neither: nothing is written).
    for n in before.graph.nodes:
        if n.op == "call_function" and (n.target is bump_version or is_bounds_check(n.target) and not _met(n, cut)):
            dropped.append(n)
    output = before.graph.output_node()
    output.args = ((),)
    for n in sorted(set(dropped), key=order.__getitem__, reverse=True):
        for user in list(n.users):
            if user not in dropped:
                raise Unfusable(f"{user} reads what the failing {failing.target} computes")  # (not seen: defensive)
        before.graph.erase_node(n)
    before.recompile()
    prologue = make_prologue(before)

    def run(*args: Any) -> Any:
        if prologue is not None:
            prologue(args)
        # Marked as raised before the call did anything: the graph's caller runs it eagerly instead, which makes
        # eager's writes before `failing` and raises there (frontend/backend.py `_eagerly`).
        raised = copy.copy(error).with_traceback(None)
        mark_refused(raised)
        raise raised from None

    run.graph = gm  # type: ignore[attr-defined]  # (for traces: the program that raises is this one's)
    what = f"raises eager's {type(error).__name__} of {failing.target} at every call, before any write"
    run.raises = what  # type: ignore[attr-defined]  # (the execution trace's header says so)
    return run


def _met(check: fx.Node, cut: fx.Node) -> bool:
    """Whether the bounds check `check` guards an op eager runs before `cut`: one taking its index as an index."""
    index = check.args[0]
    order = {n: i for i, n in enumerate(cut.graph.nodes)}
    return any(
        order[u] < order[cut] and any(i is index for i, _, _ in index_args(u))
        for u in index.users
        if u.op == "call_function" and not is_bounds_check(u.target)
    )
