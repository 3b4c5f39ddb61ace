"""A call without autograd history is timed on copies of its tensors in the first call (frontend/copies.py), but on
fresh copies a short memory-bound program's order of tiers is not the user's calls' (a foreach EMA's step, 0.2 ms:
on copies 1.3-2.3x the user's calls, the graph tier ranked 7-15 % ahead of the fused one, which was 4-7 % the
faster on the user's tensors). So the copies decide alone only between tiers more than `tiers.COPIES_CLOSE` apart;
closer ones are measured afresh on the user's calls (tiers.Tiered._sift). Timing is faked; the "fused" program is the
torch executor's, so every call is compared with eager bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
from test_copytiers import fake_fused
from torch import nn

import dealias
from dealias.frontend import copies as copies_module
from dealias.frontend import tiers

# (the choice rules' calls counted call by call: conftest.calls_one_by_one)
pytestmark = pytest.mark.usefixtures("calls_one_by_one")


def ema(avg, params):
    torch._foreach_lerp_(avg, params, 0.001)


def make():
    torch.manual_seed(0)
    params = [torch.randn(16, 8), torch.randn(8), torch.randn(3, 8)]
    return [p + 0.1 * torch.randn_like(p) for p in params], params


def fake_times(monkeypatch, on_copies: dict[str, float], on_calls: dict[str, float]) -> list[str]:
    """Each run on copies of tier t takes on_copies[t] seconds, each of the user's calls on_calls[t]. Returns the tiers
    run, in order (runs on copies included)."""
    copying = [False]
    real = copies_module.run_on_copies

    def run_on_copies(*args, **kwargs):
        copying[0] = True
        try:
            return real(*args, **kwargs)
        finally:
            copying[0] = False

    monkeypatch.setattr(copies_module, "run_on_copies", run_on_copies)
    ran = fake_fused(monkeypatch, torch=0.0, graph=0.0, fused=0.0)
    measure = tiers.measure

    def timed(tier, run, leaves):
        out, _ = measure(tier, run, leaves)
        return out, (on_copies if copying[0] else on_calls)[tier]

    monkeypatch.setattr(tiers, "measure", timed)
    return ran


def calls_like_eager(jf, calls: int) -> None:
    avg, params = make()
    ref, ref_params = make()
    for call in range(calls):
        assert jf(avg, params) is None
        ema(ref, ref_params)
        assert all(torch.equal(a, b) for a, b in zip(avg, ref)), call


def test_tiers_close_on_copies_are_chosen_by_the_users_calls(monkeypatch):
    # on copies the graph tier looks 10 % faster; on the user's calls the fused program is the fastest
    on_copies = {"torch": 3.0e-4, "graph": 2.7e-4, "fused": 3.0e-4}
    on_calls = {"torch": 2.2e-4, "graph": 2.15e-4, "fused": 2.0e-4}
    ran = fake_times(monkeypatch, on_copies, on_calls)
    jf = dealias.jit(ema)
    calls_like_eager(jf, 60)
    info = dealias.cache_info(jf)
    assert info.tiers == ("fused",), info
    assert info.timings[0] == on_calls, info  # (the user's calls' times, none of the copies')
    assert "measured on the calls" in info.tier_reasons[0], info
    assert ran.count("graph") < 2 * (tiers.SAMPLES + 1) * tiers.CLOSE_ROUNDS  # (not close on the calls: dropped)


def test_a_tier_far_behind_on_copies_is_not_run_on_the_users_calls(monkeypatch):
    # torch 30 % behind the copies' best: dropped there; graph and fused within COPIES_CLOSE measured on the calls
    on_copies = {"torch": 3.9e-4, "graph": 3.0e-4, "fused": 3.1e-4}
    on_calls = {"torch": 1.0e-4, "graph": 2.1e-4, "fused": 2.0e-4}
    ran = fake_times(monkeypatch, on_copies, on_calls)
    jf = dealias.jit(ema)
    avg, params = make()
    jf(avg, params)
    first = len(ran)
    calls_like_eager(jf, 60)
    assert "torch" not in ran[first:]
    info = dealias.cache_info(jf)
    assert info.tiers == ("fused",) and info.timings[0]["torch"] == 3.9e-4, info


def test_tiers_far_apart_on_copies_are_settled_on_copies(monkeypatch):
    ran = fake_times(
        monkeypatch, {"torch": 3e-4, "graph": 4e-4, "fused": 1e-4}, {"torch": 0.0, "graph": 0.0, "fused": 0.0}
    )
    jf = dealias.jit(ema)
    calls_like_eager(jf, 1)
    first = len(ran)
    calls_like_eager(jf, 5)
    assert len(ran) == first  # (settled: nothing timed after the first call)
    info = dealias.cache_info(jf)
    assert info.tiers == ("fused",) and "on copies in the first call" in info.tier_reasons[0], info


@pytest.mark.parametrize("between", [0.0, 1e-3])
def test_a_forward_never_backpropagated_is_chosen_by_the_users_calls_where_close_on_copies(monkeypatch, between):
    # nn.MultiheadAttention's forward with grad, outputs dropped: on copies the fused forward 2 % ahead of dynamo's
    # graph, on the user's calls 20 % behind it; the torch executor far behind on copies (not run on the calls)
    on_copies = {"torch": 1.5e-4, "graph": 1.02e-4, "fused": 1.0e-4}
    on_calls = {"torch": 1.0e-5, "graph": 0.8e-4, "fused": 1.0e-4}
    ran = fake_times(monkeypatch, on_copies, on_calls)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
    model = copy.deepcopy(ref)
    now = [0.0]
    monkeypatch.setattr(tiers, "clock", lambda: now[0])  # (the user's code between calls: `between` seconds each)
    jf = dealias.jit(model)
    first = None
    for call in range(60):
        x = torch.randn(4, 8)
        out, expected = jf(x), ref(x)
        assert torch.equal(out, expected) and out.grad_fn is not None, call
        del out, expected  # (never backpropagated)
        now[0] += between  # (timed with the calls, it would be every tier's and no tier's: each call is timed alone)
        first = len(ran) if first is None else first
    assert "torch" not in ran[first:]
    info = dealias.cache_info(jf)
    assert info.tiers == ("graph",), info
    assert info.timings[0]["graph"] == 0.8e-4 and info.timings[0]["fused"] == 1.0e-4, info
    assert all(p.grad is None for p in model.parameters())
