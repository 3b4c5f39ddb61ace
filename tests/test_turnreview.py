"""Review of the turns on the user's calls (tiers.Tiered._turn) and of training steps measured there
(tiers.Tiered._choose_trained): timing faked as in test_turns.py; results compared with eager."""

from __future__ import annotations

import threading

import pytest
import torch
from harness import compare_call
from test_backward_callback import checkpointed_steps
from test_copytiers import fused_is_torch
from test_defaultgap2 import model_and_reference
from test_turns import add_rows, switch_costs

import dealias
from dealias.frontend import tiers


@pytest.mark.inductor
def test_a_checkpoint_recomputation_while_measured_on_the_calls_runs_its_forwards_tier(monkeypatch):
    # A training step measured on the user's calls (its tiers within CLEAR_LOSS on copies), its forward under a
    # non-reentrant checkpoint: the recomputation, a call inside the user's backward, ended the forward's timed call,
    # whose sample completed the measurement there, and ran the tier chosen (the torch executor), not its forward's
    # (fused): every gradient of that step silently wrong (call 60).

    monkeypatch.setattr(tiers, "FUSE_FIRST", True)
    # (dynamo's graph a clear loser on copies; the fused program, measured last, the slower)
    ran = switch_costs(monkeypatch, {"torch": 2.0e-5, "graph": 6e-5, "fused": 2.05e-5}, {})
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    checkpointed_steps(jf, model, ref, 70)
    info = dealias.cache_info(jf)
    assert "torch, fused measured on the calls" in " ".join(info.tier_reasons), info
    assert info.tiers == ("torch",), (info, ran)


def _calls_behind_a_narrower_guard(monkeypatch, after_switch, rejects):
    """120 calls of add_rows (no fused compile in the first; the fused program is the torch executor's, 18 us a call
    in a row against the torch executor's 20 and dynamo's graph's 22, `after_switch` as switch_costs takes it)
    behind a narrower shape guard that rejects its k-th check where `rejects(k)`, each compared with eager: the
    cache_info, the tiers run (an exact tier's run for a rejected call as "exact") and the guard's checks."""
    monkeypatch.setattr(tiers, "FUSE_FIRST", False)
    ran = switch_costs(monkeypatch, {"torch": 2.0e-5, "graph": 2.2e-5, "fused": 1.8e-5}, after_switch)
    checks = [0]

    class Guard:
        text = "narrower"

        def __call__(self, leaves):
            checks[0] += 1
            if rejects(checks[0]):
                ran.append("exact")  # (what ran instead, for switch_costs' count of calls in a row)
                return False
            return True

    fused_is_torch(monkeypatch, Guard())
    jf = dealias.jit(add_rows)
    for call in range(120):
        assert compare_call(add_rows, jf, (torch.randn(8, 4), torch.randn(4))) is None, call
    return dealias.cache_info(jf), ran, checks[0]


def test_a_call_the_fused_guard_rejects_ends_the_fused_turn(monkeypatch):
    # The fused program's narrower shape guard rejecting a call of its turn ran the exact tier (untimed) and the turn
    # went on: the fused program's next calls, its first after a switch (cache-cold, 2.2x its steady call here), were
    # timed as the turn's third and fourth, and it lost clearly to the torch executor it beats by 10 % in a row.
    # (the guard rejects the fused program's second call of every four: tensors of another size, say)
    info, ran, _ = _calls_behind_a_narrower_guard(monkeypatch, {"fused": [4.0e-5, 4.0e-5]}, lambda k: k % 4 == 2)
    assert info.tiers == ("fused",), (info, ran)
    assert info.timings[0]["fused"] == 1.8e-5, info  # (no sample from a call right after a switch)


