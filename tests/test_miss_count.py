"""A call is a cache miss when it compiled something for its function, on its own thread: a frame another thread
compiles meanwhile (another function's first call) is not this call's miss, nor is a frame dynamo is handed and
skips untraced. Dynamo's own count of frames is process-wide and counts those; `cache_info` counted them
(test_dynamic's sequence lengths: weakref callbacks the collector ran inside a call, 3 misses for 2 compiles, once
in a few runs of the suite)."""

from __future__ import annotations

import threading
import weakref

import torch

import dealias


def test_a_compile_on_another_thread_during_a_call_is_not_its_miss():
    other = dealias.jit(lambda x: x.cos() + 1)
    other_done = threading.Event()

    @torch._dynamo.disable
    def let_the_other_thread_compile(first_call: bool) -> None:
        # (runs eagerly in the middle of f's call: a second call meets the other thread's first compile here)
        if first_call:
            return
        thread = threading.Thread(target=lambda: (other(torch.randn(3)), other_done.set()))
        thread.start()
        thread.join()

    def f(x, first_call):
        y = x.sin() * 2
        let_the_other_thread_compile(first_call)
        return y + 1

    jf = dealias.jit(f)
    x = torch.randn(4)
    torch.testing.assert_close(jf(x, True), f(x, True), rtol=0, atol=0)
    misses = dealias.cache_info(jf).misses
    torch.testing.assert_close(jf(x, False), f(x, False), rtol=0, atol=0)
    assert other_done.is_set() and dealias.cache_info(other).misses == 1
    info = dealias.cache_info(jf)
    assert info.misses == misses, info  # (the other function's compile is not jf's)
    assert info.hits >= 1, info


def test_each_call_that_compiles_is_still_a_miss():
    def f(x):
        return x * 2

    jf = dealias.jit(f)
    for n in (3, 3, 5, 5, 7):
        jf(torch.randn(n))
    info = dealias.cache_info(jf)
    assert (info.misses, info.hits) == (2, 3), info  # (3: first call; 5: recompiled over a symbol; 7 served by it)


class _Held:
    pass


def test_a_weakref_callback_run_inside_a_call_is_not_its_miss():
    # The call drops the last reference to an object with a weakref callback: the callback runs inside the compiled
    # frame, and dynamo is handed its frame (a new code object each time) and skips it untraced.
    refs = []

    def holding_one(k):
        held = _Held()

        def callback(ref):
            pass

        callback.__code__ = callback.__code__.replace(co_firstlineno=1000 + k)  # (a code dynamo has not seen yet)
        refs.append(weakref.ref(held, callback))
        return [held]

    def f(x, box):
        box.pop()
        return x.sin() + 1

    jf = dealias.jit(f)
    x = torch.randn(4)
    for k in range(4):
        torch.testing.assert_close(jf(x, holding_one(k)), x.sin() + 1, rtol=0, atol=0)
    assert all(r() is None for r in refs)
    info = dealias.cache_info(jf)
    assert (info.misses, info.hits) == (1, 3), info
