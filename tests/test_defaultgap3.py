"""A call recording autograd whose runs on copies leave tiers that disagree (the fused forward the fastest, its
backward the slowest): hooks on the first call's outputs' autograd nodes (frontend/backward_seen.py) tell the next
call whether the user ran their backward, and the choice is made there from the copies' two measures
(frontend/by_backward.ByBackward._choose_by_backward; a training step's tiers close on copies measured on the
user's calls, `_choose_trained`). A training step must not run its calls on the tier whose backward is slow
(issue 38: no call after the first above eager x 1.10), a forward never backpropagated settles on the fastest
forward, and the hooks must be invisible (gradients, the user's own hooks, retain_graph, double backward) and gone
once the choice is made. Timing is faked (test_defaultgap2): the "fused" program is the torch executor's, so every
result is compared with eager bit for bit."""

from __future__ import annotations

import threading

import pytest
import torch
from test_defaultgap2 import BACKWARDS_ON_COPIES, fake_forward_and_backward, model_and_reference, user_runs
from torch import nn

import dealias
from dealias.frontend import backward_seen, by_backward, tiers


def watched(monkeypatch) -> list:
    """The hooks set (backward_seen.Watch), each with a copy of its handles taken when set."""
    made = []
    real = backward_seen.watch

    def watch(out, inputs=(), after=None):
        w, why = real(out, inputs, after)
        if w is not None:
            made.append((w, list(w.handles)))
        return w, why

    monkeypatch.setattr(backward_seen, "watch", watch)
    return made


def assert_removed(made) -> None:
    assert made
    for w, handles in made:
        assert w.handles == []
        for handle in handles:
            hooks = handle.hooks_dict_ref()
            assert hooks is None or handle.id not in hooks


def same_grads(model, ref) -> bool:
    return all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), ref.parameters()))


def training_steps(jf, model, ref, calls: int) -> None:
    """`calls` training steps of the jitted `model` and of eager's `ref` on the same inputs: outputs and gradients
    equal bit for bit at each."""
    for call in range(calls):
        x = torch.randn(4, 8)
        out, expected = jf(x), ref(x)
        assert torch.equal(out, expected), call
        out.sum().backward()
        expected.sum().backward()
        assert same_grads(model, ref), call


def accumulated_steps(jf, model, ref, steps: int = 3, forwards: int = 4) -> None:
    """`steps` steps of gradients accumulated over `forwards` forwards, then one backward, of the jitted `model` and
    of eager's `ref` on the same inputs: outputs equal at each forward, gradients at each step, bit for bit."""
    for step in range(steps):
        losses, expected = [], []
        for _ in range(forwards):
            x = torch.randn(4, 8)
            out, e = jf(x), ref(x)
            assert torch.equal(out, e)
            losses.append(out.sum())
            expected.append(e.sum())
        sum(losses).backward()
        sum(expected).backward()
        assert same_grads(model, ref), step


def reasons(jf) -> str:
    return " | ".join(dealias.cache_info(jf).tier_reasons)


