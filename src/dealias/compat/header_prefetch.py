"""Inductor's precompiled C++ header named on the machine's other core while a first call traces (issue 38: the warm
first call).

Loading a CPU kernel library from inductor's cache (a warm process's first fused call) begins with
`codecache._precompile_header(header, hashable_cmd_line, **compile_command)`: it runs the C++ preprocessor over the
header inductor's kernels include (`cpp_prefix.h`, ATen's vectorized headers behind it) and hashes the output with
`openssl` in a second child, so that the precompiled header is named by everything it includes. Once per process
(the function is `functools.cache`d), while the calling thread waits: measured 0.25-0.47 s of its wall in warm 2.14
first calls (AdamW foreach, GPT-2) and 1.1-1.2 s on 2.13 (AdamW), on a 2-core machine at a load of 9-12; 0.15 s CPU
in the children. torch.compile's warm first call pays the same.

dealias notes the arguments of the calls its own compiles make (`recording`, in inductor.py's `dealias_compile`, in
the compiling thread only: a wrapper of torch's function that passes every call through unchanged) and keeps them
on disk (`DEALIAS_CACHE_DIR/headers/`, keyed on the torch build and the host). A later process's first call that
fuses (`start`) calls torch's function with those arguments in a thread of its own: its children run while dynamo
and dealias trace, and inductor's own call with the same arguments finds the process's cache filled; a compile that
comes while the thread is still at it waits for it (`wait`) rather than starting the same children again. The value
is torch's function's for those arguments (the thread changes when it is computed, never what; none of the inductor
config dealias's compiles patch enters it). The compile command's vector ISA is the process's own: its list is made
first, in the calling thread, from dealias's verdict as the compile would make it (compat/vec_isa.py), and only where
the verdict is on disk and says every ISA passed (else the list would be inductor's probe, in child processes, now);
the recorded ISA is matched by name. A record that cannot be read, of another build, or an argument of another kind
or name: nothing is started for it. Whatever the thread raises is dropped; the compile then computes it itself.

`DEALIAS_HEADER_PREFETCH=0` (read at import) turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import background
from .registry import Missing, require, require_module

ENABLED = os.environ.get("DEALIAS_HEADER_PREFETCH", "1") != "0"
VERSION = 1
MAX_CALLS = 16  # (calls kept per record: one or two per kernel kind in practice)

_lock = threading.Lock()
_local = threading.local()
_original: Any = None  # torch's cached `_precompile_header`, once the wrapper is in place
_saved: set[str] = set()  # calls this process has on disk already
_once = background.Once()
thread: threading.Thread | None = None  # (tests: join it)
errors: list[str] = []  # what the thread's calls raised (dropped otherwise: the compile computes those itself)


def _install() -> Any:
    """torch's `_precompile_header` with the recording wrapper in its place (once); None where it is not torch's
    cached function of those parameters."""
    global _original
    with _lock:
        if _original is not None:
            return _original
        try:
            codecache = require_module("torch._inductor.codecache")
            original = require(codecache, "_precompile_header", "header", "hashable_cmd_line")
        except Missing:
            return None
        if not (callable(getattr(original, "cache_info", None)) and callable(getattr(original, "cache_clear", None))):
            return None  # (not functools.cache'd: a call ahead would not spare the compile's)

        def _precompile_header(header: str, hashable_cmd_line: str, **compile_command: Any) -> Any:
            calls = getattr(_local, "calls", None)
            if calls is not None:
                calls.append((header, hashable_cmd_line, tuple(compile_command.items())))
            return original(header, hashable_cmd_line, **compile_command)

        functools.update_wrapper(_precompile_header, original)
        _precompile_header.cache_info = original.cache_info  # type: ignore[attr-defined]
        _precompile_header.cache_clear = original.cache_clear  # type: ignore[attr-defined]
        codecache._precompile_header = _precompile_header
        _original = original
        return original


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Around a dealias compile with inductor (this thread): a header call ahead still running is waited for, and the
    calls the compile makes are kept for the next process."""
    if not ENABLED or _install() is None:
        yield
        return
    wait()
    before = getattr(_local, "calls", None)
    _local.calls = []
    try:
        yield
    finally:
        calls, _local.calls = _local.calls, before
        if before is not None:
            before.extend(calls)
        elif calls:
            _save(calls)


def wait() -> None:
    """Wait for the header calls ahead, where they are still running (not from their own thread)."""
    t = thread
    if t is not None and t.is_alive() and t is not threading.current_thread():
        t.join()


def _encode(value: Any) -> Any:
    """A compile-command value as JSON, or raises TypeError: a plain value, a tuple of them, a vector ISA by name."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, tuple) and all(v is None or isinstance(v, (bool, int, str)) for v in value):
        return {"tuple": list(value)}
    isa = require_module("torch._inductor.cpu_vec_isa")
    if isinstance(value, require(isa, "VecISA")):
        return {"vec_isa": str(value)}
    raise TypeError(f"a compile-command value of type {type(value).__name__}")


def _decode(value: Any, isas: dict[str, Any]) -> Any:
    """The value `_encode` made, the vector ISA the process's own of that name; raises ValueError otherwise."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict) and set(value) == {"tuple"} and isinstance(value["tuple"], list):
        items = value["tuple"]
        if all(v is None or isinstance(v, (bool, int, str)) for v in items):
            return tuple(items)
    if isinstance(value, dict) and set(value) == {"vec_isa"} and value["vec_isa"] in isas:
        return isas[value["vec_isa"]]
    raise ValueError("not a recorded compile-command value")


