"""A tensor that requires grad, overwritten with grad on through a view that covers all of it (`v.view(-1).copy_(w)`)
by values that do not read it: eager's CopySlices still calls the node of its old history with a zero gradient, so
a leaf behind it gets zeros (not None) and an op there whose saved tensor the write made stale raises at backward.
The functional value (the written values reshaped back) had no edge to that history: dealias gave None, and
gradients where eager raised (fuzz seed 2431326). gradops.rewritten gives it the edge (regions.covers_without_reading
says where)."""

from __future__ import annotations

import pytest
import torch
from harness import grads_like_eager

import dealias
from dealias.ir.gradops import rewritten


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


@pytest.mark.parametrize("executor", ["torch", "tiered"])
def test_a_stale_saved_tensor_behind_a_whole_overwrite_raises_as_in_eager(executor):
    jf = dealias.jit(fuzz_2431326, executor=executor)
    for f in (fuzz_2431326, jf):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            f(*_make())[0].sum().backward()


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


@pytest.mark.inductor
def test_the_fused_executor_gives_the_zero_gradient_too():
    assert grads_like_eager(through_view, dealias.jit(through_view, executor="inductor"), _make) == []


def test_only_a_value_the_op_did_not_compute_from_the_region_gets_the_node():
    def targets(fn):
        jf = dealias.jit(fn, executor="torch")
        jf(*_make())
        return [n.target for t in dealias.last_traces(jf) if t.graph is not None for n in t.graph.graph.nodes]

    assert rewritten in targets(through_view)
    assert rewritten in targets(copy_of_a_value_read_from_it)
    assert rewritten not in targets(value_reading_the_base)
