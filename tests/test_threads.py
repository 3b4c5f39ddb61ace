"""Threads and the dynamo front end: threads racing a first call, and eager code running in one thread while
another compiles (make_fx patches nn.Module.__call__ process-wide). Every result is compared with eager."""

from __future__ import annotations

import copy
import functools
import threading
import types
import warnings

import pytest
import torch
from harness import check_real_parameters, no_fallback, same, same_state
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _python_dispatch

import dealias
import dealias.frontend.backend


def _eval_model() -> torch.nn.Module:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with torch.no_grad():  # running stats that differ from the defaults, so eval mode visibly uses them
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    return model.eval()


_MODULE_CALL, _MODULE_GETATTR = torch.nn.Module.__call__, torch.nn.Module.__getattr__


def _module_class_intact() -> list[str]:
    """Restore nn.Module.__call__/__getattr__ if something left them patched (so later tests are unaffected);
    say which were."""
    patched = []
    if torch.nn.Module.__call__ is not _MODULE_CALL:
        patched.append(f"nn.Module.__call__ is {torch.nn.Module.__call__.__code__.co_name}")
        torch.nn.Module.__call__ = _MODULE_CALL
    if torch.nn.Module.__getattr__ is not _MODULE_GETATTR:
        patched.append(f"nn.Module.__getattr__ is {torch.nn.Module.__getattr__.__code__.co_name}")
        torch.nn.Module.__getattr__ = _MODULE_GETATTR
    # torch's process-wide "inside a dispatch mode" flags: entering and leaving fake modes from two threads at
    # once can leave them set with no mode on any stack.
    flags = (
        "_is_in_torch_dispatch_mode",
        "_is_in_non_infra_torch_dispatch_mode",
        "_is_in_any_mode_without_ignore_compile_internals",
    )
    left_set = [f for f in flags if getattr(_python_dispatch, f, False)]
    if torch._C._len_torch_dispatch_stack() == 0 and left_set:
        patched.append("dispatch-mode flags left set: " + ", ".join(left_set))
        for f in flags:
            if hasattr(_python_dispatch, f):
                setattr(_python_dispatch, f, False)
        set_in_mode = getattr(torch._C._dynamo.guards, "set_is_in_mode_without_ignore_compile_internals", None)
        if set_in_mode is not None:
            set_in_mode(False)
    return patched


@pytest.fixture
def isolated_dynamo():
    """After a threads test, drop dynamo's caches: the code object of compiled modules' wrapper is shared by
    every compiled module, so a broken cache entry made during a race would reach later tests."""
    yield
    _module_class_intact()
    torch._dynamo.reset()


def _run_threads(targets) -> list:
    """Run the callables in threads, with any FallbackWarning an error; the exceptions they raised."""
    errors: list = []

    def guarded(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    with no_fallback():  # the filter is process-wide: set once, here, not in each thread
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


def test_threads_race_on_the_first_call(isolated_dynamo, monkeypatch):
    from dealias.frontend import tiers

    # (17 calls, compared bit for bit: the default's fused program, compiled on a program's PROMOTE_AFTER-th call, is
    # within a few ulps of eager, and an inductor compile, not what this test is about)
    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 10**6)
    eager = _eval_model()
    jitted = copy.deepcopy(eager)
    jf = dealias.jit(jitted)
    n = 8
    inputs = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(n)]
    expected = [eager(x) for x in inputs]
    results: list = [None] * n
    barrier = threading.Barrier(n)

    def worker(i):
        barrier.wait()
        results[i] = jf(inputs[i])

    try:
        errors = _run_threads([functools.partial(worker, i) for i in range(n)])
    finally:
        patched = _module_class_intact()
    assert not errors, [f"{type(e).__name__}: {str(e)[:200]}" for e in errors]
    assert patched == [], patched
    for got, exp in zip(results, expected):
        same(got, exp)
    same_state(eager, jitted)
    check_real_parameters(jitted)
    with no_fallback():  # cached afterwards
        same(jf(inputs[0]), expected[0])
    # Dynamo looks up its cache before it takes its compile lock, so threads that arrive together may each
    # compile (one after the other, never overlapping); afterwards every call hits.
    info = dealias.cache_info(jf)
    assert info.misses <= n and info.entries <= n, info
    for x, exp in zip(inputs, expected):
        same(jf(x), exp)
    assert dealias.cache_info(jf).misses == info.misses


