"""Writes autograd does not see (under no_grad, through detach() or a dtype view) and views made under no_grad,
compiled (no eager fallback) and compared with eager: outputs, inputs after the call, requires_grad, grad_fn
presence, gradients of every leaf, eager's errors; first and cached call. (Writes of the caller's tensors, what
eager saves of them and their version counters: test_autograd_writes_callers.py.)"""

from __future__ import annotations

import warnings

import pytest
import torch
from autograd_harness import assert_compiled_like_eager, non_leaf
from harness import AddsItsInput

import dealias
from dealias.runtime.verify import compare_call
from dealias.tools.fuzz import _compare_grads


def _leaf(*shape):
    def make():
        g = torch.Generator().manual_seed(0)
        return (torch.randn(*shape, generator=g, requires_grad=True),)

    return make


def no_grad_write_then_read(x):
    y = x + 2
    with torch.no_grad():
        y.add_(2)  # invisible to autograd in eager: y keeps its history
    return (x * 2 + y).sum()


def no_grad_write_returned(x):
    y = x * 3
    with torch.no_grad():
        y.mul_(2)
    return y


def grad_write_then_no_grad_write(x):
    x.index_fill_(0, torch.tensor([1]), 0.25)
    with torch.no_grad():
        x.zero_()
    return (x,)


def no_grad_write_then_grad_write(x):
    with torch.no_grad():
        x.mul_(2)
    x.mul_(3).add_(1)  # eager: x's history is these writes on x's history before the no_grad write
    return x * 3


def interleaved(x):
    y = x * 2
    with torch.no_grad():
        y[0] = 7.0
    y.mul_(3)
    with torch.no_grad():
        y[1].zero_()
    return y, x.sin()


def no_grad_write_of_a_view_read_by_a_view(x):
    y = x * 2
    v = y[:, 1]
    with torch.no_grad():
        y.t()[0].fill_(-1)
    return v * y[1]


def view_made_under_no_grad(x):
    with torch.no_grad():
        v = x.t()
    return x * 2 + v.t()  # eager's v is a leaf that requires grad: no gradient reaches x through it


def no_grad_view_returned(x):
    with torch.no_grad():
        v = x[0]
    return v, x * 2


def view_of_no_grad_view_under_no_grad_returned(x):
    with torch.no_grad():
        v = x.t()
        w = v[1]
    return w, v.sum()


def detach_write(x):
    x.detach().add_(1)  # the values change, the history does not
    return x * x


def dtype_view_write(x):
    x.view(torch.int32).bitwise_xor_(1)
    return x * x


def leaf_written_under_no_grad_then_read(p):
    with torch.no_grad():
        p.add_(1)
    return p * p  # the gradient reaches the leaf p


def leaf_detach_write(p):
    p.detach().mul_(2)
    return p.sum() * p


def draw_into_a_transpose(x):
    y = x * 2
    y.t().bernoulli_(0.5)  # (drawn where eager draws; the draw's backward sends zeros to what y was)
    return y * x, x.t().clone().uniform_()


def rrelu_in_training(x):
    # rrelu_with_noise writes its noise: run as eager's op on a copy, whose backward reads the drawn noise (the
    # functional form's derivative reads the noise before the draw)
    return torch.nn.functional.rrelu(x - 0.5, training=True), torch.nn.functional.rrelu_(x * 2, training=True)


def factory_of_a_grad_input_saved_then_written(p):
    z = torch.zeros_like(p) + 1  # requires no grad: sin saves nothing eager checks, and z.mul_ raises nowhere
    y = z.sin()
    z.mul_(2)
    return y, z * p


def orthogonal_init(w):
    torch.nn.init.orthogonal_(w)  # (new_empty, normal_, linalg_qr, then `q *= ph`: a write of what qr made)
    return w


CASES = [
    (no_grad_write_then_read, non_leaf(3)),
    (no_grad_write_returned, non_leaf(3)),
    (grad_write_then_no_grad_write, non_leaf(2, 3)),
    (no_grad_write_then_grad_write, non_leaf(2, 3)),
    (interleaved, non_leaf(2, 3)),
    (no_grad_write_of_a_view_read_by_a_view, non_leaf(3, 3)),
    (view_made_under_no_grad, non_leaf(2, 3)),
    (no_grad_view_returned, non_leaf(2, 3)),
    (view_of_no_grad_view_under_no_grad_returned, non_leaf(2, 3)),
    (detach_write, non_leaf(2, 3)),
    (dtype_view_write, non_leaf(2, 3)),
    (leaf_written_under_no_grad_then_read, _leaf(2, 3)),
    (leaf_detach_write, _leaf(2, 3)),
    (draw_into_a_transpose, _leaf(3, 4)),
    (factory_of_a_grad_input_saved_then_written, _leaf(3)),
    (orthogonal_init, _leaf(3, 4)),
    (rrelu_in_training, _leaf(3, 4)),
]


@pytest.mark.parametrize("fn, make_args", CASES, ids=[c[0].__name__ for c in CASES])
def test_compiled_and_equal_to_eager(fn, make_args):
    assert_compiled_like_eager(fn, make_args)


def test_history_kept_in_the_functional_graph():
    # Structure: the no_grad write's value and the history before it are joined by keep_history, and the
    # executor runs the op under grad mode on.
    jf = dealias.jit(no_grad_write_then_read)
    jf(*non_leaf(3)())
    assert "keep_history" in "\n".join(str(t) for t in dealias.last_traces(jf))


