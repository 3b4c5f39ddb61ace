"""Autograd through functionalized programs, on the views eager restricts: views returned after their base was
written, inputs that are views made under no_grad or split elements (or views a custom Function returned), views
of tensors of their own, and tensors on the memory of unsafe_split elements. Each compared with eager: values,
gradients, which graphs run eagerly, and eager's errors."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from harness import HalvesGradient, grads_like_eager

import dealias


# Views eager forbids reading the grad_fn of once their base is written: made before a write, returned after it.
def no_grad_view_returned_after_a_write(x):  # fuzz seed 996020
    with torch.no_grad():
        v = x.transpose(0, 1)
    x.mul_(2)
    return v, x * 1


def unbind_element_returned_after_a_write(x):  # fuzz seed 996175
    a, b = x.unbind(0)
    x[1:].add_(1)
    return a, x.sum()


def no_grad_view_of_an_input_view_returned_after_a_write(x, y):
    with torch.no_grad():
        v = y[0]
    x.add_(y.sum())  # y is a view of x: its memory is written
    return v


def no_grad_view_returned_after_a_write_of_a_copy(x):
    y = x * 1  # memory of the program's own: its view is made stale after the graph (OutputSlot.stale)
    with torch.no_grad():
        v = y[0]
    y.mul_(2)
    return v


def no_grad_view_of_a_stale_view_made_after_the_write(x0, x1):  # fuzz seed 985561: eager's is not stale
    with torch.no_grad():
        v = x1.reshape(-1)
    x1.zero_()
    with torch.no_grad():
        w = v.unsqueeze(0)
    return x0.chunk(2, 0)[-1], w


def split_of_a_split_element_returned_after_a_write(x0):  # fuzz seed 986327: eager's error names the last split,
    # replayed as made (the first as a plain view), the view made stale after the graph
    v = x0.split(2, 0)[0][::3]
    w = v.chunk(2, 0)[-1]
    x0.masked_fill_(x0 > 0, 0.25)
    return w


def grad_view_of_a_no_grad_view_returned_after_a_write(x0):  # fuzz seed 985253
    v1 = x0.diagonal(0)
    with torch.no_grad():
        v3 = v1.transpose(0, 0)
    v7 = v3.narrow(0, 3, 1).squeeze()  # made with grad on: eager's error names Squeeze
    v1.zero_()
    return v7


def split_element_changed_in_place_then_returned_after_a_write(x0):  # fuzz seed 979715, shrunk
    v1 = x0.chunk(2, 1)[-1]
    with torch.no_grad():
        v1.t_()  # the same object: eager's error still names the split
    x0[0] = 3.0
    return v1


STALE_VIEW_PROGRAMS = [
    (no_grad_view_returned_after_a_write, lambda t: (t(2, 3),), True),
    (unbind_element_returned_after_a_write, lambda t: (t(2, 3),), True),
    (no_grad_view_of_an_input_view_returned_after_a_write, lambda t: (lambda x: (x, x[::2]))(t(4, 3)), True),
    (no_grad_view_returned_after_a_write_of_a_copy, lambda t: (t(2, 3),), True),
    (no_grad_view_of_a_stale_view_made_after_the_write, lambda t: (t(5, 5), t(2, 3)), False),
    (split_of_a_split_element_returned_after_a_write, lambda t: (t(6),), True),  # (OutputSlot.stale)
    (grad_view_of_a_no_grad_view_returned_after_a_write, lambda t: (t(4, 6),), False),
    (split_element_changed_in_place_then_returned_after_a_write, lambda t: (t(5, 5),), False),
]


@pytest.mark.parametrize("fn, make, compiles", STALE_VIEW_PROGRAMS, ids=[p[0].__name__ for p in STALE_VIEW_PROGRAMS])
def test_view_returned_after_its_base_was_written(fn, make, compiles):
    # Eager's returned view raises when its grad_fn is read (its base was written after it was made): made from
    # the caller's tensor before the graph runs, dealias's is left the same way by the call's own writes.

    def make_args():  # non-leaf inputs that require grad
        g = torch.Generator().manual_seed(0)
        return make(lambda *shape: torch.randn(*shape, generator=g, requires_grad=True) * 1)

    jf = dealias.jit(fn)
    fell_back = [str(w.message) for w in grads_like_eager(fn, jf, make_args)]
    assert (not fell_back) if compiles else fell_back, fell_back
    if compiles:
        out = jf(*make_args())
        view = out[0] if isinstance(out, tuple) else out
        with pytest.raises(RuntimeError, match="modified inplace"):
            _ = view.grad_fn


# Inputs eager restricts: a view made under no_grad, a split's element, that requires grad (the code after a graph
# break often gets one). Eager raises when one is written with grad on, and when its grad_fn is read after a write
# of its memory; its gradient goes to the input itself, a leaf.
def restricted_read(v, x):
    return v * 2 + x.sum(), v.t()


def restricted_written_under_no_grad(v, x):
    with torch.no_grad():
        v.mul_(2)
    return x * 1


def restricted_written_with_grad(v, x):  # eager raises
    v.mul_(2)
    return v


def views_of_a_restricted_input(v, x):
    w = v[0]  # with grad on: its gradient reaches v
    with torch.no_grad():
        u = v[1]  # a leaf of its own
    return w * 3, u * 2, w


def restricted_read_after_its_base_written(v, x):  # eager raises
    with torch.no_grad():
        x.add_(1)
    return v * 2


def _no_grad_view_input():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, generator=g, requires_grad=True) * 1
    with torch.no_grad():
        v = x[1:]
    return v, x


def _split_element_input():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, generator=g, requires_grad=True) * 1
    return x.split(2)[0], x


def view_of_a_restricted_input_beside_its_base(v, x):  # fuzz seed 1040411, shrunk
    w = v[0]  # v and x share memory (one alias group): w is replayed from the group's base, not from x's history
    return w * 3, x * 1


RESTRICTED = [
    view_of_a_restricted_input_beside_its_base,
    restricted_read,
    restricted_written_under_no_grad,
    restricted_written_with_grad,
    views_of_a_restricted_input,
    restricted_read_after_its_base_written,
]


@pytest.mark.parametrize("make", [_no_grad_view_input, _split_element_input], ids=["no_grad_view", "split_element"])
@pytest.mark.parametrize("fn", RESTRICTED, ids=[f.__name__ for f in RESTRICTED])
def test_restricted_view_inputs(fn, make):

    jf = dealias.jit(fn)
    fell_back = [str(w.message) for w in grads_like_eager(fn, jf, make)]
    raises = fn in (restricted_written_with_grad, restricted_read_after_its_base_written)
    assert raises or not fell_back, fell_back  # (the others were refused before: "not compiled yet")
    if fn is views_of_a_restricted_input:  # where the gradient goes: eager's no_grad view is a leaf without an
        got = []  # accumulator (its .grad stays None), a split element passes it on to its base
        for f in (fn, jf):
            v, x = make()
            v.retain_grad()
            f(v, x)[0].sum().backward()
            got.append((v.grad, x.grad_fn.next_functions[0][0].variable.grad))
        (ev, eb), (jv, jb) = got
        assert (ev is None) == (jv is None) and torch.equal(eb, jb) if eb is not None else jb is None


def grad_view_of_a_no_grad_view(x0):  # fuzz seed 996000
    with torch.no_grad():
        v1 = x0.select(0, -2)  # a leaf that requires grad
    v6 = v1.unsqueeze(0)  # made with grad on: a grad_fn that ends at that leaf
    return x0 * 1, v6 * 2, v6


def test_view_made_with_grad_on_of_a_no_grad_view_is_returned_as_made():
    # Replayed under no_grad from the no_grad step on, it had no grad_fn; it ran eagerly instead. Now its last step
    # is replayed with grad on (OutputSlot.grad_until).

    def make():
        g = torch.Generator().manual_seed(0)
        return (torch.randn(4, 6, generator=g, requires_grad=True) * 1,)

    fn = grad_view_of_a_no_grad_view
    jf = dealias.jit(fn)
    assert grads_like_eager(fn, jf, make) == []
    v6 = jf(*make())[2]
    assert v6.grad_fn is not None and v6.grad_fn.next_functions[0][0] is None  # (eager's leaf has no accumulator)


def unbind_of_a_chunk_element(x0):  # fuzz seed 989775, shrunk
    return x0.chunk(2, 0)[-1].unbind(2)[1]


def test_split_of_a_split_element_is_rebuilt_by_the_last_split():
    # Rebuilt with only the first split replayed as made, the result was a select of it: after a write of x0,
    # reading its grad_fn raised naming Select where eager's error names Unbind. The last split is replayed now.
    errors = []
    for fn in (unbind_of_a_chunk_element, dealias.jit(unbind_of_a_chunk_element)):
        x0 = torch.randn(3, 4, 2, requires_grad=True) * 1
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            v = fn(x0)
        with torch.no_grad():
            x0[:, :, 0:] = -2.0
        with pytest.raises(RuntimeError) as e:
            _ = v.grad_fn
        errors.append(str(e.value).split(" is a view")[0])
    assert errors[0] == errors[1] == "Output 1 of Unbind"


class _ViewOf(torch.autograd.Function):  # returns a view of its input: eager restricts writes through it
    @staticmethod
    def forward(ctx, x):
        return x[1:]

    @staticmethod
    def backward(ctx, g):
        return torch.cat([torch.zeros_like(g[:1]), g])


def _custom_function_view_input():
    x = torch.randn(3, 4, requires_grad=True) * 1
    return _ViewOf.apply(x), x


@pytest.mark.parametrize("fn", RESTRICTED, ids=[f.__name__ for f in RESTRICTED])
def test_other_restricted_view_inputs_run_eagerly(fn):
    # A view a custom Function returned, requiring grad, is left to eager (the passes track no_grad views and
    # split elements only), and the warning names how eager restricts it.
    jf = dealias.jit(fn)
    fell_back = [str(w.message) for w in grads_like_eager(fn, jf, _custom_function_view_input)]
    assert any("returned by a custom Function" in m for m in fell_back), fell_back


def reshape_of_a_no_grad_view_across_a_break(x0):  # fuzz seed 964718, shrunk
    flat = x0.flatten()  # x0 itself (1-D)
    with torch.no_grad():
        moved = x0.movedim(0, -1)  # requires grad, no grad_fn: its views lead to no history
    x0.as_strided((3,), (1,), x0.storage_offset())  # a dynamo graph break: flat and moved are two inputs after it
    element = flat[3]
    out = moved.reshape(-1)
    HalvesGradient.apply(element)  # (after the reshape: dynamo passes flat first)
    return out


def test_a_returned_view_is_made_from_the_input_it_was_taken_from():
    # After the break, flat and moved (one memory, one layout) are an alias group; the returned view was replayed
    # on the first of them, flat, which has history: the leaf got a gradient where eager's gets none.
    def make():
        return (torch.arange(1.0, 7.0).requires_grad_() * 1,)

    fn = reshape_of_a_no_grad_view_across_a_break
    grads_like_eager(fn, dealias.jit(fn), make)
    for f in (fn, dealias.jit(fn)):
        leaf = torch.arange(1.0, 7.0).requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            out = f(leaf * 1)
        assert torch.autograd.grad(out.sum(), leaf, allow_unused=True) == (None,)


def copy_from_a_no_grad_view_across_a_break(x0, x1):  # fuzz seed 994811, shrunk
    with torch.no_grad():
        v1 = x0.squeeze()  # a view made under no_grad: a leaf that requires grad, with no history
    HalvesGradient.apply(v1 * 1)  # a break: v1 is an input after it, in an alias group with x0 and x1
    x0.copy_(v1)
    return x1


def read_of_a_no_grad_view_input_then_base_written(x0, v):
    y = v * 2  # v is a leaf of its own: no gradient reaches x0's history through it
    x0.mul_(3)
    return y, x0


def _base_and_its_first():
    x0 = torch.arange(1.0, 7.0).requires_grad_() * 1
    return x0, x0[0]


def _base_and_its_no_grad_view():
    x0 = torch.arange(1.0, 7.0).requires_grad_() * 1
    with torch.no_grad():
        v = x0[1:]
    return x0[:5], v


@pytest.mark.parametrize(
    "fn, make",
    [
        (copy_from_a_no_grad_view_across_a_break, _base_and_its_first),
        (read_of_a_no_grad_view_input_then_base_written, _base_and_its_no_grad_view),
    ],
    ids=["copy_across_break", "read_then_write"],
)
def test_a_no_grad_view_input_is_read_through_a_clone_of_its_own(fn, make):
    # A written alias group is read through a clone of its base under autograd (protect_written_inputs); a member
    # made under no_grad was read as a view of that clone, with the base's history: the leaf got a gradient
    # through it where eager's gets none.
    fell_back = grads_like_eager(fn, dealias.jit(fn), make)
    assert not fell_back, [str(w.message) for w in fell_back]  # (compiled, not run eagerly)


def no_grad_split_element_of_a_base_written_with_grad(x0):  # fuzz seed 964875, shrunk
    base = torch.zeros(5, 5).t()
    with torch.no_grad():
        element = base.split(2, 1)[0]  # a view made under no_grad of a tensor that does not require grad yet
    base += x0.cumsum(0)  # it does now: eager's element raises when its grad_fn is read
    return element


def split_element_of_a_base_that_comes_to_require_grad(x0):  # fuzz seed 1040242, shrunk
    base = x0.detach() * 2
    element = base.split(2, 0)[0]  # made with grad on, of a base that does not require grad: restricted anyway
    base.mul_(x0)  # now the base requires grad, and eager raises reading the element's grad_fn
    return element


@pytest.mark.parametrize(
    "fn, shape",
    [
        (no_grad_split_element_of_a_base_written_with_grad, (5, 5)),
        (split_element_of_a_base_that_comes_to_require_grad, (5, 3)),
    ],
    ids=["made_under_no_grad", "made_with_grad"],
)
def test_split_element_of_a_base_that_comes_to_require_grad(fn, shape):
    # Eager restricts a split's element whether it was made under no_grad (dealias took it for an unsafe_split
    # element, which is not an autograd view: seed 964875) or with grad on (dealias tracked only the no_grad case:
    # seed 1040242); once a write with grad on makes the base require grad, reading its grad_fn raises. dealias
    # returned it with requires_grad and a grad_fn of its own (or none).
    errors = []
    for f in (fn, dealias.jit(fn), dealias.jit(fn)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            out = f(torch.arange(float(shape[0] * shape[1])).view(shape).requires_grad_() * 1)
        with pytest.raises(RuntimeError, match="no_grad mode and its base") as e:
            out.grad_fn  # noqa: B018
        errors.append(str(e.value))
    assert errors[1] == errors[0]


def flatten_and_a_view_of_it(x):
    v = x[:, ::3].flatten()  # a copy: a tensor of its own
    return v, v.view(-1)


def a_view_of_a_flatten_first(x):
    v = x[:, ::3].flatten()
    return v.view(2, -1), v


def two_flattens(x):
    a, b = x[:, ::3].flatten(), x[:, ::3].flatten()  # twins: the view is b's, not a's
    return a, b.view(-1)


def detached_and_a_view_of_it(x):
    y = (x * 2).detach()
    return y, y[1:]


def a_view_of_a_detach_of_a_copy(x):
    y = x.t().reshape(-1)  # a copy
    d = y.detach()  # made from it
    return d, d[1:], y  # (the view is made from d, made from y, in turn)


@pytest.mark.parametrize(
    "fn",
    [
        flatten_and_a_view_of_it,
        a_view_of_a_flatten_first,
        two_flattens,
        detached_and_a_view_of_it,
        a_view_of_a_detach_of_a_copy,
    ],
)
def test_a_view_of_a_returned_tensor_of_its_own_is_made_from_it(fn):
    # Each output replayed its chain from the graph's result: the view was one of a second, hidden copy, so a write
    # through it after the call changed that copy's history and counter, not the returned tensor's (fuzz seed
    # 1840127: sin_'s gradient lost, silently).
    def run(f):
        x = torch.randn(5, 5, generator=torch.Generator().manual_seed(0), requires_grad=True)
        outs = f(x * 1)
        view = outs[1] if fn is not a_view_of_a_flatten_first else outs[0]
        with torch.no_grad() if not view.requires_grad else contextlib.nullcontext():
            view.sin_()
        bases = [o._base is p for o in outs for p in outs]
        total = sum((o * (1 + torch.arange(o.numel()).view(o.shape) % 3)).sum() for o in outs)
        grad = torch.autograd.grad(total, x)[0] if total.requires_grad else None
        return bases, [o._version for o in outs], grad

    jf = dealias.jit(fn)
    expected = run(fn)
    for _ in range(2):
        bases, versions, grad = run(jf)
        assert (bases, versions) == expected[:2]
        torch.testing.assert_close(grad, expected[2])


def scale_a_chunk_by_a_tensor_that_requires_grad(w, y):  # autograd fuzz seed 5200115
    t = y + 1
    a, b = t.unsafe_chunk(2, 1)
    a.mul_(w[:, :2])  # eager: a requires grad; t and b, on the same memory, do not (unsafe_chunk makes no views)
    return t, a, b


def scale_the_split_input_by_a_tensor_that_requires_grad(w, y):
    t = y + 1
    a = t.unsafe_chunk(2, 1)[0]
    t.mul_(w)  # eager: t requires grad, a does not
    return t, a


def sum_the_input_after_scaling_a_chunk(w, y):
    t = y + 1
    a = t.unsafe_chunk(2, 1)[0]
    a.mul_(w[:, :2])
    return t.sum() * 2  # eager: requires no grad


@pytest.mark.parametrize(
    "fn",
    [
        scale_a_chunk_by_a_tensor_that_requires_grad,
        scale_the_split_input_by_a_tensor_that_requires_grad,
        sum_the_input_after_scaling_a_chunk,
    ],
)
def test_another_tensor_on_memory_unsafe_split_split_after_a_recorded_write_runs_eagerly(fn):
    # The functional graph has one value for the memory, so every tensor on it came out requiring grad, and a
    # backward through t reached w where eager's raises (t requires no grad). (abs_out_then_written in
    # test_autograd_meta.py, where only the element written is used after the write, stays compiled.)
    caught = grads_like_eager(
        fn, dealias.jit(fn), lambda: (torch.randn(3, 4, 2, requires_grad=True), torch.randn(3, 4, 2))
    )
    assert caught and all("wrote another tensor on it" in str(w.message) for w in caught)


def scale_a_chunk_of_the_callers_tensor(x, w):
    a = x.unsafe_chunk(2, 1)[0]
    a.mul_(w)  # eager: a requires grad, x does not; a's gradient reaches w
    return a.sin()


def scale_a_chunk_passed_in(t, a, w):
    a.mul_(w)  # a: the caller's `t.unsafe_chunk(2, 1)[0]`, not a view of t
    return t * 1


def _chunk_passed_in():
    t = torch.randn(3, 4)
    return t, t.unsafe_chunk(2, 1)[0], torch.randn(3, 2, requires_grad=True)


@pytest.mark.parametrize(
    "fn, make",
    [
        (scale_a_chunk_of_the_callers_tensor, lambda: (torch.randn(3, 4), torch.randn(3, 2, requires_grad=True))),
        (scale_a_chunk_passed_in, _chunk_passed_in),
    ],
)
def test_a_recorded_write_into_callers_memory_unsafe_split_split_runs_eagerly(fn, make):
    # (Found by review.) The first returned a result without grad (its gradient lost) and left x requiring grad;
    # the second returned t requiring grad. Both run eagerly now.
    caught = grads_like_eager(fn, dealias.jit(fn), make)
    assert caught
