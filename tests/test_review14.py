"""Review of the first call's runs on copies (frontend/copies.py): every tier timed on copies of the call's tensors,
a call recording autograd with its backward on the copies. What the user observes must be eager's; the copies a tier
runs on must be what its program was compiled for (the call's layouts). Timing is faked (test_copytiers.fake_fused:
the "fused" program is the torch executor's, every call compared with eager bit for bit)."""

from __future__ import annotations

import torch
from test_copytiers import FAST_FUSED, fake_fused

import dealias
from dealias.frontend import tiers


class Gapped(torch.autograd.Function):
    """A computed tensor requiring grad whose memory has gaps: rows 1000 elements apart (an autograd.Function's
    output in memory of its own layout)."""

    @staticmethod
    def forward(ctx, x):
        return torch.empty_strided(x.shape, (1000, 1)).copy_(x)

    @staticmethod
    def backward(ctx, g):
        return g


def test_a_gapped_computed_input_is_not_handed_to_the_tiers_in_another_layout(monkeypatch):
    # clone_args recomputes a computed tensor requiring grad as `fresh * 1`: dense (8, 1) strides for the caller's
    # (1000, 1), a 32-element storage for 3008; the tiers' programs index with the call's strides (the fused
    # program's kernels: reads 3000 elements past the copy's memory). The copies must have the call's layout, or
    # the tiers are measured on the user's calls.
    ran = fake_fused(monkeypatch, **FAST_FUSED)
    layouts = []
    fake = tiers.measure

    def measure(tier, run, leaves):
        layouts.append([(x.stride(), x.untyped_storage().nbytes()) for x in leaves if isinstance(x, torch.Tensor)])
        return fake(tier, run, leaves)

    monkeypatch.setattr(tiers, "measure", measure)

    def f(h, buf):
        buf.add_(1)
        return (h * 3).sum(1) + buf

    jf = dealias.jit(f)
    for call in range(3):
        a = torch.randn(4, 8, requires_grad=True)
        mine = a.detach().clone().requires_grad_()
        h1, h2 = Gapped.apply(a), Gapped.apply(mine)
        b1, b2 = torch.zeros(4), torch.zeros(4)
        expected, got = f(h1, b1), jf(h2, b2)
        assert torch.equal(got, expected) and torch.equal(b1, b2), call
        expected.sum().backward()
        got.sum().backward()
        assert torch.equal(a.grad, mine.grad), call
    call_layout = [((1,), 16), ((1000, 1), h2.untyped_storage().nbytes())]
    assert ran and all(sorted(seen) == sorted(call_layout) for seen in layouts), layouts[:3]
