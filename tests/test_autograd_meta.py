"""Autograd through functionalized programs: gradients, saved tensors, views made under no_grad or restricted by
eager (split elements, views of written bases), metadata changes under autograd (test_metadata_mutations.py has
the others)."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from harness import HalvesGradient, check, clone_args, grads_like_eager

import dealias


def _grads(fn, args, wrt):
    out = fn(*args)
    outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
    total = sum((o * torch.linspace(0.5, 1.5, o.numel()).view(o.shape)).sum() for o in outs if o.requires_grad)
    return torch.autograd.grad(total, [args[i] for i in wrt], allow_unused=True)


def check_grads(fn, *args, wrt=(0,)):
    for call in range(2):
        ea, ja = clone_args(args), clone_args(args)
        for a in (ea, ja):
            for i in wrt:
                a[i].requires_grad_()
        expected = _grads(fn, ea, wrt)
        jf = check_grads.cache.setdefault(fn, dealias.jit(fn))
        got = _grads(jf, ja, wrt)
        for e, g in zip(expected, got):
            torch.testing.assert_close(g, e, msg=lambda m, call=call: f"call {call + 1}: {m}")


check_grads.cache = {}


def chain_on_intermediate(x):
    y = x * 2
    y.add_(1).mul_(x).sin_()
    return y


def inplace_on_view_of_intermediate(x):
    y = x * 1.5
    y[0].mul_(3)
    y[:, 1] += y[:, 0]
    return y


def setitem_value_requires_grad(x, w):
    buf = torch.zeros(4, 3)
    buf[1] = w * 2
    buf[2:] = x[:2] * w
    return buf


def relu_inplace(x):
    y = x @ x.t()
    torch.nn.functional.relu(y, inplace=True)
    return y * 2


def write_into_input_copy(x, w):
    x = x.clone()
    x[0] = w.sum()
    x.t()[1].mul_(w[0])
    return x


GRAD_PROGRAMS = [
    (chain_on_intermediate, lambda: (torch.randn(3, 2),), (0,)),
    (inplace_on_view_of_intermediate, lambda: (torch.randn(3, 3),), (0,)),
    (setitem_value_requires_grad, lambda: (torch.randn(3, 3), torch.randn(3)), (0, 1)),
    (relu_inplace, lambda: (torch.randn(3, 4),), (0,)),
    (write_into_input_copy, lambda: (torch.randn(3, 3), torch.randn(3)), (0, 1)),
]


@pytest.mark.parametrize("fn,make,wrt", GRAD_PROGRAMS, ids=[p[0].__name__ for p in GRAD_PROGRAMS])
def test_grads_match_eager(fn, make, wrt):
    check_grads(fn, *make(), wrt=wrt)


def test_non_leaf_input_mutated_keeps_autograd_history():
    def f(x):
        x.mul_(3)
        return x * 2

    w = torch.randn(3, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    out = dealias.jit(f)(w * 1)
    out.sum().backward()
    (we * 1).mul_(3).mul(2).sum().backward()
    torch.testing.assert_close(w.grad, we.grad)


def exp_then_add_(x):
    y = x.exp()  # exp saves its result for backward
    y.add_(1)  # ... which this changes
    return y


def mul_then_add_(x, w):
    h = x * 1
    out = h * w  # mul saves h (for w's gradient)
    h.add_(1)
    return out, h


def mul_then_relu_(x, w):
    h = x * w
    h.relu_()  # relu_ saves its own result; mul saved x and w, untouched: eager's backward works
    return h


def cholesky_then_scale_(a):
    factor = torch.linalg.cholesky(a)  # saves its result (one of two: linalg_cholesky_ex returns info too)
    factor.mul_(2)
    return factor


def topk_then_shift_(x):
    values, indices = x.topk(2, dim=1)  # saves the indices it returns
    indices.add_(1)
    return values, indices


def _positive_definite():
    m = torch.randn(4, 4)
    return (m @ m.mT + torch.eye(4)).requires_grad_()


SAVED_THEN_WRITTEN = [
    (exp_then_add_, lambda: (torch.randn(3, requires_grad=True),)),
    (mul_then_add_, lambda: (torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True))),
    # over the 16 MB a probe on real zeros may take: asked on meta tensors
    (exp_then_add_, lambda: (torch.randn(1 << 23, requires_grad=True),)),
    # the saved tensor is one result of a multi-output op (each result read goes behind the raising node)
    (cholesky_then_scale_, lambda: (_positive_definite(),)),
    (topk_then_shift_, lambda: (torch.randn(3, 5, requires_grad=True),)),
]


@pytest.mark.parametrize("fn,make", SAVED_THEN_WRITTEN, ids=["exp", "mul", "exp_32MB", "cholesky", "topk"])
def test_modified_by_inplace_raises_at_backward_as_in_eager(fn, make):
    """Eager's backward raises "modified by an inplace operation" when a tensor an op saved for backward was
    written afterwards. dealias finds it when compiling (which tensors each op saves is asked of eager) and
    compiles the graph with a node raising eager's message where backward reaches the op (tests/
    test_backward_raises.py); forward values are eager's."""
    args = make()
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as expected:
        out = fn(*args)
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    jf = dealias.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dealias.FallbackWarning)
        out = jf(*args)
    assert not [w for w in caught if issubclass(w.category, dealias.FallbackWarning)]
    with pytest.raises(RuntimeError) as got:
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    assert str(got.value) == str(expected.value)


