"""Building graph nodes the way every pass after capture does: each node keeps a fake value (sizes and strides
later passes need), the user's source line, grad mode and requires_grad of the op being translated, and
symbolic sizes as graph values. Functionalization and write-back lowering both build with an Emitter."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

from ..errors import UnsupportedError
from .opfacts import op_name

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
        # result is differentiable (not detached, not integer).
        grad = self.grad if self.grad is not None else torch.is_grad_enabled()
        node.meta["rg"] = (
            grad and any(a.meta.get("rg") for a in node.all_input_nodes) and differentiable(op, node.meta["val"])
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


# Ops whose floating-point result autograd never differentiates (derivatives.yaml's `output_differentiability:
# [False]`): eager's result requires no grad, and its graph has no edge to the input. Taken for differentiable, the
# fused graph's node had one, and ran a custom Function behind the input with zeros (`w * 2 + x.histc()`: the leaf
# behind x got a gradient where eager's is None).
_NEVER_DIFFERENTIATED = frozenset({aten.histc.default})


def differentiable(op: Any, val: Any) -> bool:
    """Whether `op`'s result `val` carries autograd history when an input requires grad (grad mode on): not a
    detach, a factory taking a tensor for its metadata, nor an integer or boolean tensor."""
    if op is aten.detach.default or op in _NEVER_DIFFERENTIATED:
        return False
    schema = getattr(op, "_schema", None)
    if schema is not None and {"layout", "pin_memory"} <= {a.name for a in schema.arguments}:
        # A factory taking a tensor for its metadata (`zeros_like`, `new_ones`): a fresh leaf. `_to_copy` has
        # the same arguments but is a cast, and differentiable: autocast's casts were taken for fresh leaves, and
        # the fused executor ran `x @ w` under autocast without autograd (found in a review of real code).
        return op is aten._to_copy.default and (
            not isinstance(val, torch.Tensor) or val.dtype.is_floating_point or val.dtype.is_complex
        )
    if isinstance(val, torch.Tensor):
        return val.dtype.is_floating_point or val.dtype.is_complex
    return True  # a tuple of results, or a Python function's: as their inputs
