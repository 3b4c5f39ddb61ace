"""A call recording autograd, timed on copies in the first call with its backward: the tiers are chosen by what
the user runs. The runs on copies time each forward and its backward apart; a tier stays a candidate where it is
close to the best on either (frontend/choosing.drop_on_both), and the user's calls, each timed up to the next
(a backward there or none), choose between those left. (bench/real.py's resnet18 training forward, never
backpropagated, settled on the torch executor at 1.04x eager, where the fused forward runs 0.92x: on copies, the
fused backward made the fused tier the slower one.) Timing is faked: the "fused" program is the torch executor's,
so every call is compared with eager bit for bit."""

from __future__ import annotations

import copy

import torch
from test_copytiers import fake_fused, settled_on_copies
from torch import nn

import dealias
from dealias.frontend import copies, tiers

# seconds per run: the fused forward the fastest, its backward by far the slowest (forward and backward together:
# torch 4e-5, graph 5e-5, fused 11e-5)
FORWARD = {"torch": 3e-5, "graph": 4e-5, "fused": 1e-5}
BACKWARD = {"torch": 1e-5, "graph": 1e-5, "fused": 10e-5}


# The tier of each backward run on copies, in order (fake_forward_and_backward's).
BACKWARDS_ON_COPIES: list[str] = []


def fake_forward_and_backward(monkeypatch, forward=FORWARD, backward=BACKWARD):
    """fake_fused's timing, each backward of a run on copies taking `backward[tier]` more; the user's backward is
    added to the faked clock by the test. Returns the tiers run (their forwards; a run on copies "copies:<tier>")
    and the clock."""
    ran = fake_fused(monkeypatch, **forward)
    measure = tiers.measure
    now = [0.0]
    backwards = [0]  # (backwards run on copies: each run's count of them is what it adds)
    real_backward = copies._backward

    BACKWARDS_ON_COPIES.clear()

    def counted(*args):
        backwards[0] += 1
        BACKWARDS_ON_COPIES.append(ran[-1])  # (a run's backward follows its forward)
        return real_backward(*args)

    def timed(tier, run, leaves):
        before = backwards[0]
        if getattr(run, "backward", False):
            out, seconds = run(leaves), 0.0
        else:
            out, seconds = measure(tier, run, leaves)
        return out, seconds + backward[tier] * (backwards[0] - before)

    monkeypatch.setattr(copies, "_backward", counted)
    real_runs = copies.run_on_copies

    def on_copies(*args, **kwargs):  # (the runs on copies told apart from the user's calls: "copies:<tier>")
        start = len(ran)
        try:
            return real_runs(*args, **kwargs)
        finally:
            ran[start:] = [f"copies:{t}" for t in ran[start:]]

    monkeypatch.setattr(copies, "run_on_copies", on_copies)

    monkeypatch.setattr(tiers, "measure", timed)
    monkeypatch.setattr(tiers, "clock", lambda: now[0])
    return ran, now


def user_runs(ran: list[str]) -> list[str]:
    """The tiers of the user's calls among the runs of fake_forward_and_backward (not those on copies)."""
    return [t for t in ran if not t.startswith("copies:")]


def model_and_reference():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
    return copy.deepcopy(ref), ref


def test_a_training_forward_never_backpropagated_runs_the_tier_whose_forward_is_fastest(monkeypatch):
    ran, _ = fake_forward_and_backward(monkeypatch)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    for call in range(40):
        x = torch.randn(4, 8)
        out, expected = jf(x), ref(x)
        assert torch.equal(out, expected), call
        assert out.requires_grad and out.grad_fn is not None
    info = dealias.cache_info(jf)
    assert info.tiers == ("fused",), info
    on_copies = 3 * (tiers.SAMPLES + 1)  # (each tier's warm-up and timed runs)
    assert "graph" not in ran[on_copies:] and "torch" in ran[on_copies:]  # (graph: close on neither measure)


def test_a_training_step_keeps_the_tier_whose_forward_and_backward_is_fastest(monkeypatch):
    ran, now = fake_forward_and_backward(monkeypatch)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    for call in range(40):
        x = torch.randn(4, 8)
        out, expected = jf(x), ref(x)
        assert torch.equal(out, expected), call
        out.sum().backward()
        expected.sum().backward()
        now[0] += BACKWARD[user_runs(ran)[-1]]  # (the user's backward of the tier that ran the call)
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), ref.parameters())), call
    info = dealias.cache_info(jf)
    assert info.tiers == ("torch",), info
    assert info.timings[0]["torch"] < info.timings[0]["fused"], info


def test_tiers_agreeing_on_both_measures_are_chosen_on_copies(monkeypatch):
    # the fused tier the fastest forward and the fastest forward and backward: chosen in the first call, as before
    fake_forward_and_backward(monkeypatch, backward={"torch": 1e-5, "graph": 1e-5, "fused": 1e-5})
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    for call in range(5):
        x = torch.randn(4, 8)
        out, expected = jf(x), ref(x)
        assert torch.equal(out, expected), call
    assert dealias.cache_info(jf).tiers == ("fused",)
    settled_on_copies(jf)
