"""Building graph nodes the way every pass after capture does: each node keeps a fake value (sizes and strides
later passes need), the user's source line, grad mode and requires_grad of the op being translated, and
symbolic sizes as graph values. Functionalization and write-back lowering both build with an Emitter."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from ..compat import warns
from ..errors import UnsupportedError
from .checks import concrete
from .draws import kept_rng
from .opfacts import is_view_target, op_name

aten = torch.ops.aten


class Emitter:
    """Adds nodes to a graph, keeping a fake value on every node (sizes and strides are needed by the view
    inverses and later passes), the user's source line, grad mode and requires_grad of the op being
    translated. Functionalization and write-back lowering both build with it."""

    def __init__(self, graph: fx.Graph, fake_mode: FakeTensorMode) -> None:
        self.graph = graph
        self.fake_mode = fake_mode
        self.stack_trace: str | None = None
        self.grad: bool | None = None  # grad mode of the op being translated
        self.symbols: dict[Any, Any] | None = None  # symbol or expression -> its node (see symbolic)
        self.extra_meta: dict[str, Any] = {}  # added to every node made (e.g. which node a decomposition replaces)

    def call(self, op: Callable[..., Any], *args: Any, **kwargs: Any) -> fx.Node:
        if self.fake_mode.shape_env is not None:
            args, kwargs = self.symbolic((args, kwargs))
        name = op_name(op) if op is not operator.getitem else "getitem"
        node = self.graph.create_node("call_function", op, args, kwargs, name=name)
        fargs, fkwargs = pytree.tree_map_only(fx.Node, lambda n: n.meta["val"], (args, kwargs))
        with self.fake_mode:  # (an op of dealias's own graphs may say how its value is computed on fake tensors)
            node.meta["val"] = getattr(op, "dealias_meta", op)(*fargs, **fkwargs)
        if self.stack_trace:
            node.meta["stack_trace"] = self.stack_trace
        if self.grad is not None:
            node.meta["grad"] = self.grad
        node.meta.update(self.extra_meta)
        # requires_grad, propagated here (fake values do not keep it): grad mode on, an input needs it, and the
        # result is differentiable (not detached, not integer, not a result autograd never differentiates).
        grad = self.grad if self.grad is not None else torch.is_grad_enabled()
        node.meta["rg"] = bool(
            grad
            and any(a.meta.get("rg") for a in node.all_input_nodes)
            and differentiable(node, lambda a: bool(a.meta.get("rg")))
        )
        return node

    def symbolic(self, tree: Any) -> Any:
        """`tree` with every symbolic size in it (a SymInt taken from a fake value: `[s0, 4]`, `4*s0`) as a node
        of the graph computing it from the inputs: an input int, `x.size(d)` of an input, or arithmetic on them
        (placed right after the inputs). A size no input determines raises UnsupportedError (the backend then
        compiles with sizes specialized)."""
        return pytree.tree_map_only(torch.SymInt, self._sym_node, tree)

    def _sym_node(self, value: torch.SymInt) -> Any:
        expr = value.node.expr
        if expr.is_Integer:
            return int(expr)
        if self.symbols is None:
            self.symbols = {}
            for n in self.graph.nodes:
                val = n.meta.get("val")
                if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol:
                    self.symbols.setdefault(val.node.expr, n)
                elif n.op == "placeholder" and isinstance(val, torch.Tensor):
                    for d, size in enumerate(val.shape):
                        if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                            self.symbols.setdefault(size.node.expr, (n, d))
        return self._expr_node(expr)

    def _expr_node(self, expr: Any) -> Any:
        if expr.is_Integer:
            return int(expr)
        hit = self.symbols.get(expr)
        if isinstance(hit, fx.Node):
            return hit
        if isinstance(hit, tuple):
            node = self._early(aten.sym_size.int, *hit)
        elif type(expr).__name__ in _SYMPY_OPS:
            op = _SYMPY_OPS[type(expr).__name__]
            parts = [self._expr_node(a) for a in expr.args]
            node = parts[0]
            for part in parts[1:]:
                node = self._early(op, node, part)
        else:
            raise UnsupportedError(f"a symbolic size ({expr}) that no input of the program determines")
        self.symbols[expr] = node
        return node

    def _early(self, op: Callable[..., Any], *args: Any) -> fx.Node:
        """`op(*args)` on sizes, placed after the graph's inputs, so every later position can use it."""
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        last = self.graph.find_nodes(op="placeholder")[-1]
        last = max([last, *(a for a in args if isinstance(a, fx.Node))], key=order.__getitem__)
        with self.graph.inserting_after(last):
            node = self.graph.call_function(op, args)
        fargs = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
        node.meta["val"] = op(*fargs)
        node.meta["rg"] = False
        return node


# sympy's operations on sizes, as the Python operators that compute them.
_SYMPY_OPS = {"Add": operator.add, "Mul": operator.mul, "FloorDiv": operator.floordiv, "Mod": operator.mod}


