"""A correction to how dynamo traces `x.resize_(..)` and `x.resize_as_(y)`, for dealias's compiles only.

Dynamo traces no resize ("Unsupported Tensor.resize_() call"): a graph break, the op run eagerly. A resize that
stays within the tensor's own memory is a metadata change eager makes without touching the storage: to the same
sizes it changes nothing (the strides stay, `xb.t().resize_(5, 5)` is still transposed); to other sizes it
makes the tensor contiguous at its storage offset. That is `x.as_strided_(sizes, contiguous strides, offset)`,
an in-place metadata change dealias already traces (on inputs, compat/dynamo_inputs.py; inside a graph,
dynamo_tensor.py's refresh) and writes back, and it is traced as such where:
- the sizes are static and the new layout's last element lies within the elements x itself spans (sizes and
  strides are what dynamo guards, and x's own elements are in its storage on every call: a larger resize may
  need a larger storage than a later call's, where eager reallocates, so it keeps the break);
- no `memory_format` is given, and x does not require grad (eager raises there: dynamo's break runs it).
Everything else keeps dynamo's break. `resize_as_(y)` is `resize_(y.shape)` (eager's, without memory_format).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from .registry import correction, require, require_module
from .settings import applies

NAME = "resize_within_memory"


def _sizes(self: Any, name: str, args: list[Any]) -> tuple[int, ...] | None:
    """The sizes the call resizes to, as ints (None where they are not static constants)."""
    try:
        if name == "resize_as_":
            other = (
                args[0].as_proxy().node.meta.get("example_value") if len(args) == 1 and args[0].is_tensor() else None
            )
            return tuple(other.shape) if isinstance(other, torch.Tensor) else None
        values = [a.as_python_constant() for a in args]
    except Exception:  # noqa: BLE001 - not a constant (dynamo's NotImplementedError, a symbolic size): dynamo's break
        return None
    if len(values) == 1 and isinstance(values[0], (list, tuple, torch.Size)):
        values = list(values[0])
    return tuple(values) if all(type(v) is int and v >= 0 for v in values) else None


def _within(fake: torch.Tensor, sizes: tuple[int, ...]) -> bool:
    """Whether a contiguous tensor of `sizes` at fake's offset lies within the elements fake spans."""
    if any(type(v) is not int for v in (*fake.shape, *fake.stride(), fake.storage_offset())):
        return False
    numel = math.prod(sizes)
    if numel == 0:
        return True
    if fake.numel() == 0:
        return False
    return numel - 1 <= sum((n - 1) * st for n, st in zip(fake.shape, fake.stride()))


@correction(
    NAME,
    corrects="`x.resize_(2, 3)` / `x.resize_as_(y)` within x's memory: dynamo traces no resize (a graph break)",
    without="such a resize breaks the graph, as with every backend (exact; the op runs eagerly)",
)
def install() -> None:
    cls = require(require_module("torch._dynamo.variables.tensor"), "TensorVariable")
    original = require(cls, "call_method", "self", "tx", "name", "args", "kwargs")
    tracker = require(require_module("torch._dynamo.variables.base"), "VariableTracker")
    require(tracker, "build")
    constant = require(require_module("torch._dynamo.variables"), "ConstantVariable")

    def as_strided(self: Any, tx: Any, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """The resize traced as `as_strided_` (or as x itself, to the same sizes), or None: dynamo's break."""
        fake = self.proxy.node.meta.get("example_value")
        if kwargs or not isinstance(fake, torch.Tensor) or fake.requires_grad:
            return None
        sizes = _sizes(self, name, list(args))
        if sizes is None or not _within(fake, sizes):
            return None
        if sizes == tuple(fake.shape):
            return self  # (eager: nothing changes, the strides stay)
        strides = torch._prims_common.make_contiguous_strides_for(sizes) if sizes else ()
        method = tracker.build(tx, getattr).call_function(tx, [self, constant.create("as_strided_")], {})
        as_tuple = lambda values: tracker.build(tx, tuple(values))
        return method.call_function(
            tx, [as_tuple(sizes), as_tuple(strides), constant.create(fake.storage_offset())], {}
        )

    @functools.wraps(original)
    def call_method(self: Any, tx: Any, name: str, args: Any, kwargs: Any) -> Any:
        if name in ("resize_", "resize_as_") and type(self) is cls and applies(NAME, tx):
            traced = as_strided(self, tx, name, args, kwargs)
            if traced is not None:
                return traced
        return original(self, tx, name, args, kwargs)

    cls.call_method = call_method
