"""Programs called with changing positions, offsets and sizes (issue 11): compiled a bounded number of times,
every call equal to eager (outputs, every mutated input, aliasing)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

import dealias
from dealias.verify import compare_call


def run_calls(fn: Callable[..., Any], calls: list[tuple[Any, ...]], **jit_kw: Any) -> dealias.CacheInfo:
    """Call `fn` eagerly and jitted with each argument tuple of `calls` (fresh copies for each side, so memory
    shared between arguments stays shared); fail at the first difference or fallback warning."""
    jf = dealias.jit(fn, **jit_kw)
    for k, args in enumerate(calls):
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            diff = compare_call(fn, jf, args)
        assert diff is None, f"call {k + 1}: {diff}"
    return dealias.cache_info(jf)


def add_row(x):
    x.add_(1)
    return x * 2


def test_rows_of_one_buffer_compile_once():
    buf = torch.randn(40, 3)
    info = run_calls(add_row, [(buf[i],) for i in range(40)])
    assert info.misses == 1 and info.entries == 1, info


def test_rows_write_their_own_row():
    buf = torch.zeros(6, 3)
    jf = dealias.jit(add_row)
    for i in range(6):
        jf(buf[i])
        jf(buf[i])
    assert torch.equal(buf, torch.full((6, 3), 2.0))
    assert dealias.cache_info(jf).misses == 1


def add_other(a, b):
    a.add_(b)
    return a + b


def test_rows_of_one_buffer_disjoint_and_overlapping():
    buf = torch.randn(8, 4)
    pairs = [(0, 3), (5, 1), (2, 2), (7, 6), (4, 4), (1, 0)]
    info = run_calls(add_other, [(buf[i], buf[j]) for i, j in pairs])
    assert info.entries == 2, info  # disjoint rows, and the same row twice


def scale_then_read(a, b):
    a.mul_(2)
    return b + 1


def test_partly_overlapping_windows_specialize_on_their_distance():
    # a and b overlap partly; the distance between them decides what a's write does to b: guarded exactly.
    flat = torch.randn(32)
    calls = [(flat[i : i + 6], flat[i + d : i + d + 6]) for i, d in [(0, 2), (5, 2), (9, 3), (1, 3), (4, 7)]]
    info = run_calls(scale_then_read, calls)
    assert info.entries == 3, info  # distance 2, 3 and 7 (disjoint)


def strided_window(x):
    y = x.as_strided((2,), (1,), 5)  # an absolute storage offset: the program depends on where x sits
    y.mul_(2)
    return x + 1


def test_absolute_offsets_stay_keyed():
    flat = torch.randn(16)
    info = run_calls(strided_window, [(flat[i : i + 8],) for i in (0, 1, 2)])
    assert info.entries == 3, info