def test_training_steps_in_two_threads_are_each_timed_up_to_their_threads_next_call(monkeypatch):
    # Two threads' training steps through one program, calls alternating. A call was timed up to the program's next
    # call, whichever thread made it, on the CPU clock of the thread (tiers.clock): one thread's clock read against
    # the other's. Every sample came out as the forward alone (the torch executor's step "20 us") or a second more
    # (the fused one's "0.5 s", a clear loser): the choice by chance, and cache_info's timings wrong.
    monkeypatch.setattr(tiers, "FUSE_FIRST", True)
    forward = {"torch": 2.0e-5, "graph": 6e-5, "fused": 1.5e-5}
    backward = {"torch": 1.0e-5, "graph": 1.0e-5, "fused": 3.0e-5}  # (a step: torch 30 us, fused 45 us)
    ran = switch_costs(monkeypatch, forward, {})
    thread_clock: dict[int, float] = {}
    monkeypatch.setattr(tiers, "clock", lambda: thread_clock[threading.get_ident()])
    timed = tiers.measure

    def measure(tier, run, leaves):  # (each call's time on its thread's clock)
        out, seconds = timed(tier, run, leaves)
        thread_clock[threading.get_ident()] += seconds
        return out, seconds

    monkeypatch.setattr(tiers, "measure", measure)
    fused_is_torch(monkeypatch)

    def loss(w, x):
        return (x @ w).tanh().sum()

    jf = dealias.jit(loss)
    turn = threading.Condition()
    state = {"next": 0, "failed": None}

    def steps(me: int, start: float) -> None:
        thread_clock[threading.get_ident()] = start  # (the other thread's CPU clock a second ahead)
        w, x = torch.randn(8, 4), torch.randn(16, 8)
        for call in range(60):
            with turn:
                turn.wait_for(lambda: state["next"] == me)
                try:
                    a, b = w.clone().requires_grad_(), w.clone().requires_grad_()
                    out, expected = jf(a, x), loss(b, x)
                    tier = ran[-1]
                    out.backward()
                    expected.backward()
                    thread_clock[threading.get_ident()] += backward[tier]
                    assert torch.equal(out, expected) and torch.equal(a.grad, b.grad), call
                except BaseException as e:  # noqa: BLE001 - (reported by the test's thread)
                    state["failed"] = state["failed"] or e
                state["next"] = 1 - me
                turn.notify_all()

    threads = [threading.Thread(target=steps, args=(me, float(me))) for me in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state["failed"] is None, state["failed"]
    info = dealias.cache_info(jf)
    assert info.tiers == ("torch",), (info, ran)
    assert info.timings[0]["torch"] == pytest.approx(3.0e-5) and info.timings[0]["fused"] == pytest.approx(4.5e-5), info
    assert "torch, fused measured on the calls" in " ".join(info.tier_reasons), info


def test_a_program_called_only_in_backward_hooks_is_measured(monkeypatch):
    # A call inside a backward runs the tier of the call before it, unmeasured, only where it records autograd (a
    # checkpoint's recomputation): a program called only in a gradient hook (no autograd recorded there, a program of
    # its own: dynamo guards on grad mode) is measured and settles as any other.
    monkeypatch.setattr(tiers, "FUSE_FIRST", False)
    switch_costs(monkeypatch, {"torch": 2.0e-5, "graph": 2.4e-5, "fused": 1.5e-5}, {})
    fused_is_torch(monkeypatch)

    def clip(g):
        return g.clamp(-0.5, 0.5) * 2

    jf = dealias.jit(clip)
    for call in range(80):
        w, x = torch.randn(8, 4), torch.randn(16, 8)
        grads = []
        for f in (jf, clip):
            a = w.clone().requires_grad_()
            a.register_hook(f)
            (x @ a).tanh().sum().backward()
            grads.append(a.grad)
        assert torch.equal(*grads), call
    info = dealias.cache_info(jf)
    assert info.tiers == ("fused",), info


def test_a_fused_program_whose_guard_rejects_every_call_is_dropped(monkeypatch):
    # The fused program's narrower shape guard rejected every call (the user's tensors all outside it): each call of
    # its turn ran the exact tier untimed and ended the turn, the fused program stayed the candidate measured least,
    # so every later call was its turn again and the program never settled (measured on, forever).
    info, ran, rejected = _calls_behind_a_narrower_guard(monkeypatch, {}, lambda k: True)
    assert info.tiers == ("torch",), (info, ran)
    assert "fused" not in ran, ran
    reasons = " ".join(info.tier_reasons)
    assert "measuring" not in reasons and "shape guard rejected" in reasons, info
    assert rejected == tiers.REJECTED_CALLS, rejected  # (then no more tries of the fused program)
