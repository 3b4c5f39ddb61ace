"""A correction to the autograd facts dynamo keeps of a tensor, for dealias's compiles only.

Autograd facts of a view after a write into its base (`v = t.diagonal()`, then `t.mul_(w)` with w requiring
grad): the write runs on fake values, so v's fake value requires grad, as eager's v does; but dynamo keeps a
variable's `requires_grad` and `has_grad_fn` as they were when it was made, and re-reads them after a write only
on the variable written (t). Code reading `v.requires_grad` then takes the other branch, and `F.apply(v)` of an
autograd.Function is traced as its forward alone, without its backward: a wrong gradient, with every backend
(fuzz seed 1220114). For dealias's compiles the two facts are re-read from the fake value where dynamo consults
them: reads of a tensor's `requires_grad`, `grad_fn` and `grad`, and the arguments of `Function.apply`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .registry import correction, require, require_module
from .settings import applies


def _reread_autograd_facts(var: Any) -> None:
    """A TensorVariable's `requires_grad` and `has_grad_fn` as its fake value has them now (other variables, and
    tensors without a fake value, are left alone)."""
    from torch._dynamo.variables.tensor import TensorVariable

    if not isinstance(var, TensorVariable):
        return
    value = var.proxy.node.meta.get("example_value")
    if isinstance(value, torch.Tensor):
        var.requires_grad = value.requires_grad
        var.has_grad_fn = value.grad_fn is not None


@correction(
    "autograd_facts",
    corrects="after `t.mul_(w)` with w requiring grad, dynamo's cached requires_grad of a view of t stays False",
    without="a frame whose graph reads a view made before a write that carries grad into its base runs eagerly",
)
def install() -> None:
    """Wrap the TensorVariable method dynamo reads a tensor's attributes with (`var_getattr`; `tp_getattro_impl`
    since torch 2.14, same arguments) and `AutogradFunctionVariable.call_apply`, to re-read the autograd facts
    they consult (the module's docstring)."""
    TensorVariable = require(require_module("torch._dynamo.variables.tensor"), "TensorVariable")  # noqa: N806
    Function = require(require_module("torch._dynamo.variables.misc"), "AutogradFunctionVariable")  # noqa: N806
    VariableTracker = require(require_module("torch._dynamo.variables"), "VariableTracker")  # noqa: N806
    require(VariableTracker, "visit")
    getter = next((n for n in ("tp_getattro_impl", "var_getattr") if n in vars(TensorVariable)), "var_getattr")
    get = require(TensorVariable, getter, "self", "tx", "name")
    apply = require(Function, "call_apply", "self", "tx", "args", "kwargs")

    @functools.wraps(get)
    def var_getattr(self: Any, tx: Any, name: str) -> Any:
        if name in ("requires_grad", "grad_fn", "grad") and applies("autograd_facts", tx):
            _reread_autograd_facts(self)
        return get(self, tx, name)

    @functools.wraps(apply)
    def call_apply(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        if applies("autograd_facts", tx):
            VariableTracker.visit(_reread_autograd_facts, (args, kwargs))
        return apply(self, tx, args, kwargs)

    setattr(TensorVariable, getter, var_getattr)
    Function.call_apply = call_apply


FUNCTION_NAME = "dealias_function_name"  # node meta key: the autograd.Function class an apply node came from


@correction(
    "function_names",
    corrects="(a record) a custom Function's class name, for its backward node's name (`MyFnBackward`)",
    without="a custom Function's backward node is named after dealias's own class (`ApplyBackward`)",
)
def install_function_names() -> None:
    """Eager names a custom Function's backward node after the class (`MyFn.apply(x).grad_fn` is a
    `MyFnBackward`), and autograd's errors quote that name ("... which is output 0 of MyFnBackward, is at version
    1"). Dynamo's graph keeps the forward and backward bodies but not the class, so segments.py, which runs the
    operator as an autograd.Function of its own, would name it after its own class. While dynamo traces for a
    dealias backend, `Function.apply` leaves the class's name in its node's meta (FUNCTION_NAME); segments.py names
    its Function so."""
    Function = require(require_module("torch._dynamo.variables.misc"), "AutogradFunctionVariable")  # noqa: N806
    apply = require(Function, "call_apply", "self", "tx", "args", "kwargs")

    @functools.wraps(apply)
    def call_apply(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        if not applies("function_names", tx):
            return apply(self, tx, args, kwargs)
        graph = tx.output.graph  # the graph this apply is recorded in (a subgraph's, inside another body)
        before = len(graph.nodes)
        result = apply(self, tx, args, kwargs)
        for node in list(graph.nodes)[before:]:
            if _is_function_apply(node) and FUNCTION_NAME not in node.meta:
                node.meta[FUNCTION_NAME] = self.fn_cls.__name__
        return result

    Function.call_apply = call_apply


def _is_function_apply(node: torch.fx.Node) -> bool:
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.HigherOrderOperator)
        and target.name() == "autograd_function_apply"
    )