def abs_out_then_written(x0):  # autograd fuzz seed 1040693
    with torch.no_grad():
        x0.sin_()
    v2 = torch.ones_like(x0)
    v3 = v2.unsafe_chunk(2, 0)[0]
    torch.abs(v3, out=v3)  # an out= op records no autograd graph: it saves nothing (its probe raises)
    v2.add_(1.5)
    v3.mul_(x0.unsafe_chunk(2, 0)[0])
    return v3


def test_an_out_op_saves_nothing_for_backward():
    jf = dealias.jit(abs_out_then_written)
    assert grads_like_eager(abs_out_then_written, jf, lambda: (torch.randn(6, requires_grad=True) * 1,)) == []


def test_what_eager_cannot_be_asked_about_runs_eagerly(monkeypatch):
    # Where no probe runs (an op with no kernel for zero-filled or meta tensors), "nothing saved" would be a guess:
    # the graph runs eagerly, named.
    from dealias.passes import saved

    def no_probe(*args):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(saved, "_probe", no_probe)
    x = torch.randn(3, requires_grad=True)
    jf = dealias.jit(exp_then_add_)
    with pytest.warns(dealias.FallbackWarning, match="eager cannot be asked what aten.exp.default saves"):
        out = jf(x)
    torch.testing.assert_close(out, exp_then_add_(x), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_saved_tensors_left_alone_still_compile():
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        check_grads(mul_then_relu_, torch.randn(3), torch.randn(3), wrt=(0, 1))


def test_metadata_mutation_of_intermediate_under_autograd():
    def f(x):
        y = x * 2
        y.t_()
        return y[0], y

    check_grads(f, torch.randn(3, 4))


def test_out_with_wrong_dtype_raises_like_eager():
    def f(x, y, o):
        torch.add(x, y, out=o)
        return o

    check(f, torch.randn(3), torch.randn(3), torch.empty(3, dtype=torch.long))


# Found by the fuzzer (seeds 20114, 20151): a view taken under no_grad of a tensor that requires grad, after a
# no_grad write to it. The write cleared requires_grad of the functional value, so the view was not recognized
# as a no_grad view and came back differentiable: wrong gradients. Eager's tensor keeps requires_grad.
def nograd_write_then_nograd_view_returned(x0, x1):
    with torch.no_grad():
        x0[0] = 1.5
    with torch.no_grad():
        v = x0.unbind(1)[1]
    x1.clamp_(-1, 1)
    return (v,)


def nograd_write_of_squeezed_view_then_view_returned(x0, x1):
    x0.mul_(x0)
    v = x1.squeeze()
    with torch.no_grad():
        v.mul_(-2.0)
    with torch.no_grad():
        w = x1.unbind(0)[2]
    return (w, v)


@pytest.mark.parametrize(
    "fn, second",
    [(nograd_write_then_nograd_view_returned, (4, 6)), (nograd_write_of_squeezed_view_then_view_returned, (3,))],
)
def test_no_grad_view_after_no_grad_write_keeps_eagers_gradients(fn, second):
    from dealias.runtime.verify import compare_call
    from dealias.tools.fuzz import _compare_grads

    def make_args():  # non-leaf inputs that require grad, as the fuzzer makes them
        g = torch.Generator().manual_seed(0)
        b0 = torch.randn(3, 4, 2, generator=g, requires_grad=True)
        b1 = torch.randn(*second, generator=g, requires_grad=True)
        return b0 * 1, b1 * 1

    jf = dealias.jit(fn)
    with warnings.catch_warnings():
        # The first is compiled; the second's x0.mul_(x0) makes eager's backward raise, so it runs eagerly.
        warnings.simplefilter("ignore", dealias.FallbackWarning)
        for _ in range(2):
            assert compare_call(fn, jf, make_args()) is None
            assert _compare_grads(fn, jf, make_args) is None


# Found by the fuzzer (seed 31856): a view first read under no_grad was materialized there and the cached
# node served the later read with grad on, so the gradient through it was lost.
def view_read_under_no_grad_first(x0, x1):
    v1 = x1.permute(0, 1)
    with torch.no_grad():
        v1 + v1
    x0.add_(v1)
    return (x0,)


def test_view_read_under_no_grad_then_with_grad_keeps_its_gradient():
    from dealias.tools.fuzz import _compare_grads

    def make_args():  # the same non-leaf tensor twice
        a = torch.linspace(-1, 1, 4).view(2, 2).requires_grad_() * 1
        return a, a

    jf = dealias.jit(view_read_under_no_grad_first)
    for _ in range(2):
        assert _compare_grads(view_read_under_no_grad_first, jf, make_args) is None


def view_read_under_no_grad_first_one_input(x):
    v = x.t()
    with torch.no_grad():
        v * 2
    return v * 3


def test_view_read_under_no_grad_then_with_grad_one_input():
    check_grads(view_read_under_no_grad_first_one_input, torch.randn(2, 3))


def written_view_returned_after_a_no_grad_op(x):
    with torch.enable_grad():
        v = (x * 1).unsqueeze(2)
        v.mul_(-2)  # the intermediate's base is now `reshape(mul)`, returned as `_unsafe_view` of it
    y = x * 3  # the graph's last op runs without grad
    return v.squeeze(2), y


def test_a_returned_intermediate_base_is_made_in_its_own_grad_mode():
    # The `_unsafe_view` returning the base was emitted at the output with no grad mode of its own: it ran in the
    # mode of the op before it (no_grad), so the returned view did not require grad; eager's does.
    with torch.no_grad():
        check(written_view_returned_after_a_no_grad_op, torch.randn(2, 3, requires_grad=True))


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


def written_then_transposed_under_no_grad(x0, x1):  # fuzz seed 989675, shrunk (x1 a view of x0)
    x0 += x0
    y = x1 * 2
    with torch.no_grad():
        x0.t_()  # not recorded: x0's grad_fn stays AddBackward, made for the old layout
    return x0, y


def transposed_under_no_grad_then_written(x):
    x += 1
    with torch.no_grad():
        x.t_()
    x.mul_(2)  # recorded, for the new layout: dealias's one layout change after the write-back cannot give it
    return x


@pytest.mark.parametrize("shape", [(4, 4), (3, 4)])  # (3, 4): eager's backward raises, a gradient of the wrong shape
def test_layout_change_under_no_grad_is_replayed_unrecorded(shape):
    # The layout change was replayed with grad on after the write-back: autograd recorded it, and the gradient
    # reaching x0's leaf came transposed where eager's (whose grad_fn never saw the change) does not.
    def make():
        g = torch.Generator().manual_seed(0)
        x0 = torch.randn(*shape, generator=g, requires_grad=True) * 1
        return x0, x0[::2]

    fn = written_then_transposed_under_no_grad
    jf = dealias.jit(fn)
    assert grads_like_eager(fn, jf, make) == []
    versions = [f(*make())[0]._version for f in (fn, jf)]
    assert versions[0] == versions[1]


def transposed_under_no_grad_then_read(x0, x1):
    x0 += x0
    with torch.no_grad():
        x0.t_()
    return x0, x1 * 2  # eager regenerates x1's grad_fn from x0's new layout


def transposed_under_no_grad_then_viewed(x0, x1):
    x0 += x0
    with torch.no_grad():
        x0.t_()
    return x0[0]  # made for the new layout: its gradient reaches x0's grad_fn made for the old one


def viewed_then_transposed_under_no_grad(x0, x1):  # review finding: a silently transposed gradient
    x0 += 1
    v = x0[0]
    with torch.no_grad():
        x0.t_()  # eager regenerates v's grad_fn from x0's new layout
    return v


def made_then_transposed_under_no_grad(x0, x1):  # fuzz seed 965515: memory the program made, not the caller's
    v = torch.where(x1 > 0, x1, x1).unsqueeze(1) * 1
    with torch.no_grad():
        v.transpose_(0, 1)
    return v.squeeze()  # eager's backward raises: the gradient has the new layout, the grad_fn the old


@pytest.mark.parametrize(
    "fn",
    [
        transposed_under_no_grad_then_written,
        transposed_under_no_grad_then_read,
        transposed_under_no_grad_then_viewed,
        viewed_then_transposed_under_no_grad,
        made_then_transposed_under_no_grad,
    ],
)
def test_use_after_an_unrecorded_layout_change_runs_eagerly(fn):
    # Eager's gradients then come transposed (square) or its backward raises: dealias's functional reads and
    # writes map them by the new layout, so the graph runs eagerly.
    def make():
        x0 = torch.randn(4, 4, requires_grad=True) * 1
        return x0, x0[::2]

    jf = dealias.jit(fn)
    fell_back = grads_like_eager(fn, jf, lambda: make()[:1] if fn is transposed_under_no_grad_then_written else make())
    change = "transpose_" if fn is made_then_transposed_under_no_grad else "t_"
    assert fell_back and f"layout change autograd did not record (aten.{change}.default" in str(fell_back[0].message)


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
    # backward through t reached w where eager's raises (t requires no grad). (abs_out_then_written, where only
    # the element written is used after the write, stays compiled.)
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
