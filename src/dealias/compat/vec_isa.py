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

`cpp.vec_isa_ok` answers only the base probe: AVX-512's bf16, VNNI, AMX and AMX-fp16 extensions are probed whatever
it says (`check_build`, a library built and loaded in a child Python each: six children on an AMX host, about 0.5 s
of every warm fused first call). dealias records the outcome of each such probe the first time (`check_build`'s
answer per ISA class, its flags at the call and the probed code; a file beside the verdict, under the same key) and,
in a later process, makes inductor's list for the process itself before its first compile, under the same setting,
with those probes answered from the record (one not recorded is run and added): the list, and the extension flags
the ISAs keep, are those the probes found. Only the thread making the list is answered so; its list is cached for
the process, as inductor's own first probe's would be.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from . import background
from .registry import Missing, require, require_module

_lock = threading.Lock()


def vec_isa_config() -> dict[str, Any]:
    """The inductor config patch for a dealias compile: {"cpp.vec_isa_ok": True} where every vector ISA the CPU's
    flags name is known (on disk, or probed now) to build and load; {} otherwise, or if anything is unexpected."""
    try:
        return {"cpp.vec_isa_ok": True} if _all_pass() else {}
    except Exception:  # noqa: BLE001 - inductor probes as it always does
        return {}


def start_probe() -> None:
    """Start the host's first probe in a daemon thread of its own, where nothing is known on disk yet: its children
    (0.5-1.5 s of CPU each, six here) then run while dynamo and dealias trace the program, on the other core, and
    the compile that asks `vec_isa_config` waits for it (on the lock) instead of probing from the start. Called at
    a compiled function's first call, never at import; once per process; a warm process starts nothing (its list
    is made from the record in the compile's own thread: the config patch that takes is process-wide, and only the
    compiling thread may set it)."""
    if not _once.claim():
        return
    try:
        # The modules the probe imports, imported here: an import in another thread while dynamo imports in this
        # one could meet a module lock held the other way round (Python then raises in one of the threads).
        for name in ("torch._inductor.config", "torch._inductor.cpu_vec_isa", "torch._inductor.cpp_builder"):
            require_module(name)
        require_module("torch._inductor.codecache")
    except Exception:  # noqa: BLE001 - nothing started: the compile probes as it would have
        return
    background.start(_probe_if_unknown, "dealias-vec-isa-probe")  # (joined before a fork: background.py)


_once = background.Once()


def _probe_if_unknown() -> None:
    try:
        host = _host()
        if host is not None:
            _probe(*host, background=True)
    except Exception:  # noqa: BLE001 - the compile probes (or asks again) as it would have
        pass


@functools.cache
def _all_pass() -> bool:
    host = _host()
    return _probe(*host, background=False) if host is not None else False


def _host() -> tuple[Any, list[str], Path] | None:
    """(inductor's cpu_vec_isa, the ISAs the CPU's flags name, the verdict's file); None where there is nothing to
    probe or remember (not x86 Linux, no ISA named, the user's own setting)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None  # (elsewhere inductor's list comes from the platform, not from probes)
    isa = require_module("torch._inductor.cpu_vec_isa")
    flags = set(require(isa, "x86_isa_checker")())
    named = [str(v) for v in require(isa, "supported_vec_isa_list") if all(f in flags for f in str(v).split())]
    if not named:
        return None
    config = require_module("torch._inductor.config")
    if not hasattr(config.cpp, "vec_isa_ok"):
        raise Missing("torch._inductor.config.cpp.vec_isa_ok is not there")
    if config.cpp.vec_isa_ok is not None:  # (the user's setting, TORCHINDUCTOR_VEC_ISA_OK: it stands)
        return None
    return isa, named, _verdict_path(named)


def _probe(isa: Any, named: list[str], path: Path, background: bool) -> bool:
    """Whether every ISA in `named` passed inductor's probe: from the verdict at `path`, else probed now and
    written. In the `background` thread, a verdict on disk is left for the compiling thread to read."""
    config = require_module("torch._inductor.config")
    from ..runtime.keep_aten import write_whole  # (runtime imports compat: a lazy import, as inductor.py's)

    valid_vec_isa_list = require(isa, "valid_vec_isa_list")
    with _lock:
        try:
            known: str | None = path.read_text()
        except OSError:
            known = None
        if known is not None and background:
            return known == "1"
        if known is not None:
            if known == "1":
                # The process's list made now, as the compile would make it (the same setting), its extension probes
                # answered from the record.
                with config.patch({"cpp.vec_isa_ok": True}), _recorded_checks(isa, path):
                    valid_vec_isa_list()
            return known == "1"
        with _recorded_checks(isa, path):  # (every probe runs: recorded for the next process)
            valid = [str(v) for v in valid_vec_isa_list()]  # inductor's probe (cached for the process)
        verdict = valid == named
        write_whole(path, "1" if verdict else "0")
        return verdict


@contextlib.contextmanager
def _recorded_checks(isa: Any, verdict: Path) -> Iterator[None]:
    """While open, in this thread: inductor's `VecISA.check_build` answered from the record beside `verdict`, a
    probe not recorded run and recorded (the record written back at the end)."""
    vec = require(isa, "VecISA")
    original = require(vec, "check_build", "self", "code")
    require(vec, "build_arch_flags", "self")
    path = verdict.with_name(verdict.name + "-checks.json")
    try:
        record = json.loads(path.read_text())
        record = record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        record = {}
    before, thread = dict(record), threading.get_ident()

    def check_build(self: Any, code: str) -> bool:
        if threading.get_ident() != thread:
            return original(self, code)
        # (the flags at the call: the bf16 and AMX-fp16 probes add theirs for the call)
        what = f"{type(self).__qualname__}|{self}|{self.build_arch_flags()}|{code}"
        key = hashlib.sha256(what.encode()).hexdigest()[:32]
        if not isinstance(record.get(key), bool):
            record[key] = bool(original(self, code))
        return record[key]

    vec.check_build = check_build
    try:
        yield
    finally:
        vec.check_build = original
        if record != before:
            from ..runtime.keep_aten import write_whole

            write_whole(path, json.dumps(record, indent=1, sort_keys=True))


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
