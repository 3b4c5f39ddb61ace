"""The convolution layout's verdict (runtime/conv_layout.py) counts the weights' conversions inductor runs for
channels-last, the gradients' too in a graph autograd records: with the same kernel timings a net goes channels-last
in eval and keeps eager's layout in training (resnet18's case: its 3x3 kernels faster channels-last, its weights'
conversions, twice per step, more than they save). Timings patched, so the verdicts are fixed; results against
eager's."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from harness import fused_eval_like_eager

import dealias
from dealias.runtime import conv_layout

pytestmark = pytest.mark.inductor

CLOSE = dict(rtol=1e-4, atol=1e-4)


def net():
    """Two 3x3 convolutions (weights channels-last reorders), a depthwise one and a 1x1 one (whose memory order it
    keeps: nothing to convert), BatchNorm, ReLU."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.Conv2d(8, 8, 3, padding=1, groups=8),
        nn.Conv2d(8, 4, 1),
        nn.ReLU(),
    )


BATCH = (2, 3, 8, 8)  # the input batch, converted too


def priced(weight: float, batch: float):
    """A measure_conversion whose ATen copy takes `weight` s a weight, `batch` s the batch, inductor's 4/3 of it;
    and the list of what it was asked for."""
    asked = []

    def conversion(tensors, inductor):
        asked.append((inductor, sorted(tuple(t.shape) for t in tensors)))
        aten = sum(batch if tuple(t.shape) == BATCH else weight for t in tensors)
        return aten, aten * 4 / 3 if inductor else aten

    return conversion, asked


@pytest.fixture
def timings(monkeypatch, verdict_store):
    """Each convolution's kernel 1.0 s in eager's layout and 0.75 s channels-last (1.0 saved over the four), each
    weight's conversion 0.3 s by ATen's copy and 0.4 s by inductor's, the batch's 0.03 s and 0.04 s; what the
    conversions were asked for."""
    monkeypatch.setenv("DEALIAS_CONV_LAYOUT", "measure")
    monkeypatch.setattr(conv_layout, "measure", lambda x, w, bias, rest: (1.0, 0.75))
    conversion, asked = priced(0.3, 0.03)
    monkeypatch.setattr(conv_layout, "measure_conversion", conversion)
    return asked


def test_eval_counts_the_weights_conversions_once(timings):
    # Two weights and the batch to convert: 0.63 s by ATen's copy, within SLACK of the 1.0 saved: inductor's own
    # conversion is measured (0.84 s), and still less than what channels-last saves.
    torch.manual_seed(0)
    jf = fused_eval_like_eager(net().eval(), torch.randn(BATCH))
    assert jf.last.run_graph.graph.meta["channels_last"] is True
    converted = sorted([BATCH, (8, 3, 3, 3), (8, 8, 3, 3)])  # (not the depthwise nor the 1x1 one's weight)
    assert timings == [(False, converted), (True, converted)]


def test_training_counts_the_gradients_conversions_too(timings):
    # The same kernels, but each weight's gradient is converted back as well: four conversions and the batch's
    # (which requires no grad: once), 1.23 s by ATen's copy, more than the 1.0 saved: eager's layout, without
    # compiling inductor's conversion.
    torch.manual_seed(0)
    model, x = net().train(), torch.randn(BATCH)
    twin = copy.deepcopy(model)
    jf = dealias.jit(twin, executor="inductor")
    for _ in range(2):
        loss = model(x).square().sum()
        loss.backward()
        got = jf(x).square().sum()
        got.backward()
        torch.testing.assert_close(got, loss, **CLOSE)
        for (name, a), b in zip(twin.named_parameters(), model.parameters()):
            torch.testing.assert_close(a.grad, b.grad, **CLOSE, msg=name)
        for a, b in zip(twin.buffers(), model.buffers()):
            torch.testing.assert_close(a, b, **CLOSE)
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert jf.last.run_graph.graph.meta["channels_last"] is False
    converted = sorted([BATCH, *[(8, 3, 3, 3), (8, 8, 3, 3)] * 2])
    assert timings == [(False, converted)]


def test_kernels_slower_channels_last_ask_no_conversion(timings, monkeypatch):
    monkeypatch.setattr(conv_layout, "measure", lambda x, w, bias, rest: (1.0, 1.25))
    torch.manual_seed(0)
    jf = fused_eval_like_eager(net().eval(), torch.randn(BATCH))
    assert jf.last.run_graph.graph.meta["channels_last"] is False
    assert timings == []


