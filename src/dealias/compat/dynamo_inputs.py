"""A correction to how dynamo traces an in-place metadata change of a graph input, for dealias's compiles only.

`x.t_()`, `x.unsqueeze_(0)`, `x.as_strided_(..)` on a tensor the frame received: dynamo breaks the
graph there ("Getting an inplace view on a graph input is not supported"). Its reason: the op would run on the
input's fake value, which is also the record of the input's entry layout (dynamo's shape guards are made from it
after tracing, and a backend reads its placeholders' sizes from it), and would change that record in place.

For dealias's compiles the input's variable is first moved onto an `aten.alias(x)` node whose fake value is a
tensor of its own on the input's memory with the same layout (no view, as the input is none: only inputs that are
no view are moved; for an input autograd made, `b * 1`, one autograd made too, so that autograd checks an in-place
op on it as on a non-leaf), so the op changes that fake value and the placeholder's stays
the entry layout. The alias node is marked (`INPUT_ALIAS`); the backend folds it back into its input before
capture (`fold_input_aliases`), so the captured graph changes the input itself, which dealias's functionalization
already carries out on the caller's tensor after the call (a metadata write-back), as eager does. The variable
keeps its source, so what dynamo hands back to Python code after the graph is the caller's tensor object itself.

Moved are the variables whose fake value is a placeholder's (the input's own, or an in-place op's result on it,
`x += y; x.unsqueeze_(0)`: there dynamo sees no input and changed the input's record in place, which then failed
in guard making), once: a later change finds the variable already on its alias. A tensor dynamo reads as a
module's attribute keeps the break. `x.detach_()` keeps dynamo's break (inside a graph dealias refuses it:
dynamo's variable is not refreshed after it). The input's sizes are held static by the metadata write-back (a
compile per size under dynamic shapes). Without this correction dynamo's graph break applies (the op runs
eagerly: exact).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.fx as fx

from .dynamo_tensor import is_inplace_view
from .registry import active, correction, replace_method, require, require_module
from .settings import applies

NAME = "input_metadata"
INPUT_ALIAS = "dealias_input_alias"  # node meta key: an alias dynamo's variable for a graph input was moved onto


def _move_onto_alias(var: Any, tx: Any) -> None:
    """Point tensor variable `var` (a graph input's) at a new `aten.alias` node of it, with a fake value of its
    own (the same sizes, strides and storage as the input's)."""
    node = var.proxy.node
    fake = node.meta["example_value"]
    with tx.fake_mode:
        # A tensor of its own on the input's memory, no view, as the input is (autograd checks an in-place op on a
        # view otherwise: `t_` under no_grad of a view of a tensor requiring grad raises; eager's input is none).
        alias = torch.empty((0,), dtype=fake.dtype, device=fake.device)
        if fake.grad_fn is not None:
            # (An input autograd made, `b * 1`: a tensor autograd made too, so that autograd checks an in-place op
            # on it as on a non-leaf, where a leaf requiring grad refuses one; its history is the fake's own.)
            with torch.enable_grad():
                alias = alias.requires_grad_() * 1
        with torch.no_grad():
            alias.set_(fake.untyped_storage(), fake.storage_offset(), fake.shape, fake.stride())
        if fake.grad_fn is None:
            alias.requires_grad_(fake.requires_grad)
    proxy = tx.output.create_proxy("call_function", torch.ops.aten.alias.default, (var.proxy,), {})
    proxy.node.meta["example_value"] = alias
    proxy.node.meta[INPUT_ALIAS] = True
    var.proxy = proxy


@correction(
    NAME,
    corrects="`x.t_()` (any in-place metadata change) of a graph input breaks the graph",
    without="such a change breaks the graph, as with every backend (exact; the op runs eagerly)",
)
def install() -> None:
    """Wrap the TensorVariable method dynamo reads a tensor's attributes with (`var_getattr`; `tp_getattro_impl`
    since torch 2.14), where it answers an in-place metadata method of a graph input with a delayed graph break."""
    TensorVariable = require(require_module("torch._dynamo.variables.tensor"), "TensorVariable")  # noqa: N806
    getter = next((n for n in ("tp_getattro_impl", "var_getattr") if n in vars(TensorVariable)), "var_getattr")
    get = require(TensorVariable, getter, "self", "tx", "name")
    require(require_module("torch._dynamo.output_graph"), "OutputGraph")

    def var_getattr(self: Any, tx: Any, name: str) -> Any:
        if (
            type(self) is not TensorVariable
            or not is_inplace_view(name)
            or name == "detach_"  # (dynamo hands back the tensor itself, unrefreshed: the backend would refuse)
            or not applies(NAME, tx)
            or not active("inplace_view_refresh")  # (which refreshes the alias's variable after the op)
        ):
            return get(self, tx, name)
        node = self.proxy.node
        fake = node.meta.get("example_value")
        if isinstance(fake, torch.Tensor) and _faithful(fake) and _is_input_fake(tx, fake):
            _move_onto_alias(self, tx)
        elif not node.meta.get(INPUT_ALIAS):
            return get(self, tx, name)  # (a tensor dynamo reads as a module's attribute: dynamo's break)
        if self.source is None:
            return get(self, tx, name)
        source, self.source = self.source, None  # (dynamo delays a break for any tensor with a source)
        try:
            return get(self, tx, name)
        finally:
            self.source = source

    setattr(TensorVariable, getter, var_getattr)

    # `torch.Tensor.t_(x)`, the method called as a function (as OpInfo's in-place variants are): dynamo's function
    # path breaks the graph at it for an input ("Inplace op on input tensor"). It is `getattr(x, "t_")()`, which
    # the method path above (and the refresh after it) traces: the call is traced so.
    functions = require(require_module("torch._dynamo.variables.torch"), "TorchInGraphFunctionVariable")
    call = require(functions, "call_function", "self", "tx", "args", "kwargs")
    require(functions, "is_tensor_method")
    tracker = require(require_module("torch._dynamo.variables.base"), "VariableTracker")
    require(tracker, "build")
    constant = require(require_module("torch._dynamo.variables"), "ConstantVariable")

    @functools.wraps(call)
    def call_function(self: Any, tx: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        name = getattr(getattr(self, "value", None), "__name__", "")
        if (
            type(self) is functions
            and args
            and is_inplace_view(name)
            and type(args[0].realize() if hasattr(args[0], "realize") else args[0]) is TensorVariable
            and name != "detach_"
            and applies(NAME, tx)
            and self.is_tensor_method()
        ):
            method = tracker.build(tx, getattr).call_function(tx, [args[0], constant.create(name)], {})
            return method.call_function(tx, list(args[1:]), kwargs)
        return call(self, tx, args, kwargs)

    replace_method(functions, "call_function", call, call_function)


def _faithful(fake: torch.Tensor) -> bool:
    """Whether a tensor of its own on `fake`'s memory behaves as `fake` under autograd's checks: not a view (a
    view keeps dynamo's own handling; a tensor autograd made is moved onto one autograd made: _move_onto_alias)."""
    return not fake._is_view()


def _is_input_fake(tx: Any, fake: torch.Tensor) -> bool:
    """Whether `fake` is a graph input's fake value itself: the placeholder's, or that of an in-place op's result on
    it (`x += 1` rebinds x to the op's node, whose fake value is the input's object; dynamo then no longer sees an
    input there, and an in-place metadata change would change the record its guards are made from)."""
    return any(n.meta.get("example_value") is fake for n in tx.output.graph.find_nodes(op="placeholder"))


def fold_input_aliases(gm: fx.GraphModule) -> None:
    """Replace each marked alias of a graph input by the input itself (module docstring), in place."""
    for node in list(gm.graph.find_nodes(op="call_function", target=torch.ops.aten.alias.default)):
        if node.meta.get(INPUT_ALIAS):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.recompile()
