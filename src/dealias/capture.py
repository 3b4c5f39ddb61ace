"""Capture: run the user's function once over fake tensors with `make_fx` and keep the aten ops exactly as
dispatched, in-place and view ops included (no PyTorch functionalization).

Python scalars and every other non-tensor leaf of the arguments are specialized: they are baked into the
trace and belong to the guard key (see `guards.py`). Each traced op keeps the user's source line.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import operator
import re
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, free_unbacked_symbols
from torch.fx.proxy import _register_stack_trace_anchor
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .errors import DataDependentError, UnsupportedError, with_location
from .sharing import AliasGroup, find_groups

TENSOR_SLOT = object()  # marks a tensor output in `Captured.out_template`
_DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode)
_OWN_DIRS = ("/torch/", "/dealias/", "/torch\\", "/dealias\\")


@dataclass
class Captured:
    """A traced program over the flat tensor leaves of one call signature."""

    gm: fx.GraphModule
    in_spec: pytree.TreeSpec
    tensor_positions: list[int]  # positions of the tensor leaves among all argument leaves
    out_spec: pytree.TreeSpec | None = None
    out_template: list[Any] = field(default_factory=list)  # output leaves; TENSOR_SLOT marks a tensor
    fake_mode: FakeTensorMode | None = None
    groups: list[AliasGroup] = field(default_factory=list)  # inputs that overlap in memory
    requires_grad: list[bool] = field(default_factory=list)  # per tensor input (fake metas do not keep it)
    detached: set[int] = field(default_factory=set)  # tensor inputs the program ran detach_() on


@contextlib.contextmanager
def quiet_fake_tensor_log() -> Iterator[None]:
    """Fake tensors log a traceback whenever an op raises; while tracing, such an error is the program's own
    (eager raises it too) and is re-raised to the caller, so the log is noise."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def user_location(stack_trace: str | None) -> str | None:
    """`file:line  source` of the innermost user frame in an fx `stack_trace` string."""
    if not stack_trace:
        return None
    lines = stack_trace.strip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if line.startswith("File "):
            parts = line.split(",")
            path = parts[0][len('File "') : -1]
            lineno = parts[1].strip().removeprefix("line ")
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{path}:{lineno}  {code}"
    return None


