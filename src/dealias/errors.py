"""Exceptions raised by dealias. Every message names the op and the user's source line when known."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class DealiasError(Exception):
    """Base class of every error dealias raises on its own account."""


class UnsupportedError(DealiasError):
    """A construct dealias cannot compile exactly (e.g. writing through a view it cannot invert)."""


class DataDependentError(DealiasError):
    """The program's control flow or shapes depend on tensor data (`if x.sum() > 0`, `.item()`,
    boolean-mask reads). Raised under `strict=True`; otherwise dealias runs the function eagerly."""


class InternalError(DealiasError):
    """dealias's own invariants failed (a verifier caught it): a bug in dealias, never silently ignored."""


class EagerSemanticsError(RuntimeError, DealiasError):
    """An error eager PyTorch raises for the same program (e.g. an in-place write to an expanded tensor).
    It is a RuntimeError, like eager's, and is raised before any input is touched."""


class FallbackWarning(UserWarning):
    """dealias ran a call eagerly instead of compiling it."""


def with_location(message: str, location: str | None) -> str:
    return f"{message}\n  at {location}" if location else message


@contextlib.contextmanager
def located(location: str | None) -> Iterator[None]:
    """Around the translation of one op in a pass's graph walk: an error dealias raises inside names the op's
    source line `location`, unless it already names one (an error about a view names the line that made it)."""
    try:
        yield
    except DealiasError as e:
        if location and "\n  at " not in str(e):
            e.args = (with_location(str(e), location), *e.args[1:])
        raise
