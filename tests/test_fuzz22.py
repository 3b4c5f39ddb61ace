"""Fuzz seed 2472399 (torch 2.14.1, `--autograd --executor inductor`, static and dynamic; 2026-12-07): a result the
fused executor returned without requires_grad where eager's requires it. The piece of the split graph before the
custom Function computes `x0 * 1` twice, with and without grad; inductor (2.14) drops both as no-ops and returns
the input itself as both results, and AOTAutograd marks the no-grad one non-differentiable by the tensor's
identity, which is the other one's too. The fused compile's run on copies now finds the result without history
and leaves that graph to the torch executor (runtime/double_backward.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import AddsItsInput

import dealias


def program(x0):
    with torch.no_grad():
        v1 = x0 * 1
    v2 = AddsItsInput.apply(x0 * 1)  # (the fuzzer's Scale)
    v1.narrow(2, 1, 1)  # (a view of the no-grad value after the custom Function: without it the result is eager's)
    return (v2 + 1,)


def _grads(fn):
    b0 = torch.randn(3, 4, 2, generator=torch.Generator().manual_seed(2472399), requires_grad=True)
    (out,) = fn(b0 * 1)
    requires_grad = out.requires_grad
    if requires_grad:
        out.sum().backward()
    return requires_grad, out.detach(), b0.grad


@pytest.mark.inductor
def test_result_after_a_custom_function_and_a_no_grad_view_requires_grad_as_eager():
    jf = _check_against_eager("inductor")
    if torch.__version__.startswith("2.14"):  # (2.13's inductor keeps the two products apart: fused, and exact)
        reasons = dealias.cache_info(jf).tier_reasons
        assert any("returns it without history" in r for r in reasons), reasons


def test_torch_executor_keeps_requires_grad():
    _check_against_eager("torch", rtol=0, atol=0)


def _check_against_eager(executor, **tolerance):
    want_rg, want, want_grad = _grads(program)
    jf = dealias.jit(program, executor=executor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got_rg, got, got_grad = _grads(jf)
    assert got_rg == want_rg
    torch.testing.assert_close(got, want, **tolerance)
    torch.testing.assert_close(got_grad, want_grad, **tolerance)
    return jf
