"""Exceptions raised by dealias. Every message names the op and the user's source line when known."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any


class DealiasError(Exception):
    """Base class of every error dealias raises on its own account."""


class UnsupportedError(DealiasError):
    """A construct dealias cannot compile exactly (e.g. writing through a view it cannot invert)."""


class OverlapError(UnsupportedError):
    """A write where elements share memory: the written tensor's own (an expanded or overlapping view), or the
    written tensor and another argument it reads. Eager's result then depends on the order its kernel visits
    the elements, or dealias cannot tell that it does not, so the graph runs eagerly (eager's own result)."""


class EagerRaisesError(UnsupportedError):
    """Eager raises on this program, where dealias does not raise it itself: at backward (a tensor saved for it
    was written), or at a write or read through a view autograd forbids. The graph runs eagerly, so eager's own
    error comes where eager raises it."""


class DataDependentError(DealiasError):
    """The program's control flow or shapes depend on tensor data (`if x.sum() > 0`, `.item()`,
    boolean-mask reads). Raised under `strict=True`; otherwise dealias runs the function eagerly."""


class InternalError(DealiasError):
    """dealias's own invariants failed (a verifier caught it): a bug in dealias, never silently ignored."""


class EagerSemanticsError(RuntimeError, DealiasError):
    """An error eager PyTorch raises for the same program (e.g. an in-place write to an expanded tensor).
    It is a RuntimeError, like eager's, and is raised before any input is touched. `exact`: its message is eager's
    own, which no source line is added to."""

    exact = False


def eager_error(message: str) -> EagerSemanticsError:
    """An EagerSemanticsError whose message is eager's exactly (asked of eager's kernel)."""
    e = EagerSemanticsError(message)
    e.exact = True
    return e


class InvariantError(AssertionError):
    """A pass broke a post-condition a later pass relies on: a bug in dealias. Not a DealiasError: the backend
    does not fall back to eager on it, it propagates."""


class FallbackWarning(UserWarning):
    """dealias ran a call, a graph of it or a part of it eagerly instead of compiling it."""


class GraphBreakWarning(FallbackWarning):
    """Dynamo broke the graph at something it does not capture: that part runs eagerly, the rest compiles."""


class OverlapFallbackWarning(FallbackWarning):
    """A graph ran eagerly on an OverlapError: a write whose eager result depends on its kernel's order."""


class EagerRaisesFallbackWarning(FallbackWarning):
    """A graph ran eagerly on an EagerRaisesError: eager raises on it (at backward, or at a fragile view)."""


class NotFusedWarning(UserWarning):
    """executor="inductor": a graph runs on the torch executor (eager's kernels, exact), not fused, for the
    reason the warning gives. Once per graph and reason."""


def mark_refused(e: BaseException) -> None:
    """Mark `e` as raised before a compiled call did anything observable: by a fused program's prologue (which
    checks every index before any write, runtime/prologue.py), or by a torch executor's bounds check that only ops
    without effects precede (ir/checks.py `guard_index_writes`). Eager's ops raise at the failing one, after the
    writes before it (`buf.add_(1); return buf[i]`: eager's buf is incremented); the graph's caller
    (frontend/backend.py) runs the graph eagerly instead, which makes those writes and raises there (`refused`)."""
    try:
        e._dealias_refused = True  # type: ignore[attr-defined]
    except AttributeError:  # (an exception type without instance attributes: raised as it is)
        pass


def unmark_refused(e: BaseException) -> None:
    """`e` handled: raised on, it is an error like any other."""
    if refused(e):
        e._dealias_refused = False  # type: ignore[attr-defined]


def refused(e: BaseException) -> bool:
    """Whether `e` was raised before its compiled call did anything observable (`mark_refused`)."""
    return getattr(e, "_dealias_refused", False)


def fallback_warning(e: Exception) -> type[FallbackWarning]:
    """The warning category for a graph that runs eagerly because compiling it raised `e`."""
    if isinstance(e, OverlapError):
        return OverlapFallbackWarning
    return EagerRaisesFallbackWarning if isinstance(e, EagerRaisesError) else FallbackWarning


def with_location(message: str, location: str | None) -> str:
    return f"{message}\n  at {location}" if location else message


@contextlib.contextmanager
def located(location: str | None) -> Iterator[None]:
    """Around the translation of one op in a pass's graph walk: an error dealias raises inside names the op's
    source line `location`, unless it already names one (an error about a view names the line that made it)."""
    try:
        yield
    except DealiasError as e:
        if location and "\n  at " not in str(e) and not getattr(e, "exact", False):
            e.args = (with_location(str(e), location), *e.args[1:])
        raise


def _package_dir(module: Any) -> str:
    return os.path.dirname(os.path.abspath(module.__file__)) + os.sep


_TORCH_DIR: str | None = None
_DEALIAS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def is_library_file(filename: str, dealias_too: bool = False) -> bool:
    """Whether `filename` is torch's own source (or, with `dealias_too`, dealias's): by the installed packages'
    directories, so a user's file under a folder that happens to be named `torch` is still the user's."""
    global _TORCH_DIR
    if _TORCH_DIR is None:
        import torch

        _TORCH_DIR = _package_dir(torch)
    path = os.path.abspath(filename) if filename and not filename.startswith("<") else filename
    return path.startswith(_TORCH_DIR) or (dealias_too and path.startswith(_DEALIAS_DIR))


def user_location(stack_trace: str | None) -> str | None:
    """`file:line  source` of the innermost user frame in an fx `stack_trace` string."""
    if not stack_trace:
        return None
    lines = stack_trace.strip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if line.startswith("File "):
            parts = line.split(",")
            path = parts[0][len('File "') : -1]
            lineno = parts[1].strip().removeprefix("line ")
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{path}:{lineno}  {code}"
    return None


def node_location(node: Any) -> str | None:
    """The user's source line of a graph node (`file:line  source`), from the stack trace it carries."""
    return user_location(node.meta.get("stack_trace"))


@contextlib.contextmanager
def quiet_fake_tensor_log() -> Iterator[None]:
    """Fake tensors log a traceback whenever an op raises; while tracing, such an error is the program's own
    (eager raises it too) and is re-raised to the caller, so the log is noise."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)
