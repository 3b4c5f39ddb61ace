"""`torch._foreach_lerp_(a, b, weight)` kept as eager's op in dealias's frames (torch 2.13).

Dynamo 2.13 rewrites every `_foreach_lerp_` with one weight into its polyfill (`polyfills.foreach_lerp_inplace`):
`_foreach_sub`, a `full_like` of the weight per tensor, `_foreach_addcmul_`, for inductor's numerics, whatever the
backend. Run as it is (dynamo's graph tier) or functionalized op by op (the torch executor), that is three passes
over memory and a weight-sized tensor per parameter where eager's kernel makes one pass: a `_foreach_lerp_` EMA
over an MLP's parameters ran 5.7x eager on `backend="eager"` and on dealias's exact tiers, and Adam's foreach step
(`_foreach_lerp_(exp_avgs, grads, 1 - beta1)`) paid it too. Torch 2.14 applies the polyfill only with dynamo's
decompositions on (and a tensor weight), which dealias's frames turn off (settings.py): this does the same on 2.13
for a weight that is a Python number, so the graph holds `_foreach_lerp_` and runs eager's kernel (eager's bits by
construction). A tensor weight keeps the polyfill (its `float()` would break the graph).

Without this correction: the polyfill's ops (the same values here, slower on the exact tiers).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .registry import Missing, correction, require, require_module
from .settings import applies

NAME = "foreach_lerp_kept"


@correction(
    NAME,
    corrects="dynamo 2.13 rewrites `_foreach_lerp_` with a number weight into three foreach ops (5.7x eager run "
    "as they are); 2.14 keeps eager's op when decompositions are off, as in dealias's frames",
    without="dynamo's polyfill of `_foreach_lerp_` runs on the exact tiers (slower, the same values)",
)
def install() -> None:
    variables = require_module("torch._dynamo.variables.torch")
    in_graph = require(variables, "TorchInGraphFunctionVariable")
    handlers = require(in_graph, "_get_handlers")()
    original = handlers.get(torch._foreach_lerp_)
    if original is None:
        raise Missing("dynamo has no handler of its own for torch._foreach_lerp_ (nothing to correct)")
    polyfills = require_module("torch._dynamo.polyfills")
    require(polyfills, "foreach_lerp_inplace")
    code = getattr(original, "__code__", None)
    if code is not None and "enable_dynamo_decompositions" in code.co_names:
        raise Missing("dynamo's handler of torch._foreach_lerp_ already follows enable_dynamo_decompositions")

    @functools.wraps(original)
    def handler(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
        if applies(NAME, tx) and len(args) == 3 and not kwargs and args[2].is_python_constant():
            return None  # (dynamo then puts the call in the graph as it is)
        return original(self, tx, *args, **kwargs)

    handlers[torch._foreach_lerp_] = handler
