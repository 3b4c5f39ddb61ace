"""The fused backward timed at the end of the user's first backward (backward_seen's hook queues the autograd
engine's callback, tiers.Tiered._after_first_backward): what the user's backward sees of it. Timing is faked
(test_defaultgap2's fake tiers: the "fused" program is the torch executor's), so results are eager's bit for bit."""

from __future__ import annotations

import warnings

import torch
from test_defaultgap2 import fake_forward_and_backward, model_and_reference
from test_defaultgap3 import reasons, same_grads, training_steps
from test_lazy_backward import FUSED_WINS

import dealias


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