def differentiable(node: fx.Node, requires_grad: Callable[[fx.Node], bool]) -> bool:
    """Whether `node`'s result carries autograd history in eager when its argument nodes `requires_grad` (grad
    mode on): not a detach, a factory taking a tensor for its metadata, an integer or boolean tensor, nor a result
    autograd never differentiates (asked of autograd itself: `_result_flags`)."""
    op, val = node.target, node.meta.get("val")
    if op is aten.detach.default:
        return False
    schema = getattr(op, "_schema", None)
    if schema is not None and {"layout", "pin_memory"} <= {a.name for a in schema.arguments}:
        # A factory taking a tensor for its metadata (`zeros_like`, `new_ones`): a fresh leaf. `_to_copy` has
        # the same arguments but is a cast, and differentiable: autocast's casts were taken for fresh leaves, and
        # the fused executor ran `x @ w` under autocast without autograd (found in a review of real code).
        return op is aten._to_copy.default and (not isinstance(val, torch.Tensor) or _inexact(val))
    if isinstance(val, torch.Tensor) and not _inexact(val):
        return False
    flags = _result_flags(node, requires_grad)
    return flags is None or any(pytree.tree_leaves(flags))


def _inexact(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point or t.dtype.is_complex


def _result_flags(node: fx.Node, requires_grad: Callable[[fx.Node], bool]) -> Any:
    """Which of `node`'s results autograd may differentiate (`op`'s results as a tree of bools, False for a
    floating-point result that does not require grad, or that one result's of a `getitem`); None where unknown.

    derivatives.yaml's `output_differentiability: [False]` results (histc; linalg_lu's permutation; the special
    functions like bessel_j0; native_layer_norm's mean and rstd, nll_loss_forward's total weight) require no grad
    in eager, and its graph has no edge from them to the inputs. Taken for differentiable, a fused graph's node had
    one (runtime/fused_autograd.py), and ran a custom Function behind the input with zeros (`w * 2 + x.histc()`:
    the leaf behind x got a gradient where eager's is None). Which results these are is autograd's own answer: the
    op runs once per signature on meta (or fake) tensors, floating arguments requiring grad as the node's do
    (autograd runs above the meta kernel), and its results say which require grad."""
    if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        whole, index = _result_flags(node.args[0], requires_grad), node.args[1]
        ok = isinstance(whole, (tuple, list)) and isinstance(index, int) and -len(whole) <= index < len(whole)
        return whole[index] if ok else None
    op = node.target
    if not isinstance(op, torch._ops.OpOverload) or op._schema.is_mutable or is_view_target(op):
        # An in-place or out= op's result is the written tensor, and a view of a tensor requiring grad requires
        # it (detach aside): as the dtype says, unasked (views are about half of a net's distinct ops).
        return None
    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in flat]
    grads = [isinstance(v, torch.Tensor) and _inexact(v) and bool(requires_grad(a)) for a, v in zip(flat, vals)]
    # The signature: the op, the argument structure, each tensor's dtype and requires_grad, and the values of
    # flags (bools, strings, dtypes, None): not sizes nor scalars, which no op's differentiability depends on, so
    # that each op runs about once per process (a few signatures each), not once per node.
    key = (op, spec, tuple(_signature(v, g) for v, g in zip(vals, grads)))
    if key not in _probed:
        _probed[key] = _probe(op, spec, vals, grads)
    return _probed[key]


_probed: dict[Any, Any] = {}
_probe_mode: list[FakeTensorMode] = []


def _signature(v: Any, grad: bool) -> Any:
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.device.type, grad)
    return v if v is None or isinstance(v, (bool, str, torch.dtype)) else type(v)


def _probe(op: torch._ops.OpOverload, spec: Any, vals: list[Any], grads: list[bool]) -> Any:
    """`_result_flags` of one run of `op` on fresh tensors like `vals` (symbolic sizes at their values in the
    compiling call); None where it cannot run (never raising: the dtype rule then stands). On meta tensors (the
    cheapest: a fake mode's first run of an op took 1-10 ms, a meta one's 0.2-4 ms), else, where no
    meta kernel runs it (`unique`, `bincount`: data-dependent sizes), in a fake mode of its own with a shape env
    of its own. Either way the program's shape env gets no guard from it, and no tensor of it reaches a graph."""

    def like(v: Any, grad: bool, device: Any) -> Any:
        if isinstance(v, torch.Tensor):
            size, stride = [concrete(s) for s in v.shape], [concrete(s) for s in v.stride()]
            return torch.empty_strided(size, stride, dtype=v.dtype, device=device or v.device).requires_grad_(grad)
        return concrete(v)

    for fake in (False, True):
        if fake and not _probe_mode:
            _probe_mode.append(FakeTensorMode(shape_env=ShapeEnv()))
        try:
            # (Modes the caller runs in set aside; grad on, as the node's; the random state as it was.)
            with _disable_current_modes(), _probe_mode[0] if fake else contextlib.nullcontext():
                with torch.inference_mode(False), torch.enable_grad(), warns.ignored(), kept_rng(vals):
                    leaves = [like(v, g, None if fake else "meta") for v, g in zip(vals, grads)]
                    args, kwargs = pytree.tree_unflatten(leaves, spec)
                    out = op(*args, **kwargs)
        except Exception:  # noqa: BLE001 - unknown, as said
            continue
        # (A result not floating-point: True, the node's own dtype decides in `differentiable`.)
        return pytree.tree_map(lambda r: not isinstance(r, torch.Tensor) or not _inexact(r) or r.requires_grad, out)
    return None
