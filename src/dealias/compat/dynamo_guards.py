"""A correction to dynamo's guard on a specialized float, for dealias's frames only: 0.0 and -0.0 are told apart.

Dynamo specializes a Python float of the user's frame (dealias's frames keep floats specialized: settings.py) and
guards it with `==`, under which `-0.0 == 0.0`: `f(x, 0.0)` then `f(x, -0.0)` reused the first program, so
`x / s` returned inf where eager gives -inf (a silent wrong result, with every backend on torch 2.13). While
dynamo builds the guards of a dealias frame, a guard on a float equal to zero also checks its sign. Without this
correction the program compiled for one zero serves the other, as with every backend.

A nan is specialized too (dynamo's guard modeling cannot reason about nan, so it compiles a nan apart even where
floats are inputs) and guarded with `isnan`: its sign is checked the same way (`x.copysign(s)`, `x * s` keep it).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from .registry import active, correction, require, require_module
from .settings import in_dealias_frame


def _same_sign(zero: float) -> Any:
    sign = math.copysign(1.0, zero)

    def check(x: Any) -> bool:
        return not isinstance(x, float) or math.copysign(1.0, x) == sign

    return check


@correction(
    "signed_zero_guards",
    corrects="a specialized float is guarded with ==: the program for 0.0 served -0.0 (1 / s gave inf, not -inf); "
    "likewise a nan's sign",
    without="the program compiled for one zero serves the other, as with every backend",
)
def install() -> None:
    builder = require(require_module("torch._dynamo.guards"), "GuardBuilder")
    original = require(builder, "EQUALS_MATCH", "self", "guard")
    require(builder, "get_guard_manager", "self", "guard")
    require(builder, "get", "self", "guard_or_source")

    @functools.wraps(original)
    def equals_match(self: Any, guard: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, guard, *args, **kwargs)
        if active("signed_zero_guards") and in_dealias_frame():
            value = self.get(guard)
            if type(value) is float and (value == 0.0 or math.isnan(value)):  # (a nan's sign: copysign reads it)
                code = [f"copysign(1, {guard.name}) == {math.copysign(1.0, value)}"]
                self.get_guard_manager(guard).add_lambda_guard(_same_sign(value), code, guard.user_stack)
        return result

    builder.EQUALS_MATCH = equals_match
