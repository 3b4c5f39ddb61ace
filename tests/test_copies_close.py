"""A call recording autograd is timed on copies with its backward in the first call (frontend/copies.py), and on the
user's calls up to the next call, with whatever the user runs between (a backward or none): two measures that are no
measure together. Tiers close on copies are timed on the user's calls alone (tiers.Tiered._measure_on_copies): mixed,
the copies' runs (a forward and a backward, nothing else) were the fastest calls of every close tier, so they chose
(bench/real.py's MultiheadAttention forward with grad, never backpropagated, settled on the torch executor at 1.11x
eager beside the fused program's 1.00x). Timing is faked; the "fused" program is the torch executor's, so every
call is compared with eager bit for bit."""

from __future__ import annotations

import copy

import torch
from test_copytiers import fake_fused
from torch import nn

import dealias
from dealias.frontend import backward_seen, tiers
from dealias.frontend import copies as copies_module


def test_close_tiers_of_a_call_recording_autograd_are_chosen_by_the_users_calls_alone(monkeypatch):
    on_copies = [True]
    real = copies_module.run_on_copies

    def run_on_copies(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        finally:
            on_copies[0] = False

    monkeypatch.setattr(copies_module, "run_on_copies", run_on_copies)
    # (where a hook on the first call's outputs can be set, the copies' measures choose, frontend/backward_seen.py,
    # tests/test_defaultgap3.py; the user's calls choose where none can: compiled autograd, no grad_fn)
    monkeypatch.setattr(backward_seen, "watch", lambda *args: (None, "no output with a grad_fn"))
    # On copies (forward and backward): torch 1.00 ms, fused 1.03 ms (close), graph 5 ms (not). On the user's calls
    # (up to the next call): fused 1.5 ms, torch 2 ms.
    seconds = {"torch": (1.0e-3, 2.0e-3), "fused": (1.03e-3, 1.5e-3), "graph": (5e-3, 5e-3)}
    ran = fake_fused(monkeypatch, torch=0.0, fused=0.0, graph=0.0)
    measure = tiers.measure

    def timed(tier, run, leaves):
        out, _ = measure(tier, run, leaves)
        return out, seconds[tier][0 if on_copies[0] else 1]

    monkeypatch.setattr(tiers, "measure", timed)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    model = copy.deepcopy(ref)
    jf = dealias.jit(model)
    for call in range(40):
        x = torch.randn(4, 8)
        out, expected = jf(x), ref(x)
        assert torch.equal(out, expected), call
        out.sum().backward()
        expected.sum().backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), ref.parameters())), call
    info = dealias.cache_info(jf)
    assert info.tiers == ("fused",), info
    assert info.timings[0]["fused"] == 1.5e-3 and info.timings[0]["torch"] == 2.0e-3, info
    assert "graph" not in ran[ran.index("fused") + 40 :]  # (not close on copies: not run on the user's calls)
