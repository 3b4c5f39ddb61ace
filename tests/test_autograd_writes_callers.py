"""Writes of the caller's tensors under autograd: what eager saves of them (a write after the call, or in the
next graph, makes backward raise as in eager), self-copies and their version counters, writes through members of
an alias group, hooks on bases written through their views, returned bases. Compared with eager on cloned inputs,
first and cached call."""

from __future__ import annotations

import warnings

import pytest
import torch
from autograd_harness import assert_compiled_like_eager, non_leaf
from harness import HalvesGradient, grads_like_eager

import dealias
from dealias.runtime.verify import compare_call
from dealias.tools.fuzz import _compare_grads


def assert_write_after_the_call_breaks_backward(fn, jf):
    """Eager, then the first and a cached call: writing the argument after the call makes backward raise."""
    for f in (fn, jf, jf):
        x = torch.randn(2, 3, requires_grad=True) * 1
        y = f(x)
        x.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


_lin = torch.nn.Linear(3, 3)


def relu_then_linear(x):
    x.relu_()
    return _lin(x)  # saves x for backward: eager's saved tensor is the caller's x


def test_saved_caller_tensor_written_after_the_call_makes_backward_raise():
    # The caller's tensor receives its final value inside the graph, where its last write is, and the linear
    # reads (and saves) the caller's tensor itself: an in-place write after the call, in eager code or another
    # graph, makes backward raise as in eager. Before, the graph saved its own copy and backward went through.
    jf = dealias.jit(relu_then_linear)
    assert_write_after_the_call_breaks_backward(relu_then_linear, jf)
    x = torch.randn(2, 3, requires_grad=True)
    y = jf(x * 1)  # not written afterwards: backward works, as in eager
    y.sum().backward()
    assert x.grad is not None
    assert_compiled_like_eager(relu_then_linear, non_leaf(2, 3))


def written_then_saved_then_function_writes(x, w):
    x.mul_(2)
    s = x.sin()  # saves the caller's x
    x.add_(w * 1)  # the next piece writes x: eager's backward raises
    return s


def test_saved_in_one_graph_written_in_the_next():
    def make():
        g = torch.Generator().manual_seed(0)
        return torch.randn(3, generator=g, requires_grad=True) * 1, torch.randn(3, generator=g, requires_grad=True)

    def with_a_break(x, w):
        x.mul_(2)
        s = x.sin()
        torch._dynamo.graph_break()
        x.add_(w * 1)
        return s

    for fn in (written_then_saved_then_function_writes, with_a_break):
        jf = dealias.jit(fn)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            for _ in range(2):
                assert compare_call(fn, jf, make()) is None
                assert _compare_grads(fn, jf, make) is None


# Found by review.
def relu_of_a_part_returned(x):
    y = torch.where(x > 0, x, x * 2)
    y.narrow(1, 1, 1).relu_()  # autograd saves its result: a view of y
    return y


def relu_of_a_part_then_function(x0):  # fuzz seed 985266, shrunk: the piece before the Function returns v2
    v2 = torch.where(x0 > 0, x0, x0)
    v4 = v2.select(0, -1)
    v2.narrow(1, 1, 1).relu_()
    s = v4.unbind(0)[0].sum(0, keepdim=True)
    HalvesGradient.apply(v2)
    v4.squeeze_()  # in the piece after the Function: moves v2's version counter, and eager's backward raises
    return s


