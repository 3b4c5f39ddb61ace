"""Inductor's key of the installed triton, remembered on disk instead of hashed again in every process (issue 38:
first calls).

Every inductor compile and every FX graph cache or AOTAutograd cache lookup keys its entry on
`CacheBase.get_system()`, which takes `torch._inductor.codecache.triton_key()`: where triton is installed (torch
2.14's CUDA build, run on a CPU) a hash of triton's compiler, backends and language sources and of its 505 MB
`libtriton.so`, once per process: 0.35 CPU s of every process's first compile (a warm mobilenet-like training
forward's first call, 5.0 s in all; torch.compile pays the same).

dealias computes it once, by torch's own function, and records it under a fingerprint of what that function reads:
for every file under triton's `compiler`, `backends` and `language` packages, and for `runtime/cache.py`,
`_C/libtriton.*` and `__init__.py` (triton's version), its path, inode, size and modification and change times
(change times cannot be set back: any rewrite, copy or reinstall changes them), and the path of every directory;
keyed also on the torch build and whether inductor imported triton. A later process whose fingerprint matches (1-2
ms of `stat` calls) hands the value to torch's cache for it before its first compile (`prefetchable_cache.set`,
torch's own way to fill it ahead), so nothing hashes the files again; the value is the one torch computed from the
same files. A fingerprint that does not match, an unreadable record, no triton, or a torch without these
functions: torch computes it as it always does. Only the value is set, never a function replaced; another backend
in the process reads the same value, sooner.
`DEALIAS_INDUCTOR_KEYS=0` (read at import) turns it off.

(torch's own `torch_key()`, a hash of torch's sources, costs 0.09 s, of which a fingerprint of torch's 12,700 files
would take 0.04: not remembered.)
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

from . import background

ENABLED = os.environ.get("DEALIAS_INDUCTOR_KEYS", "1") != "0"
_once = background.Once()
_RECORD_ENTRIES = 16  # (fingerprints kept: installs a user switches between)


def prefill() -> str:
    """Once per process, before the first compile of dealias that may key an inductor cache entry: torch's
    `triton_key` cache filled from the record, or computed now (the compile would compute it next) and recorded.
    Returns what was done ("recorded", "from record", or why nothing was), for tests."""
    if not ENABLED or not _once.claim():
        return "off" if not ENABLED else "done before"
    try:
        return _prefill()
    except Exception:  # noqa: BLE001 - torch computes the key as it always does
        return "failed"


def _prefill() -> str:
    from torch._inductor import codecache, config
    from torch._inductor.runtime import triton_compat

    key_function = getattr(codecache, "triton_key", None)
    if not (callable(key_function) and hasattr(key_function, "set")):
        return "no prefetchable triton_key"  # (another torch: nothing to fill)
    if not getattr(config, "fx_graph_cache", False):
        return "no inductor cache"  # (no FX graph cache, nor AOTAutograd's on it: nothing may compute the key)
    root = triton_root()
    if root is None:
        return "no triton"  # (torch's function returns None at once)
    key = record_key(root, bool(getattr(triton_compat, "HAS_TRITON", False)))
    record = _record()
    found = record.get(key, _MISSING)
    if found is not _MISSING and (found is None or isinstance(found, str)):
        try:
            key_function.set(found)
        except RuntimeError:
            return "computed before"  # (another compile of the process computed it first: the same value)
        return "from record"
    value = key_function()  # (torch's own computation, cached for the process)
    if value is None or isinstance(value, str):
        record.put(key, value)
        record.flush()
    return "recorded"


_MISSING = object()


def triton_root() -> Path | None:
    """The directory of the installed triton package, found without importing it; None where there is none."""
    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        return None
    locations = list(getattr(spec, "submodule_search_locations", None) or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def record_key(root: Path, has_triton: bool) -> str:
    """The record's key: the torch build, whether inductor has triton, and the fingerprint of what triton's key is
    computed from under `root`."""
    parts = [torch.__version__, str(getattr(torch.version, "git_version", "")), str(has_triton), str(root)]
    parts.append(fingerprint([root / "compiler", root / "backends", root / "language", root / "runtime" / "cache.py"]))
    parts.append(fingerprint([root / "__init__.py", *sorted((root / "_C").glob("libtriton.*"))]))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def fingerprint(paths: list[Path]) -> str:
    """A hash of the path, inode, size and modification and change times of each file of `paths` and under those
    that are directories, and of each directory's path (compiled `__pycache__` aside: Python writes there, no key
    reads it). A path that is not there counts as such."""
    h = hashlib.sha256()
    todo = list(reversed(paths))
    while todo:
        path = todo.pop()
        try:
            st = os.stat(path)
        except OSError:
            h.update(f"{path}\0missing\n".encode())
            continue
        if not os.path.isdir(path):
            h.update(f"{path}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\n".encode())
        else:
            # (a directory by its entries alone: its own times move when Python first makes its __pycache__)
            h.update(f"{path}\0dir\n".encode())
            try:
                names = sorted(os.listdir(path))
            except OSError:
                h.update(f"{path}\0unlisted\n".encode())
                continue
            todo.extend(Path(path) / name for name in reversed(names) if name != "__pycache__")
    return h.hexdigest()


def _record() -> Any:
    from ..runtime.keep_aten import DiskDict, cache_dir  # (runtime imports compat: lazily)

    global _disk
    if _disk is None:
        _disk = DiskDict(lambda: cache_dir() / "inductor_keys.json", _RECORD_ENTRIES)
    return _disk


_disk: Any = None


def reset_for_tests() -> None:
    """Forget this process's claim and what it read (the next `prefill` acts as a new process's first)."""
    global _once, _disk
    _once, _disk = background.Once(), None
