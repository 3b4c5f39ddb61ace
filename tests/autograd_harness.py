"""Helpers of the autograd write tests (test_autograd_writes*.py): seeded arguments requiring grad, and the check
that a program compiles (or runs eagerly) with eager's values and gradients."""

from __future__ import annotations

import warnings

import torch

import dealias
from dealias.runtime.verify import compare_call
from dealias.tools.fuzz import _compare_grads


def non_leaf(*shape):
    """A maker of one non-leaf tensor of `shape` requiring grad, the same values on every call."""

    def make():
        g = torch.Generator().manual_seed(0)
        return (torch.randn(*shape, generator=g, requires_grad=True) * 1,)

    return make


def assert_compiled_like_eager(fn, make_args, compiled=True):
    """Values, inputs, aliasing and gradients as eager's on two calls, compiled (or, `compiled=False`, run eagerly
    with a FallbackWarning); returns the jitted function."""
    jf = dealias.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dealias.FallbackWarning)
        for call in range(2):
            assert compare_call(fn, jf, make_args()) is None, call
            assert _compare_grads(fn, jf, make_args) is None, call
    fell_back = [str(w.message) for w in caught if issubclass(w.category, dealias.FallbackWarning)]
    if compiled:
        assert not fell_back, fell_back
    else:
        assert fell_back
    return jf