def test_eager_thread_runs_while_another_thread_compiles(isolated_dynamo):
    model = _eval_model()
    jf = dealias.jit(model)
    inputs = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(16)]
    expected = [model(x) for x in inputs]
    compiled = threading.Event()
    mismatches: list = []
    eager_calls = [0]
    results: list = []

    def eager_loop():
        i = 0
        while not compiled.is_set() or i < 32:
            got = model(inputs[i % 16])
            if isinstance(got, FakeTensor) or not torch.equal(got, expected[i % 16]):
                mismatches.append(i)
            i += 1
        eager_calls[0] = i

    def compile_once():
        try:
            results.append(jf(inputs[3]))
        finally:
            compiled.set()

    try:
        errors = _run_threads([eager_loop, compile_once])
    finally:
        patched = _module_class_intact()
    assert not errors, errors
    assert patched == [], patched
    assert not mismatches, f"{len(mismatches)} of {eager_calls[0]} eager calls differ, first at call {mismatches[0]}"
    assert eager_calls[0] >= 32
    same(results[0], expected[3])
    check_real_parameters(model)
    with no_fallback():
        same(jf(inputs[5]), expected[5])
    info = dealias.cache_info(jf)
    assert info.misses == 1 and info.hits == 1, info
    print(f"eager calls while compiling: {eager_calls[0]}")


def scaled_in_place(x):
    x.mul_(1.5)
    return x + 1


def test_a_call_while_another_thread_traces_runs_eagerly_once(monkeypatch):
    # dealias's capture traces with make_fx, whose "tracing" flag is process-wide: a call entering dynamo while
    # another thread compiles is refused by dynamo ("using FX to symbolically trace a dynamo-optimized function").
    # That call runs eagerly; the function used to be marked eager for good.
    import torch.fx._symbolic_trace as fx_trace

    if not hasattr(fx_trace, "_is_fx_tracing_flag"):
        pytest.skip("this torch (2.14) keeps FX's tracing flag per thread: another thread's capture refuses nothing")
    jf = dealias.jit(scaled_in_place)
    monkeypatch.setattr(fx_trace, "_is_fx_tracing_flag", True)  # (as while another thread's capture runs)
    x, y = torch.randn(3), torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        assert torch.equal(jf(x.clone()), scaled_in_place(x.clone()))
        monkeypatch.setattr(fx_trace, "_is_fx_tracing_flag", False)
        for _ in range(2):
            assert torch.equal(jf(y.clone()), scaled_in_place(y.clone()))
    assert not jf.eager
    assert dealias.cache_info(jf).entries == 1


def add_then_double(x, y):
    x.add_(y)
    return x.mul(2)


def _scaled(x, y):
    return add_then_double(x, y) * 1


def _calls_like_eager(jf, fn, seed: int, calls: int = 5) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(calls):
        x, y = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
        ex = x.clone()
        expected = fn(ex, y.clone())
        same(jf(x, y), expected)
        same(x, ex)


def test_strict_function_called_by_8_threads_at_once(isolated_dynamo):
    # Each call either compiles or hits; none is refused by dynamo because another thread traces with FX (the
    # flag is process-wide), and the threads arriving together compile the function once, not once each (8 copies
    # filled the cache limit: strict=True then raised).
    jf = dealias.jit(add_then_double, strict=True)
    barrier = threading.Barrier(8)

    def worker(i):
        barrier.wait()
        _calls_like_eager(jf, add_then_double, i)

    errors = _run_threads([functools.partial(worker, i) for i in range(8)])
    assert not errors, [f"{type(e).__name__}: {str(e)[:200]}" for e in errors]
    info = dealias.cache_info(jf)
    assert info.entries == 1 and info.misses == 1 and info.hits == 39, info


def test_strict_calls_while_other_threads_compile(isolated_dynamo):
    # A compiled strict function called while other threads compile new functions (dealias captures with make_fx
    # at a graph's first run) waits for their compile instead of raising
    warm = dealias.jit(add_then_double, strict=True)
    _calls_like_eager(warm, add_then_double, 0, calls=1)
    compiled = threading.Semaphore(0)
    barrier = threading.Barrier(8)

    def caller(i):
        barrier.wait()
        while not compiled.acquire(blocking=False):  # until a compiler has finished all its functions
            _calls_like_eager(warm, add_then_double, i, calls=1)
        compiled.release()

    def compiler(i):
        barrier.wait()
        try:
            for k in range(3):  # fresh functions, each its own code object (dynamo's cache limit is per code)
                fresh = dealias.jit(types.FunctionType(_scaled.__code__.replace(), globals(), f"fresh_{i}_{k}"))
                _calls_like_eager(fresh, add_then_double, 10 * i + k, calls=1)
        finally:
            compiled.release()  # (also when it raised: the callers stop, and the error is reported)

    targets = [functools.partial(caller, i) for i in range(4)] + [functools.partial(compiler, i) for i in range(4)]
    errors = _run_threads(targets)
    assert not errors, [f"{type(e).__name__}: {str(e)[:200]}" for e in errors]
    assert dealias.cache_info(warm).entries == 1
