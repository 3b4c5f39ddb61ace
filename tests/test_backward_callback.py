"""The fused backward timed at the end of the user's first backward (backward_seen's hook queues the autograd
engine's callback, tiers.Tiered._after_first_backward): what the user's backward sees of it. Timing is faked
(test_defaultgap2's fake tiers: the "fused" program is the torch executor's), so results are eager's bit for bit."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_defaultgap2 import fake_forward_and_backward, model_and_reference
from test_defaultgap3 import reasons, same_grads, training_steps
from test_lazy_backward import FUSED_WINS

import dealias
from dealias.frontend import tiers


def test_a_first_backward_under_compiled_autograd_with_fullgraph_is_eagers(monkeypatch):
    # Compiled autograd turned on for the backward alone has dynamo trace the hooks on the first call's outputs into
    # the user's compiled backward: the hook queueing the engine's callback was a graph break there (dynamo cannot
    # trace `queue_callback`: a warning), and under fullgraph=True the user's backward raised Unsupported.
    from torch._dynamo import compiled_autograd

    fake_forward_and_backward(monkeypatch, FUSED_WINS, FUSED_WINS)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    x = torch.randn(4, 8)
    out, expected = jf(x), ref(x)
    assert torch.equal(out, expected)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for o in (out, expected):
            with compiled_autograd._enable(torch.compile(backend="eager", fullgraph=True)):
                o.sum().backward()
    assert same_grads(model, ref)
    assert not [w for w in seen if "queue_callback" in str(w.message)], [str(w.message) for w in seen]
    training_steps(jf, model, ref, 3)  # (the next call times the fused backward, as where the state differs)
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert "on copies in the call after the first backward" in reasons(jf), reasons(jf)


@pytest.mark.inductor
def checkpointed_steps(jf, model, ref, calls: int) -> None:
    """`calls` training steps of the jitted `model` and of eager's `ref` under a non-reentrant checkpoint (the call
    run again in the user's backward), on the same inputs: outputs and gradients compared at each."""
    from torch.utils.checkpoint import checkpoint

    for call in range(calls):
        x = torch.randn(4, 8)
        out, expected = checkpoint(jf, x, use_reentrant=False), checkpoint(ref, x, use_reentrant=False)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=lambda m, call=call: f"call {call}: {m}")


def test_a_checkpointed_calls_recomputation_runs_the_tier_of_its_forward(monkeypatch):
    # torch.utils.checkpoint (non-reentrant) calls the function again in the user's backward and checks that it saves
    # the tensors its forward saved. That second call, inside the first backward, timed the fused backward and
    # switched tiers there (the torch executor's forward saved 7 tensors, the fused recomputation 3):
    # CheckpointError in the user's first backward. The switch waits for the end of that backward.

    monkeypatch.setattr(tiers, "FUSE_FIRST", True)
    monkeypatch.setattr(tiers, "clock", lambda: 0.0)

    def measure(tier, run, leaves):  # (real runs; times faked: the fused tier the fastest on both, once timed)
        return run(leaves), 0.5e-5 if tier == "fused" else (1e-5 if tier == "torch" else 3e-5)

    monkeypatch.setattr(tiers, "measure", measure)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    checkpointed_steps(jf, model, ref, 3)
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert "on copies in the first backward" in reasons(jf), reasons(jf)


@pytest.mark.inductor
def test_the_first_calls_fused_compile_calls_no_saved_tensor_hook_of_the_users(monkeypatch):
    # The fused compile's run on copies (double_backward.double_backward_of_its_own) saved its tensors through the
    # user's saved-tensor hooks: 7 packs in the first call where eager packs 4 (offloading, counting, a checkpoint)
    monkeypatch.setattr(tiers, "FUSE_FIRST", True)
    packed = []

    def pack(t):
        packed.append(t.shape)
        return t

    model, ref = model_and_reference()
    jf = dealias.jit(model)
    counts = []
    for fn in (ref, jf):
        packed.clear()
        x = torch.randn(4, 8)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fn(x)
        counts.append(len(packed))
        out.sum().backward()
    assert counts[0] == counts[1], counts


def test_a_first_backward_outside_the_calls_autocast_times_the_fused_backward_there(monkeypatch):
    # The mixed-precision idiom: the forward under autocast, its backward outside. The state at the end of that
    # backward was not the call's (autocast off), so the user's second call timed and compiled the fused backward.
    fake_forward_and_backward(monkeypatch, FUSED_WINS, FUSED_WINS)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    for call in range(3):
        x = torch.randn(4, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, expected = jf(x), ref(x)
        assert out.dtype == expected.dtype == torch.bfloat16 and torch.equal(out, expected), call
        out.float().sum().backward()
        expected.float().sum().backward()
        assert same_grads(model, ref), call
        assert not torch.is_autocast_enabled("cpu")
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert "on copies in the first backward" in reasons(jf), reasons(jf)
