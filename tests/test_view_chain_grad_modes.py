"""A returned view whose chain's steps were made in different grad modes, in a piece of a graph that dynamo
resumed inside a no_grad region (a graph break there: the piece is called with grad off and switches it on):
each step is replayed in the mode eager made it in, not in the call's (fuzz seed 2300095)."""

from __future__ import annotations

import torch
from harness import grads_like_eager

import dealias


def _make():
    g = torch.Generator().manual_seed(2300095)
    return (torch.randn(3, 4, 2, generator=g, requires_grad=True) * 1,)


def fuzz_2300095(x0):
    v1 = x0 + 1
    v2 = v1.transpose(0, 2)
    with torch.no_grad():
        x0.copy_(v1)
    v5 = v2.reshape(-1)
    with torch.no_grad():
        v1.register_hook(lambda g: g * 2)
    v2.copy_(v2)
    v8 = torch.zeros_like(v1)
    with torch.no_grad():
        v9 = v5.narrow(0, 3, 1)
    return (v2, v9, v8)


def copy_made_with_grad_then_no_grad_view(x0):
    # The graph breaks at register_hook inside the no_grad region: the rest is a piece called with grad off.
    # reshape of the transposed tensor copies (clone, then _unsafe_view) with grad on: v5 requires grad and is
    # no view of v1; its narrow under no_grad is a view that requires grad (eager's, without a grad_fn).
    v1 = x0 + 1
    v2 = v1.transpose(0, 2)
    with torch.no_grad():
        x0.copy_(v1)
    v5 = v2.reshape(-1)
    with torch.no_grad():
        v1.register_hook(lambda g: g * 2)
    with torch.no_grad():
        v9 = v5.narrow(0, 3, 1)
    return (v9,)


def test_fuzz_2300095_like_eager():
    assert grads_like_eager(fuzz_2300095, dealias.jit(fuzz_2300095, executor="torch"), _make) == []


def test_steps_before_a_no_grad_view_keep_their_grad_mode():
    jf = dealias.jit(copy_made_with_grad_then_no_grad_view, executor="torch")
    assert grads_like_eager(copy_made_with_grad_then_no_grad_view, jf, _make) == []
    out = jf(*_make())[0]
    assert out.requires_grad and out.grad_fn is None and out._base is not None


def unbind_element_under_no_grad_of_a_view(x0):  # autograd fuzz seed 1100236: compiled, no fallback
    v2 = x0.unsqueeze(0)
    with torch.no_grad():
        v6 = v2.unbind(3)[1]
    return (x0 * 2, v6)


def test_steps_before_a_no_grad_split_element_in_the_calls_mode_compile():
    jf = dealias.jit(unbind_element_under_no_grad_of_a_view, executor="torch")
    assert grads_like_eager(unbind_element_under_no_grad_of_a_view, jf, _make) == []
