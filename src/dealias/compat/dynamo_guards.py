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

from .registry import Missing, active, correction, require, require_module
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


# A module's hook dict whose entries say which of the hooks of another dict take keyword arguments: eager's
# `Module._call_impl` reads it only for the ids of hooks it runs, those of the module's own dict and of the global
# one named beside it; with both empty, nothing in it changes what a call does.
_KWARGS_DICTS = {
    "_forward_hooks_with_kwargs": ("_forward_hooks", "_global_forward_hooks"),
    "_forward_pre_hooks_with_kwargs": ("_forward_pre_hooks", "_global_forward_pre_hooks"),
}


@correction(
    "hook_kwargs_guards",
    corrects="dealias's frames guard every hook dict of every module they call (settings.py); the two dicts saying "
    "which hooks take keyword arguments are left unguarded where the module's hooks of that kind are guarded empty",
    without="those two dicts are guarded too: the same programs, a third more hook guards a call (~0.2 us a module)",
)
def install_hook_kwargs() -> None:
    """Dynamo reads all six hook dicts of each module it calls (a hook in any of them means inlining the module's
    `_call_impl`), and dealias's settings guard each one empty: six guards a module, on every call. Two of them
    (`_forward_hooks_with_kwargs`, `_forward_pre_hooks_with_kwargs`) change nothing while the module's own dict
    of that kind (`_forward_hooks`, `_forward_pre_hooks`) and torch's global one are empty: eager looks an id up
    there only for a hook it runs from those. So one is left unguarded where, in the guards built for this frame,
    the module's own dict of its kind was already guarded empty (it sorts first: dynamo builds guards in order
    of their names' lengths) and the global one is empty now: a hook registered on the module later fails that
    guard and the frame compiles again, as before. A mobilenet-like net's 79 modules: 158 guards fewer a call."""
    guards = require_module("torch._dynamo.guards")
    builder = require(guards, "GuardBuilder")
    original = require(builder, "EMPTY_NN_MODULE_HOOKS_DICT", "self", "guard")
    attr_source = require(require_module("torch._dynamo.source"), "AttrSource")
    module = require_module("torch.nn.modules.module")
    for _, global_name in _KWARGS_DICTS.values():
        require(module, global_name)

    @functools.wraps(original)
    def empty_hooks_dict(self: Any, guard: Any, *args: Any, **kwargs: Any) -> Any:
        if not (active("hook_kwargs_guards") and in_dealias_frame()):
            return original(self, guard, *args, **kwargs)
        source = guard.originating_source
        name = getattr(source, "member", None) if isinstance(source, attr_source) else None
        guarded = self.__dict__.setdefault("_dealias_empty_hook_dicts", set())
        if name in _KWARGS_DICTS:
            own, global_name = _KWARGS_DICTS[name]
            if (source.base.name, own) in guarded and not getattr(module, global_name):
                return None  # (eager's call reads this dict for no hook while those two stay empty)
        result = original(self, guard, *args, **kwargs)
        if name is not None:
            guarded.add((source.base.name, name))
        return result

    builder.EMPTY_NN_MODULE_HOOKS_DICT = empty_hooks_dict


# torch's global module hook dicts a module call runs (`register_module_forward_hook` and the like): dynamo reads
# their lengths to choose whether a module call inlines its hooks or calls `forward` straight, and guards none.
_GLOBAL_HOOK_DICTS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)


@correction(
    "global_hook_guards",
    corrects="dynamo guards none of torch's global module hook dicts: a global hook registered after a compile was "
    "not run by its program (a forward hook's result lost, silently)",
    without="a global module hook registered after a compile is not run by that program, as with every backend",
)
def install_global_hooks() -> None:
    """Dynamo reads torch's global hook dicts (`tx.nn_modules_globals_vt`, once per frame it traces) where a module
    call may go straight to `forward`; in a dealias frame their lengths are guarded there too, so that a global hook
    registered (or removed) later compiles the frame again, as one registered on the module does."""
    translator = require(require_module("torch._dynamo.symbolic_convert"), "InstructionTranslatorBase")
    cached = vars(translator).get("nn_modules_globals_vt")
    if not isinstance(cached, functools.cached_property):
        raise Missing("InstructionTranslatorBase.nn_modules_globals_vt is no cached_property")
    require(translator, "import_source", "self", "module_name")
    guards = require_module("torch._dynamo.guards")
    install_guard = require(guards, "install_guard")
    # (the guard dynamo's EMPTY_NN_MODULE_HOOKS_DICT puts on a module's own hook dict; where a global dict is not
    # empty, dynamo runs the module's `_call_impl`, which reads its hooks, and guards them as it reads)
    length = require(require(guards, "GuardBuilder"), "SEQUENCE_LENGTH", "self", "guard")
    attr_source = require(require_module("torch._dynamo.source"), "AttrSource")
    module = require_module("torch.nn.modules.module")
    for name in _GLOBAL_HOOK_DICTS:
        require(module, name)
    original = cached.func

    @functools.wraps(original)
    def nn_modules_globals_vt(self: Any) -> Any:
        vt = original(self)
        if active("global_hook_guards") and in_dealias_frame():
            source = self.import_source("torch.nn.modules.module")
            for name in _GLOBAL_HOOK_DICTS:
                install_guard(attr_source(source, name).make_guard(length))
        return vt

    wrapped = functools.cached_property(nn_modules_globals_vt)
    wrapped.__set_name__(translator, "nn_modules_globals_vt")
    translator.nn_modules_globals_vt = wrapped
