"""Warnings set aside while dealias compiles or probes, without making Python forget which were shown.

`warnings.catch_warnings()` marks Python's filters changed on entering and again on leaving, and a module's
`__warningregistry__` (where the "default" action records the lines that have warned once) is emptied at its next
warning after such a change: a user's warning shown once per line came again after each of dealias's compiles
(eager, or torch.compile with the "eager" backend, show it once). Here a filter is put at the head of Python's
`warnings.filters` list for the while and taken out after, the list otherwise untouched: nothing marked changed, and
the registries stay right (a warning ignored, or shown "always", is not recorded in them). As with
`catch_warnings`, another thread's warnings in that window are handled by the same filter.

Where the filters are not the plain list this expects (another Python's warnings machinery), `catch_warnings` does it.
"""

from __future__ import annotations

import contextlib
import types
import warnings
from collections.abc import Iterator
from typing import Any


def _usable() -> bool:
    return isinstance(getattr(warnings, "filters", None), list) and callable(getattr(warnings, "showwarning", None))


@contextlib.contextmanager
def _at_head(action: str) -> Iterator[None]:
    filters = warnings.filters
    entry = (action, None, Warning, None, 0)
    filters.insert(0, entry)
    try:
        yield
    finally:
        # (by identity, where it is now: the code run meanwhile may have added or removed filters of its own)
        for i, f in enumerate(filters):
            if f is entry:
                del filters[i]
                break


@contextlib.contextmanager
def ignored() -> Iterator[None]:
    """Every warning ignored (`simplefilter("ignore")` in a `catch_warnings()`)."""
    if not _usable():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
        return
    with _at_head("ignore"):
        yield


def at_its_own_lines(fn: Any) -> bool:
    """Whether `fn`'s warnings are given at lines of its own (a Python function: torch.tensordot's), which the user's
    eager call may have put in that module's registry, so that `recorded` would see none of them: there the `out=`
    probe saw no warning and the program never gave eager's. A builtin's are given at the caller's line (dealias's,
    where none is kept in the registry: recorded "always")."""
    return not isinstance(fn, (types.BuiltinFunctionType, types.MethodDescriptorType))


@contextlib.contextmanager
def recorded(afresh: bool = False) -> Iterator[list[warnings.WarningMessage]]:
    """Every warning recorded in the list given, none shown (`catch_warnings(record=True)` with "always").

    A warning already in the registry of the module at whose line it is given is not recorded: Python reads that
    registry before any filter. Where that module may be one whose lines the user's own code ran (a warning given
    in torch's Python), `afresh` uses `catch_warnings`, which empties the registries, at the cost said above."""
    if afresh or not _usable():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught
        return
    caught: list[warnings.WarningMessage] = []
    shown = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202 - Python's own
        caught.append(warnings.WarningMessage(message, category, filename, lineno, file, line))

    warnings.showwarning = record  # (Python's documented hook: `_showwarnmsg` calls a replaced one)
    try:
        with _at_head("always"):
            yield caught
    finally:
        if warnings.showwarning is record:
            warnings.showwarning = shown
