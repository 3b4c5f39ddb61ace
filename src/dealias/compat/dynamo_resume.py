"""A correction to what dynamo does when tracing the code after a graph break raises, for dealias's compiles.

Dynamo traces the code after a graph break as a function of its own (a resume function) when it is first
reached. If that tracing raises (a fake-tensor rule stricter than eager, dynamo's own error, or the user's
error raised at a later line than eager's), none of that code has run: it runs eagerly instead, with a
warning, where dynamo would raise (eager then raises its own error at its own line, or returns).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from .registry import active, correction, require, require_module
from .settings import for_dealias


@correction(
    "resume_fallback",
    corrects="code after a graph break whose tracing raises: dynamo raises where eager may not",
    without="dynamo's error propagates, as with every backend",
)
def install() -> None:
    """Wrap `ConvertFrame.__call__`: a resume function whose tracing for a dealias backend raises runs eagerly
    (module docstring); dynamo's default result of a frame it does not compile skips that code from then on."""
    ConvertFrame = require(require_module("torch._dynamo.convert_frame"), "ConvertFrame")  # noqa: N806
    ResumePrologueTracingError = require(require_module("torch._dynamo.exc"), "ResumePrologueTracingError")  # noqa: N806
    resumed = require(require_module("torch._dynamo.resume_execution"), "TORCH_DYNAMO_RESUME_IN_PREFIX")
    ConvertFrameReturn = require(require_module("torch._dynamo.types"), "ConvertFrameReturn")  # noqa: N806
    original = require(ConvertFrame, "__call__", "self", "frame")

    @functools.wraps(original)
    def call(self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, frame, *args, **kwargs)
        except Exception as e:
            code = frame.f_code
            backend = getattr(self, "_torchdynamo_orig_backend", None)
            if not active("resume_fallback") or not code.co_name.startswith(resumed) or not for_dealias(backend):
                raise
            if isinstance(e, ResumePrologueTracingError) or self._inner_convert._box.error_on_graph_break:
                raise  # (dynamo's own rules: strict compiles raise)
            from ..errors import GraphBreakWarning

            cause = e.__cause__ or e
            where = f"{code.co_filename}:{code.co_firstlineno}"
            first = (str(cause).strip().splitlines() or [""])[0][:200]
            warnings.warn(
                f"dealias: the code after a graph break in {where} runs eagerly: dynamo could not trace it: "
                f"{type(cause).__name__}: {first}",
                GraphBreakWarning,
                stacklevel=2,
            )
            return ConvertFrameReturn(skip_reason="dealias: tracing the code after a graph break raised")

    ConvertFrame.__call__ = call
