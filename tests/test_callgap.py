"""The fused executor's call around inductor's code (issue 38, "fast by default"): generated with only the steps a
program has (runtime/fused.py `runner`), each step it leaves out implied by what every call
reaching the program was checked for. Each case compares with eager call after call."""

from __future__ import annotations

import pytest
import torch
from harness import like_eager_within_ulps

import dealias

pytestmark = pytest.mark.inductor


def _fused_runs(jf):
    """The fused program's call of each graph and layout compiled (a grad mode of its own: a graph of its own)."""
    programs = [e for g in jf.stats.graphs for bucket in g.cache.values() for *_, e, _ in bucket]
    assert programs and all(p.tier == "fused" for p in programs)
    return [p.run_graph for p in programs]


def test_no_input_requiring_grad_runs_without_switching_grad_off():
    """A program none of whose inputs requires grad (guarded) records nothing in either grad mode: its call does not
    switch grad mode off around inductor's, and its results are eager's in both modes."""

    def f(x, w):
        x.add_(1)
        return x @ w + 1

    jf = dealias.jit(f, executor="inductor")
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    for grad in (True, True, False, True):
        with torch.set_grad_enabled(grad):
            like_eager_within_ulps(f, jf, x, w)
    assert all("set_grad_enabled" not in run.source for run in _fused_runs(jf))


def test_input_requiring_grad_keeps_grad_off_around_the_kernels():
    """A graph that runs under no_grad inside on a weight requiring grad (a decode step's) is fused without autograd,
    and inductor calls ATen's mm on the weight with `out=`: with grad mode on, ATen refuses that ("don't support
    automatic differentiation"), and a kernel it falls back to without `out=` would record. The call switches grad
    off around inductor's call, and the result requires no grad, as eager's."""

    def f(x, w):
        with torch.no_grad():
            x.add_(1)
            return x @ w + 1

    jf = dealias.jit(f, executor="inductor")
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    for _ in range(3):
        like_eager_within_ulps(f, jf, x, w)
        out = jf(x, w)
        assert not out.requires_grad and out.grad_fn is None
    assert all("set_grad_enabled(False)" in run.source for run in _fused_runs(jf))


def test_fused_autograd_call_results_of_their_own_nodes():
    """MultiheadAttention's forward with grad: two results requiring grad, the attention weights given a backward
    node of their own by the call; a gradient into either alone reaches the inputs as eager's does (None
    for the output projection's parameters from the weights alone)."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def f(m, x):
        return m(x, x, x)

    jf = dealias.jit(f, executor="inductor")
    x = torch.randn(2, 3, 8)
    for _ in range(3):
        like_eager_within_ulps(f, jf, mha, x)
    params = list(mha.parameters())
    for which in (0, 1):
        out = jf(mha, x)[which]
        ref = f(mha, x)[which]
        got = torch.autograd.grad(out.sum(), params, allow_unused=True)
        want = torch.autograd.grad(ref.sum(), params, allow_unused=True)
        for g, e in zip(got, want):
            assert (g is None) == (e is None)
            if e is not None:
                torch.testing.assert_close(g, e)
