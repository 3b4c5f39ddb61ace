"""Review of the convbn merge (a training BatchNorm on the torch executor runs eager's ops on the caller's
buffers): programs where dealias's result differed from eager's. Each compares with eager on copies."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from harness import same

import dealias


def _backward_error(out: torch.Tensor) -> str | None:
    try:
        out.square().sum().backward()
    except RuntimeError as e:
        return str(e)
    return None


def _bn_then_zero(x, rm, rv):
    y = F.batch_norm(x, rm, rv, training=True)
    rm.zero_()
    return y


def _bn_then_add_no_grad(x, rm, rv):
    y = F.batch_norm(x, rm, rv, training=True)
    with torch.no_grad():
        rm.add_(1)
    return y


def _module_then_zero(m, x):
    y = m(x)
    with torch.no_grad():
        m.running_mean.zero_()
    return y


@pytest.mark.parametrize("fn", [_bn_then_zero, _bn_then_add_no_grad])
def test_running_stat_written_after_the_batch_norm_raises_at_backward_as_eager(fn):
    """NativeBatchNormBackward0 saves the running mean; the program then writes it: eager's backward raises
    "modified by an inplace operation". The functional batch norm's results went around the node raising it
    (a MUTABLE op's results were bound without it), and dealias's backward ran."""
    jf = dealias.jit(fn, executor="torch")
    for _ in range(2):
        x = torch.randn(4, 3, requires_grad=True)
        rm, rv = torch.rand(3), torch.rand(3) + 1
        jx, jrm, jrv = x.detach().clone().requires_grad_(), rm.clone(), rv.clone()
        want, got = fn(x, rm, rv), jf(jx, jrm, jrv)
        same(got, want)
        same(jrm, rm), same(jrv, rv)
        expected = _backward_error(want)
        assert expected is not None and "modified by an inplace operation" in expected
        assert _backward_error(got) == expected


def test_module_running_mean_zeroed_after_forward_raises_at_backward_as_eager():
    torch.manual_seed(0)
    eager_m = nn.BatchNorm2d(3).train()
    jit_m = copy.deepcopy(eager_m)
    jf = dealias.jit(_module_then_zero, executor="torch")
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    want, got = _module_then_zero(eager_m, x), jf(jit_m, x.detach().clone().requires_grad_())
    same(got, want)
    expected = _backward_error(want)
    assert expected is not None and _backward_error(got) == expected


def _bn(x, rm, rv):
    return F.batch_norm(x, rm, rv, training=True, momentum=0.2)


def _same_tensor():
    r = torch.ones(3)
    return r, r


def test_running_mean_is_running_var():
    """Eager's kernel updates the running mean, then the running variance from the memory it just wrote: the
    functional form computed both from the old values (a silent wrong running statistic). Now refused: the
    graph runs eagerly with a FallbackWarning, and the statistics are eager's."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 4)
    jf = dealias.jit(_bn, executor="torch")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dealias.FallbackWarning)
        for _ in range(2):
            (erm, erv), (jrm, jrv) = _same_tensor(), _same_tensor()
            want, got = _bn(x, erm, erv), jf(x, jrm, jrv)
            same(got, want)
            same(jrm, erm)
    assert any(issubclass(w.category, dealias.FallbackWarning) for w in caught)


def test_module_whose_running_var_is_its_running_mean():
    torch.manual_seed(0)
    eager_m = nn.BatchNorm2d(3).train()
    eager_m.running_var = eager_m.running_mean
    with torch.no_grad():
        eager_m.running_mean.fill_(1.0)
    jit_m = copy.deepcopy(eager_m)
    assert jit_m.running_var is jit_m.running_mean
    jf = dealias.jit(lambda m, x: m(x), executor="torch")
    x = torch.randn(2, 3, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dealias.FallbackWarning)
        for _ in range(2):
            same(jf(jit_m, x), eager_m(x))
            same(jit_m.running_mean, eager_m.running_mean)
            same(jit_m.num_batches_tracked, eager_m.num_batches_tracked)


def _train_step(m, x):
    return m(x)


@pytest.mark.parametrize("made_inside", [True, False])
def test_training_batch_norm_called_in_inference_mode(made_inside):
    """The generated call read the running statistics' version counters to set them back after the write-back:
    an inference tensor has none ("Inference tensors do not track version counter"), where eager's call ran.
    Buffers made outside inference mode keep their counters as eager's."""
    torch.manual_seed(0)
    jf = dealias.jit(_train_step, executor="torch")
    for _ in range(2):
        if made_inside:
            with torch.inference_mode():
                eager_m = nn.BatchNorm2d(3).train()
                jit_m = copy.deepcopy(eager_m)
        else:
            eager_m = nn.BatchNorm2d(3).train()
            jit_m = copy.deepcopy(eager_m)
        x = torch.randn(2, 3, 4, 4)
        with torch.inference_mode():
            want, got = _train_step(eager_m, x), jf(jit_m, x)
        same(got, want)
        for name, b in eager_m.named_buffers():
            jb = dict(jit_m.named_buffers())[name]
            same(jb, b)
            assert jb.is_inference() == b.is_inference()
            if not b.is_inference():
                assert jb._version == b._version, name
