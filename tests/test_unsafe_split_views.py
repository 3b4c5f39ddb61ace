"""`unsafe_split` / `unsafe_chunk` elements eager's autograd does not treat as views, where the graph compiles
now: a split whose elements nothing uses (its tensor written afterwards: eager's program is the same without
it), and a split of an element returned (the element, a tensor of its own, is the view's base: both steps are
replayed as eager made them). Against eager on fresh arguments, first and cached call: outputs (requires_grad,
grad_fn, is-view, `_base` kind), inputs, aliasing, version counters, gradients; and no fallback (held-out fuzz
seeds 1201151, 1203820, 1202781, 1202968, 1204309); an element only returned, whose memory other tensors
wrote after the split: eager's keeps the history it had at the split (gradops.attach_history), or none, made under
no_grad (seeds 1204075, 1204517, 1202333). A split whose elements are read after a write of its memory still runs
eagerly, as eager's autograd keeps their histories apart."""

from __future__ import annotations

import pytest
import torch
from harness import grads_like_eager

import dealias


def _rg(*shapes):
    def make():
        g = torch.Generator().manual_seed(3)
        return tuple(torch.randn(*s, generator=g, requires_grad=True) * 1 for s in shapes)

    return make


def _plain(*shapes):
    def make():
        g = torch.Generator().manual_seed(4)
        return tuple(torch.randn(*s, generator=g) for s in shapes)

    return make


def element_unused_then_written(x0, x1):  # fuzz seed 1201151
    x0.index_fill_(0, torch.tensor([5]), -2.0)
    v5 = x1.unsafe_chunk(2, 0)[0]
    x0.neg_()
    x1.add_(x1.roll(1, 0))
    v9 = torch.where(x1 > 0, v5, x1)  # noqa: F841 - computed and dropped, as the fuzz program does
    return (x0, x1)


def element_read_for_its_metadata_then_written(x0):
    v2 = x0.unsafe_chunk(2, 1)[0]
    z = v2.new_zeros(v2.shape)
    x0[:, 1] = 1.5
    return (x0 * 2, z)


def split_of_an_element_returned(x0):  # fuzz seed 1202771 (no autograd): v9's base is v2, both returned
    v1 = x0.t()
    v2 = v1.unsafe_chunk(2, 0)[0]
    v1[2:] = 0.25
    v9 = v2.unbind(0)[2]
    return (v9, v2, v1)


def split_of_an_element_written_through(x0):  # fuzz seed 1204309 (no autograd)
    v2 = x0.unsafe_chunk(2, 0)[0]
    v4 = v2.chunk(2, 0)[-1]
    v4.zero_()
    return (x0[1:].narrow(0, 2, 1), v4)


def split_of_an_element_with_grad(x0):
    e = x0.unsafe_chunk(2, 0)[0]
    return (e.split(1, 0)[0], x0 * 3)


def element_returned_after_a_write_of_its_input(x0):  # fuzz seeds 1204075, 1204517
    e = x0.unsafe_chunk(2, 0)[0]
    x0.index_fill_(0, torch.tensor([0]), 1.5)  # eager's e keeps UnsafeSplitBackward to x0 before this write
    return (e,)


def element_returned_with_its_input_after_a_read_write(x0):
    e = x0.unsafe_chunk(2, 0)[0]
    x0.mul_(3)  # (x0's gradient goes through mul_, e's does not)
    return (e, x0)


def element_returned_after_a_no_grad_write(x0):
    e = x0.unsafe_chunk(2, 0)[0]
    with torch.no_grad():
        x0.fill_(1.0)
    return (e, x0)


def element_of_an_intermediate_returned_after_a_write(x0):
    y = x0 * 2
    e = y.unsafe_chunk(2, 0)[0]
    y.mul_(y)
    return (e, y)


def element_of_a_member_returned_after_a_write_of_the_group(x0, v):
    e = v.unsafe_chunk(2, 0)[0]
    x0.mul_(2)
    return (e,)


def element_made_under_no_grad_returned_after_a_write(x0):  # fuzz seed 1202333: no history, not a view
    with torch.no_grad():
        v2 = x0.unsafe_chunk(2, 0)[0]
    x0[2] = 1.5
    return (v2,)


def relu_after_unsafe_chunk(x0):  # fuzz seed 997604: relu_, the last write, runs in place on the caller's x0
    v1 = x0.reshape(-1)
    v2 = x0.unsafe_chunk(2, 1)[0]
    v1.relu_()
    return (v2,)


def _group():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, generator=g, requires_grad=True) * 1
    return (x, x[2:])


