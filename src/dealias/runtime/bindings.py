"""The torch executor's binding probes (executor.py: which Tensor method or torch function dispatches to exactly a
node's aten call) remembered per op and argument kinds: in this process, and on disk for the next one (a program's
first call probed each node, 1-5 ms apiece; a process restarting with warm caches probed them all again).

The disk file is per torch version and per source of the probe (executor.py, this file): an answer is the probe's
answer on that build; a file from another build is another file. Keys hash the `repr` of the in-process key (the
overload, grad mode, and each argument's kind: types, dtypes, devices, sizes, strides and plain values), which is
deterministic for the values keys hold. An answer is stored by its kind (method, function, none) and made
again from the op's name on load."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import torch

from ..ir.opfacts import op_name
from .keep_aten import DiskDict, cache_dir, source_key

_LIMIT = 8192  # entries in memory, and on disk
_memory: dict[Any, tuple[str, Any] | None] = {}


def lookup(key: Any) -> tuple[bool, tuple[str, Any] | None]:
    """(found, answer) for a key of executor._probe_key."""
    answer = _memory.get(key, _MISSING)  # (one read: another thread's `remember` may clear the dict)
    if answer is not _MISSING:
        return True, answer
    stored = _disk.get(_disk_key(key), _MISSING)
    if stored is _MISSING:
        return False, None
    answer = _from_kind(key[0], stored)
    if answer is _MISSING:
        return False, None
    _memory[key] = answer
    return True, answer


def remember(key: Any, answer: tuple[str, Any] | None) -> None:
    if len(_memory) >= _LIMIT:
        _memory.clear()
    _memory[key] = answer
    _disk.put(_disk_key(key), None if answer is None else answer[0])


def flush() -> None:
    """Write what this process probed (with what another process wrote meanwhile) for the next process."""
    _disk.flush()


def clear() -> None:
    """Forget every answer in this process (tests: the next lookup reads the disk file again)."""
    _memory.clear()
    _disk.clear()


_MISSING: Any = object()


def _disk_key(key: Any) -> str:
    # (hashed: a foreach op's key names every tensor of its lists)
    return hashlib.sha256(repr(key).encode()).hexdigest()[:32]


def _from_kind(op: Any, kind: str | None) -> Any:
    """The answer the probe gave, made from its kind: the probe binds the op's own name (executor.probe_binding)."""
    if kind is None:
        return None
    name = op_name(op)
    if kind == "method":
        return ("method", name) if hasattr(torch.Tensor, name) else _MISSING
    fn = getattr(torch, name, None)
    return ("function", fn) if kind == "function" and callable(fn) else _MISSING


def _path() -> Path | None:
    """The disk file; None where the probe's sources cannot be read (answers kept in the process only)."""
    key = _build_key()
    return None if key is None else cache_dir() / f"bindings-{key}.json"


@functools.cache
def _build_key() -> str | None:
    # (the probe also binds through ir/opfacts.py)
    here = Path(__file__).parent
    return source_key((here / "executor.py", here / "bindings.py", here.parent / "ir" / "opfacts.py"))


_disk = DiskDict(_path, _LIMIT)  # _disk_key(key) -> the answer's kind; read once per process
