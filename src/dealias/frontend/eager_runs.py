"""Dynamo's graph run eagerly, as it is, where a compiled program cannot give eager's behaviour of this call: a call
its program refused before doing anything observable (an index out of range that eager meets after some writes),
and the question whether eager raises on a call whose compile failed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from ..compat.fx_lazy import generated_forward
from ..errors import unmark_refused
from ..ir.draws import kept_rng
from ..runtime.verify import clone_args


def after_refusal(gm: fx.GraphModule, leaves: list[Any], refusal: BaseException) -> Any:
    """`gm` run on the call's `leaves` after its program refused the call, having done nothing observable
    (errors.refused): eager's writes before the failing op, then eager's error; or `refusal` where it is the same
    error (its message names the op and the user's line too)."""
    unmark_refused(refusal)  # (handled here: a caller of this graph must not run its own again)
    try:
        return graph_run(generated_forward(gm))(leaves)  # (not fx's __call__, which prints the error's traceback)
    except BaseException as eager_error:
        if type(eager_error) is type(refusal) and str(refusal).startswith(str(eager_error)):
            raise refusal from None
        raise


def raises_in_eager(gm: fx.GraphModule, leaves: list[Any]) -> bool:
    """Whether eager raises running the graph, on copies of its inputs and with the random state restored."""
    with kept_rng(gm, leaves):  # (the default generator's state and that of the generators its draws take)
        try:
            # Its generated code, not fx's __call__, which prints the error's traceback (a lazy graph module's
            # forward is that call until its code is generated)
            generated_forward(gm)(*clone_args(leaves))
        except Exception:  # noqa: BLE001 - any error: the program's own
            return True
    return False


def graph_run(forward: Callable[..., Any]) -> Callable[[list[Any]], Any]:
    """The run of dynamo's graph `forward` as it is (the "graph" tier's, and after a refusal). Its
    `with torch.no_grad()` (`enable_grad`, `set_grad_enabled`) is a pair of `_set_grad_enabled` calls in the graph,
    not Python's `with`: an error between them (an index out of range) left the region's grad mode on for the
    caller's code after the call (`backend="eager"` too), where eager's `with` restores it. So the caller's mode is
    set back when the run raises."""

    def run(leaves: list[Any]) -> Any:
        grad = torch.is_grad_enabled()
        try:
            return forward(*leaves)
        except BaseException:
            torch._C._set_grad_enabled(grad)
            raise

    return run
