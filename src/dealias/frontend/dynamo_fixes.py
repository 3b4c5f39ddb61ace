"""Where dynamo's capture is wrong on its own and dealias corrects it, for dealias's compiles only.

In-place metadata changes inside a graph (`v = x[1:]; v.unsqueeze_(0)`, `v.t_()`): dynamo records the op in
the graph and runs it on the tensor's fake value, which changes that fake tensor's sizes and strides in place;
but the variable dynamo keeps for `v` caches the sizes, strides and rank it had when it was made. Python code
after the op that reads `v.shape`, `v.dim()` or `v.stride()` then gets the old values, baked into the graph as
constants, with every backend (torch.compile with backend="eager" returns `v.shape[0] == 2` where eager says
1). dealias's passes handle these ops exactly, so after dynamo traces one of them on a tensor, the variable's
cached metadata is refreshed from its fake value, and the graph node is marked as refreshed. The backend still
refuses (runs the frame eagerly) any in-place metadata change it finds unmarked, so if these dynamo internals
move in a later torch, the result is a fallback, never a stale shape.

Not corrected: the same ops on graph inputs and on tensors dynamo reaches from them (module attributes).
Dynamo graph-breaks there, and the op runs eagerly: the input's fake value is shared with dynamo's shape
guards, and changing its rank breaks their production.

A record for the backend: where in the graph a hook was registered on a graph input (`x.register_hook(h)`).
Dynamo registers such hooks after the graph has run, on the tensor as the graph left it; the backend must know
whether the graph writes the tensor after the user's registration (eager hooks the version before that write:
refused) or only before it (eager hooks the written version too: compiled). The graph's nodes at registration
are kept in the hooked node's meta (HOOKED_AFTER).

The corrections are installed on import of the backend and apply only while dynamo traces for a dealias
backend; other backends see dynamo unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

REFRESHED = "dealias_refreshed_metadata"  # node meta key: dynamo's variable was refreshed after this op
HOOKED_AFTER = "dealias_hooked_after"  # node meta key: the graph's nodes when a hook was first registered on it
_HOOKS = ("register_hook", "register_post_accumulate_grad_hook")


@functools.cache
def is_inplace_view(name: str) -> bool:
    """Whether the aten op named `name` (`t_`, `unsqueeze_`, `as_strided_`, ...) changes its argument's
    metadata in place (aten's `inplace_view` tag on any overload)."""
    packet = getattr(torch.ops.aten, name, None) if name.endswith("_") else None
    if packet is None or not hasattr(packet, "overloads"):
        return False
    return any(torch.Tag.inplace_view in getattr(packet, o).tags for o in packet.overloads())


def for_dealias(compiler_fn: Any) -> bool:
    """Whether dynamo's compiler function is a dealias backend, under the wrappers dynamo puts around it
    (`WrapBackendDebug`, `functools.partial` for options)."""
    for _ in range(8):
        if getattr(compiler_fn, "is_dealias_backend", False):
            return True
        inner = getattr(compiler_fn, "compiler_fn", None) or getattr(compiler_fn, "func", None)
        if inner is None:
            return False
        compiler_fn = inner
    return False


def _refresh(var: Any) -> None:
    """Re-read a TensorVariable's cached metadata from its fake value (symbolic layouts cache none)."""
    from torch._dynamo.variables.tensor import TensorVariable

    props = TensorVariable.specialize(var.proxy.node.meta["example_value"])
    for key in ("ndim", "_size", "stride", "is_contiguous"):
        setattr(var, key, props.get(key))


def install() -> None:
    """Wrap `TensorVariable.call_method` once (idempotent)."""
    try:
        from torch._dynamo.variables.tensor import TensorVariable
    except ImportError:  # dynamo's internals moved: nothing is refreshed, and the backend refuses instead
        return
    original = TensorVariable.call_method
    if getattr(original, "dealias_wrapped", False):
        return

    @functools.wraps(original)
    def call_method(self: Any, tx: Any, name: str, args: Any, kwargs: Any) -> Any:
        if name in _HOOKS and for_dealias(getattr(tx.output, "compiler_fn", None)):
            node = self.proxy.node
            if HOOKED_AFTER not in node.meta:  # the first registration: the earliest version hooked
                node.meta[HOOKED_AFTER] = frozenset(tx.output.graph.nodes)
            return original(self, tx, name, args, kwargs)
        result = original(self, tx, name, args, kwargs)
        if is_inplace_view(name) and for_dealias(getattr(tx.output, "compiler_fn", None)):
            node = getattr(getattr(result, "proxy", None), "node", None)
            if node is not None and "example_value" in self.proxy.node.meta:
                _refresh(self)
                node.meta[REFRESHED] = True
        return result

    call_method.dealias_wrapped = True  # type: ignore[attr-defined]
    TensorVariable.call_method = call_method
