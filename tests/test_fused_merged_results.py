"""Results the fused program computes apart, which eager returns in memories of their own, must not come back in one
(fuzz seed 2441434, torch 2.13 and 2.14: two `Ident.apply(v * 1)` of a value made of constants alone, each forward a
`x.clone()`; inductor dropped both clones as no-ops and returned one buffer twice, so a write into one result
changed the other). fused.runner learns it on the first call and gives the later result memory of its own."""

from __future__ import annotations

import pytest
import torch
from harness import HalvesGradient

import dealias

pytestmark = pytest.mark.inductor


# (the fuzzer's Ident: a clone forward, half the gradient backward)
Ident = HalvesGradient


def two_clones(x):
    v = torch.linspace(-1, 1, 6)
    return Ident.apply(v * 1), Ident.apply(v * 1), x + 1


def two_clones_of_a_size(x):
    v = torch.arange(x.shape[0], dtype=torch.float32)  # (a size of the call's: symbolic under dynamic=True)
    return v.clone(), v.clone(), x * 2


def fuzz_2441434(x0, x1):
    with torch.no_grad():
        v1 = x0.t()
    v4 = v1.reshape(-1)
    v4.add_(-2.0)
    v7 = v1.new_zeros((6, 4))
    v8 = torch.linspace(-1, 1, 6).view((6,))
    v13 = Ident.apply(v8 * 1)
    v15 = v13.unfold(0, 2, 2)
    v16 = Ident.apply(v8 * 1)
    return (v15, v16, v7)


def _args(fn):
    g = torch.Generator().manual_seed(2441434)
    if fn is fuzz_2441434:
        b0 = torch.randn(4, 6, generator=g, requires_grad=True)
        return (b0 * 1, torch.randn(4, 6, generator=g, requires_grad=True) * 1)
    return (torch.randn(5, generator=g),)


def _memories(outs):
    ptrs = [o.untyped_storage().data_ptr() for o in outs]
    return [ptrs.index(p) for p in ptrs]


@pytest.mark.parametrize("fn", [two_clones, fuzz_2441434, two_clones_of_a_size])
def test_results_computed_apart_come_back_apart(fn):
    torch._dynamo.reset()
    jf = dealias.jit(fn, executor="inductor", dynamic=fn is two_clones_of_a_size)
    for _ in range(3):  # (the first call, where it is learned, and the next ones)
        want, got = fn(*_args(fn)), jf(*_args(fn))
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w)
        assert _memories(got) == _memories(want)
    if fn is not fuzz_2441434:  # (which the fused executor does not take whole: it checks the default's tiers)
        assert dealias.cache_info(jf).tiers == ("fused",)
    got = jf(*_args(fn))
    before = got[0].clone()
    got[1].fill_(7.0)  # (as eager: the other result unchanged)
    assert torch.equal(got[0], before)
