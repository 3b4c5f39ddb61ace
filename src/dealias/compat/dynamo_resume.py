"""A correction to what dynamo does when tracing the code after a graph break raises, for dealias's compiles.

Dynamo traces the code after a graph break as a function of its own (a resume function) when it is first
reached. If that tracing raises (a fake-tensor rule stricter than eager, dynamo's own error, or the user's
error raised at a later line than eager's), none of that code has run: it runs eagerly instead, with a
warning, where dynamo would raise (eager then raises its own error at its own line, or returns).

The same wrapper counts, per thread, the frames dynamo traced (`frames_compiled_here`): a jitted function's call
is a cache miss when it traced one. Dynamo's own count (`counters["frames"]["total"]`) is process-wide, and counts
every frame its callback is handed, those it then skips untraced included: weakref callbacks the collector ran in
the middle of a call (`WeakValueDictionary`'s `remove`, a finalizer's `__call__`) made a call whose programs were
all cached a miss, once in a few runs of the suite (test_dynamic's sequence lengths, 3 misses for 2 compiles).
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any

from .registry import active, correction, require, require_module
from .settings import for_dealias

_here = threading.local()  # .frames: the frames dynamo traced on this thread (install's wrapper)
_counting = False


def frames_compiled_here() -> int | None:
    """How many frames dynamo has traced on this thread (a frame it skips untraced not counted), or None where the
    wrapper below is not installed."""
    return getattr(_here, "frames", 0) if _counting else None


def _count(before: int, compiles: Any) -> None:
    if sum(compiles.values()) != before:
        _here.frames = getattr(_here, "frames", 0) + 1


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
    # (a frame's compiles so far, by frame: a compile id is drawn where dynamo starts to trace a frame, not for a
    # frame it skips before that. Another thread's compile that ends between the two reads below would be counted
    # here too: dynamo traces one frame at a time, so only one this thread was waiting to follow.)
    compiles = require(require_module("torch._dynamo.convert_frame"), "FRAME_COMPILE_COUNTER")

    @functools.wraps(original)
    def call(self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
        before = sum(compiles.values())
        try:
            result = original(self, frame, *args, **kwargs)
        except Exception as e:
            _count(before, compiles)
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
        _count(before, compiles)
        return result

    ConvertFrame.__call__ = call
    global _counting
    _counting = True
