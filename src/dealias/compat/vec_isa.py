"""Inductor's probe of the host's vector ISAs, remembered per host for dealias's compiles.

Each process's first inductor compile for the CPU (or load from its FX graph cache) picks the vector ISA its C++
kernels are built for: `cpu_vec_isa.valid_vec_isa_list()` takes every ISA whose flags the CPU has and, unless
`config.cpp.vec_isa_ok` says, builds a small library with its flags and loads it in a child Python, one child per
ISA (four on an AMX host: about 0.2 s each on a quiet 2-core machine, over 2 s loaded). torch.compile pays that in
every process too; it is most of what separates a warm-cache first call from the code load itself.

dealias probes the first time as inductor does (the same function, so the result is inductor's), and records on
disk (`DEALIAS_CACHE_DIR`, beside the keep-ATen verdicts) whether every ISA the flags name passed, keyed on the
torch build, the flags, the C++ compiler and the Python. Where they all passed, dealias's compiles set
`cpp.vec_isa_ok=True`, which tells inductor the same without the children. Where one failed, or nothing is known,
nothing is set and inductor probes as it always does. The setting is inductor's config patch of dealias's compile
(and the same value every time, so that it keys inductor's FX graph cache consistently); the list inductor then
caches for the process is the one its probe would have found.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
import threading
from pathlib import Path
from typing import Any

import torch

from .registry import Missing, require, require_module

_lock = threading.Lock()


def vec_isa_config() -> dict[str, Any]:
    """The inductor config patch for a dealias compile: {"cpp.vec_isa_ok": True} where every vector ISA the CPU's
    flags name is known (on disk, or probed now) to build and load; {} otherwise, or if anything is unexpected."""
    try:
        return {"cpp.vec_isa_ok": True} if _all_pass() else {}
    except Exception:  # noqa: BLE001 - inductor probes as it always does
        return {}


@functools.cache
def _all_pass() -> bool:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False  # (elsewhere inductor's list comes from the platform, not from probes)
    isa = require_module("torch._inductor.cpu_vec_isa")
    flags = set(require(isa, "x86_isa_checker")())
    named = [str(v) for v in require(isa, "supported_vec_isa_list") if all(f in flags for f in str(v).split())]
    if not named:
        return False
    config = require_module("torch._inductor.config")
    if not hasattr(config.cpp, "vec_isa_ok"):
        raise Missing("torch._inductor.config.cpp.vec_isa_ok is not there")
    if config.cpp.vec_isa_ok is not None:  # (the user's setting, TORCHINDUCTOR_VEC_ISA_OK: it stands)
        return False
    from ..runtime.keep_aten import write_whole  # (runtime imports compat: a lazy import, as inductor.py's)

    path = _verdict_path(named)
    with _lock:
        try:
            return path.read_text() == "1"
        except OSError:
            pass
        valid = [str(v) for v in require(isa, "valid_vec_isa_list")()]  # inductor's probe (cached for the process)
        verdict = valid == named
        write_whole(path, "1" if verdict else "0")
        return verdict


def _verdict_path(named: list[str]) -> Path:
    """The file of this host's verdict: keyed on what the probe's outcome depends on."""
    try:
        cpp_builder = require_module("torch._inductor.cpp_builder")
        compiler = str(require(cpp_builder, "get_cpp_compiler")())
    except Missing:
        compiler = "?"
    try:
        stat = os.stat(compiler) if os.path.isabs(compiler) else None
        compiler += f"|{stat.st_size}|{stat.st_mtime_ns}" if stat is not None else ""
    except OSError:
        pass
    from ..runtime.keep_aten import cache_dir

    parts = [torch.__version__, ",".join(named), compiler, sys.executable, platform.release()]
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    return cache_dir() / f"vec_isa-{key}"
