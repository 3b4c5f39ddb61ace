"""Inductor's per-process keys of the installed torch and triton, remembered on disk instead of hashed again in
every process (issue 38: first calls).

Every inductor compile and every FX graph cache or AOTAutograd cache lookup keys its entry on two values computed
once per process: `torch._inductor.codecache.torch_key()`, a hash of torch's 2,352 module files (0.09 CPU s), and
`CacheBase.get_system()`, which takes `codecache.triton_key()`: where triton is installed (torch 2.14's CUDA build,
run on a CPU) a hash of triton's compiler, backends and language sources and of its 505 MB `libtriton.so` (0.35
CPU s). Together they were 0.44 s of a warm mobilenet-like training forward's first call of 5.0 s; torch.compile
pays the same in every process.

dealias computes each once, by torch's own function, and records it under a fingerprint of what that function
reads: for triton's, every file under triton's `compiler`, `backends` and `language` packages, and
`runtime/cache.py`, `_C/libtriton.*` and `__init__.py` (triton's version); for torch's, every module file in
torch's packages as `build_code_hash` finds them, and inductor's three extra files. Each file counts by its path,
inode, size and modification and change times (change times cannot be set back: any rewrite, copy or reinstall
changes them), each directory by its path; keyed also on the torch build and whether inductor imported triton. A
later process whose fingerprints match (1.5 + 10 ms of `stat` calls) hands the values to torch's caches for them
before its first compile (`prefetchable_cache.set`, torch's own way to fill them ahead), so nothing hashes the files
again; each value is the one torch computed from the same files. A fingerprint that does not match, an unreadable
record, a value already computed in the process, or a torch without these functions: torch computes it as it
always does. Only values are set, never a function replaced; another backend in the process reads the same values,
sooner. `DEALIAS_INDUCTOR_KEYS=0` (read at import) turns it off.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

from . import background

ENABLED = os.environ.get("DEALIAS_INDUCTOR_KEYS", "1") != "0"
_once = background.Once()
_RECORD_ENTRIES = 16  # (fingerprints kept: installs a user switches between)


def prefill() -> dict[str, str]:
    """Once per process, before the first compile of dealias that may key an inductor cache entry: torch's
    `torch_key` and `triton_key` caches filled from the record, or computed now (the compile would compute them
    next) and recorded. Returns what was done for each ("recorded", "from record", or why nothing was), for tests."""
    if not ENABLED or not _once.claim():
        return {"all": "off" if not ENABLED else "done before"}
    try:
        from torch._inductor import codecache, config
    except Exception:  # noqa: BLE001 - another torch: torch computes the keys as it always does
        return {"all": "no inductor"}
    if not getattr(config, "fx_graph_cache", False):
        return {"all": "no inductor cache"}  # (no FX graph cache, nor AOTAutograd's on it: nothing may need them)
    return {name: _fill(codecache, name, sources) for name, sources in _SOURCES.items()}


def _fill(codecache: Any, name: str, sources: Any) -> str:
    """Torch's cached function `codecache.<name>` filled from the record under the fingerprint `sources` gives of
    what it reads, or computed by torch and recorded."""
    function = getattr(codecache, name, None)
    if not (callable(function) and hasattr(function, "set")):
        return "not prefetchable"  # (another torch: nothing to fill)
    try:
        parts = sources(codecache)
        if parts is None:
            return "nothing to read"  # (no triton: torch's function returns None at once)
        key = hashlib.sha256("\0".join([name, *_build(), *parts]).encode()).hexdigest()
        record = _record()
        value = _decoded(record.get(key))
        if value is not _MISSING:
            try:
                function.set(value)
            except RuntimeError:
                return "computed before"  # (another compile of the process computed it first: the same value)
            return "from record"
        encoded = _encoded(function())  # (torch's own computation, cached for the process)
        if encoded is not None:
            record.put(key, encoded)
            record.flush()
        return "recorded"
    except Exception:  # noqa: BLE001 - torch computes the key as it always does
        return "failed"


def _build() -> list[str]:
    return [torch.__version__, str(getattr(torch.version, "git_version", ""))]


def _encoded(value: Any) -> list[Any] | None:
    """A JSON form of a key's value (torch's is bytes, triton's a string or None); None for another kind."""
    if value is None:
        return ["none", ""]
    if isinstance(value, str):
        return ["str", value]
    if isinstance(value, bytes):
        return ["bytes", value.hex()]
    return None


def _decoded(stored: Any) -> Any:
    """The value `_encoded` gave `stored`; _MISSING for anything else (no entry, a damaged one)."""
    if not (isinstance(stored, list) and len(stored) == 2 and all(isinstance(s, str) for s in stored)):
        return _MISSING
    kind, text = stored
    if kind == "none" and text == "":
        return None
    if kind == "str":
        return text
    if kind == "bytes":
        try:
            return bytes.fromhex(text)
        except ValueError:
            return _MISSING
    return _MISSING


_MISSING = object()


def _triton_sources(codecache: Any) -> list[str] | None:
    """What triton's key is computed from: whether inductor has triton, and the fingerprint of the files under its
    package that `triton.runtime.cache.triton_key` reads; None where triton is not installed."""
    root = triton_root()
    if root is None:
        return None
    from torch._inductor.runtime import triton_compat

    parts = [str(bool(getattr(triton_compat, "HAS_TRITON", False))), str(root)]
    parts.append(fingerprint([root / "compiler", root / "backends", root / "language", root / "runtime" / "cache.py"]))
    parts.append(fingerprint([root / "__init__.py", *sorted((root / "_C").glob("libtriton.*"))]))
    return parts


def _torch_sources(codecache: Any) -> list[str]:
    """What torch's key is computed from: the modules of torch's packages (`build_code_hash` walks them as pkgutil
    finds them) and three files of inductor's."""
    root = Path(codecache._TORCH_PATH)
    inductor = Path(codecache.__file__).parent
    extra = [inductor / "codegen" / "aoti_runtime" / f for f in ("interface.cpp", "streams.h")] + [
        inductor / "script.ld"
    ]
    return [str(root), package_fingerprint(root), fingerprint(extra)]


def triton_root() -> Path | None:
    """The directory of the installed triton package, found without importing it; None where there is none."""
    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        return None
    locations = list(getattr(spec, "submodule_search_locations", None) or []) if spec is not None else []
    return Path(locations[0]) if locations else None


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
            h.update(_stat_line(path, st))
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


def _stat_line(path: Any, st: os.stat_result) -> bytes:
    """What a fingerprint hashes of one file: its path, inode, size and modification and change times."""
    return f"{path}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\n".encode()


def package_fingerprint(root: Path) -> str:
    """`fingerprint`'s hash for the modules pkgutil finds under `root` (files of a module suffix, `__pycache__`
    aside), descending only into packages (directories with an `__init__` module), as `build_code_hash` does:
    torch's headers and libraries beside its packages are no module."""
    suffixes = tuple(importlib.machinery.all_suffixes())
    h = hashlib.sha256()
    todo = [str(root)]
    while todo:
        directory = todo.pop()
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        h.update(f"{directory}\0dir\n".encode())
        for e in reversed(entries):
            if e.is_dir():
                if e.name != "__pycache__" and any(
                    os.path.isfile(os.path.join(e.path, "__init__" + s)) for s in suffixes
                ):
                    todo.append(e.path)
            elif e.name.endswith(suffixes):
                h.update(_stat_line(e.path, e.stat()))
    return h.hexdigest()


_SOURCES = {"torch_key": _torch_sources, "triton_key": _triton_sources}


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
