"""Writes through `unfold` of a non-contiguous tensor (ir/viewops.py `_LOGICAL`): pushed back into
the base by the base's indices, as through a contiguous stand-in of its shape, where the generic as_strided inverse
reads storage positions (right only for a contiguous base; such writes used to run the whole graph eagerly).
Each against eager: values, written inputs, aliasing, first and cached calls, one compile, no fallback; grads
where autograd records the write."""

from __future__ import annotations

import pytest
import torch
from harness import check, grads_like_eager

import dealias


def add_through_unfold_of_strided_rows(x0, x1):  # fuzz seed 1200242: x1 is x0[::2]
    x1.index_fill_(1, torch.tensor([4]), 1.5)
    v3 = x0.unbind(0)[1]
    v4 = x1.unfold(1, 2, 2)
    v4.add_(v4)
    return v4, x0, v3


def clamp_into_unfold_of_moved_dims(x0):  # fuzz seed 1200009
    x0.index_fill_(1, torch.tensor([1]), 0.25)
    v2 = x0.movedim(0, -1)
    v2.mul_(v2)
    v2[:, 3] = 0.25
    v10 = v2.unfold(1, 2, 2)
    torch.clamp(v10[:, :, 1:], -1, 1, out=v10[:, :, 1:])
    return v10, x0, v2


def masked_fill_overlapping_unfold_of_columns(x1):  # fuzz seed 1201476 (unfold of step 1: elements shared)
    v2 = x1[:, ::3].split(2, 0)[0]
    v4 = v2.unfold(0, 2, 1)
    v4.masked_fill_(v4 > 0, -2.0)
    return x1, v4


def zero_unfold_with_gaps_of_transposed(x):  # (step 3 over size 2: elements of the base left out)
    x.t().unfold(0, 2, 3).zero_()
    return x


def _rows_of(make):
    def made():
        a = make()
        return (a, a[::2])

    return made


CASES = [
    (add_through_unfold_of_strided_rows, _rows_of(lambda: torch.randn(5, 5))),
    (clamp_into_unfold_of_moved_dims, lambda: (torch.randn(5, 5),)),
    (masked_fill_overlapping_unfold_of_columns, lambda: (torch.randn(3, 6),)),
    (zero_unfold_with_gaps_of_transposed, lambda: (torch.randn(4, 8),)),
]


@pytest.mark.parametrize("fn, make", CASES, ids=[f.__name__ for f, _ in CASES])
def test_a_write_through_unfold_of_a_non_contiguous_tensor_is_compiled(fn, make):
    jf = check(fn, *make(), calls=3)  # (fails on a FallbackWarning, a difference, a second compile)
    assert dealias.graph_breaks(jf) == []


def mul_through_unfold_of_transposed_with_grad(x):
    v = x.t().unfold(0, 2, 2)
    v.mul_(3)
    return x.sin(), v


def test_autograd_through_the_write_is_eagers():
    make = lambda: (torch.randn(4, 6, requires_grad=True) * 1,)
    jf = dealias.jit(mul_through_unfold_of_transposed_with_grad)
    assert grads_like_eager(mul_through_unfold_of_transposed_with_grad, jf, make, calls=2) == []
    assert dealias.cache_info(jf).misses == 1


@pytest.mark.inductor
def test_the_fused_executor_agrees():
    check(add_through_unfold_of_strided_rows, *_rows_of(lambda: torch.randn(5, 5))(), executor="inductor")