def test_a_training_step_settles_at_the_end_of_its_first_backward_on_the_tier_fastest_on_both(monkeypatch):
    ran, _ = fake_forward_and_backward(monkeypatch)
    made = watched(monkeypatch)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    for call in range(12):
        x = torch.randn(4, 8)
        out, expected = jf(x), ref(x)
        assert torch.equal(out, expected), call
        if call == 0:
            assert not made[0][0].seen
            # (the first call's runs on copies time the fused forward alone: its backward, inductor's second
            # compile, waits for a backward of the user's)
            assert "fused" not in BACKWARDS_ON_COPIES and "torch" in BACKWARDS_ON_COPIES, BACKWARDS_ON_COPIES
        out.sum().backward()
        expected.sum().backward()
        assert same_grads(model, ref), call
        if call == 0:  # (at the end of the backward: each tier's forward and backward timed on copies, settled)
            assert "fused" in BACKWARDS_ON_COPIES, BACKWARDS_ON_COPIES
            assert dealias.cache_info(jf).tiers == ("torch",)
            assert "chosen by forward and backward" in reasons(jf)
            assert_removed(made)
    assert "fused" not in user_runs(ran), user_runs(ran)  # (no user call on the tier whose backward is slow)
    # (in the first call, then after its backward: a clear loss needs fewer runs there, the user's calls measure
    # the close ones; the exact tiers, warm from the first call, not warmed up again)
    assert ran.count("copies:fused") == tiers.SAMPLES + 1 + by_backward.FILTER_SAMPLES + 1, ran
    assert ran.count("copies:torch") == tiers.SAMPLES + 1 + by_backward.FILTER_SAMPLES, ran
    info = dealias.cache_info(jf)
    assert info.tiers == ("torch",), info
    assert "chosen by forward and backward" in reasons(jf)
    assert info.timings[0]["torch"] < info.timings[0]["fused"], info


def test_a_forward_never_backpropagated_settles_on_the_fastest_forward(monkeypatch):
    ran, _ = fake_forward_and_backward(monkeypatch)
    made = watched(monkeypatch)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    for call in range(12):
        x = torch.randn(4, 8)
        out, expected = jf(x), ref(x)
        assert torch.equal(out, expected), call
        assert out.requires_grad and out.grad_fn is not None
        if call == 2:  # (call 2 cannot tell yet: call 1's outputs alive; call 3 found them freed)
            assert dealias.cache_info(jf).tiers == ("fused",)
            assert_removed(made)
    assert user_runs(ran) == ["torch", "torch", "fused"], user_runs(ran)  # (then settled: no call measured)
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert "chosen by the forward alone" in reasons(jf)
    assert "fused" not in BACKWARDS_ON_COPIES, BACKWARDS_ON_COPIES  # (its backward never compiled nor run)
    assert all(p.grad is None for p in model.parameters())


def test_a_forward_whose_outputs_are_dropped_settles_at_the_second_call(monkeypatch):
    ran, _ = fake_forward_and_backward(monkeypatch)
    made = watched(monkeypatch)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    for call in range(6):
        x = torch.randn(4, 8)
        assert torch.equal(jf(x).argmax(1), ref(x).argmax(1)), call  # (the outputs freed at once)
    assert user_runs(ran) == ["torch", "fused"], user_runs(ran)  # (then settled: no call measured)
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert_removed(made)


def test_accumulated_gradients_end_on_the_tier_fastest_on_both(monkeypatch):
    # four forwards, then one backward: the calls before it run the tier fastest on both, not the fastest forward
    ran, _ = fake_forward_and_backward(monkeypatch)
    made = watched(monkeypatch)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    accumulated_steps(jf, model, ref)
    assert "fused" not in user_runs(ran), user_runs(ran)
    assert dealias.cache_info(jf).tiers == ("torch",)
    assert "chosen by forward and backward" in reasons(jf)
    assert_removed(made)


def f(x, w):
    h = torch.tanh(x @ w)
    return h, h, h.view(-1), h[0]  # (an output returned twice, views of it)


