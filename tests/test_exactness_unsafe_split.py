"""Exactness against eager for unsafe_split and unsafe_chunk elements (issue 13): tensors of their own on their
input's memory, not autograd views, with or without autograd, written, re-strided in place or split again; each
test one root cause, run on a first and on cached calls."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import check

import dealias
from dealias.runtime.verify import compare_call


def write_through_unsafe_chunk(x):
    a, b = x.unsafe_chunk(2)
    a.mul_(2)  # the input's memory: eager's unsafe_chunk elements share it, without being autograd views
    return x + 1, b * 3


def return_unsafe_elements(x):
    y = x * 1
    a, b = y.unsafe_split_with_sizes([1, 3])
    b.add_(1)
    c, d = x.unsafe_split(2)
    with torch.no_grad():
        e = c.t()  # a view made under no_grad of an element: its base is the element, not x
    return y, a, b, d.t(), e


def whole_unsafe_chunk_of_a_slice(x0, x1):  # fuzz seed 983778
    v1 = x1.narrow(0, 0, 1)
    return v1.unsafe_chunk(2, 0)[0]  # one chunk: the same slice again, not a view in eager (its _base is None)


def test_unsafe_element_equal_to_an_earlier_step_is_rebuilt_at_its_own_step():
    # The element's step was looked up in the output's chain by equality, and the narrow's equal slice came first:
    # unsafe_split was replayed there and the element's own slice after it, which returned a view.
    base = torch.randn(4, 6)
    jf = check(whole_unsafe_chunk_of_a_slice, base, base.t())
    out = jf(base, base.t())
    assert out._base is None and out.data_ptr() == base.data_ptr()


@pytest.mark.parametrize("fn", [write_through_unsafe_chunk, return_unsafe_elements])
def test_unsafe_split_elements_share_their_inputs_memory(fn):
    jf = check(fn, torch.randn(4, 3))  # (alias analysis refused these before: the schema declares no alias)
    if fn is return_unsafe_elements:
        y, a, b, dt, e = jf(torch.randn(4, 3))
        assert not a._is_view() and not b._is_view() and dt._base is not None  # eager's elements are not views
        assert e._base is not None and not e._base._is_view()
        assert a.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()


def self_copy_of_unsafe_element(x0):  # fuzz seed 996505: x.copy_(x) writes nothing but is recorded on the element
    v4 = (x0 * 2).t().squeeze()
    v6 = v4.unsafe_chunk(2, 0)[0]
    v6.copy_(v6)
    return (v4.sin(),)


# (relu_after_unsafe_chunk compiles since the element, only returned, is given its history at the split:
# test_unsafe_split_views.py)
@pytest.mark.parametrize("fn", [write_through_unsafe_chunk, self_copy_of_unsafe_element])
def test_unsafe_split_of_a_tensor_that_requires_grad_then_written_runs_eagerly(fn):
    # Eager's autograd does not see a write through an element as a write of the input: not compiled yet.
    jf = dealias.jit(fn)
    x = torch.randn(4, 4, requires_grad=True) * 1
    with pytest.warns(dealias.FallbackWarning, match="unsafe_split from a tensor that requires grad|saves a tensor"):
        assert compare_call(fn, jf, (x,)) is None
    check(fn, torch.randn(4, 4, requires_grad=True) * 1, allow_fallback=True)


def unsafe_elements_read(x):
    y = x * 1
    p, q = y.unsafe_split(2, 0)
    return p.sin() + q, p, q.t(), x.unsafe_chunk(2, 1)[1]


def unsafe_split_under_no_grad(x):
    with torch.no_grad():
        p, q = x.unsafe_split(2, 0)  # eager's elements do not require grad (they are not views of x)
    return p * 2, q


def test_unsafe_split_of_a_tensor_that_requires_grad_compiles_when_nothing_writes_it():
    # Each element's gradient reaches the input as through split's views; a returned one is rebuilt by
    # unsafe_split itself, a tensor of its own with eager's grad_fn (fuzz seeds 996039, 990053).
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        jf = check(unsafe_elements_read, torch.randn(4, 3, requires_grad=True) * 1)
    s, p, qt, c = jf(torch.randn(4, 3, requires_grad=True) * 1)
    assert not p._is_view() and type(p.grad_fn).__name__.startswith("UnsafeSplit")
    assert not c._is_view() and type(c.grad_fn).__name__.startswith("UnsafeSplit")
    with pytest.warns(dealias.FallbackWarning, match="under no_grad"):
        dealias.jit(unsafe_split_under_no_grad)(torch.randn(4, 3, requires_grad=True) * 1)
    check(unsafe_split_under_no_grad, torch.randn(4, 3, requires_grad=True) * 1, allow_fallback=True)


def unsafe_element_of_input_unsqueezed(x):
    a, b = x.unsafe_split(2)
    a.unsqueeze_(0)
    return a, b


def unsafe_element_of_intermediate_transposed(x):
    a, b = (x * 2).unsafe_split(2)
    a.t_()
    return a, b[0]


@pytest.mark.parametrize("fn", [unsafe_element_of_input_unsqueezed, unsafe_element_of_intermediate_transposed])
@pytest.mark.parametrize("grad", [False, True])
def test_unsafe_split_element_restrided_in_place_is_no_view(fn, grad):
    # Review finding: eager's element is a tensor of its own, its metadata changed in place; dealias returned a
    # view of the input. It is rebuilt by unsafe_split, then re-strided.
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        check(fn, torch.randn(4, 3, requires_grad=grad) * 1)


def two_results_of_one_unsafe_element(x0):  # fuzz seed 987725, shrunk
    v3 = x0.unsafe_chunk(2, 0)[0]
    v5 = v3.movedim(0, -1)
    return v3, v5  # eager: v5._base is v3, an element of its own (with its own version counter)


def test_two_results_of_one_unsafe_element_run_eagerly():
    # Each was rebuilt by an unsafe_split of its own: v5 became a view of another element than the v3 returned,
    # so a later write of v3 (x.copy_(x) in the fuzz program) left v5's views unaware of it.
    x = torch.randn(6, requires_grad=True) * 1
    jf = dealias.jit(two_results_of_one_unsafe_element)
    with pytest.warns(dealias.FallbackWarning, match="two results are views of one unsafe_split element"):
        v3, v5 = jf(x)
    assert v5._base is v3
    # Without autograd too: eager's v5 is a view of the v3 returned (its `_base`, its counter, requires_grad through
    # it once the caller calls v3.requires_grad_()); see test_unsafe_split_views.py
    jf = dealias.jit(two_results_of_one_unsafe_element)
    with pytest.warns(dealias.FallbackWarning, match="two results are views of one unsafe_split element"):
        v3, v5 = jf(torch.randn(6))
    assert v5._base is v3
    check(two_results_of_one_unsafe_element, torch.randn(6), allow_fallback=True)


def split_of_an_unsafe_element(x):  # fuzz seed 988806, shrunk
    return x.unsafe_chunk(2, 2)[0].split(2, 1)[0]


def test_split_of_an_unsafe_element_is_no_view_of_the_input():
    # Rebuilt with the split replayed as made but the element as a slice of x, the result shared x's version
    # counter: a write of x after the call made reading its grad_fn raise, where eager's (a view of an element
    # with a counter of its own) does not. It runs eagerly now.
    for fn in (split_of_an_unsafe_element, dealias.jit(split_of_an_unsafe_element)):
        x = torch.randn(3, 4, 2, requires_grad=True) * 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            v = fn(x)
        with torch.no_grad():
            x.fill_(3.0)
        assert v.grad_fn is not None
