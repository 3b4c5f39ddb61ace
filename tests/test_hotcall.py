"""A fused program's cached call (issue 38 item 4): its lean lookup (frontend/guards.lean_check) checks only what
dynamo's guards do not (which inputs share a storage, leaf-ness, grad mode), so every call whose inputs' sharing
differs from the compiled layout's must leave it: the same tensor twice, two views of one base (disjoint or
overlapping), a storage swapped in with `set_` between calls (a buffer of a module, an optimizer's state the graph
holds as an attribute), a storage resized. Each call compared with eager on copies (outputs, inputs after the call,
aliasing), and the common call, back to distinct storages, runs the fused program again from the lean lookup."""

from __future__ import annotations

import warnings

import pytest
import torch

import dealias
from dealias.runtime.verify import ULP_TOLERANT, compare_call

pytestmark = pytest.mark.inductor


def _like_eager(fn, jf, *args):
    token = ULP_TOLERANT.set(True)  # (fused kernels: within a few ulps)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)  # (an alias group may run on the torch executor)
            diff = compare_call(fn, jf, args)
    finally:
        ULP_TOLERANT.reset(token)
    assert diff is None, diff


def _lean_hit(jf) -> bool:
    """Whether the last call was served by the first graph's lean lookup (its first compiled layout). (A call dynamo
    recompiles, the same tensor passed twice, runs another graph.)"""
    graph = jf.stats.graphs[0]
    return graph.lean is not None and graph.lean[1] is jf.last


def step(a, b):
    a.add_(1)
    b.mul_(2)
    return a + b


def test_inputs_sharing_memory_only_in_later_calls_leave_the_lean_lookup():
    jf = dealias.jit(step, executor="inductor")
    x, y = torch.randn(6), torch.randn(6)
    _like_eager(step, jf, x, y)  # distinct storages: the compiled layout
    _like_eager(step, jf, x, y)
    assert jf.last.tier == "fused" and _lean_hit(jf)
    base = torch.randn(12)
    for a, b in [
        (x, x),  # the same tensor twice
        (base[:6], base[6:]),  # two views of one base, disjoint
        (base[:6], base[3:9]),  # overlapping
        (base[::2], base[1::2]),  # interleaved
    ]:
        _like_eager(step, jf, a, b)
        assert not _lean_hit(jf)
    _like_eager(step, jf, x, y)  # distinct again: the lean lookup takes it
    assert _lean_hit(jf)


def test_a_storage_swapped_in_between_calls_is_seen():
    """`set_` gives a tensor another storage without a new tensor object or new sizes: dynamo's guards on it all hold.
    Here it makes `a` share `b`'s memory."""
    jf = dealias.jit(step, executor="inductor")
    a, b = torch.randn(4), torch.randn(4)
    for _ in range(2):
        _like_eager(step, jf, a, b)
    assert _lean_hit(jf)
    a.set_(b.untyped_storage(), 0, (4,), (1,))
    _like_eager(step, jf, a, b)
    assert not _lean_hit(jf)


def test_a_resized_storage_between_calls():
    """`resize_` to more elements moves the data into new memory of the same storage; a storage shared by two inputs
    stays shared."""
    jf = dealias.jit(step, executor="inductor")
    base = torch.randn(8)
    a, b = base[:4], base[4:]
    for _ in range(2):
        _like_eager(step, jf, a, b)
    base.resize_(64)
    _like_eager(step, jf, a, b)
    c = torch.randn(4)
    c.untyped_storage().resize_(64 * c.element_size())  # (a larger storage under the same sizes)
    _like_eager(step, jf, c, torch.randn(4))
    _like_eager(step, jf, torch.randn(4), torch.randn(4))
    assert _lean_hit(jf)


class Stats(torch.nn.Module):
    """Buffers a forward writes, as BatchNorm's running statistics (`count` from all of `mean` and from its other
    elements). (Inductor's kernels store in program order, so a program that took the two for distinct memory gave
    eager's result here too: the check of their sharing is what test_a_storage_swapped_in_between_calls_is_seen
    catches; this one compares the layouts' programs with eager.)"""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        total = self.mean.sum()
        self.mean.mul_(0.5).add_(x.mean(0))
        self.count.add_(self.mean.roll(1)).add_(total)
        return x - self.mean


