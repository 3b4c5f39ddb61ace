"""The threads dealias starts at a compiled function's first call (compat/vec_isa.py's probe of the host's vector
ISAs, compat/key_prefetch.py's inductor cache keys, compat/header_prefetch.py's precompiled header), and what keeps
them safe inside the user's process.

A thread that holds a lock when the process forks leaves that lock held in the child for good (only the forking
thread is copied): a child that then compiled would wait forever on dealias's probe lock or on torch's key cache
lock. So before any fork of the process (`os.register_at_fork`, registered with the first thread) the threads still
running are joined: they run within a first call only (seconds on a new host, ~0.5 s on a known one), and take no
lock a forking thread may hold while it forks (the compile waits on theirs, it does not fork under them; inductor's
compile subprocesses are spawned without Python's fork hooks). A fork from one of the threads (none does) would join
the others only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

_threads: list[threading.Thread] = []
_lock = threading.Lock()
_registered = False


class Once:
    """Claimed by its first caller only, whichever thread: each of the threads above starts once per process."""

    def __init__(self) -> None:
        self.claimed = False
        self._lock = threading.Lock()

    def claim(self) -> bool:
        """True for the first call, False for every later one."""
        with self._lock:
            first, self.claimed = not self.claimed, True
        return first


def start(target: Callable[..., Any], name: str, *args: Any) -> threading.Thread:
    """Run `target(*args)` in a daemon thread named `name` (the process may exit without waiting for it: whatever
    it computes, the compile computes itself when it is not there)."""
    global _registered
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    with _lock:
        if not _registered and hasattr(os, "register_at_fork"):
            os.register_at_fork(before=_join)
            _registered = True
        _threads[:] = [t for t in _threads if t.is_alive()]
        _threads.append(thread)
    thread.start()
    return thread


def _join() -> None:
    me = threading.current_thread()
    for thread in list(_threads):
        if thread is not me and thread.is_alive():
            thread.join()