def exception_location(exc: BaseException) -> str | None:
    """The innermost frame of `exc`'s traceback that is user code (not torch, not dealias)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not any(d in f.filename for d in _OWN_DIRS)]
    if not frames:
        return None
    f = frames[-1]
    return f"{f.filename}:{f.lineno}  {(f.line or '').strip()}"


def node_location(node: fx.Node) -> str | None:
    return user_location(node.meta.get("stack_trace"))


def capture(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    anchor: Callable[..., Any] | None = None,
    names: list[str] = (),
) -> Captured:
    """Trace `fn(*args, **kwargs)`; raise DataDependentError if the program depends on tensor data.
    `anchor` is the user's function (its frames are the source lines kept); `names` name the first inputs."""
    leaves, in_spec = pytree.tree_flatten((args, kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    captured = Captured(fx.GraphModule({}, fx.Graph()), in_spec, positions)
    captured.groups = find_groups([leaves[p] for p in positions])
    captured.requires_grad = [leaves[p].requires_grad for p in positions]

    def flat_fn(*tensors: torch.Tensor) -> list[torch.Tensor]:
        call_leaves = list(leaves)
        for pos, t in zip(positions, tensors):
            call_leaves[pos] = t
        a, kw = pytree.tree_unflatten(call_leaves, in_spec)
        with grad_modes, _AutogradMetadata(tensors, captured.detached):
            out = fn(*a, **kw)
        out_leaves, captured.out_spec = pytree.tree_flatten(out)
        captured.out_template = [TENSOR_SLOT if isinstance(o, torch.Tensor) else o for o in out_leaves]
        return [o for o in out_leaves if isinstance(o, torch.Tensor)]

    from_dynamo = isinstance(fn, fx.GraphModule)
    if from_dynamo:
        # A graph from dynamo: run it node by node so that each aten op keeps the node's meta (the user's
        # source line is in its stack_trace).
        graph_module, fn = fn, lambda *a: fx.Interpreter(graph_module).run(*a)
        names = [names[p] for p in positions] if names else []
    else:
        target = anchor if anchor is not None else fn
        target = getattr(target, "forward", target)
        code_owner = getattr(target, "__func__", target)
        if hasattr(code_owner, "__code__"):
            _register_stack_trace_anchor(code_owner)
    grad_modes = _GradModes()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(leaves[p]) for p in positions]
    keep_meta = fx_traceback.preserve_node_meta() if from_dynamo else contextlib.nullcontext()
    try:
        with quiet_fake_tensor_log(), keep_meta:
            gm = make_fx(
                flat_fn, tracing_mode="fake", record_stack_traces=not from_dynamo, _allow_non_fake_inputs=True
            )(*fakes)
    except _DATA_DEPENDENT as e:
        if isinstance(e, DataDependentOutputException):
            what = "reads a tensor's value into Python"
        elif isinstance(e, DynamicOutputShapeException):
            what = "makes a tensor whose shape depends on data (a data-dependent shape)"
        else:
            what = "branches in Python on a tensor's value"
        raise DataDependentError(with_location(f"the program {what}", exception_location(e))) from e
    _check_static(gm)
    grad_modes.annotate(gm)
    if from_dynamo:
        _rename_all(gm, names)
    else:
        _name_placeholders(gm, anchor if anchor is not None else fn, leaves, positions, in_spec, list(names))
    captured.gm = gm
    captured.fake_mode = mode
    return captured


class _AutogradMetadata(TorchFunctionMode):
    """`x.detach_()`, `x.requires_grad_()` and attribute assignments (`x.data = y`) change a tensor without any
    aten op, so make_fx does not see them. Record detach_() of an input (written back to the caller's
    tensor); refuse the rest (the program then runs eagerly)."""

    def __init__(self, inputs: tuple[torch.Tensor, ...], detached: set[int]) -> None:
        super().__init__()
        self.inputs = {id(t): i for i, t in enumerate(inputs)}
        self.detached = detached

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.detach_:
            if id(args[0]) not in self.inputs:
                raise UnsupportedError("detach_() of a tensor that is not an argument is not supported")
            self.detached.add(self.inputs[id(args[0])])
        elif func is torch.Tensor.requires_grad_:
            raise UnsupportedError("requires_grad_() inside a compiled function is not supported")
        elif getattr(func, "__name__", "") == "__set__":  # `x.data = y`, `x.grad = None`: no aten op records it
            attr = getattr(getattr(func, "__self__", None), "__name__", "an attribute")
            raise UnsupportedError(f"assigning a tensor's .{attr} inside a compiled function is not supported")
        return func(*args, **(kwargs or {}))


class _GradModes(TorchDispatchMode):
    """Records whether grad mode was on for each aten call the program makes (`with torch.no_grad():`
    inside the function), then stores it on the traced nodes as meta["grad"]."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, torch.is_grad_enabled()))
        return func(*args, **(kwargs or {}))

    def annotate(self, gm: fx.GraphModule) -> None:
        # make_fx records the same calls in the same order; a node it adds on its own keeps the mode of the
        # call before it.
        i, grad = 0, torch.is_grad_enabled()
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            j = next((j for j in range(i, len(self.calls)) if self.calls[j][0] is node.target), None)
            if j is not None:
                grad, i = self.calls[j][1], j + 1
            node.meta["grad"] = grad


def _check_static(gm: fx.GraphModule) -> None:
    """Reject reads of tensor data into Python (`.item()`) and data-dependent shapes (`x[mask]`):
    make_fx traces them with unbacked symbols, which a static program cannot run exactly."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        val = node.meta.get("val")
        data_dependent = node.target is torch.ops.aten._local_scalar_dense.default
        if not data_dependent and node.target is not operator.getitem:
            vals = val if isinstance(val, (list, tuple)) else [val]
            data_dependent = any(isinstance(v, torch.Tensor) and free_unbacked_symbols(v) for v in vals)
        if data_dependent:
            what = ".item()/Python scalar of a tensor" if "scalar" in str(node.target) else "a data-dependent shape"
            raise DataDependentError(with_location(f"the program reads {what} ({node.target})", node_location(node)))


def _name_placeholders(
    gm: fx.GraphModule,
    fn: Callable[..., Any],
    leaves: list[Any],
    positions: list[int],
    in_spec: pytree.TreeSpec,
    names: list[str],
) -> None:
    """Name each input after the user's parameter and its place in the pytree (`xs_a`, `cache_0`); the
    first `len(names)` inputs (lifted state) by `names`."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    if names:
        params = ["lifted", *params]
    paths = [p for p, _ in pytree.tree_flatten_with_path(pytree.tree_unflatten(leaves, in_spec))[0]]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (node, pos) in enumerate(zip(placeholders, positions)):
        if i < len(names):
            node._rename("".join(c if c.isalnum() else "_" for c in names[i]))
            continue
        keys = [getattr(k, "idx", getattr(k, "key", None)) for k in paths[pos]]
        if keys and keys[0] == 0 and len(keys) > 1 and isinstance(keys[1], int):
            head = params[keys[1]] if keys[1] < len(params) else f"arg{keys[1]}"
            rest = keys[2:]
        else:
            head, rest = (str(keys[1]) if len(keys) > 1 else "arg"), keys[2:]
        name = "_".join([head, *map(str, rest)])
        node._rename("".join(c if c.isalnum() or c == "_" else "_" for c in name))
    gm.recompile()


def _rename_all(gm: fx.GraphModule, names: list[str]) -> None:
    """Name each input after what the user calls it (`cache`, `self_lin_weight`)."""
    used: set[str] = set()
    for node, name in zip([n for n in gm.graph.nodes if n.op == "placeholder"], names):
        base = re.sub(r"\W+", "_", name).strip("_") or "arg"
        if base[0].isdigit():
            base = f"arg_{base}"
        candidate, k = base, 1
        while candidate in used:
            candidate, k = f"{base}_{k}", k + 1
        used.add(candidate)
        node._rename(candidate)
    gm.recompile()
