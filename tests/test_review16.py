"""Review of the xfail1808 and fuzz17 merges: results that differed from eager's."""

import warnings

import pytest
import torch

import dealias


class _Ident(torch.autograd.Function):  # (dynamo splits the graph here)
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g


def _grads(f, make, weight):
    x, *rest = make()
    out = f(x * 1, *rest)
    (g,) = torch.autograd.grad((out * weight).sum(), x)
    return out.detach(), g


# -- a layout change of an alias group's member that is no view, before a write that brings grad ---------------------
# The group's memory required no grad at the change, so it was replayed unrecorded after the write-backs; but the
# member that is no view is where the write-back through the group's base records autograd's CopySlices, made for
# its old layout: for a square tensor, its gradients came silently transposed.


def _split_program(x0):
    v3 = x0 * 2
    b = v3.new_ones((3, 3)) + torch.arange(9.0).view(3, 3)
    v = b[:, 1:]
    _Ident.apply(x0)  # b and v are the second piece's inputs, neither requiring grad
    b.t_()  # b is no view: its grad_fn is the one the write makes
    v.mul_(v3[:, 1:])
    return b


def _inputs_program(x0, b, v):
    b.t_()
    v.mul_(x0[:, 1:] * 2)
    return b


def _square():
    return (torch.arange(9.0).view(3, 3) + 1).requires_grad_()


def _caller_tensors(view):
    def make():
        if view:
            b = (torch.ones(3, 3) + torch.arange(9.0).view(3, 3)).view(3, 3)
        else:
            b = torch.ones(3, 3) + torch.arange(9.0).view(3, 3)
        return _square(), b, b[:, 1:]

    return make


WEIGHT = torch.arange(9.0).view(3, 3) ** 2


@pytest.mark.parametrize("executor", ["torch", "tiered"])
def test_layout_change_of_a_member_that_is_no_view_split(executor):
    jf = dealias.jit(_split_program, executor=executor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dealias.FallbackWarning)
        for call in range(2):
            expected, got = _grads(_split_program, lambda: (_square(),), WEIGHT), _grads(jf, lambda: (_square(),), WEIGHT)
            for e, g in zip(expected, got):
                torch.testing.assert_close(g, e, msg=f"call {call}")


@pytest.mark.parametrize("views", [(False, True), (True, False)])
def test_layout_change_of_a_member_that_is_no_view_inputs(views):
    # (a call with the member a view, another with it no view: the program of one is not the other's)
    jf = dealias.jit(_inputs_program, executor="torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dealias.FallbackWarning)
        for view in views:
            make = _caller_tensors(view)
            expected, got = _grads(_inputs_program, make, WEIGHT), _grads(jf, make, WEIGHT)
            for e, g in zip(expected, got):
                torch.testing.assert_close(g, e, msg=f"view {view}")
