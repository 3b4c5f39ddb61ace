"""kernel_checks.py's verdicts remembered: which ops eager's kernel accepts for their arguments' metadata, in this
process and on disk for the next one (a fused build's first call probed every op of the graph on zeros again in a
process restarting with warm caches: 15-20 ms of a warm first call of 1.5-2.5 s).

What a probe checks (checks.metadata_error): whether eager's kernel of the op raises for its arguments' dtypes,
sizes, strides, storage offsets and sizes, devices, which of them share memory, and the op's constants, whatever
the values. Its answer depends on nothing else but the torch build (the kernels), the probe's own source, and the
process settings a kernel reads: deterministic algorithms (a kernel refusing its nondeterministic path raises),
the default dtype and device, torch.backends' switches choosing a kernel (compat/kernel_flags.py: oneDNN's
convolution rejects a bias dtype the native one accepts). The key is all of that, so an op looked up under a key
answers as its probe would. Only "eager accepts it" (the probe's None) is remembered: a program whose kernel raises
is probed again (its error, with eager's message, is what the program raises), and a graph over symbols is never
looked up (its probe is at the compiling call's values). The disk file is per torch build (its version, commit and
configuration) and per source of the probe (checks.py, opfacts.py, draws.py, kernel_checks.py, this file); a key
hashes the `repr` of the in-process key, deterministic for the values it holds.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..compat.kernel_flags import kernel_flags
from .keep_aten import cache_dir, read_json, source_key, write_whole

_LIMIT = 8192  # keys in memory, and on disk
_lock = threading.Lock()
_accepted: set[str] = set()  # keys eager's kernel accepts, this process's and the disk file's
_loaded = False
_unsaved = False


def key_of(node: fx.Node) -> str | None:
    """The key of `node`'s probe, or None where it is not kept (symbols, values a key cannot name)."""
    storages: dict[Any, int] = {}  # (which arguments share memory: the probe gives them one buffer)
    flags = kernel_flags()  # (which kernel runs: oneDNN's convolution rejects what the native one accepts)
    if flags is None:
        return None
    settings = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.get_default_dtype(),
        str(torch.get_default_device()),  # (the probe's memory is made there)
        flags,
    )
    parts: list[Any] = [str(node.target), settings]
    leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
    parts.append(str(spec))  # (where each argument stands: `op(a, [b, c])` is not `op([a, b], c)`)
    for a in leaves:
        if isinstance(a, fx.Node):
            a = a.meta.get("val")
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None
        if isinstance(a, torch.Tensor):
            if a.layout is not torch.strided:  # (no strides nor storage to name: sparse, mkldnn)
                return None
            if any(isinstance(d, torch.SymInt) for d in (*a.shape, *a.stride(), a.storage_offset())):
                return None
            storage = a.untyped_storage()
            sid = storages.setdefault(storage._cdata, len(storages))
            parts.append(
                (
                    "T",
                    a.dtype,
                    a.device,
                    a.layout,
                    tuple(a.shape),
                    a.stride(),
                    a.storage_offset(),
                    sid,
                    storage.nbytes(),
                )
            )
        elif a is None or isinstance(a, (bool, int, float, complex, str, torch.dtype, torch.device, torch.layout)):
            parts.append(a)
        elif isinstance(a, torch.memory_format):
            parts.append(str(a))
        else:
            return None  # (a value whose repr may not say everything the kernel reads)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def accepted(key: str | None) -> bool:
    """Whether a probe under `key` found that eager's kernel accepts the op (this process or an earlier one)."""
    if key is None:
        return False
    _read()
    return key in _accepted


def remember(key: str | None) -> None:
    """The probe under `key` found that eager's kernel accepts the op."""
    global _unsaved
    if key is None or key in _accepted:
        return
    _read()
    if len(_accepted) >= _LIMIT:
        return
    _accepted.add(key)
    _unsaved = True


def flush() -> None:
    """Write what this process probed (with what another process wrote meanwhile) for the next process."""
    global _unsaved
    if not _unsaved:
        return
    with _lock:
        _unsaved = False
        path = _path()
        if path is not None:
            write_whole(path, json.dumps(sorted(set(_load_file()) | _accepted)[:_LIMIT]))


def clear() -> None:
    """Forget every verdict in this process (tests: the next lookup reads the disk file again)."""
    global _loaded, _unsaved
    _accepted.clear()
    _loaded, _unsaved = False, False


def _read() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        _accepted.update(_load_file())


def _load_file() -> list[str]:
    data = read_json(_path())
    return [k for k in data if isinstance(k, str)] if isinstance(data, list) else []


def _path() -> Path | None:
    """The disk file; None where the probe's source cannot be read (an install of compiled files only, a zip): its
    verdicts are then kept in this process only (another version's file must not answer for this one)."""
    key = _build_key()
    return None if key is None else cache_dir() / f"kernel_checks-{key}.json"


@functools.cache
def _build_key() -> str | None:
    here = Path(__file__).parent
    # (the probe's and what it calls: opfacts.py finds an op's index arguments, which a probe fills as indices)
    ir = here.parent / "ir"
    files = (
        here / "kernel_checks.py",
        here / "kernel_verdicts.py",
        ir / "checks.py",
        ir / "opfacts.py",
        ir / "draws.py",
    )
    # (the build's configuration too: two builds of one commit may have other kernels, without LAPACK or oneDNN)
    return source_key(files, torch.__config__.show())
