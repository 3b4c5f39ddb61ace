"""The record of every correction dealias makes to torch, and whether each one is in force on this torch.

A correction wraps a private function of dynamo (or sets one of its settings) to change what dynamo does, and
only while dynamo traces for a dealias backend. Each one is installed by a function that first looks up the
internals it needs with `require` (the attribute exists, and its leading parameters have the names the
correction's wrapper passes on); a lookup that fails raises `Missing`, and the correction stays out of force.
Nothing here raises at import: a torch whose internals moved gets dealias with fewer corrections, and each
correction says what dealias does then (`without`): the construct it corrects breaks the graph or runs its
frame eagerly with a warning, and never changes another backend's tracing. Six fall-backs are dynamo's own
behaviour, as with every backend, and are said so in the README: resume_fallback (dynamo's error), kept_index_reads
(no IndexError for an unused read), function_names (a backward node's name), checkpoint_arguments (backward raises
at a write of state a checkpointed function closes over), signed_zero_guards (-0.0 served by 0.0's program),
leaf_guards (a leaf's program served a non-leaf; retains_grad False).

Wrappers consult `active(name)` on every call, so a correction can be taken out of force at any time
(`forced_off`, for tests; `DEALIAS_COMPAT_OFF=name,name` or `=all` at import, for a user who suspects one) and
the wrapper then passes straight through to dynamo's own function.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


class Missing(Exception):
    """An internal of torch a correction needs is absent, or has other parameters than the correction expects."""


@dataclass
class Correction:
    name: str
    corrects: str  # the upstream behaviour corrected, in a line
    without: str  # what dealias does where the correction is not in force
    install: Callable[[], None]
    lazy: bool = False  # installed at its first use (`ensure`), not on import: it imports inductor
    installed: bool = False
    reason: str = ""  # why it is not in force ("" when it is)
    off: bool = False  # taken out of force by forced_off or DEALIAS_COMPAT_OFF


_CORRECTIONS: dict[str, Correction] = {}
_LOCK = threading.RLock()  # (lazy ones install at a first fused compile, which threads may reach together)


def correction(
    name: str, corrects: str, without: str, lazy: bool = False
) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Register the decorated function as the installer of correction `name` (installed by `install_all`, or by
    `ensure` at its first use where `lazy`)."""

    def register(install: Callable[[], None]) -> Callable[[], None]:
        _CORRECTIONS[name] = Correction(name, corrects, without, install, lazy=lazy)
        return install

    return register


def require(owner: Any, attr: str, *params: str) -> Any:
    """`owner.attr`, checked: it exists and, when `params` are given, its signature begins with them (a wrapper
    passes its arguments on by those positions). Raises Missing otherwise."""
    where = f"{getattr(owner, '__module__', '')}.{getattr(owner, '__qualname__', owner)}.{attr}".lstrip(".")
    found = inspect.getattr_static(owner, attr, None) if isinstance(owner, type) else getattr(owner, attr, None)
    if found is None:
        raise Missing(f"{where} is not there")
    value = getattr(owner, attr)
    if params:
        try:
            names = list(inspect.signature(inspect.unwrap(value)).parameters)
        except (TypeError, ValueError) as e:
            raise Missing(f"{where} has no signature to check") from e
        if names[: len(params)] != list(params):
            raise Missing(f"{where} takes ({', '.join(names)}), not ({', '.join(params)}, ...)")
    return value


def replace_method(cls: type, attr: str, original: Any, wrapper: Any) -> None:
    """Put `wrapper` in place of `cls.attr` (which is `original`): the attribute itself, which torch 2.13's
    dynamo looks up by name, and the entries of `cls`'s `tp_methods` table holding `original`, which torch 2.14's
    dynamo calls instead (its table keeps the functions it was built with)."""
    setattr(cls, attr, wrapper)
    table = vars(cls).get("tp_methods")
    if isinstance(table, dict):
        for key, entry in list(table.items()):
            if getattr(entry, "handler", None) is original:
                table[key] = dataclasses.replace(entry, handler=wrapper)


def require_module(path: str) -> Any:
    """The module at `path`, or Missing."""
    import importlib

    try:
        return importlib.import_module(path)
    except ImportError as e:
        raise Missing(f"module {path} is not there") from e


def install_all(lazy: bool = False) -> None:
    """Install every registered correction not yet tried (the lazy ones too with `lazy`); one that cannot be
    installed stays out of force, with its reason kept for `report`. Never raises."""
    for c in _CORRECTIONS.values():
        if lazy or not c.lazy:
            _install(c)


def ensure(name: str) -> bool:
    """Install correction `name` if not yet tried; whether it is in force."""
    _install(_CORRECTIONS[name])
    return active(name)


def _install(c: Correction) -> None:
    with _LOCK:
        if c.installed or c.reason:
            return
        off = {n.strip() for n in os.environ.get("DEALIAS_COMPAT_OFF", "").split(",") if n.strip()}
        if "all" in off or c.name in off:
            c.reason = "turned off by DEALIAS_COMPAT_OFF"
            return
        try:
            c.install()
            c.installed = True
        except Missing as e:
            c.reason = str(e)
        except Exception as e:  # noqa: BLE001 - an internal that moved in a way no lookup foresaw: out of force
            c.reason = f"{type(e).__name__}: {e}"


def active(name: str) -> bool:
    """Whether correction `name` is in force now."""
    c = _CORRECTIONS.get(name)
    return c is not None and c.installed and not c.off


@contextlib.contextmanager
def forced_off(*names: str) -> Iterator[None]:
    """Take corrections out of force for a while, as if their internals were missing (their wrappers pass
    through and the fall-backs apply). For tests."""
    saved = {n: _CORRECTIONS[n].off for n in names}
    try:
        for n in names:
            _CORRECTIONS[n].off = True
        yield
    finally:
        for n, was in saved.items():
            _CORRECTIONS[n].off = was


def corrections() -> list[Correction]:
    return list(_CORRECTIONS.values())


def report() -> str:
    """What `dealias doctor` prints: each correction, in force or not and why, and what dealias does without it."""
    import torch

    lines = [
        f"torch {torch.__version__}: {sum(active(c.name) for c in _CORRECTIONS.values())} of "
        f"{len(_CORRECTIONS)} corrections in force"
    ]
    for c in _CORRECTIONS.values():
        if active(c.name):
            state = "in force"
        elif c.lazy and not c.installed and not c.reason:
            state = "not installed yet (at the first fused compile)"
        else:
            state = f"NOT in force ({c.reason or 'turned off'})"
        lines.append(f"- {c.name}: {state}")
        lines.append(f"    corrects: {c.corrects}")
        if not active(c.name):
            lines.append(f"    without it: {c.without}")
    return "\n".join(lines)
