"""Candidates measured on the user's calls take turns of tiers.TURN_CALLS calls in a row, the first
tiers.SWITCH_CALLS of each untimed (frontend/tiers.Tiered._turn): a tier's first calls after another tier ran are
slow (its buffers and kernels out of cache), the fused one's most, and tiers taking turns call by call ranked a
conv+BN+ReLU training step's fused program behind the torch executor where, run in a row, it is ahead. Timing is
faked: each tier's call takes its steady time, more in the first calls after a switch; every call is compared with
eager."""

from __future__ import annotations

import itertools

import pytest
import torch
from harness import compare_call
from test_copytiers import fused_is_torch
from test_defaultgap2 import model_and_reference

import dealias
from dealias.frontend import tiers


def switch_costs(monkeypatch, steady: dict[str, float], after_switch: dict[str, list[float]], now=None) -> list[str]:
    """`tiers.measure` says a call on tier t took steady[t], or after_switch[t][k] in the k-th call after another
    tier's call (k from 0). Returns the tiers run, in order."""
    ran: list[str] = []
    monkeypatch.setattr(tiers, "BACKGROUND", False)
    now = [0.0] if now is None else now
    monkeypatch.setattr(tiers, "clock", lambda: now[0])

    def measure(tier, run, leaves):
        if getattr(run, "backward", False):  # (a run on copies' backward, timed apart: none)
            return run(leaves), 0.0
        in_row = next((k for k, t in enumerate(reversed(ran)) if t != tier), len(ran))
        ran.append(tier)
        costs = after_switch.get(tier, [])
        return run(leaves), costs[in_row] if in_row < len(costs) else steady[tier]

    monkeypatch.setattr(tiers, "measure", measure)
    return ran


def add_rows(buf, row):
    buf[3].add_(row)
    return buf.sum(1)


# dynamo's graph the faster in a row (20 us against 22); its first two calls after a switch 40 and 30 us, the torch
# executor's 24 and 23: call by call, the graph tier's every call is its first after a switch, 40 us against 24
STEADY = {"graph": 2.0e-5, "torch": 2.2e-5}
AFTER_SWITCH = {"graph": [4.0e-5, 3.0e-5], "torch": [2.4e-5, 2.3e-5]}


def test_tiers_taking_turns_choose_the_fastest_in_a_row(monkeypatch):
    ran = switch_costs(monkeypatch, STEADY, AFTER_SWITCH)
    jf = dealias.jit(add_rows, executor="exact")
    for call in range(60):
        assert compare_call(add_rows, jf, (torch.randn(8, 4), torch.randn(4))) is None, call
    info = dealias.cache_info(jf)
    assert info.tiers == ("graph",), (info, ran)
    assert info.timings[0]["graph"] == STEADY["graph"], info  # (no sample from a turn's first calls)
    # turns of TURN_CALLS in a row (the last one cut where the choice was made)
    runs = [len(list(calls)) for _, calls in itertools.groupby(ran)]
    assert all(n == tiers.TURN_CALLS for n in runs[:-1]), ran


def test_call_by_call_the_same_costs_choose_the_slower(monkeypatch):
    # the test above's costs with turns of one call, every call after a tier's first timed (the rule before turns):
    # the wrong tier, which is why turns are there (this test fails if the fake stops making switches costly)
    monkeypatch.setattr(tiers, "TURN_CALLS", 1)
    monkeypatch.setattr(tiers, "SWITCH_CALLS", 0)
    switch_costs(monkeypatch, STEADY, AFTER_SWITCH)
    jf = dealias.jit(add_rows, executor="exact")
    for call in range(60):
        assert compare_call(add_rows, jf, (torch.randn(8, 4), torch.randn(4))) is None, call
    assert dealias.cache_info(jf).tiers == ("torch",)


@pytest.mark.parametrize("turns, chosen", [(True, "fused"), (False, "torch")])
def test_a_training_step_measured_on_the_users_calls_takes_turns(monkeypatch, turns, chosen):
    # a training step, each call timed up to the next (its backward there): the fused tier the fastest in a row (18
    # us against 20), 23 and 22 us in its first calls after a switch; on copies (taking turns run by run) within
    # COPIES_CLOSE of the torch executor: measured on the user's calls, in turns the fused tier wins; call by call
    # (without turns) the torch executor would
    if not turns:
        monkeypatch.setattr(tiers, "TURN_CALLS", 1)
        monkeypatch.setattr(tiers, "SWITCH_CALLS", 0)
    monkeypatch.setattr(tiers, "FUSE_FIRST", True)
    steady = {"torch": 2.0e-5, "graph": 2.1e-5, "fused": 1.8e-5}
    ran = switch_costs(monkeypatch, steady, {"fused": [2.3e-5, 2.2e-5]})
    fused_is_torch(monkeypatch)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    for call in range(80):
        x = torch.randn(4, 8)
        out, expected = jf(x), ref(x)
        assert torch.equal(out, expected), call
        out.sum().backward()
        expected.sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.equal(p.grad, q.grad), call
    info = dealias.cache_info(jf)
    assert info.tiers == (chosen,), (info, ran)
    assert "measured on the calls" in " ".join(info.tier_reasons), info


def test_an_adopted_fused_program_ends_the_turn_under_way(monkeypatch):
    # promoted at the third call, in the middle of the torch executor's first turn: that turn ends there, and the
    # tiers not yet warm (dynamo's graph, the fused program) take theirs
    monkeypatch.setattr(tiers, "FUSE_FIRST", False)
    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 3)
    ran = switch_costs(monkeypatch, {"torch": 2e-5, "graph": 3e-5, "fused": 1e-5}, {})
    fused_is_torch(monkeypatch)
    jf = dealias.jit(add_rows)
    for call in range(40):
        assert compare_call(add_rows, jf, (torch.randn(8, 4), torch.randn(4))) is None, call
    assert ran[:2] == ["torch", "torch"] and ran[2] != "torch", ran
    assert "fused" in ran[2 : 2 + 2 * tiers.TURN_CALLS], ran
    assert dealias.cache_info(jf).tiers == ("fused",)
