"""Autograd through functionalized programs: gradients, saved tensors, views made under no_grad, metadata and
layout changes under autograd (test_metadata_mutations.py has the others; views eager restricts, split elements and
views of written bases: test_autograd_restricted_views.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import check, clone_args, grads_like_eager

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
