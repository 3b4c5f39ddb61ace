"""Inductor's cache keys of the process computed on the machine's other core while a first call traces (issue 38:
the warm first call).

Every inductor compile, and every FX graph cache lookup of a warm process, keys its entry on two values computed
once per process: `torch_key()` (a hash of torch's source files) and `CacheBase.get_system()`, which takes
`triton_key()`, a hash of triton's compiler and of its 505 MB `libtriton.so` where triton is installed (torch 2.14's
environment). Measured in a warm AdamW first call of torch 2.14: 0.35 s CPU for get_system and 0.14 s for
torch_key, of 1.9 s. Both are mostly file reads and sha256 updates over large buffers, which release the GIL: in a
thread of their own they overlap dynamo's tracing and dealias's passes, which hold it (a wall-clock gain on a
machine with a free core, none in CPU time).

`start()` begins that thread once per process, for a backend that compiles with inductor. It only calls torch's
own cached functions (`torch._inductor.codecache.triton_key`, `torch_key`): each holds its own lock while it
computes, so a compile that needs the value meanwhile waits for this computation instead of making a second one,
and the value is whatever torch computes (the thread changes when, never what). Whatever it raises is dropped
here, and torch's function is then left uncached: the compile computes it itself, as without the thread.
torch's and triton's modules it needs are imported in the calling thread first, so that the thread imports
nothing another thread may be importing.

Off by default: `DEALIAS_KEY_PREFETCH=1` (read at import) turns it on. Measured on torch 2.14.1 (Intel Xeon, 2
cores, quiet; the twentieth session), warm first calls, thread on / off, wall s: mobilenet-like training forward
6.49 / 6.22, 5.98 / 5.47, 6.31 / 5.82; resnet18 eval 3.83 / 3.70, 3.02 / 2.53, 2.85 / 2.69; Adam foreach 2.77 /
2.46, 2.29 / 2.18, 2.32 / 2.07 (9 of 9 pairs slower with the thread). The hashing holds the GIL between its reads
(triton's key walks its package file by file): it took 0.94 s beside dynamo's tracing where the compile computes it
in 0.48 s, and slowed the tracing it was meant to overlap. Cold first calls: 24.0 / 22.2 and 23.0 / 23.7 (within
their spread).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from . import background

ENABLED = os.environ.get("DEALIAS_KEY_PREFETCH", "0") == "1"
_once = background.Once()
thread: threading.Thread | None = None  # (tests: join it)


def start() -> None:
    """Start computing inductor's per-process cache keys in a daemon thread, once per process (a no-op after, or
    unless turned on, or where torch has not these functions, or inductor's FX graph cache is off)."""
    global thread
    if not ENABLED or not _once.claim():
        return
    keys = _key_functions()
    if keys:
        thread = background.start(_compute, "dealias inductor keys", keys)  # (joined before a fork: background.py)


def _key_functions() -> list[Any]:
    """torch's cached key functions to compute ahead, their modules imported here (the calling thread)."""
    try:
        from torch._inductor import codecache, config
        from torch._inductor.runtime import triton_compat  # noqa: F401 - triton_key imports it: imported here
    except Exception:  # noqa: BLE001 - another torch: nothing computed ahead
        return []
    if not getattr(config, "fx_graph_cache", False):
        return []  # (no FX graph cache: nothing keys an entry on them at a first compile)
    out = []
    # In the order a compile asks for them (FxGraphHashDetails takes torch_key, then get_system): computed the other
    # way, a warm mobilenet training forward's compile (torch 2.14.1) reached torch_key while the thread still hashed
    # triton, and computed it itself (0.39 s against 0.11 uncontended) beside the thread (0.94 s for triton_key).
    for name in ("torch_key", "triton_key"):
        f = getattr(codecache, name, None)
        # (only torch's own cache with its lock: prefetchable_cache's `set`; a plain function would be computed twice)
        if callable(f) and hasattr(f, "set") and hasattr(f, "clear"):
            out.append(f)
    return out


def _compute(keys: list[Any]) -> None:
    for f in keys:
        try:
            f()
        except BaseException:  # noqa: BLE001 - left uncached: the compile computes it itself
            pass
