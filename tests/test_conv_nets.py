"""Convolution nets on the fused executor (runtime/conv_layout.py, fused_autograd.py): the convolutions' layout is
the one measured faster here (training graphs too), a training graph saves no boolean masks for backward, and
outputs, BatchNorm's running statistics and gradients match eager's. Small nets: each compile costs seconds."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from harness import fused_eval_like_eager

import dealias
from dealias.runtime import conv_layout

pytestmark = pytest.mark.inductor

CLOSE = dict(rtol=1e-4, atol=1e-4)


class Block(nn.Module):
    """A resnet BasicBlock in small: conv, BatchNorm, ReLU(inplace), a residual add, maxpool, avgpool, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)  # (a mobilenet's depthwise convolution, ReLU6)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.pool(self.relu(self.bn1(self.stem(x))))
        out = self.bn2(self.conv(x))
        out += x
        out = F.relu6(self.dw(self.relu(out)))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


@pytest.fixture
def layouts_measured(monkeypatch, verdict_store):
    """The layout measured, with channels-last `slower` times eager's layout (and the sizes each was asked for),
    its weights' conversions taking no time."""
    monkeypatch.setenv("DEALIAS_CONV_LAYOUT", "measure")
    asked = []

    def measure(slower):
        def fake(x, w, bias, rest):
            asked.append((tuple(x.shape), tuple(w.shape)))
            return 1.0, slower

        monkeypatch.setattr(conv_layout, "measure", fake)
        monkeypatch.setattr(conv_layout, "measure_conversion", lambda weights, inductor: (0.0, 0.0))

    return measure, asked


@pytest.mark.parametrize("slower", [2.0, 0.5])
def test_eval_takes_the_layout_measured_faster(layouts_measured, slower):
    measure, asked = layouts_measured
    measure(slower)
    torch.manual_seed(0)
    jf = fused_eval_like_eager(Block().eval(), torch.randn(2, 3, 8, 8))
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert jf.last.run_graph.graph.meta["channels_last"] is (slower < 1.0)
    assert ((2, 3, 8, 8), (8, 3, 3, 3)) in asked and len(asked) == 3  # each convolution, at its own sizes


@pytest.mark.parametrize("name", ["block", "conv_bn_relu"])
def test_training_matches_eager_and_saves_no_masks(layouts_measured, name):
    layouts_measured[0](0.5)  # (channels-last measured faster: a training graph takes it too)
    torch.manual_seed(0)
    if name == "block":
        net, x = Block().train(), torch.randn(4, 3, 8, 8)
    else:  # (its ReLU's result is the graph's: min-cut saved `out <= 0` as bools for the backward)
        net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True)).train()
        x = torch.randn(4, 3, 8, 8)
    twin = copy.deepcopy(net)
    jf = dealias.jit(twin, executor="inductor")
    saved = []

    def pack(t):
        saved.append(t.dtype)
        return t

    def loss_of(out):
        return (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum()

    for _ in range(2):
        loss = loss_of(net(x))
        loss.backward()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            got = loss_of(jf(x))
        got.backward()
        torch.testing.assert_close(got, loss, **CLOSE)
        for (name, a), b in zip(twin.named_parameters(), net.parameters()):
            torch.testing.assert_close(a.grad, b.grad, **CLOSE, msg=name)
        for a, b in zip(twin.buffers(), net.buffers()):  # running statistics, batches tracked
            torch.testing.assert_close(a, b, **CLOSE)
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert jf.last.run_graph.graph.meta["channels_last"] is True  # (measured, as for eval)
    # ReLU's backward mask is computed in the backward from the saved result, not stored as bools by the forward
    # (inductor's CPU bool stores are slow).
    assert saved and torch.bool not in saved, saved


def inverted_residual_head():
    """A mobilenet's expansion and depthwise convolutions, each BatchNorm then ReLU6 (inplace)."""
    return nn.Sequential(
        nn.Conv2d(4, 8, 1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU6(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU6(inplace=True),
    ).train()


def _run_saving(fn, x):
    """fn(x), and the tensors its forward saves for backward."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        return fn(x), saved


def test_training_forward_saves_copies_of_biases_not_results_before_relu6():
    # Min-cut saves each BatchNorm's bias (the ReLU6 backward recomputes the normalized result from it) where the
    # default partition saved that result, a store the fused BatchNorm + ReLU6 kernel otherwise skips (a
    # mobilenet-like training forward: 0.63x eager so, 0.58x with min-cut's, torch.compile's 0.55x). Eager's
    # backward saves no bias: the forward saves copies, so a write of a bias before backward goes on as in eager.
    torch.manual_seed(0)
    net, x = inverted_residual_head(), torch.randn(2, 4, 8, 8)
    twin = copy.deepcopy(net)
    jf = dealias.jit(twin, executor="inductor")
    activations = []  # (per model: how many tensors of the activations' size its forward saves)
    for _ in range(2):  # (the second call's: the first runs the compiled function more than once)
        activations = []
        for model, fn in ((net, net), (twin, jf)):
            out, saved = _run_saving(fn, x)
            activations.append(sum(t.numel() == out.numel() for t in saved))
            with torch.no_grad():
                model[1].bias.add_(1.0)  # (an optimizer's step before backward)
            (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        for (name, a), b in zip(twin.named_parameters(), net.parameters()):
            torch.testing.assert_close(a.grad, b.grad, **CLOSE, msg=name)
    assert dealias.cache_info(jf).tiers == ("fused",)
    eager, fused = activations
    assert fused < eager, activations  # (the default partition saved as many as eager's: the results before ReLU6)


def test_training_forward_copies_biases_in_its_kernels():
    # The copies of the biases min-cut saves are made by inductor's generated code, fused into a kernel the forward
    # runs anyway, not by one ATen clone per bias called from its Python wrapper (a mobilenet-like training forward
    # ran 16 of them a call, ~3 us each). Still copies: a bias written before backward leaves them as they were.
    torch.manual_seed(0)
    net, x = inverted_residual_head(), torch.randn(2, 4, 8, 8)
    twin = copy.deepcopy(net)
    jf = dealias.jit(twin, executor="inductor")
    jf(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out, saved = _run_saving(jf, x)
    ran = {e.name for e in prof.events()}
    assert "aten::clone" not in ran and "aten::copy_" not in ran, sorted(n for n in ran if n.startswith("aten::"))
    biases = [twin[1].bias, twin[4].bias]
    for b in biases:  # (saved as a tensor of its own with the bias's values, not the bias's memory)
        copies = [t for t in saved if t.shape == b.shape and torch.equal(t, b)]
        assert copies and all(t.untyped_storage().data_ptr() != b.untyped_storage().data_ptr() for t in copies)
    expected = net(x)
    with torch.no_grad():
        for b, b_eager in zip(biases, [net[1].bias, net[4].bias]):
            b.add_(1.0)  # (an optimizer's step before backward)
            b_eager.add_(1.0)
    weights = torch.linspace(-1, 1, out.numel()).view(out.shape)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    torch.testing.assert_close(out, expected, **CLOSE)
    for (name, a), b in zip(twin.named_parameters(), net.parameters()):
        torch.testing.assert_close(a.grad, b.grad, **CLOSE, msg=name)
    assert dealias.cache_info(jf).tiers == ("fused",)
