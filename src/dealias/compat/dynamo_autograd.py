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

from .registry import active, correction, require, require_module
from .settings import for_dealias


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

    def ours(tx: Any) -> bool:
        return active("autograd_facts") and for_dealias(getattr(tx.output, "compiler_fn", None))

    @functools.wraps(get)
    def var_getattr(self: Any, tx: Any, name: str) -> Any:
        if name in ("requires_grad", "grad_fn", "grad") and ours(tx):
            _reread_autograd_facts(self)
        return get(self, tx, name)

    @functools.wraps(apply)
    def call_apply(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        if ours(tx):
            VariableTracker.visit(_reread_autograd_facts, (args, kwargs))
        return apply(self, tx, args, kwargs)

    setattr(TensorVariable, getter, var_getattr)
    Function.call_apply = call_apply
