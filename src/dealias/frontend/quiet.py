"""What dealias's compiles and runs print of torch's internals: nothing on the console, detail under the
"dealias" logger.

A program that makes eager raise reaches the user as eager's own error (and dealias's one-line warnings). On the
way, two parts of torch print their internals: the fake-tensor logger logs the traceback of the op that failed on
fake tensors while dynamo traced ("failed while attempting to run meta for aten.add_.Tensor"), and fx prints the
generated code around the failing line ("Call using an FX-traced Module ... <--- HERE") when a graph module that
dealias runs (a piece around an autograd.Function, the Function's forward body) raises. For dealias's compiles
and graphs only, the first goes to the "dealias" logger at DEBUG, and dealias's graph modules raise without the
print. Other backends' compiles and other graph modules log and print as before.
"""

from __future__ import annotations

import logging
from typing import Any

import torch.fx as fx
from torch import nn

from ..compat.settings import for_dealias

log = logging.getLogger("dealias")

_LOGGERS = ("torch._subclasses.fake_tensor",)  # the loggers whose records a dealias compile takes over


class _DuringDealiasTracing(logging.Filter):
    """Takes a record logged while this thread's dynamo traces for a dealias backend (to the "dealias" logger,
    at DEBUG); lets every other record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _tracing_for_dealias():
            return True
        log.debug("%s: %s", record.name, record.getMessage(), exc_info=record.exc_info)
        return False


def _tracing_for_dealias() -> bool:
    try:
        from torch._dynamo.symbolic_convert import tls
    except ImportError:  # dynamo's internals moved: torch logs as it does
        return False
    tx = getattr(tls, "current_tx", None)
    return tx is not None and for_dealias(getattr(tx.output, "compiler_fn", None))


def install() -> None:
    """Add the filter to torch's loggers once (idempotent)."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DuringDealiasTracing) for f in logger.filters):
            logger.addFilter(_DuringDealiasTracing())


def _module_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return nn.Module.__call__(module, *args, **kwargs)


def quiet_calls(gm: fx.GraphModule) -> fx.GraphModule:
    """`gm` and the graph modules it holds called without fx's print of the generated code on an error: each
    graph module has a class of its own, whose `_wrapped_call` (kept by later recompiles) is that print's wrapper."""
    for module in gm.modules():
        if isinstance(module, fx.GraphModule):
            type(module)._wrapped_call = staticmethod(_module_call)
    return gm
