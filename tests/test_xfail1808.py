"""A layout change (`v.t_()`, `squeeze_`, `as_strided_`, `resize_`..) of a split piece's input while its memory requires
no grad, then a write that brings grad to that memory (fuzz seed 1808283).

The piece's inputs (a tensor the program made and a view of it) are an alias group. Its base was taken to require
grad when any input did, so the change was taken as one autograd records and was replayed with grad on after the
write-back: autograd refused it ("a leaf Variable that requires grad is being used in an in-place operation"),
where eager changed the layout before the write and returns. Eager's change is recorded by nothing (no grad_fn
yet); the view's grad_fn, regenerated when read, is made from its new layout. dealias now replays it under no_grad
after the write-back through the group's base (another tensor object): the view's grad_fn is regenerated from the
new layout as eager's."""

import warnings

import pytest
import torch

import dealias
from dealias.runtime.verify import compare_call
from dealias.tools.fuzz import _compare_grads


class _Ident(torch.autograd.Function):  # (dynamo splits the graph here)
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g


LAYOUT_CHANGES = {
    "transpose_": lambda v: v.transpose_(0, 1),
    "t_": lambda v: v.t_(),
    "squeeze_": lambda v: v.squeeze_(),
    "squeeze_dim": lambda v: v.squeeze_(0),
    "unsqueeze_": lambda v: v.unsqueeze_(0),
    "as_strided_": lambda v: v.as_strided_((v.numel(),), (1,)),
    "resize_": lambda v: v.resize_(1),
    "swapdims_": lambda v: v.swapdims_(0, -1),
}

VIEWS = {
    "movedim": lambda b: b.movedim(0, -1),
    "row": lambda b: b[:1],
    "column": lambda b: b[:, 1:],
}


def _program(view, change, returns):
    def fn(x0):
        v3 = x0 * 2
        b = v3.new_ones((2, 3)) + torch.arange(6.0).view(2, 3)
        v = view(b)
        _Ident.apply(x0)  # b and v are the second piece's inputs, neither requiring grad
        change(v)  # a layout change autograd records nothing of
        b.mul_(v3)  # then a write that makes the memory require grad
        if returns == "both":
            return b, v
        return v * 2

    return fn


def _make():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, 3, generator=g, requires_grad=True) * 1,)


def _check(fn, executor):
    jf = dealias.jit(fn, executor=executor)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dealias.FallbackWarning)
        for call in range(2):
            assert compare_call(fn, jf, _make()) is None, call
            assert _compare_grads(fn, jf, _make) is None, call
            expected, got = fn(*_make()), jf(*_make())
            expected = expected if isinstance(expected, tuple) else (expected,)
            got = got if isinstance(got, tuple) else (got,)
            for e, g in zip(expected, got):
                assert (g.shape, g.stride(), g.requires_grad) == (e.shape, e.stride(), e.requires_grad)
            # (the base's grad_fn is the write-back's copy; the view's is regenerated from its new layout)
            assert type(got[-1].grad_fn) is type(expected[-1].grad_fn)
    assert not [w for w in caught if issubclass(w.category, dealias.FallbackWarning)]


# (squeeze_ changes the layout of the row only: the others have no dimension of size 1)
@pytest.mark.parametrize(
    "view, change", [(v, c) for v in VIEWS for c in LAYOUT_CHANGES if v == "row" or not c.startswith("squeeze")]
)
def test_layout_change_before_a_write_that_brings_grad(view, change):
    _check(_program(VIEWS[view], LAYOUT_CHANGES[change], "both"), "torch")


def test_a_read_after_the_change_is_eagers():
    _check(_program(VIEWS["movedim"], LAYOUT_CHANGES["transpose_"], "read"), "torch")


@pytest.mark.inductor
def test_layout_change_before_a_write_that_brings_grad_fused():
    _check(_program(VIEWS["row"], LAYOUT_CHANGES["t_"], "both"), "inductor")


def test_layout_change_before_a_write_that_brings_grad_default_executor():
    _check(_program(VIEWS["column"], LAYOUT_CHANGES["as_strided_"], "both"), "tiered")
