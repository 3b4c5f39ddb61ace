"""Results of one fused graph that eager's graph keeps apart, each backpropagated on its own: two networks' losses
from one compiled function, each network's optimizer stepping after its own backward (double_backward.separate_parts,
TwiceDifferentiable). Eager's graph has a node per op, and the two losses share none; the fused graph had one
backward node for both, so the second backward raised "Trying to backward through the graph a second time"
(executor="inductor", and the default wherever it chose the fused tier; torch.compile raises the same), and
re-running the compiled backward for the second loss read the first network's saved weights, written by its
optimizer step meanwhile. The second part's backward now recomputes that part with eager's ops."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.fx as fx
from torch import nn

import dealias
from dealias.runtime.double_backward import separate_parts


def _net(width: int, out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, out))


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.g, self.d = _net(16, 16), _net(16, 1)

    def forward(self, x, z):
        return self.d(x).pow(2).mean(), self.g(z).tanh().pow(2).mean()


def _steps(compile_, order="dg", retain=False, step=True, calls=3):
    """Each call's two losses backpropagated one after the other (`order`: d's first or g's), the first with
    `retain`, the network just backpropagated stepped by its own SGD in between (`step`). Returns each call's
    gradients (None kept as None) and the parameters at the end."""
    torch.manual_seed(0)
    pair = Pair()
    fn = compile_(pair)
    opts = {k: torch.optim.SGD(getattr(pair, k).parameters(), lr=0.1) for k in "dg"}
    grads = []
    for _ in range(calls):
        x, z = torch.randn(8, 16), torch.randn(8, 16)
        losses = dict(zip("dg", fn(x, z)))
        for k, first in zip(order, (True, False)):
            losses[k].backward(retain_graph=retain and first)
            grads.append([None if p.grad is None else p.grad.clone() for p in pair.parameters()])
            if step:
                opts[k].step()
            opts[k].zero_grad()
    return grads, [p.detach().clone() for p in pair.parameters()]


def _fused(pair):
    return dealias.jit(pair, executor="inductor")


def _same(want, got):
    for a, b in zip(want, got):
        if isinstance(a, list):
            _same(a, b)
        else:
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.inductor
@pytest.mark.parametrize(
    "order, retain, step", [("dg", False, True), ("gd", False, True), ("dg", True, True), ("gd", False, False)]
)
def test_each_loss_backpropagated_on_its_own_as_eager(order, retain, step):
    want = _steps(lambda pair: pair, order, retain, step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _steps(_fused, order, retain, step)
    _same(want, got)


def _raises(compile_, action):
    torch.manual_seed(0)
    pair = Pair()
    fn = compile_(pair)
    loss_d, loss_g = fn(torch.randn(8, 16), torch.randn(8, 16))
    loss_g.backward()
    try:
        action(pair, loss_d, loss_g)
    except RuntimeError as e:
        return str(e)
    return None


def _both_raise(action, message):
    """`action` after the call's g loss backpropagated raises `message` in eager and on the fused executor."""
    want = _raises(lambda pair: pair, action)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _raises(_fused, action)
    assert want is not None and message in want
    assert got is not None and message in got


@pytest.mark.inductor
def test_a_part_backpropagated_twice_raises_as_eager():
    def again(pair, loss_d, loss_g):
        loss_d.backward()
        loss_g.backward()  # (its part's graph freed by its first backward)

    _both_raise(again, "second time")


@pytest.mark.inductor
def test_a_weight_the_other_part_saved_written_since_raises_as_eager():
    def written(pair, loss_d, loss_g):
        with torch.no_grad():
            pair.d[2].weight.mul_(2)  # (saved by eager's second Linear of d: its input's gradient needs it)
        loss_d.backward()

    _both_raise(written, "modified by an inplace operation")


@pytest.mark.inductor
def test_results_sharing_a_node_stay_one_part():
    """Two results of one hidden activation: eager's second backward raises (the activation's node freed its saved
    result), and so does the fused graph's one node."""

    def two_heads(x, w):
        h = torch.tanh(x @ w)
        return h.sin().sum(), h.cos().sum()

    def run(fn):
        torch.manual_seed(0)
        w = torch.randn(8, 8, requires_grad=True)
        a, b = fn(torch.randn(4, 8), w)
        a.backward()
        with pytest.raises(RuntimeError, match="second time"):
            b.backward()
        return w.grad

    want = run(two_heads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = run(dealias.jit(two_heads, executor="inductor"))
    torch.testing.assert_close(got, want)


def test_the_default_runs_each_loss_on_its_own_over_many_calls():
    """The default measures its tiers on the user's calls (the fused one included, wherever it is fast enough):
    none of its calls may raise, and every gradient is eager's (within the fused tolerance)."""
    want = _steps(lambda pair: pair, calls=24)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _steps(dealias.jit, calls=24)
    _same(want, got)


def _traced(fn) -> fx.GraphModule:
    return fx.symbolic_trace(fn)


def test_parts_are_results_sharing_no_computed_node():
    def apart(x, y, w):
        return (x * w).sum(), (y * w).sum(), (x + 1).sum()

    def shared(x, y, w):
        h = x * w
        return h.sin().sum(), (h + y).cos().sum()

    gm = _traced(apart)
    parts = separate_parts(gm, [0, 1, 2])
    assert parts is not None and len(set(parts.of.values())) == 3  # (reading one input w joins nothing)
    assert [parts.inputs[parts.of[i]] for i in range(3)] == [frozenset({0, 2}), frozenset({1, 2}), frozenset({0})]
    assert separate_parts(_traced(shared), [0, 1]) is None
    assert separate_parts(gm, [0]) is None  # (one result requiring grad: one part)


def attention_apart(x, w, v):
    y = x @ w
    return y.view(2, 2, 6).transpose(0, 1), (x @ v).softmax(-1).mean(0)


@pytest.mark.inductor
def test_parts_run_in_a_twice_differentiable_and_hooks_see_their_own_gradient():
    make = lambda: tuple(torch.randn(*s, requires_grad=True) for s in ((4, 3), (3, 6), (3, 6)))  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jf = dealias.jit(attention_apart, executor="inductor")
        view, mean = jf(*make())
    assert "fused with autograd" in str(dealias.last_traces(jf)[-1])
    under_views = view.grad_fn.next_functions[0][0].next_functions[0][0]  # (TransposeBackward0, ViewBackward0)
    assert type(under_views).__name__ == "TwiceDifferentiableBackward", type(under_views)
    for f in (attention_apart, jf):
        for into, hooked in ((0, 1), (1, 0)):
            inputs = make()
            outs, ran = f(*inputs), []
            outs[hooked].register_hook(ran.append)
            outs[into].sum().backward()
            assert not ran, f
            assert inputs[1 if into == 1 else 2].grad is None  # (the other part's weight: no gradient, as eager's)