def _key() -> str | None:
    from ..runtime.keep_aten import _host_key, source_key  # (runtime imports compat: lazily)

    return source_key((), _host_key(), f"v{VERSION}")


def _path(key: str) -> Path:
    from ..runtime.keep_aten import cache_dir

    return cache_dir() / "headers" / f"{key}.json"


def _load(key: str) -> list[dict[str, Any]]:
    """The recorded calls under `key` (each header, command line and compile command as JSON); [] where there are
    none usable."""
    from ..runtime.keep_aten import read_json

    data = read_json(_path(key))
    if not isinstance(data, dict) or data.get("version") != VERSION or data.get("key") != key:
        return []
    calls = data.get("calls")
    if not isinstance(calls, list) or len(calls) > MAX_CALLS:
        return []
    good = []
    for c in calls:
        if not (isinstance(c, dict) and isinstance(c.get("header"), str) and isinstance(c.get("cmd"), str)):
            return []
        kwargs = c.get("kwargs")
        if not isinstance(kwargs, list) or not all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in kwargs
        ):
            return []
        good.append(c)
    return good


def _save(calls: list[tuple[str, str, tuple[tuple[str, Any], ...]]]) -> None:
    """Keep the compile's header calls not on disk yet (a directory that cannot be written: not kept)."""
    from ..runtime.keep_aten import write_whole

    try:
        new = [{"header": h, "cmd": cmd, "kwargs": [[k, _encode(v)] for k, v in kwargs]} for h, cmd, kwargs in calls]
        key = _key()
    except (TypeError, Missing):
        return  # (an argument not recorded: the next process computes it in the compile, as before)
    if key is None:
        return
    texts = [json.dumps(c, sort_keys=True) for c in new]
    with _lock:
        if all(t in _saved for t in texts):
            return
        kept = _load(key)
        known = {json.dumps(c, sort_keys=True) for c in kept}
        for c, t in zip(new, texts):
            if t not in known:
                kept.append(c)
                known.add(t)
        if len(kept) > MAX_CALLS:
            return
        write_whole(_path(key), json.dumps({"version": VERSION, "key": key, "calls": kept}, indent=1))
        _saved.update(texts)


def start() -> None:
    """Where an earlier process recorded header calls: make them again in a daemon thread, once per process (a
    no-op after, or where nothing usable is recorded, or the vector ISA list would need a probe)."""
    global thread
    if not ENABLED or not _once.claim():
        return
    try:
        calls = _calls_ahead()
    except Exception:  # noqa: BLE001 - nothing started: the compile computes them as before
        return
    if calls:
        thread = background.start(_compute, "dealias inductor header", calls)  # (joined before a fork: background.py)


def _calls_ahead() -> list[tuple[str, str, dict[str, Any]]]:
    """The recorded calls, their arguments decoded for this process; [] where there is nothing to start."""
    key = _key()
    if key is None:
        return []
    recorded = _load(key)
    if not recorded or _install() is None:
        return []
    # The modules the call uses, imported here: an import in the thread while dynamo imports in this one could meet
    # a module lock held the other way round.
    require_module("torch._inductor.cpp_builder")
    require_module("torch.utils._filelock")
    isas = _process_isas()
    calls = []
    for c in recorded:
        try:
            kwargs = {k: _decode(v, isas) for k, v in c["kwargs"]}
        except ValueError:
            continue
        calls.append((c["header"], c["cmd"], kwargs))
    return calls


def _process_isas() -> dict[str, Any]:
    """The vector ISAs a compile command of this process names, by name: inductor's invalid one, and the one it picks
    where the process's list is made without a probe (from dealias's verdict that every ISA passed, as the compile
    makes it); {} for a recorded ISA otherwise."""
    from . import vec_isa as dealias_vec_isa

    isa = require_module("torch._inductor.cpu_vec_isa")
    out = {}
    invalid = getattr(isa, "invalid_vec_isa", None)
    if invalid is not None:
        out[str(invalid)] = invalid
    host = dealias_vec_isa._host()
    if host is None:
        return out
    try:
        verdict = host[2].read_text()
    except OSError:
        return out
    if verdict != "1":
        return out
    if dealias_vec_isa.vec_isa_config() != {"cpp.vec_isa_ok": True}:  # (makes the process's list, as the compile)
        return out
    picked = require(isa, "pick_vec_isa")()
    out[str(picked)] = picked
    return out


def _compute(calls: list[tuple[str, str, dict[str, Any]]]) -> None:
    for header, cmd, kwargs in calls:
        try:
            _original(header, cmd, **kwargs)
        except BaseException as e:  # noqa: BLE001 - left uncached: the compile computes it itself
            if len(errors) < MAX_CALLS:
                errors.append(f"{type(e).__name__}: {e}")
