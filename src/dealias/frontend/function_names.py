"""Which autograd.Function each `autograd_function_apply` node of a dynamo graph came from, for dealias's compiles.

Eager names a custom Function's backward node after the class (`MyFn.apply(x).grad_fn` is a `MyFnBackward`), and
autograd's errors quote that name ("... which is output 0 of MyFnBackward, is at version 1"). Dynamo's graph
keeps the forward and backward bodies but not the class, so segments.py, which runs the operator as an
autograd.Function of its own, would name it after its own class. While dynamo traces for a dealias backend,
`Function.apply` leaves the class's name in its node's meta (FUNCTION_NAME); segments.py names its Function so.
Should these dynamo internals move, the name is missing and the backward node keeps dealias's class name.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .dynamo_fixes import for_dealias

FUNCTION_NAME = "dealias_function_name"


def install() -> None:
    """Wrap `AutogradFunctionVariable.call_apply` once (idempotent)."""
    try:
        from torch._dynamo.variables.misc import AutogradFunctionVariable
    except ImportError:  # dynamo's internals moved: no names recorded
        return
    apply = AutogradFunctionVariable.call_apply
    if getattr(apply, "dealias_names", False):
        return

    @functools.wraps(apply)
    def call_apply(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        if not for_dealias(getattr(tx.output, "compiler_fn", None)):
            return apply(self, tx, args, kwargs)
        graph = tx.output.graph  # the graph this apply is recorded in (a subgraph's, inside another body)
        before = len(graph.nodes)
        result = apply(self, tx, args, kwargs)
        for node in list(graph.nodes)[before:]:
            if _is_function_apply(node) and FUNCTION_NAME not in node.meta:
                node.meta[FUNCTION_NAME] = self.fn_cls.__name__
        return result

    call_apply.dealias_names = True  # type: ignore[attr-defined]
    AutogradFunctionVariable.call_apply = call_apply


def _is_function_apply(node: torch.fx.Node) -> bool:
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.HigherOrderOperator)
        and target.name() == "autograd_function_apply"
    )
