"""A correction to dynamo's guards on a tensor's autograd identity, for dealias's compiles only.

Dynamo answers `t.is_leaf`, `t.grad_fn` (None for a leaf; a graph break otherwise) and `t._base` from the fake
value it made of the tensor at the first call, which mirrors the real tensor's leaf-ness and view base; but its
tensor guards check `requires_grad`, not those. `f(x, w)` branching on `w.is_leaf` (or `w.grad_fn is None`,
`w._base is None`), compiled for a leaf `w`, served a later non-leaf `w = p * 1` with the leaf's branch: a silent
wrong result, with every backend. For dealias's compiles, where dynamo reads one of them from a tensor the frame
received (one with a source), the same attribute of the caller's tensor is guarded: `is_leaf` (which `grad_fn is
None` is: autograd's own definition) matched as a bool, `_base` by its type (None's, or a tensor's). A call whose
tensor differs there traces again. Dynamo's own guard builders (`BOOL_MATCH`, `TYPE_MATCH`) check them, on the
caller's tensor at the compile, in C++.

`t.retains_grad` is worse: dynamo answers it from the fake value, which never retains, so a branch on it was wrong
from the first call of a tensor after `retain_grad()`. For dealias's compiles it is answered from the caller's
tensor (`OutputGraph.resolve_source_value`), guarded the same way (a source that cannot be read back breaks the
graph there).

Tensors made inside the graph are left alone: their leaf-ness follows from the guarded inputs and grad mode,
which dynamo guards. Without this correction the program compiled for one leaf-ness serves the other, as with
every backend (dealias's own cache key holds leaf-ness, but its program would be made from dynamo's graph, which
already took the branch).
"""

from __future__ import annotations

import functools
from typing import Any

from .registry import correction, require, require_module
from .settings import applies

NAME = "leaf_guards"
_LEAF = ("is_leaf", "grad_fn")  # (a tensor's grad_fn is None exactly where it is a leaf)


@correction(
    NAME,
    corrects="`t.is_leaf`, `t.grad_fn is None` and `t._base is None` of an input are not guarded: the program "
    "compiled for a leaf served a non-leaf (the other branch of `w if w.is_leaf else ..`); `t.retains_grad` is "
    "always False",
    without="the program compiled for one leaf-ness (or view-ness) serves the other, and `retains_grad` is False, "
    "as with every backend",
)
def install() -> None:
    """Wrap the TensorVariable method dynamo reads a tensor's attributes with (`var_getattr`; `tp_getattro_impl`
    since torch 2.14, same arguments) to guard the attribute read where it is one of the module docstring's."""
    TensorVariable = require(require_module("torch._dynamo.variables.tensor"), "TensorVariable")  # noqa: N806
    getter = next((n for n in ("tp_getattro_impl", "var_getattr") if n in vars(TensorVariable)), "var_getattr")
    get = require(TensorVariable, getter, "self", "tx", "name")
    guards = require_module("torch._dynamo.guards")
    install_guard = require(guards, "install_guard")
    builder = require(guards, "GuardBuilder")
    bool_match = require(builder, "BOOL_MATCH", "self", "guard")
    type_match = require(builder, "TYPE_MATCH", "self", "guard")
    attr_source = require(require_module("torch._dynamo.source"), "AttrSource")
    constant = require(require_module("torch._dynamo.variables"), "ConstantVariable")
    require(require_module("torch._dynamo.output_graph").OutputGraph, "resolve_source_value", "self", "source")
    unimplemented = require(
        require_module("torch._dynamo.exc"), "unimplemented", "gb_type", "context", "explanation", "hints"
    )

    def guard(var: Any, name: str) -> None:
        """Guard `name` of the caller's tensor behind `var` as the tensor has it at this compile."""
        source = getattr(var, "source", None)
        if source is None or not source.subguards_allowed():
            return  # (made in the graph: its leaf-ness follows from the guarded inputs and grad mode)
        check = bool_match if name in _LEAF else type_match
        install_guard(attr_source(source, "is_leaf" if name in _LEAF else "_base").make_guard(check))

    def retains_grad(var: Any, tx: Any) -> Any:
        """The caller's tensor's `retains_grad`, guarded; None (dynamo's answer) for a tensor made in the graph."""
        source = getattr(var, "source", None)
        if source is None or not source.subguards_allowed():
            return None  # (made in the graph: `retain_grad()` breaks the graph, so it retains none)
        try:
            value = tx.output.resolve_source_value(source).retains_grad
        except Exception:  # noqa: BLE001 - a source dynamo cannot read back here: dynamo's answer is not trusted
            value = None
        if type(value) is not bool:
            unimplemented(
                gb_type="dealias: retains_grad of an input (dynamo answers False, unguarded)",
                context=f"{source.name}.retains_grad",
                explanation="the caller's tensor could not be read back: it runs eagerly",
                hints=[],
            )
        install_guard(attr_source(source, "retains_grad").make_guard(bool_match))
        return constant.create(value)

    @functools.wraps(get)
    def var_getattr(self: Any, tx: Any, name: str) -> Any:
        if name in (*_LEAF, "_base", "retains_grad") and isinstance(self, TensorVariable) and applies(NAME, tx):
            if name == "retains_grad":
                answer = retains_grad(self, tx)
                if answer is not None:
                    return answer
            else:
                guard(self, name)
        return get(self, tx, name)

    setattr(TensorVariable, getter, var_getattr)
