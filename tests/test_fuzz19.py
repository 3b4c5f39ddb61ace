"""Findings of the nineteenth fuzzing session (seeds 1975000-2009999, the default path with FUSE_FIRST and the other
executors, both torches). Each against eager."""

from __future__ import annotations

import warnings

import pytest
import torch

import dealias


def made_then_transposed_under_no_grad(x0, x1):  # fuzz seed 1975263
    v = x1.sin()
    with torch.no_grad():
        v.t_()  # eager's v keeps SinBackward, made for the old layout: gradients reach it untransposed
    return (v,)


def _grads(fn):
    b0 = torch.randn(5, 5, generator=torch.Generator().manual_seed(1975263), requires_grad=True)
    a0 = b0 * 1
    (out,) = fn(a0, a0.t())
    out.backward(torch.arange(25.0).view(5, 5))
    return out.detach(), b0.grad


def _check(executor):
    out, grad = _grads(made_then_transposed_under_no_grad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got_out, got_grad = _grads(dealias.jit(made_then_transposed_under_no_grad, executor=executor))
    assert torch.equal(got_out, out)
    assert got_out.stride() == out.stride()
    assert torch.allclose(got_grad, grad)  # (before: the gradient transposed back, as if t_ had been recorded)
    assert any("layout change autograd did not record" in str(w.message) for w in caught)


def test_returned_after_an_unrecorded_layout_change_keeps_eagers_gradient():
    _check("torch")


@pytest.mark.inductor
def test_returned_after_an_unrecorded_layout_change_keeps_eagers_gradient_fused():
    _check("inductor")