# Eager raises for these (at the op, when the view's grad_fn is read, or at backward): dealias runs the graph
# eagerly so the same error comes at the same moment.
def no_grad_view_written_with_grad(x):
    with torch.no_grad():
        v = x[0]
    v.add_(1)
    return v


def no_grad_view_read_after_its_base_was_written(x):
    with torch.no_grad():
        v = x[0]
        x.mul_(2)
    return v * 2


def no_grad_view_returned_after_its_base_was_written(x):
    with torch.no_grad():
        v = x[0]
    x.mul_(2)
    return v


def value_requiring_grad_written_through_detach(x, w):
    d = x.detach()
    d.add_(w)  # eager: d now has w's history; a view replayed from x cannot
    return d * 2, x * 3


def saved_then_written_under_no_grad(x):
    y = x * 1
    z = y.sin()  # saves y
    with torch.no_grad():
        y.add_(1)
    return z  # backward raises "modified by an inplace operation"


def no_grad_view_of_a_plain_tensor_whose_base_comes_to_require_grad(x):
    t = torch.full_like(x, 3.0)
    with torch.no_grad():
        v = t.reshape(-1)  # t does not require grad yet
    t.copy_(x)  # now it does, written with grad on: eager raises reading v's grad_fn (fuzz seed 978112)
    return v


@pytest.mark.parametrize(
    "fn",
    [
        no_grad_view_written_with_grad,
        no_grad_view_read_after_its_base_was_written,
        no_grad_view_returned_after_its_base_was_written,
        saved_then_written_under_no_grad,
        no_grad_view_of_a_plain_tensor_whose_base_comes_to_require_grad,
    ],
)
def test_eagers_autograd_errors_kept(fn):
    jf = dealias.jit(fn)
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            assert compare_call(fn, jf, non_leaf(2, 3)()) is None
            assert _compare_grads(fn, jf, non_leaf(2, 3)) is None


def no_grad_view_of_a_plain_tensor_used_with_grad(x):
    t = torch.full_like(x, 3.0)
    with torch.no_grad():
        v = t.reshape(-1)
    v.add_(1)  # with grad on, but nothing requires grad: eager accepts it
    t.add_(1)
    return v, v * x.reshape(-1)


def test_no_grad_view_of_a_tensor_that_does_not_require_grad_is_compiled():
    assert_compiled_like_eager(no_grad_view_of_a_plain_tensor_used_with_grad, non_leaf(2, 3))


def test_value_requiring_grad_written_through_detach_runs_eagerly():
    def make():
        g = torch.Generator().manual_seed(0)
        return torch.randn(3, generator=g, requires_grad=True) * 1, torch.randn(3, generator=g, requires_grad=True)

    assert_compiled_like_eager(value_requiring_grad_written_through_detach, make, compiled=False)


# Found by the autograd fuzzer (seeds 101693, 101794, 102994).
def overwritten_with_grad_on(x):  # seed 101693
    with torch.no_grad():
        c = x.new_full(x.shape, 0.25)
    y = x.clone()
    y.copy_(c)  # eager's y still requires grad (CopyBackwards, a zero gradient to x)
    return y


def overwritten_history_gets_zeros(x, y):  # seed 1032924
    v = AddsItsInput.apply(x)[1:].clone()
    v.copy_(y)  # eager's copy_ sends v's old value a zero gradient: AddsItsInput's backward runs, x gets x
    return v


def test_overwritten_history_gets_eagers_zero_gradient():
    def make():
        g = torch.Generator().manual_seed(0)
        return torch.randn(2, 3, generator=g, requires_grad=True) * 1, torch.randn(3, generator=g, requires_grad=True)

    assert_compiled_like_eager(overwritten_history_gets_zeros, make)
    seen = []

    def hooked(x, y):
        v = x * 1
        v.register_hook(lambda g: seen.append(g))  # eager runs it, with zeros
        w = v.clone()
        w.copy_(y)
        return w

    for f in (hooked, dealias.jit(hooked)):
        x, y = make()
        f(x, y).sum().backward()
    assert len(seen) == 2 and all(torch.equal(g, torch.zeros(2, 3)) for g in seen), seen


def zero_through_an_expanded_view(x):  # seed 101794: eager's backward raises (an overlapping written view)
    v = x.expand(2, *x.shape)
    v.zero_()
    return v


def test_overwritten_tensor_still_requires_grad():
    assert_compiled_like_eager(overwritten_with_grad_on, non_leaf(2, 3))


def test_write_through_an_overlapping_view_with_grad_runs_eagerly():
    assert_compiled_like_eager(zero_through_an_expanded_view, non_leaf(3), compiled=False)


def split_element_returned(x):
    return x.split(2)[0], x.unbind(0)[1].t()


def test_returned_split_elements_are_eagers_multi_output_views():
    # Replayed as split(..)[i] (not as the slice it normalizes to): eager's element refuses an in-place write,
    # and its grad_fn raises once its base was written (seed 102994 returned it after such a write).
    for f in (split_element_returned, dealias.jit(split_element_returned)):
        x = torch.randn(4, 2, 2, requires_grad=True) * 1
        a, b = f(x)
        for out in (a, b):
            with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
                out.mul_(2)
        with torch.no_grad():
            x.add_(1)
        for out in (a, b):
            with pytest.raises(RuntimeError, match="its base or another view of its base has been modified"):
                _ = out.grad_fn
