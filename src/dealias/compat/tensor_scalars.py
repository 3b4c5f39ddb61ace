"""A 0-d tensor passed where an in-place op takes a Scalar (`p.addcdiv_(m, d, value=-lr / bc1)` with `bc1`
computed from a tensor step, `x.add_(g, alpha=step)`), traced into the graph, for dealias's compiles only.

Eager converts such a tensor to a Python number in the op's argument parsing (`.item()`) and runs the op's own
kernel. Dynamo can do neither: with its decompositions on (other backends' default) it rewrites the op into
`prims.fma` (other bits than eager's kernel, and through 2.14's `_foreach_lerp_` polyfill a different formula);
with them off (dealias's frames, settings.py) the `.item()` on a fake tensor breaks the graph, and a break inside
the loop over an optimizer's parameters made dynamo skip the whole frame (issue 39: a hand-written Adam step ran
wholly eagerly). Here, for dealias's frames, `addcmul_`, `addcdiv_` and `add_` with a tensor `value`/`alpha` are
traced as ops of dealias's own (`dealias::addcdiv_` ...), whose kernel does what eager's argument parsing and
kernel do: `self.addcdiv_(t1, t2, value=value.item())`. They have functional twins (`dealias::addcdiv`) found from
their schemas like aten's, so the passes functionalize them as any in-place op; inductor calls them as extern
kernels. Where an operand requires grad under grad mode the op is left to dynamo (the graph breaks, as before):
these ops have no derivative formula of their own.

Without this correction the graph breaks at such a call (exact; dynamo may then run the whole frame eagerly).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .registry import correction, replace_method, require, require_module
from .settings import applies

_LIB: Any = None  # dealias's own ops, made at install (runtime/keep_aten.py and hazards.py define more)
_OPS = {
    # method name: (the Scalar argument's name, the tensor arguments before it)
    "addcmul_": ("value", ("tensor1", "tensor2")),
    "addcdiv_": ("value", ("tensor1", "tensor2")),
    "add_": ("alpha", ("other",)),
}


def _define(name: str, scalar: str, tensors: tuple[str, ...]) -> None:
    args = ", ".join(f"Tensor {t}" for t in tensors)
    base = name[:-1]
    _LIB.define(f"{name}(Tensor(a!) self, {args}, Tensor {scalar}) -> Tensor(a!)")
    _LIB.define(f"{base}(Tensor self, {args}, Tensor {scalar}) -> Tensor")

    def inplace(self: torch.Tensor, *operands: torch.Tensor) -> torch.Tensor:
        *others, value = operands
        return getattr(self, name)(*others, **{scalar: value.item()})

    def functional(self: torch.Tensor, *operands: torch.Tensor) -> torch.Tensor:
        *others, value = operands
        return getattr(torch, base)(self, *others, **{scalar: value.item()})

    _LIB.impl(name, inplace, "CompositeExplicitAutograd")
    _LIB.impl(base, functional, "CompositeExplicitAutograd")

    # Fake tensors: the op's own metadata rules (shapes, dtypes and eager's errors for them) with any value.
    @torch.library.register_fake(f"dealias::{name}", lib=_LIB)
    def inplace_fake(self: torch.Tensor, *operands: torch.Tensor) -> torch.Tensor:
        return getattr(self, name)(*operands[:-1])

    @torch.library.register_fake(f"dealias::{base}", lib=_LIB)
    def functional_fake(self: torch.Tensor, *operands: torch.Tensor) -> torch.Tensor:
        return getattr(torch, base)(self, *operands[:-1])


def _is_tensor(var: Any) -> bool:
    return var is not None and getattr(var, "is_tensor", lambda: False)()


def _fake(var: Any) -> Any:
    node = getattr(getattr(var, "proxy", None), "node", None)
    return node.meta.get("example_value") if node is not None else None


def _requires_grad(var: Any) -> bool:
    value = _fake(var)
    return isinstance(value, torch.Tensor) and value.requires_grad


def _as_eager_takes_it(scalar: Any, self: Any) -> bool:
    """Whether eager's argument parsing takes the tensor `scalar` as a Scalar (0-d, not requiring grad: else it
    raises TypeError, which dynamo's own path raises too) and the call can be traced as dealias's op: the scalar
    does not share memory with the tensor written (eager reads it before the write moves its version counter, and
    the write-back of a merged write would move that counter once where eager moves it per call)."""
    value, written = _fake(scalar), _fake(self)
    if not isinstance(value, torch.Tensor) or value.dim() != 0 or value.requires_grad:
        return False
    if not isinstance(written, torch.Tensor):
        return False
    return value.untyped_storage()._cdata != written.untyped_storage()._cdata


@correction(
    "tensor_scalars",
    corrects="`p.addcdiv_(m, d, value=t)` with a 0-d tensor t: prims.fma (other bits) or a graph break at .item()",
    without="the graph breaks at such a call, as with dynamo's decompositions off",
)
def install() -> None:
    require(torch.library, "register_fake")
    require(torch.library, "Library")
    TensorVariable = require(require_module("torch._dynamo.variables.tensor"), "TensorVariable")  # noqa: N806
    variables = require_module("torch._dynamo.variables")
    in_graph = require(variables, "TorchInGraphFunctionVariable")
    originals = {name: require(TensorVariable, f"method_{name}", "self", "tx") for name in _OPS}
    global _LIB
    if _LIB is None:  # (defined here, not on import: a torch without these APIs leaves the correction out)
        _LIB = torch.library.Library("dealias", "FRAGMENT")
        for name, (scalar, tensors) in _OPS.items():
            _define(name, scalar, tensors)

    def wrap(name: str, original: Any) -> Any:
        scalar, _ = _OPS[name]
        op = getattr(torch.ops.dealias, name).default

        @functools.wraps(original)
        def method(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
            value = kwargs.get(scalar)
            ours = applies("tensor_scalars", tx)
            if not ours or not _is_tensor(value) or len(kwargs) != 1 or not all(_is_tensor(a) for a in args):
                return original(self, tx, *args, **kwargs)
            if not _as_eager_takes_it(value, self):
                return original(self, tx, *args, **kwargs)
            if torch.is_grad_enabled() and any(_requires_grad(v) for v in (self, *args, value)):
                return original(self, tx, *args, **kwargs)  # (no derivative formula: dynamo's own path)
            in_graph(op).call_function(tx, [self, *args, value], {})
            return self

        return method

    for name, original in originals.items():
        replace_method(TensorVariable, f"method_{name}", original, wrap(name, original))
