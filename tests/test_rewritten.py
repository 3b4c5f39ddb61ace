"""A tensor that requires grad, overwritten with grad on through a view that covers all of it (`v.view(-1).copy_(w)`)
by values that do not read it: eager's CopySlices still calls the node of its old history with a zero gradient, so
a leaf behind it gets zeros (not None) and an op there whose saved tensor the write made stale raises at backward.
The functional value (the written values reshaped back) had no edge to that history: dealias gave None, and
gradients where eager raised (fuzz seed 2431326). gradops.rewritten gives it the edge (regions.covers_without_reading
says where). The fused executor hands it (and gradops.overwritten) to AOTAutograd as `where(False, old, new)`."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.fx as fx
from harness import grads_like_eager

import dealias
from dealias.ir.gradops import overwritten, rewritten
from dealias.runtime.fused_autograd import _as_where


def _make():
    g = torch.Generator().manual_seed(2431326)
    b0 = torch.randn(3, 4, 2, generator=g, requires_grad=True)
    l1 = torch.randn(6, generator=g, requires_grad=True)
    return (b0 * 1, l1 * 1)


def fuzz_2431326(x0, x1):
    v4 = x0.exp()  # (exp saves its result, which the write below makes stale)
    v5 = x1[4]
    v6 = v5.view(1)
    v7 = v4.view(-1)
    v7.copy_(v6)
    return (v4,)


def through_view(x0, x1):
    v = x0 + 1
    v.view(-1).copy_(x1[4].view(1))
    return (v,)


def through_unsqueeze(x0, x1):
    v = x0 + 1
    v.unsqueeze(0).copy_(x1[4].expand(1, 3, 4, 2))
    return (v,)


def through_transpose(x0, x1):
    v = x0.sum(2) + 1
    v.t().copy_(x1[:4].view(4, 1) * 2)
    return (v,)


def value_reading_the_base(x0, x1):
    # (mul_ computes from the region: eager passes its gradient for `self` on that edge alone, -0.0 staying -0.0)
    v = x0 * 1
    v.view(-1).mul_(-0.0)
    return (v,)


def copy_of_a_value_read_from_it(x0, x1):
    # (`copy_`'s source read from the base: eager's old history gets the source's gradient and CopySlices' zero, so
    # the source's -0.0 becomes 0.0 there; this one is an edge apart from the source's)
    v = x0 * 1
    v.view(-1).copy_(v.view(-1) * -0.0)
    return (v,)


PROGRAMS = [through_view, through_unsqueeze, through_transpose, value_reading_the_base, copy_of_a_value_read_from_it]


@pytest.mark.parametrize("executor", ["torch", "tiered", "inductor"])  # (stale_saved: not fused, no compile)
def test_a_stale_saved_tensor_behind_a_whole_overwrite_raises_as_in_eager(executor):
    jf = dealias.jit(fuzz_2431326, executor=executor)
    for f in (fuzz_2431326, jf):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"), warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.NotFusedWarning)
            f(*_make())[0].sum().backward()
    assert dealias.cache_info(jf).tiers == ("torch",)


@pytest.mark.parametrize("fn", PROGRAMS)
@pytest.mark.parametrize("executor", ["torch", "tiered"])
def test_the_old_history_gets_eagers_zero_gradient(fn, executor):
    assert grads_like_eager(fn, dealias.jit(fn, executor=executor), _make) == []


def _leaf_grads(f):
    g = torch.Generator().manual_seed(0)
    b0 = torch.rand(3, 4, 2, generator=g).add_(0.5).requires_grad_()
    l1 = torch.randn(6, generator=g, requires_grad=True)
    f(b0 * 1, l1 * 1)[0].sum().backward()
    return b0.grad, l1.grad


@pytest.mark.parametrize("fn", PROGRAMS)
def test_the_leafs_gradient_is_zeros_not_none_and_its_signs_are_eagers(fn):
    want = _leaf_grads(fn)
    got = _leaf_grads(dealias.jit(fn, executor="torch"))
    assert want[0] is not None and got[0] is not None
    for w, g in zip(want, got):
        assert (w is None and g is None) or (torch.equal(w, g) and torch.equal(w.signbit(), g.signbit()))


def overwritten_through_view(x0, x1):
    v = x0 + 1
    v.view(-1).copy_(x1.detach()[4].view(1))  # (values requiring no grad: gradops.overwritten, v still requires it)
    return (v,)


def a_view_of_it_returned(x0, x1):
    v = x0 * 2
    v.view(-1).copy_(x1[4].view(1))
    return (v.transpose(0, 2), v[1])


# The fused executor hands AOTAutograd `where(False, old, new)` for gradops' node (fused_autograd._as_where): fused,
# not run on the torch executor, with eager's values and gradients (a leaf's zeros, not None).
FUSED = [*(f for f in PROGRAMS if f is not value_reading_the_base), overwritten_through_view, a_view_of_it_returned]


@pytest.mark.inductor
@pytest.mark.parametrize("fn", FUSED)
def test_the_fused_executor_gives_the_zero_gradient_too(fn):
    jf = dealias.jit(fn, executor="inductor")
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.NotFusedWarning)
        assert grads_like_eager(fn, jf, _make) == []
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert _leaf_grads(jf)[0] is not None


def test_only_a_value_the_op_did_not_compute_from_the_region_gets_the_node():
    def targets(fn):
        jf = dealias.jit(fn, executor="torch")
        jf(*_make())
        return [n.target for t in dealias.last_traces(jf) if t.graph is not None for n in t.graph.graph.nodes]

    assert rewritten in targets(through_view)
    assert rewritten in targets(copy_of_a_value_read_from_it)
    assert rewritten not in targets(value_reading_the_base)


def squared_then_rewritten(x0, x1):
    v = x0 * x0
    v.view(-1).copy_((x1[4] * x1[4]).view(1))
    return (v,)


@pytest.mark.inductor
def test_a_fused_double_backward_through_it_is_eagers():
    # (create_graph=True recomputes the graph with the functional graph's own nodes: gradops' Function, as the
    # torch executor runs it, double_backward.py)
    jf = dealias.jit(squared_then_rewritten, executor="inductor")
    results = []
    for f in (squared_then_rewritten, jf):
        b0, l1 = (t.detach().requires_grad_() for t in _make())
        out = f(b0 * 1, l1 * 1)[0]
        g = torch.autograd.grad((out * out).sum(), (b0, l1), create_graph=True)
        results.append((out, *g, *torch.autograd.grad(sum(t.sum() for t in g), (b0, l1), allow_unused=True)))
    assert dealias.cache_info(jf).tiers == ("fused",)
    for want, got in zip(*results):
        assert want is not None and got is not None
        torch.testing.assert_close(got, want)


@pytest.mark.inductor
@pytest.mark.usefixtures("calls_one_by_one")
def test_the_tiered_executor_fuses_it_too(monkeypatch):
    from test_inductor_tiers import fake_times

    from dealias.frontend import tiers

    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 2)
    fake_times(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    jf = dealias.jit(through_view)  # the default, executor="tiered"
    assert grads_like_eager(through_view, jf, _make, calls=4) == []
    assert dealias.cache_info(jf).tiers == ("fused",)


def test_the_node_is_handed_over_as_where_only_where_its_function_applies_and_the_layout_stays():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        dense, transposed = torch.empty(2, 3), torch.empty(3, 2).t()

    def node(target, old_val, new_val, old_rg=True, new_rg=True, grad=True):
        g = fx.Graph()
        old, new = g.placeholder("old"), g.placeholder("new")
        old.meta.update(val=old_val, rg=old_rg)
        new.meta.update(val=new_val, rg=new_rg)
        n = g.call_function(target, (old, new))
        n.meta.update(val=new_val, grad=grad, rg=True)  # (the Function's result: a view of new)
        return n

    assert _as_where(node(rewritten, dense, dense)) and _as_where(node(overwritten, dense, dense, new_rg=False))
    assert _as_where(node(rewritten, transposed, transposed))
    # Where the Function is not applied (it returns new, old gets no zero gradient): left to it.
    assert not _as_where(node(rewritten, dense, dense, new_rg=False))
    assert not _as_where(node(overwritten, dense, dense))
    assert not _as_where(node(rewritten, dense, dense, old_rg=False))
    assert not _as_where(node(rewritten, dense, dense, grad=False))
    # `where` lays its result out as old, the Function as new.
    assert not _as_where(node(rewritten, dense, transposed)) and not _as_where(node(rewritten, transposed, dense))