def test_hooks_are_invisible_to_the_users_backward(monkeypatch):
    # the user's hooks on the outputs (tensor hooks, node pre-hooks and hooks, retain_grad), retain_graph, double
    # backward and torch.autograd.grad on the first call's outputs, as eager
    fake_forward_and_backward(monkeypatch)
    made = watched(monkeypatch)
    jf = dealias.jit(f)
    torch.manual_seed(0)
    x, w0 = torch.randn(3, 4), torch.randn(4, 5)

    def run(fn):
        w = w0.clone().requires_grad_()
        outs = fn(x, w)
        calls = []
        h = outs[0]
        h.retain_grad()
        h.register_hook(lambda g: calls.append(("tensor", g.clone())))
        h.grad_fn.register_prehook(lambda go: calls.append(("pre", go[0].clone())))
        h.grad_fn.register_hook(lambda gi, go: calls.append(("post", gi[0].clone())))
        outs[2].register_hook(lambda g: g * 2)  # (a hook that changes the gradient)
        loss = outs[0].sum() + outs[1].pow(2).sum() + outs[2].sum() + outs[3].sum()
        loss.backward(retain_graph=True)
        first = w.grad.clone()
        loss.backward(retain_graph=True)
        (g,) = torch.autograd.grad(outs[0].pow(3).sum(), w, create_graph=True)
        g.sum().backward(retain_graph=True)
        (g2,) = torch.autograd.grad(outs[3].sum(), w, retain_graph=True)
        return [first, w.grad, h.grad, g, g2], calls

    got, got_calls = run(jf)
    assert made and made[0][0].seen
    want, want_calls = run(f)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert [k for k, _ in got_calls] == [k for k, _ in want_calls]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got_calls, want_calls))
    # the end of the first backward decided (by forward and backward) and removed the hooks
    got, got_calls = run(jf)
    assert dealias.cache_info(jf).tiers == ("torch",)
    assert_removed(made)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_no_grad_call_between_and_a_second_call_from_another_thread(monkeypatch):
    ran, _ = fake_forward_and_backward(monkeypatch)
    made = watched(monkeypatch)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    x = torch.randn(4, 8)
    out, expected = jf(x), ref(x)
    with torch.no_grad():  # (another cache entry: the first one still choosing)
        assert torch.equal(jf(x), ref(x))
    assert "choosing between" in reasons(jf)
    out.sum().backward()
    expected.sum().backward()
    assert same_grads(model, ref)
    results = []
    thread = threading.Thread(target=lambda: results.append(jf(x)))
    thread.start()
    thread.join()
    assert torch.equal(results[0], ref(x))
    assert "torch" in dealias.cache_info(jf).tiers and "chosen by forward and backward" in reasons(jf)
    assert_removed(made)


@pytest.mark.parametrize("why", ["compiled autograd", "no grad_fn"])
def test_where_no_hook_can_be_set_the_users_calls_choose(monkeypatch, why):
    ran, now = fake_forward_and_backward(monkeypatch)
    if why == "compiled autograd":
        monkeypatch.setattr(backward_seen, "compiled_autograd_in_force", lambda: True)
    else:
        monkeypatch.setattr(backward_seen, "watch", lambda *args: (None, "no output with a grad_fn"))
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    for call in range(40):
        x = torch.randn(4, 8)
        out, expected = jf(x), ref(x)
        assert torch.equal(out, expected), call
    assert "tiers measured on the calls: no hook on the outputs" in reasons(jf)
    assert dealias.cache_info(jf).tiers == ("fused",)  # (defaultgap2's: the user's calls timed)


def test_an_output_without_grad_fn_is_not_watched():
    w = nn.Parameter(torch.randn(3))
    assert backward_seen.watch((w, torch.randn(2))) == (None, "no output with a grad_fn")
    with torch.no_grad():
        assert backward_seen.watch(w * 2)[0] is None
    y = w * 2
    assert backward_seen.watch(y, [y])[0] is None  # (an input returned: its node the user's)
    watch, why = backward_seen.watch(y)
    assert watch is not None and why == ""
    watch.remove()


def timed_steps(jf, model, ref, calls: int, ran: list[str], now: list[float], user_backward: dict) -> None:
    """training_steps, each user backward adding `user_backward[tier]` to the faked clock (the tier of the call it
    backpropagates): the user's calls, each timed up to the next, take the tier's forward and this backward."""
    for call in range(calls):
        x = torch.randn(4, 8)
        before = len(user_runs(ran))
        out, expected = jf(x), ref(x)
        runs = user_runs(ran)
        tier = runs[-1] if len(runs) > before else dealias.cache_info(jf).tiers[0]  # (settled: not timed)
        assert torch.equal(out, expected), call
        out.sum().backward()
        expected.sum().backward()
        now[0] += user_backward[tier]
        assert same_grads(model, ref), call


