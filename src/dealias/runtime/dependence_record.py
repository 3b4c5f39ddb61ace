"""double_backward.py's traces of a multi-output op's decomposition (which arguments each result is computed from)
remembered on disk for the next process (issue 38: the warm first call). A fused training graph asks it of every
batch norm whose running statistics the graph writes, one trace per layout (make_fx of the decomposition on fake
tensors, 16-40 ms each): a mobilenet-like training forward's 13 layouts took 0.22 CPU s of a warm first call of
4.5, a process restarting with warm caches tracing them all again.

An answer depends only on the op's decomposition in the torch build, the layouts and the other arguments' values
(the signature double_backward keys its in-process memo on) and the trace's own code. The disk file is per torch
build (version, git revision) and per source of the trace (double_backward.py, this file); an entry's key hashes
the `repr` of the signature, kept only where every value in it is one whose `repr` says all of it (tensors' sizes,
strides and dtypes; None, bools, ints, floats, strings, dtypes, devices, layouts, memory formats). A file that
cannot be read or is damaged is ignored (the op is traced, as before); a directory that cannot be written keeps
nothing. `DEALIAS_DEPENDENCE_RECORD=0` (read at import; the test suite's setting, whose tests count traces) turns it
off.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from .keep_aten import DiskDict, cache_dir, source_key

ENABLED = os.environ.get("DEALIAS_DEPENDENCE_RECORD", "1") != "0"
_LIMIT = 4096  # entries on disk
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)
counts = {"read": 0, "written": 0}  # answers read from the file and files written in this process (tests)


def key_of(op: Any, spec: Any, parts: tuple[Any, ...]) -> str | None:
    """The disk key of the signature (`parts`: each argument's (sizes, strides, dtype) or (type, value)); None where
    it is not kept."""
    if not ENABLED:
        return None
    for part in parts:
        for v in _values(part):
            if not isinstance(v, _PLAIN) and not (isinstance(v, type) and v in _PLAIN):
                return None  # (a value whose repr may not say all of it: an object's address, a SymInt)
    return hashlib.sha256(repr((str(op), str(spec), parts)).encode()).hexdigest()[:32]


def _values(part: Any) -> list[Any]:
    if isinstance(part, (tuple, list)):
        return [v for p in part for v in _values(p)]
    return [part]


def lookup(key: str | None) -> tuple[bool, list[frozenset[int]] | None]:
    """(found, the answer) under `key`."""
    if key is None:
        return False, None
    stored = _disk.get(key, _MISSING)
    if stored is _MISSING:
        return False, None
    if stored is None:
        counts["read"] += 1
        return True, None
    if not isinstance(stored, list) or not all(
        isinstance(r, list) and all(isinstance(i, int) and i >= 0 for i in r) for r in stored
    ):
        return False, None  # (damaged: traced again)
    counts["read"] += 1
    return True, [frozenset(r) for r in stored]


def remember(key: str | None, answer: list[frozenset[int]] | None) -> None:
    if key is not None:
        _disk.put(key, None if answer is None else [sorted(r) for r in answer])


def flush() -> None:
    """Write what this process traced (with what another process wrote meanwhile) for the next process."""
    if _disk.flush():
        counts["written"] += 1


def clear() -> None:
    """Forget what was read or traced in this process (tests: the next lookup reads the file again)."""
    _disk.clear()


_MISSING = object()


def _path() -> Path | None:
    """The disk file; None where the trace's sources cannot be read (answers kept in the process only)."""
    key = _build_key()
    return None if key is None else cache_dir() / f"dependence-{key}.json"


@functools.cache
def _build_key() -> str | None:
    here = Path(__file__).parent
    return source_key((here / "double_backward.py", here / "dependence_record.py"))


_disk = DiskDict(_path, _LIMIT)  # key -> [[position, ...] per result] or None (no trace); read once per process
