"""Dynamo's graph modules are `_LazyGraphModule`s: their Python code is generated at their first call, through
`_lazy_forward`, which then calls the module (`nn.Module.__call__`). The "graph" tier of executor "tiered"/"exact"
runs dynamo's graph as it is: its forward taken before that first call would stay `_lazy_forward` (the module call
on every call), and its first call would generate the code (10 ms for HF Llama's decode step, a call at 3x eager's
while the tiers are measured). `generated_forward` generates it when the tier is set up, in the compiling call.

Without `_LazyGraphModule.real_recompile` (another torch): the module's forward as it is, generated at its first
call, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch.fx as fx

from .registry import Missing, require, require_module


def generated_forward(gm: fx.GraphModule) -> Callable[..., Any]:
    """`gm`'s forward, its code generated now."""
    try:
        lazy = require(require_module("torch.fx._lazy_graph_module"), "_LazyGraphModule")
        if isinstance(gm, lazy):
            require(lazy, "real_recompile")
            gm.real_recompile()
    except Missing:
        pass
    return gm.forward


def lazy_graph_modules() -> contextlib.AbstractContextManager[None]:
    """While in force, graph modules made or recompiled generate their Python code only when it is read (`.code`, a
    call, pickling: inductor's cache key), as dynamo's own are (`_LazyGraphModule`). A compile's passes rewrite and
    copy graphs a dozen times, each recompile 5-10 ms of a GPT-2 forward's first call, and most of that code was never
    read. Without `_use_lazy_graph_module` (another torch), or where the user turned dynamo's lazy graph modules off
    (`torch._dynamo.config.use_lazy_graph_module`; `_force_skip_lazy_graph_module`, for TorchScript, which cannot
    script one): modules generate their code at once, as before."""
    if _lazy_class() is None:
        return contextlib.nullcontext()
    return require(require_module("torch.fx._lazy_graph_module"), "_use_lazy_graph_module")(True)


def graph_module(root: Any, graph: fx.Graph) -> fx.GraphModule:
    """`fx.GraphModule(root, graph)`, lazy as under `lazy_graph_modules` (its code generated when read) where that
    is in force: a pass's copy of a graph is rewritten and recompiled before anything reads it."""
    lazy = _lazy_class()
    return fx.GraphModule(root, graph) if lazy is None else lazy(root, graph)


def _lazy_class() -> Any:
    """`_LazyGraphModule` where dealias's compiles may make lazy graph modules, as dynamo's own; None otherwise."""
    try:
        module = require_module("torch.fx._lazy_graph_module")
        lazy = require(module, "_LazyGraphModule")
        require(lazy, "real_recompile")
        require(module, "_use_lazy_graph_module")
        wanted = require(require_module("torch._dynamo.config"), "use_lazy_graph_module")
    except Missing:
        return None
    skipped = getattr(module, "_force_skip_lazy_graph_module_flag", False)
    return lazy if wanted is True and not skipped else None