def _module_state(m):
    return [t.clone() for t in (m.mean, m.count)]


def test_module_buffers_made_to_share_memory_between_calls():
    ours, theirs = Stats(), Stats()
    jm = dealias.jit(ours, executor="inductor")
    for call in range(4):
        if call == 2:  # both buffers onto one storage, in both modules
            for m in (ours, theirs):
                m.count.set_(m.mean.untyped_storage(), 0, (4,), (1,))
        x = torch.randn(3, 4)
        torch.testing.assert_close(jm(x.clone()), theirs(x.clone()), rtol=1e-5, atol=1e-6)
        for got, expected in zip(_module_state(ours), _module_state(theirs)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert ours.count.untyped_storage().data_ptr() == ours.mean.untyped_storage().data_ptr()


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=False)


def _step(opt):
    opt.step()


def test_optimizer_state_made_to_share_memory_between_steps():
    """A non-foreach optimizer's parameters and state are the graph's attributes (lifted as trailing inputs, checked
    by the lean lookup's held check): two momentum buffers moved onto one storage between steps, overlapping by two
    rows."""
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(3, 3)) for _ in range(2)]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    ours, theirs = _sgd(ps), _sgd(qs)
    jf = dealias.jit(_step, executor="inductor")
    for call in range(5):
        g = [torch.randn(3, 3) for _ in ps]
        for p, q, gi in zip(ps, qs, g):
            p.grad, q.grad = gi.clone(), gi.clone()
        if call == 3:  # (the same sizes and strides: only the memory differs)
            for opt, params in ((ours, ps), (theirs, qs)):
                buffers = [opt.state[p]["momentum_buffer"] for p in params]
                memory = torch.cat([buffers[0].flatten(), buffers[1][2]]).untyped_storage()
                buffers[0].set_(memory, 0, (3, 3), (3, 1))
                buffers[1].set_(memory, 3, (3, 3), (3, 1))  # (its rows 1 and 2 are the other's 0 and 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            jf(ours)
        _step(theirs)
        for p, q in zip(ps, qs):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(ours.state[p]["momentum_buffer"], theirs.state[q]["momentum_buffer"])


def test_a_piece_called_in_the_other_grad_mode():
    """Grad mode is part of the lean lookup: a call under no_grad of a program compiled with grad on compiles its own
    (outputs without history, as eager's)."""

    def f(w, x):
        y = x * w
        y.add_(1)
        return y

    jf = dealias.jit(f, executor="inductor")
    w = torch.randn(4, requires_grad=True)
    for _ in range(2):
        _like_eager(f, jf, w, torch.randn(4))
    with torch.no_grad():
        _like_eager(f, jf, w, torch.randn(4))
        assert not jf(w, torch.randn(4)).requires_grad
    assert jf(w, torch.randn(4)).requires_grad


def attention(mha, x):
    return mha(x, x, x)


@pytest.mark.parametrize("through", [0, 1])
def test_a_gradient_into_one_result_of_a_fused_multihead_attention(through):
    """The fused call registers its none-gradient post-hook on the backward node it reads once per call: with a
    gradient into the attention weights only, the output projection's parameters get None, as eager's (not the
    compiled backward's zeros); into the output only, every parameter a gradient."""
    torch.manual_seed(0)
    ours = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    theirs.load_state_dict(ours.state_dict())
    jf = dealias.jit(attention, executor="inductor")
    for call in range(3):
        x = torch.randn(1, 3, 8)
        got, expected = jf(ours, x.clone()), attention(theirs, x.clone())
        grads = [
            torch.autograd.grad(out[through].sum(), list(m.parameters()), allow_unused=True)
            for out, m in ((got, ours), (expected, theirs))
        ]
        for name, g, e in zip([n for n, _ in ours.named_parameters()], *grads):
            assert (g is None) == (e is None), f"call {call + 1}: {name}: {g} where eager's is {e}"
            if e is not None:
                torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    assert jf.last.tier == "fused" and _lean_hit(jf)