@pytest.mark.parametrize("grad", [False, True])
def test_the_input_batchs_conversion_counts(monkeypatch, verdict_store, grad):
    # The kernels save 0.4 s channels-last and the weights convert in 0.02 s, but the batch the graph takes as an
    # input is converted at every call too (conv + BatchNorm on an 8x3x32x32 batch: 4 us saved in the kernel, 8.5
    # us spent converting the batch): 0.5 s here, more than what channels-last saves: eager's layout. Its gradient
    # is converted back too where it requires grad.
    monkeypatch.setenv("DEALIAS_CONV_LAYOUT", "measure")
    monkeypatch.setattr(conv_layout, "measure", lambda x, w, bias, rest: (1.0, 0.9))
    conversion, asked = priced(0.01, 0.5)
    monkeypatch.setattr(conv_layout, "measure_conversion", conversion)
    torch.manual_seed(0)
    model, x = net().train(), torch.randn(BATCH, requires_grad=grad)
    twin, x2 = copy.deepcopy(model), x.detach().clone().requires_grad_(grad)
    jf = dealias.jit(twin, executor="inductor")
    loss = model(x).square().sum()
    loss.backward()
    got = jf(x2).square().sum()
    got.backward()
    torch.testing.assert_close(got, loss, **CLOSE)
    for (name, a), b in zip(twin.named_parameters(), model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, **CLOSE, msg=name)
    if grad:
        torch.testing.assert_close(x2.grad, x.grad, **CLOSE)
    assert jf.last.run_graph.graph.meta["channels_last"] is False
    weights = [(8, 3, 3, 3), (8, 8, 3, 3)] * 2
    assert asked == [(False, sorted([*[BATCH] * (1 + grad), *weights]))]


@pytest.mark.parametrize("layout, faster", [("channels_last", True), ("channels_last", False), ("contiguous", True)])
def test_one_by_one_convolutions_as_products_where_measured_faster(monkeypatch, verdict_store, layout, faster):
    # Channels-last, a 1x1 convolution is one matrix product of the activations' rows by the weight: taken where
    # its measured time is less than ATen's convolution's (patched here), and only channels-last (in eager's layout
    # the rows would be a copy); the 3x3 and depthwise convolutions stay convolutions.
    monkeypatch.setenv("DEALIAS_CONV_LAYOUT", layout)
    asked = []

    def timing(x, w, bias):
        asked.append(tuple(w.shape))
        return (1.0, 0.5) if faster else (0.5, 1.0)

    monkeypatch.setattr(conv_layout, "measure_matmul", timing)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    jf = fused_eval_like_eager(net().eval(), x)
    assert asked == ([(4, 8, 1, 1)] if layout == "channels_last" else [])
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        jf(x)
    ran = [e.name for e in prof.events()]
    products = layout == "channels_last" and faster
    assert ("aten::addmm" in ran) is products, ran  # (the 1x1 convolution has a bias)
    assert ran.count("aten::convolution") == (3 if products else 4), ran


def test_training_forward_with_products_gives_eager_gradients(monkeypatch, verdict_store):
    # The same products in a graph autograd records: its forward computes the 1x1 convolution by addmm, its backward
    # (convolution_backward, unchanged) gives eager's gradients and BatchNorm's statistics.
    monkeypatch.setenv("DEALIAS_CONV_LAYOUT", "channels_last")
    monkeypatch.setattr(conv_layout, "measure_matmul", lambda x, w, bias: (1.0, 0.5))
    torch.manual_seed(0)
    model, x = net().train(), torch.randn(2, 3, 8, 8)
    twin = copy.deepcopy(model)
    jf = dealias.jit(twin, executor="inductor")
    for _ in range(2):
        loss = model(x).square().sum()
        loss.backward()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = jf(x).square().sum()
        got.backward()
        torch.testing.assert_close(got, loss, **CLOSE)
        for (name, a), b in zip(twin.named_parameters(), model.parameters()):
            torch.testing.assert_close(a.grad, b.grad, **CLOSE, msg=name)
        for a, b in zip(twin.buffers(), model.buffers()):
            torch.testing.assert_close(a, b, **CLOSE)
    assert "aten::addmm" in [e.name for e in prof.events()]
    assert dealias.cache_info(jf).tiers == ("fused",)