CASES = [
    (element_returned_after_a_write_of_its_input, _rg((6,))),
    (element_returned_with_its_input_after_a_read_write, _rg((6, 2))),
    (element_returned_after_a_no_grad_write, _rg((6,))),
    (element_of_an_intermediate_returned_after_a_write, _rg((4, 3))),
    (element_of_a_member_returned_after_a_write_of_the_group, _group),
    (element_made_under_no_grad_returned_after_a_write, _rg((6,))),
    (relu_after_unsafe_chunk, _rg((4, 4))),
    (element_unused_then_written, _rg((6,), (1,))),
    (element_read_for_its_metadata_then_written, _rg((3, 4, 2))),
    (split_of_an_element_written_through, _plain((6, 3))),
    (split_of_an_element_with_grad, _rg((4, 3))),
]


def _facts(outs):
    def history(t):
        try:
            return "leaf" if t.grad_fn is None else "grad_fn"
        except RuntimeError as e:
            return f"raises: {str(e)[:40]}"

    return [(t.requires_grad, t._is_view(), history(t), t._base is not None and t._base._is_view()) for t in outs]


@pytest.mark.parametrize("fn,make", CASES, ids=[f.__name__ for f, _ in CASES])
def test_like_eager_without_fallback(fn, make):
    jf = dealias.jit(fn, executor="torch")
    assert grads_like_eager(fn, jf, make) == []
    eager_args, jit_args = make(), make()
    eager, got = fn(*eager_args), jf(*jit_args)
    assert _facts(got) == _facts(eager)
    assert [a._version > 0 for a in jit_args] == [a._version > 0 for a in eager_args]
    assert dealias.cache_info(jf).entries >= 1


def element_read_after_a_write(x0):
    e = x0.unsafe_chunk(2, 0)[0]
    x0.mul_(2)
    return (e * 1,)


def test_an_element_read_after_a_write_still_runs_eagerly():
    # Eager's e keeps the history it had at the split (UnsafeSplitBackward to x0 before mul_) and sees mul_'s
    # values: one functional value cannot carry both; the graph runs eagerly, named, with eager's results.
    fn, make = element_read_after_a_write, _rg((4, 3))
    fell_back = grads_like_eager(fn, dealias.jit(fn, executor="torch"), make)
    assert any("unsafe_split" in str(w.message) for w in fell_back)


def no_grad_view_of_an_element_that_came_to_require_grad(x0, w):
    y = x0.detach() * 1
    with torch.no_grad():
        e = y.unsafe_chunk(2, 0)[0]  # (a tensor of its own, no grad)
    e.mul_(w)  # e requires grad now
    with torch.no_grad():
        v = e[1:]  # a no_grad view of a tensor that requires grad...
    e.add_(1)  # ...stale in eager from here
    return (v,)


def split_of_an_element_that_came_to_require_grad(x0, w):
    y = x0.detach() * 1
    with torch.no_grad():
        e = y.unsafe_chunk(2, 0)[0]
    e.mul_(w)
    s = e.split(1, 0)[0]  # a multi-output view of e, which requires grad
    e.add_(1)
    return (s,)


@pytest.mark.parametrize(
    "fn", [no_grad_view_of_an_element_that_came_to_require_grad, split_of_an_element_that_came_to_require_grad]
)
def test_views_of_an_element_made_under_no_grad_are_views_of_it(fn):
    # The element made under no_grad is no autograd view, but, unlike a detached tensor, a write with grad on
    # through it makes it require grad, and views of it are then autograd views of it as any: eager's go stale
    # (their grad_fn raises). Taken for views autograd does not track, they were returned readable, a leaf or
    # with a grad_fn, where eager raises.
    make = _rg((4, 3), (3,))
    jf = dealias.jit(fn, executor="torch")
    grads_like_eager(fn, jf, make)
    assert _facts(jf(*make())) == _facts(fn(*make()))


def split_of_an_element_returned_with_it(x0):
    e = x0.unsafe_chunk(2, 0)[0]
    return (e.split(1, 0)[0], e)


def view_of_an_element_returned_with_it(x0):
    e = x0.unsafe_chunk(2, 0)[0]
    return (e[1:], e)


@pytest.mark.parametrize(
    "fn", [split_of_an_element_returned, split_of_an_element_returned_with_it, view_of_an_element_returned_with_it]
)
def test_two_results_of_one_element_without_autograd(fn):
    # Eager's first result is a view of the element, the second result (or its `_base`): they share its version
    # counter, and once the caller makes the element require grad, the view requires grad through its base and
    # backward reaches it. Rebuilt by an unsafe_split each, the view was one of another element: `_base` not the
    # returned one, its counter its own, requires_grad False and backward raised. Runs eagerly, named.
    make = _plain((5, 5))

    def after(outs):
        view, other = outs[0], outs[1]
        element = other if other._base is None else other._base
        facts = [view._base is element, view._version == element._version]
        view.add_(1)
        facts.append(element._version)
        element.requires_grad_()
        facts.append(view.requires_grad)
        return facts

    jf = dealias.jit(fn, executor="torch")
    grads_like_eager(fn, jf, make)
    for _ in range(2):
        assert after(jf(*make())) == after(fn(*make()))
