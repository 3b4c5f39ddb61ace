"""Review of defaultgap2/defaultgap3 (frontend/backward_seen.py, tiers.Tiered._choose_by_backward): cases where the
hooks on the first call's outputs do not tell what the user runs. Timing is faked as in test_defaultgap3 (the
"fused" program is the torch executor's), so every result is compared with eager bit for bit."""

from __future__ import annotations

import torch
from test_defaultgap2 import BACKWARD, fake_forward_and_backward
from test_defaultgap3 import ON_COPIES, reasons, watched

import dealias


def g(x, w):
    return (x @ w + 1).t()  # (the only output a view of an intermediate the user never sees)


def test_a_training_step_writing_into_a_view_output_is_seen_as_training(monkeypatch):
    # The user writes into the output (a view) before the backward: eager rebuilds the view's grad_fn, so the node
    # the first call's output had is no longer in the graph the backward runs; its base's node is.
    ran, now = fake_forward_and_backward(monkeypatch)
    watched(monkeypatch)
    jf = dealias.jit(g)
    torch.manual_seed(0)
    w0 = torch.randn(4, 5)
    for call in range(6):
        x = torch.randn(3, 4)
        w, we = w0.clone().requires_grad_(), w0.clone().requires_grad_()
        out, expected = jf(x, w), g(x, we)
        assert out._is_view() and torch.equal(out, expected)
        out.mul_(2)
        expected.mul_(2)
        out.sum().backward()
        expected.sum().backward()
        now[0] += BACKWARD[ran[-1]]
        assert torch.equal(w.grad, we.grad), call
    assert "chosen by forward and backward" in reasons(jf), reasons(jf)
    assert "fused" not in ran[ON_COPIES:], ran[ON_COPIES:]
