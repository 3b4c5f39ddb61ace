"""Audit of the default path as users get it (executor "tiered", the fused program compiled in a program's first
call, the exact tiers timed on copies there: frontend/tiers.py, FUSE_FIRST): each test against eager on cloned
inputs. The suite pins DEALIAS_FUSE_FIRST=0 (conftest.py); the tests here that are about the first call set
tiers.FUSE_FIRST themselves."""

from __future__ import annotations

import warnings

import pytest
import torch

import dealias
from dealias.frontend import tiers


def _grad_and_warnings(fn, make_input):
    """The gradient reaching the leaf behind `fn`'s input (a computed tensor, as a layer's output is), and dealias's
    warnings."""
    leaf = make_input()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(leaf * 1)
    out.sum().backward()
    return leaf.grad, [w for w in caught if issubclass(w.category, dealias.FallbackWarning)]


def _transposed_then_hooked(x):
    x.transpose_(0, 1)
    x.register_hook(lambda g: g + torch.arange(g.numel(), dtype=g.dtype).view(g.shape))  # (shape-dependent)
    return x * 2


def _hooked_then_transposed(x):
    x.register_hook(lambda g: g * 3)
    x.transpose_(0, 1)
    return x * 2


@pytest.mark.parametrize("fn", [_transposed_then_hooked, _hooked_then_transposed], ids=["change_first", "hook_first"])
def test_a_hook_on_an_input_whose_layout_the_graph_changes_sees_its_gradient(monkeypatch, fn):
    # (fuzz seed 1700025: `x0.transpose_(0, 1); x0.register_hook(...)`: dealias carried the change out on the caller's
    # tensor after the call, a new autograd node the outputs do not go through, and dynamo registered the hook there:
    # it never fired, every executor; now the frame runs eagerly, with a FallbackWarning)
    monkeypatch.setattr(tiers, "FUSE_FIRST", True, raising=False)
    make = lambda: torch.randn(3, 4, requires_grad=True)  # noqa: E731
    torch.manual_seed(0)
    expected, _ = _grad_and_warnings(fn, make)
    jf = dealias.jit(fn)
    for _ in range(2):
        torch.manual_seed(0)
        got, fallbacks = _grad_and_warnings(jf, make)
        assert torch.equal(got, expected), (got, expected)
    assert fallbacks == [] or "hook" in str(fallbacks[0].message)
