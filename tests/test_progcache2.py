"""Inductor's per-process cache keys computed in a thread of their own from a first call's start
(compat/key_prefetch.py, with DEALIAS_KEY_PREFETCH=1: off by default; issue 38: the warm first call): the thread
changes when torch computes them, never what, a compile needing one meanwhile waits for it rather than computing it
twice, and a failure there is left to the compile to compute again."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.utils._functools import prefetchable_cache

import dealias
from dealias.compat import background, key_prefetch

SRC = str(Path(__file__).resolve().parent.parent / "src")


def test_a_compile_meanwhile_waits_for_the_thread_not_computing_again():
    calls = []

    @prefetchable_cache
    def key():
        calls.append(threading.current_thread().name)
        time.sleep(0.3)
        return "k"

    t = threading.Thread(target=key_prefetch._compute, args=([key],), name="prefetch")
    t.start()
    time.sleep(0.05)  # (the thread holds the function's lock)
    assert key() == "k"  # the compile's call
    t.join()
    assert calls == ["prefetch"]


def test_what_the_thread_raises_is_left_to_the_compile():
    calls = []

    @prefetchable_cache
    def key():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("a file that cannot be read")
        return "k"

    key_prefetch._compute([key])  # (swallowed: nothing cached)
    assert key() == "k" and len(calls) == 2


def test_only_torchs_locked_caches_are_computed_ahead():
    keys = key_prefetch._key_functions()
    from torch._inductor import codecache

    assert keys and all(k in (codecache.triton_key, codecache.torch_key) for k in keys)
    assert codecache.torch_key in keys


_CHILD = r"""
import json, sys, torch, dealias
from dealias.compat import key_prefetch
from torch._inductor import codecache

def f(x, y):
    x.mul_(2).add_(y)
    return (x * y).sum()

x, y = torch.randn(64), torch.randn(64)
ex, ey = x.clone(), y.clone()
expected = f(ex, ey)
g = dealias.jit(f, executor="inductor")
out = g(x, y)
started = key_prefetch.thread is not None
if started:
    key_prefetch.thread.join()
ahead = codecache.torch_key()
codecache.torch_key.clear()
print(json.dumps({
    "started": started,
    "fused": g.last.tier == "fused",
    "same_key": codecache.torch_key() == ahead,
    "exact": bool(torch.equal(x, ex)) and bool(torch.allclose(out, expected)),
}))
"""


def _child(tmp_path, prefetch):
    env = dict(os.environ, PYTHONPATH=SRC, DEALIAS_KEY_PREFETCH=prefetch)
    env.update(DEALIAS_CACHE_DIR=str(tmp_path / "dealias"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    p = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.inductor
def test_a_fused_first_call_computes_the_keys_ahead_and_the_same(tmp_path):
    on = _child(tmp_path, "1")
    assert on == {"started": True, "fused": True, "same_key": True, "exact": True}
    off = _child(tmp_path, "0")  # (warm now: inductor's FX cache found by the same keys)
    assert off == {"started": False, "fused": True, "same_key": True, "exact": True}


@pytest.mark.parametrize(
    "executor, fuse_first, starts",
    [
        ("torch", True, False),
        ("exact", True, False),
        ("tiered", False, False),
        ("tiered", True, True),
        ("inductor", False, True),
    ],
)
def test_only_a_first_call_that_fuses_starts_it(monkeypatch, executor, fuse_first, starts):
    from dealias.frontend import tiers
    from dealias.frontend.backend import Options, start_early

    monkeypatch.setattr(key_prefetch, "ENABLED", True)  # (DEALIAS_KEY_PREFETCH=1: off by default)
    monkeypatch.setattr(key_prefetch, "_once", background.Once())
    monkeypatch.setattr(key_prefetch, "thread", None)
    monkeypatch.setattr(key_prefetch, "_key_functions", lambda: [])  # (nothing computed: only whether it starts)
    monkeypatch.setattr(tiers, "FUSE_FIRST", fuse_first)
    start_early(Options(executor=executor))
    assert key_prefetch._once.claimed is starts
    if executor == "torch":  # (and through dealias.jit's first call)
        g = dealias.jit(lambda x: x.add_(1), executor=executor)
        x = torch.zeros(3)
        g(x)
        assert key_prefetch._once.claimed is False and torch.equal(x, torch.ones(3))


def test_off_unless_asked_for():
    """Measured on torch 2.14.1, the thread slowed warm first calls (it holds the GIL between its reads, beside
    dynamo's tracing): off by default (key_prefetch.py's docstring has the numbers)."""
    code = "from dealias.compat import key_prefetch; print(key_prefetch.ENABLED)"
    for value, enabled in ((None, "False"), ("0", "False"), ("1", "True")):
        env = {k: v for k, v in os.environ.items() if k != "DEALIAS_KEY_PREFETCH"}
        env["PYTHONPATH"] = SRC
        if value is not None:
            env["DEALIAS_KEY_PREFETCH"] = value
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert p.stdout.strip() == enabled, (value, p.stderr[-2000:])


def test_a_fork_waits_for_the_threads_started_at_a_first_call():
    """A thread holding a lock at a fork leaves it held in the child for good: compat/background.py joins dealias's
    threads before any fork, so the child finds them finished (their locks free) and can compute the keys itself."""
    import os
    import threading

    from dealias.compat import background

    release, done = threading.Event(), threading.Event()
    lock = threading.Lock()

    def holds_a_lock():
        with lock:
            release.wait(10)
        done.set()

    thread = background.start(holds_a_lock, "dealias test thread")
    threading.Timer(0.2, release.set).start()  # (the fork below waits for it, then for the thread)
    pid = os.fork()
    if pid == 0:  # the child: the lock is free (it would be held for good without the join)
        os._exit(0 if lock.acquire(timeout=5) else 1)
    _, status = os.waitpid(pid, 0)
    assert done.is_set() and not thread.is_alive()
    assert os.waitstatus_to_exitcode(status) == 0
