"""Review of defaultgap2/defaultgap3 (frontend/backward_seen.py, tiers.Tiered._choose_by_backward): cases where the
hooks on the first call's outputs do not tell what the user runs. Timing is faked as in test_defaultgap3 (the
"fused" program is the torch executor's), so every result is compared with eager bit for bit."""

from __future__ import annotations

import torch
from test_defaultgap2 import BACKWARD, fake_forward_and_backward
from test_defaultgap3 import reasons, user_runs, watched

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
        now[0] += BACKWARD[user_runs(ran)[-1]]  # (the user's backward of the tier that ran the call)
        assert torch.equal(w.grad, we.grad), call
    assert "chosen by forward and backward" in reasons(jf), reasons(jf)
    assert "fused" not in user_runs(ran), ran


def test_an_output_viewing_an_input_hooks_no_node_of_the_users():
    from dealias.frontend import backward_seen

    u = torch.randn(3, 4, requires_grad=True)
    x = u * 2  # (the user's, its node theirs)
    v = x[0]
    w, why = backward_seen.watch([v.view(-1)], [x])
    assert w is not None and len(w.handles) == 1  # (the output's own node: not x's)
    w.remove()
    y = x + 1
    w, why = backward_seen.watch([y.t()], [x])
    assert w is not None and len(w.handles) == 2  # (the view's node and its base's, the call's intermediate)
    x.sum().backward(retain_graph=True)  # (a backward of the user's own, not through the outputs)
    assert not w.seen
    y.t().mul_(2).sum().backward()
    assert w.seen
    w.remove()
