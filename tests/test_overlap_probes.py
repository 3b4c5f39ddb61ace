"""In-place and `out=` writes whose written tensor is also read through another argument or another view of its
memory (passes/writecheck.py): eager's kernel is asked (checks.aliasing_is_benign, on memory laid out like the
call's) whether it computes what the functional program computes, on copies; where it does the graph compiles,
where it does not (an order of its own) the graph runs eagerly with an OverlapFallbackWarning. Eager's values
either way, first and cached call. Where eager's order decides, the op runs as an eager island (its own kernel on
a copy of the memory laid out as the caller's: ir/island.py, tests/test_overlap_islands.py), not the graph
eagerly, except where eager's own result varies (several threads)."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import check, compare_call, functional_ops

import dealias
from dealias.ir.island import island


def cumsum_into_itself(x):
    torch.cumsum(x, 0, out=x)  # the same tensor read and written: eager's kernel reads x[i] before it writes out[i]
    return x


def where_into_its_argument(x, y):
    torch.where(y > 0, x, y, out=x)
    return x


def lerp_towards_own_column(x):
    x.lerp_(x.narrow(1, 3, 1), 0.5)  # column 3 is written with its own value: each row agrees with copies
    return x


def clamp_by_own_column(x):
    x.clamp_(min=x.narrow(1, 2, 1))  # max(x, x[:, 2]): column 2 stays itself, the rest agree with copies
    return x


@pytest.mark.parametrize(
    "fn, make",
    [
        (cumsum_into_itself, lambda: (torch.randn(6),)),
        (where_into_its_argument, lambda: (torch.randn(4, 5), torch.randn(4, 5))),
        (lerp_towards_own_column, lambda: (torch.randn(4, 6),)),
        (clamp_by_own_column, lambda: (torch.randn(4, 6),)),
    ],
)
def test_a_write_that_eager_computes_as_on_copies_is_compiled(fn, make):
    check(fn, *make(), calls=3)  # (a FallbackWarning fails it)


def add_own_column(x):
    x.add_(x.narrow(1, 3, 1))  # column 3 doubles, then columns 4 and 5 read the doubled value
    return x


def mul_by_own_diagonal(x):
    x.mul_(x.diagonal())  # (a strided view: eager cannot tell the overlap) x[1, 1] squares, then x[2:, 1] read it
    return x


@pytest.mark.parametrize(
    "fn, make", [(add_own_column, lambda: (torch.randn(4, 6),)), (mul_by_own_diagonal, lambda: (torch.randn(4, 4),))]
)
def test_a_write_whose_result_depends_on_eagers_order_runs_as_an_island(fn, make):
    assert str(island) in functional_ops(check(fn, *make()))


def test_a_large_pointwise_overlap_is_not_asked():
    # Over ATen's grain size eager's pointwise kernel runs in several threads: which aliased element is written
    # first may change from run to run, so no probe answer holds.
    jf = dealias.jit(clamp_by_own_column)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert compare_call(clamp_by_own_column, jf, (torch.randn(2048, 32),)) is None
    assert any(issubclass(w.category, dealias.OverlapFallbackWarning) for w in record)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.complex64])
@pytest.mark.parametrize("fn, shape", [(add_own_column, (4, 6)), (mul_by_own_diagonal, (4, 4))])
def test_an_order_dependent_write_of_integers_or_complex_runs_as_an_island(fn, shape, dtype):
    # The probe once filled only floating-point and boolean tensors: on integer (complex) zeros the cascade
    # computes zeros, as copies do, so these compiled and returned the values of copies, not eager's.
    assert str(island) in functional_ops(check(fn, torch.randint(1, 9, shape).to(dtype)))


def add_zero_times_what_it_wrote(x, y):
    torch.add(y, x[0:10:2], alpha=0, out=x[4:9])  # out[2] (x[6]) reads x[4], which out[0] already wrote
    return x


def test_a_write_that_agrees_with_copies_on_finite_values_only_runs_as_an_island():
    # 0 * x: whatever x held, on finite values. Eager's x[4] had been written (finite) when it was read; a
    # functional program reading the caller's inf there computed 0 * inf = NaN.
    x = torch.tensor([1.0, 2, 3, 4, float("inf"), 5, float("nan"), 6, 7, 8, 9, 10])
    assert str(island) in functional_ops(check(add_zero_times_what_it_wrote, x, torch.randn(5)))


def indexed_write_of_own_strided_view(x, idx):
    x[idx] = x[0:6:2]  # with idx = [2, 4, 0] eager writes x[2], then reads it as the value for x[4]
    return x


def test_an_indexed_write_of_its_own_memory_runs_as_an_island():
    # The probe leaves indices at 0 (valid positions), where only x[0] is written and copies agree: which
    # elements are read after being written depends on the index's values, so the probe's answer cannot hold.
    # Eager's own kernel, on memory laid out as the caller's, reads what it wrote as eager's does.
    jf = check(indexed_write_of_own_strided_view, torch.randn(6), torch.tensor([2, 4, 0]))
    assert str(island) in functional_ops(jf)
