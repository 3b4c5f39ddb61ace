"""A training BatchNorm on the torch executor runs eager's own ops on the caller's buffers (issue 38's conv +
BatchNorm2d + ReLU(inplace)): `native_batch_norm` on the running statistics, `num_batches_tracked.add_(1)`, and
nothing after the graph (no copy back, no version counter set back). Each test compares with eager: outputs,
running statistics, num_batches_tracked, version counters, grad_fn names and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from harness import execution_ops, grad_fn_chain, no_fallback, same, same_state

import dealias


def _model(momentum: float | None = 0.1, affine: bool = True) -> nn.Module:
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(4, momentum=momentum, affine=affine)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), bn, nn.ReLU(inplace=True)).train()


def forward(m, x):
    return m(x)


def _call_source(jf) -> str:
    return str(dealias.last_traces(jf)[-1])


def _versions(m: nn.Module) -> list[int]:
    bn = m[1]
    return [bn.running_mean._version, bn.running_var._version, bn.num_batches_tracked._version]


@pytest.mark.parametrize("momentum,affine", [(0.1, True), (0.3, False)])
def test_training_batch_norm_runs_eagers_ops_on_the_caller_buffers(momentum, affine):
    """Forward and backward three times: everything as eager's, bit for bit, the running statistics updated by
    eager's `native_batch_norm` in place (eager's NativeBatchNormBackward0 recorded), num_batches_tracked by
    `add_`, and the generated call does nothing after the graph."""
    eager_m = _model(momentum, affine)
    jit_m = copy.deepcopy(eager_m)
    jf = dealias.jit(forward, executor="torch")
    torch.manual_seed(1)
    with no_fallback():
        for _ in range(3):
            x = torch.randn(2, 3, 6, 6)
            want, got = forward(eager_m, x), jf(jit_m, x.clone())
            same(got, want)
            same_state(eager_m, jit_m)
            assert _versions(jit_m) == _versions(eager_m)
            assert got._version == want._version
            assert (
                grad_fn_chain(got)
                == grad_fn_chain(want)
                == ["ReluBackward0", "NativeBatchNormBackward0", "ConvolutionBackward0"]
            )
            want.square().sum().backward()
            got.square().sum().backward()
            for (name, a), b in zip(eager_m.named_parameters(), jit_m.parameters()):
                same(b.grad, a.grad), name
    ops = execution_ops(jf)
    assert "native_batch_norm" in ops and "_native_batch_norm_legit" not in ops, ops
    assert "add_" in ops and "clone" not in ops and "copy_" not in ops, ops
    source = _call_source(jf)
    assert "set_version_counters" not in source and ".copy_(" not in source, source
    assert [r.mode for r in dealias.explain(jf)] == ["in place"] * 3  # (mean, var, num_batches_tracked)


def test_running_statistics_saved_by_autograd_as_eagers():
    """NativeBatchNormBackward0 saves the caller's running mean (eager's and the torch executor's): written after
    the forward, backward raises in both, and num_batches_tracked's counter moved once a call, as eager's."""
    for f in (forward, dealias.jit(forward, executor="torch")):
        m, x = _model(), torch.randn(2, 3, 6, 6)
        f(m, x)
        before = _versions(m)
        out = f(m, x)
        assert _versions(m) == [before[0], before[1], before[2] + 1]
        m[1].running_mean.zero_()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_num_batches_tracked_read_after_its_update_stays_exact():
    """The updated count read in the graph (an output computed from it), or returned itself: it is eager's."""

    def f(m, x):
        y = m(x)
        return y, m[1].num_batches_tracked * 2

    def g(m, x):
        m(x)
        return m[1].num_batches_tracked

    for fn in (f, g):
        eager_m = _model()
        jit_m = copy.deepcopy(eager_m)
        jf = dealias.jit(fn, executor="torch")
        x = torch.randn(2, 3, 6, 6)
        for _ in range(2):
            want, got = fn(eager_m, x), jf(jit_m, x.clone())
            same(got, want)
            same_state(eager_m, jit_m)
            assert _versions(jit_m) == _versions(eager_m)
        if fn is g:
            assert got is jit_m[1].num_batches_tracked


def test_buffer_written_with_a_grad_requiring_value_is_not_updated_in_place_blindly():
    """`buf.add_(w)` with w requiring grad: the value requires grad, so the buffer's write-back stays a copy after
    the graph (which gives it its history); values, counter and gradients as eager's."""

    def f(buf, w, x):
        buf.add_(w)
        return (x * buf).sum()

    w = torch.randn(3, requires_grad=True)
    eb, jb = torch.zeros(3), torch.zeros(3)
    jf = dealias.jit(f, executor="torch")
    want, got = f(eb, w, torch.ones(3)), jf(jb, w, torch.ones(3))
    same(got, want)
    same(jb, eb)
    assert jb.requires_grad == eb.requires_grad
    assert jb._version == eb._version
    want.backward()
    expected, w.grad = w.grad, None
    got.backward()
    same(w.grad, expected)