def test_a_tier_close_on_the_forward_alone_is_not_run_by_a_training_step(monkeypatch):
    # both measures' fastest is the torch executor; the fused forward is close to it (its backward 10x), dynamo's
    # graph close on forward and backward: the fused tier dropped at the end of the first backward, never run on
    # the user's calls (there its calls took 1.3x eager's with their backward: resnet18); the graph tier, close to
    # the best on copies, measured against the torch executor on the user's calls, each up to the next
    forward = {"torch": 1.0e-5, "fused": 1.03e-5, "graph": 1.5e-5}
    backward = {"torch": 1.0e-5, "fused": 10e-5, "graph": 0.55e-5}
    ran, now = fake_forward_and_backward(monkeypatch, forward, backward)
    made = watched(monkeypatch)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    timed_steps(jf, model, ref, 80, ran, now, backward)
    runs = user_runs(ran)
    assert "fused" not in runs and "graph" in runs, runs
    assert len(runs) < 80 and runs[-1] == "torch", runs  # (settled: the last calls not timed)
    assert dealias.cache_info(jf).tiers == ("torch",)
    assert "chosen by forward and backward" in reasons(jf) and "measured on the calls" in reasons(jf)
    assert_removed(made)


@pytest.mark.parametrize(
    "fused_forward, user_fused, chosen",
    [
        (0.98e-5, 1.5e-5, "torch"),  # resnet18's step: 2-4 % faster fused on copies, 1.5x slower on the user's calls
        (0.98e-5, 0.7e-5, "fused"),  # a GAN discriminator's: even on copies, 7 % faster fused on the user's calls
        (1.6e-5, 0.2e-5, "fused"),  # 1.3x on copies (under load, right after its backward's compile), faster on calls
    ],
)
def test_a_training_step_close_on_copies_is_chosen_on_the_users_calls(monkeypatch, fused_forward, user_fused, chosen):
    # forward and backward on copies: fused 1.98 (or 2.6), torch 2.0, graph 6 (a clear loser: dropped); the copies'
    # backward (into no .grad, nothing between) is not the user's: the user's calls, each up to the next, choose
    forward = {"torch": 1.0e-5, "fused": fused_forward, "graph": 3e-5}
    backward = {"torch": 1.0e-5, "fused": 1.0e-5, "graph": 3e-5}
    ran, now = fake_forward_and_backward(monkeypatch, forward, backward)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    timed_steps(jf, model, ref, 60, ran, now, {**backward, "fused": user_fused})
    runs = user_runs(ran)
    assert "graph" not in runs and "torch" in runs and "fused" in runs, runs
    assert len(runs) < 60 and runs[-1] == chosen, runs  # (settled: the last calls not timed)
    info = dealias.cache_info(jf)
    assert info.tiers == (chosen,), info
    assert "measured on the calls" in reasons(jf), reasons(jf)


def test_accumulated_gradients_close_on_copies_choose_there(monkeypatch):
    # four forwards, then one backward: the user's calls, timed up to the next, would be forwards (three of four):
    # close on copies, the exact tier (choosing.trained), none measured on the user's calls
    forward = {"torch": 1.0e-5, "fused": 0.5e-5, "graph": 3e-5}
    backward = {"torch": 1.0e-5, "fused": 1.48e-5, "graph": 3e-5}
    ran, _ = fake_forward_and_backward(monkeypatch, forward, backward)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    accumulated_steps(jf, model, ref)
    assert "fused" not in user_runs(ran), user_runs(ran)
    assert dealias.cache_info(jf).tiers == ("torch",)
    assert "measured on the calls" not in reasons(jf), reasons(jf)