def test_saved_result_of_a_part_of_a_returned_tensor():
    # Eager's relu_ saves its result, a view of y: a write of y after the graph (in the caller's code, or in the
    # piece after a Function) makes its backward raise. dealias's relu saved the value it computed, apart from
    # the y it returns, and backward returned gradients: such a graph now runs eagerly.
    for f in (relu_of_a_part_returned, dealias.jit(relu_of_a_part_returned)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", dealias.FallbackWarning)
            y = f(torch.randn(3, 4, 2, requires_grad=True))
        assert (f is relu_of_a_part_returned) != any("autograd saves its result" in str(w.message) for w in caught)
        with torch.no_grad():
            y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    fn = relu_of_a_part_then_function
    fell_back = grads_like_eager(fn, dealias.jit(fn), lambda: (torch.randn(3, 4, 2, requires_grad=True) * 1,))
    assert any("autograd saves its result" in str(w.message) for w in fell_back)


def saved_then_written_inside_enable_grad(x):
    with torch.enable_grad():
        y = x * 1
        y.mul_(y)  # saves y, then writes it: eager's backward raises
    return y


def test_saved_tensor_probe_under_a_no_grad_caller():
    # The probe asking eager what an op saves ran in the caller's mode (no_grad) and learned nothing.
    x = torch.randn(3, requires_grad=True)
    for f in (saved_then_written_inside_enable_grad, dealias.jit(saved_then_written_inside_enable_grad)):
        arg = x * 1
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            y = f(arg)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def fill_expanded_then_read(x, w):
    x.fill_(2.0)
    return x * w


def overwritten_by_zeros_like(x):
    y = x * 2
    y.copy_(torch.zeros_like(x))  # zeros_like(x) does not require grad: y still does, through copy_
    return y


def test_expanded_input_written_then_read_with_grad():
    # The write-back where the last write is (write_back_now) copied into the expanded tensor: eager's error.
    def make():
        return torch.randn(1).expand(3), torch.randn(3, requires_grad=True)

    assert_compiled_like_eager(fill_expanded_then_read, make)
    assert_compiled_like_eager(overwritten_by_zeros_like, non_leaf(3))


def write_reading_a_detached_alias(x):  # fuzz seed 400640
    d = x.detach()
    x.mul_(d)  # mul_ saves d, which shares x's version counter: eager's backward raises
    return x


def test_write_reading_a_detached_alias_of_itself():
    # The probe asking eager what mul_ saves gave x and d separate memory, so mul_'s own write did not
    # invalidate d there; the probe's arguments sharing memory are now views of one tensor. Compiled: mul_'s
    # result raises eager's error at backward (test_backward_raises.py).
    assert_compiled_like_eager(write_reading_a_detached_alias, non_leaf(2, 3))


def no_grad_view_of_a_copy_made_by_flatten(x):  # fuzz seed 401996
    v = x.expand(2, *x.shape).flatten()  # a copy (an expanded tensor cannot be viewed flat), with grad
    v.fill_(-2.0)
    with torch.no_grad():
        w = v.view(-1)
    return w


def test_no_grad_view_of_a_copy_keeps_requires_grad():
    # The returned view was replayed under no_grad from the base, the copy included, so it lost requires_grad;
    # only the steps eager made under no_grad are replayed so now.
    assert_compiled_like_eager(no_grad_view_of_a_copy_made_by_flatten, non_leaf(4, 6))


def relu_on_the_caller(x):  # fuzz seed 400188, without the Function between
    x.mul_(2)
    x.relu_()  # relu_'s backward saves its result: eager's is the caller's tensor
    return x * 3


def test_in_place_op_saving_its_result_runs_on_the_caller_tensor():
    # Its last write runs in place on the caller's tensor, so the saved result is that tensor: an in-place write
    # after the call makes backward raise, as in eager. Before, the graph saved its own value.
    jf = dealias.jit(relu_on_the_caller)
    assert_write_after_the_call_breaks_backward(relu_on_the_caller, jf)
    assert_compiled_like_eager(relu_on_the_caller, non_leaf(2, 3))
    trace = "\n".join(str(t) for t in dealias.last_traces(jf))
    assert "relu_" in trace.split("# execution trace")[1]


def views_of_a_no_grad_view_input_then_base_written(x):  # fuzz seed 601017, after its graph break
    with torch.no_grad():
        v = x.select(0, 0)
    w = v.as_strided((6,), (1,), v.storage_offset())  # dynamo breaks the graph here: w arrives as an input
    a, b = w.squeeze(), w.t()
    x.fill_(0.25)
    return a, w, b


def test_no_grad_view_arriving_as_an_input():
    # The second graph's input is a view of a view made under no_grad; its views were replayed after the
    # write-back of x, and eager's "view of a view created in no_grad mode ... modified inplace" came from
    # dealias's own epilogue, where eager raises nothing. Such inputs are left to eager.
    def make():
        return (torch.randn(2, 3, 4, requires_grad=True) * 1,)

    fn = views_of_a_no_grad_view_input_then_base_written
    jf = dealias.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dealias.FallbackWarning)
        for _ in range(2):
            assert compare_call(fn, jf, make()) is None


def self_copy_then_split_element_returned(x):  # fuzz seed 700321
    v = x.unbind(0)[1]
    with torch.no_grad():
        v.copy_(v)  # no value changes, but the version counter moves: eager's v raises reading its grad_fn
    return v


def test_self_copy_moves_the_version_counter():
    fn = self_copy_then_split_element_returned
    jf = dealias.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dealias.FallbackWarning)
        for _ in range(2):
            assert compare_call(fn, jf, non_leaf(3, 2)()) is None


def relu_then_self_copy_of_the_caller(x):
    x.relu_()  # saves x itself
    return x * 2


def self_copy_of_a_row(x):
    v = x.narrow(0, 1, 1)
    v.copy_(v)


def test_self_copy_of_a_caller_tensor_moves_its_version_counter():
    # `x.copy_(x)` in a later graph writes no value, but eager's backward then raises: relu_ saved x. Before,
    # dealias dropped the copy and backward ran (fuzz seed 600285).
    jf = dealias.jit(relu_then_self_copy_of_the_caller)
    copy = dealias.jit(self_copy_of_a_row)
    for f, c in ((relu_then_self_copy_of_the_caller, lambda x: x.copy_(x)), (jf, copy), (jf, copy)):
        x = torch.randn(2, 3, requires_grad=True) * 1
        y = f(x)
        c(x)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    # With grad on, autograd records the copy (eager's x gets its grad_fn): the caller's x is written back, with
    # that history; the write-back moves the counter.
    trace = "\n".join(str(t) for t in dealias.last_traces(copy))
    assert "x.copy_(" in trace.split("# execution trace")[1]


def relu_on_an_alias_group_member(x, xt):
    xt[0] = 0.5
    x.relu_()  # the group's last write: eager saves x itself
    return x * 2


def test_in_place_op_saving_its_result_on_an_alias_group_member():
    # x and xt share memory (an alias group): the last write runs in place on the group's base, a view of the
    # caller's memory, so a write after the call makes backward raise as in eager (fuzz seed 601148).
    def make():
        x = torch.randn(3, 3, requires_grad=True) * 1
        return x, x.t()

    fn = relu_on_an_alias_group_member
    jf = assert_compiled_like_eager(fn, make)
    for f in (fn, jf, jf):
        x, xt = make()
        y = f(x, xt)
        x.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def clamp_then_self_copy_in_a_group(x, rows):
    x.clamp_(-1, 1)
    x.copy_(x)  # moves the caller's version counter, not the graph's own copy of it
    rows.add_(rows)
    return x * 1


def test_self_copy_moves_the_callers_counter_only():
    # The version bump went to the clone the graph reads a written input through, so what the graph itself
    # saved was stale and backward raised where eager's runs (fuzz seed 801729).
    def make():
        x = torch.randn(5, 5, requires_grad=True) * 1
        return x, x[::2]

    assert_compiled_like_eager(clamp_then_self_copy_in_a_group, make)


def negate_the_base(chunk, x):
    total = chunk.sum()  # (chunk is read: both are inputs of the graph)
    x.neg_()  # eager moves x's version counter, not chunk's (an unsafe_chunk element has a counter of its own)
    return total


def scale_a_column_of_the_chunk(chunk, x):
    total = x.sum()
    chunk[:, 1].mul_(3)  # moves chunk's counter only
    return total


def test_a_write_moves_the_counter_of_the_member_it_went_through():
    # Inputs sharing memory but not a version counter: the write-back into the alias group's base (a view of the
    # first member) moved the chunk's counter, and x's stayed, so what autograd saved of x before the call passed
    # backward's check (fuzz seed 971090).
    def make():
        x = torch.randn(5, 5)
        return x.unsafe_chunk(2, 1)[0], x

    for fn in (negate_the_base, scale_a_column_of_the_chunk):
        jf = dealias.jit(fn)
        for _ in range(2):
            assert compare_call(fn, jf, make()) is None
    jf = dealias.jit(negate_the_base)
    for f in (negate_the_base, jf, jf):
        chunk, x = make()
        w = torch.ones(5, 5, requires_grad=True)
        y = w * x  # saves x
        f(chunk, x)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    assert dealias.cache_info(jf).misses == 1


def sin_of_a_member_then_sum(x, first):
    first.sin_()
    s = first.sum(0, keepdim=True)
    s.masked_fill_(s > 0, 0.25)
    return s


def test_unused_autograd_bookkeeping_is_not_placed_by_alias_analysis():
    # An in-place op on a view that requires grad left unused nodes in the trace (a clone; an as_strided replay
    # on a lifted constant whose fake shares the input's memory): alias analysis refused the graph (34 of 1,000
    # autograd fuzz programs ran eagerly for it, seed 800004).
    def make():
        x = torch.randn(6, requires_grad=True) * 1
        return x, x[:1]

    assert_compiled_like_eager(sin_of_a_member_then_sum, make)


def hook_on_a_base_written_through_its_view(x):
    v2 = x + 1
    v4 = v2.unsqueeze(2)
    v4.mul_(-2.0)  # v2's value is now computed as a view of the written one: returned, it must be a base
    v2.register_hook(lambda g: g + 1)
    with torch.no_grad():
        v2.clamp_(-1, 1)  # bumps v4's version: its grad_fn is rebuilt through v2's, hook included (fuzz 979374)
    return v4


def test_hook_on_a_base_written_through_its_view():
    assert_compiled_like_eager(hook_on_a_base_written_through_its_view, non_leaf(4, 6))


def base_written_through_its_view(x):
    v2 = x + 1
    v4 = v2.unsqueeze(2)
    v4.mul_(-2.0)
    return v2, v4


def test_returned_base_written_through_its_view_is_not_a_view():
    jf = dealias.jit(base_written_through_its_view)
    for make in (non_leaf(4, 6), lambda: (torch.randn(4, 6),)):
        for _ in range(2):
            assert compare_call(base_written_through_its_view, jf, make()) is None
            v2, v4 = jf(*make())
            assert not v2._is_view() and v4._base is v2  # as eager's


def transposed_copy_filled(x):
    v = x.t().clone()  # strides (1, 6); masked_fill's functional result is contiguous
    v.masked_fill_(v > 0, -2.0)
    return (v,)


def test_returned_whole_write_restrided_with_grad_is_not_a_view():
    # The differentiable restride to eager's layout (permute -> clone -> permute) was returned as it was: a view
    # (fuzz seed 996463, found by the fused executor's autograd fuzz; the torch executor did the same).
    assert_compiled_like_eager(transposed_copy_filled, non_leaf(4, 6))
    (v,) = dealias.jit(transposed_copy_filled)(*non_leaf(4, 6)())
    assert not v._is_view() and v.stride() == (1, 6)
