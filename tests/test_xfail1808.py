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
from harness import Ident

import dealias
from dealias.runtime.verify import compare_call
from dealias.tools.fuzz import _compare_grads

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
        Ident.apply(x0)  # b and v are the second piece's inputs, neither requiring grad
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


# -- eager's warnings of a write into a tensor that repeats its memory -----------------------------------------------
# Such a write runs as an eager island (ir/island.py), eager's kernel on a copy of the memory: called as an aten
# OpOverload, the kernel's C++ deprecation warning went to stderr, not to Python's warnings where eager's goes.


def put_into_expanded(x, i, v):
    y = x * 1
    y.expand(4, 3).index_put_((i,), v)  # (eager: "Use of index_put_ on expanded tensors is deprecated")
    return y


def fill_into_expanded(x, i):
    y = x * 1
    y.expand(3, 4).index_fill_(0, i, 1.0)
    return y


WARNING_CASES = {
    "index_put_": (put_into_expanded, lambda: (torch.zeros(1, 3), torch.tensor([1]), torch.ones(3))),
    "index_fill_": (fill_into_expanded, lambda: (torch.zeros(3, 1), torch.tensor([1]))),
}


def _warnings_of(f, args, action):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action)
        warnings.simplefilter("ignore", dealias.FallbackWarning)
        out = f(*args)
    return out, [
        (w.category, str(w.message), w.filename, w.lineno) for w in caught if "expanded tensors" in str(w.message)
    ]


@pytest.mark.parametrize("executor", ["torch", "tiered", pytest.param("inductor", marks=pytest.mark.inductor)])
@pytest.mark.parametrize("case", WARNING_CASES)
def test_a_write_into_an_expanded_tensor_warns_as_eager(case, executor):
    fn, make = WARNING_CASES[case]
    jf = dealias.jit(fn, executor=executor)
    for call in range(2):
        expected, eager_warnings = _warnings_of(fn, make(), "always")
        got, jit_warnings = _warnings_of(jf, make(), "always")
        torch.testing.assert_close(got, expected)
        if executor == "tiered":  # (its graph tier, dynamo's graph, warns at the graph module's line)
            eager_warnings, jit_warnings = ([w[:2] for w in ws] for ws in (eager_warnings, jit_warnings))
        assert len(eager_warnings) == 1 and jit_warnings == eager_warnings, call


def test_the_warning_filter_decides_as_for_eagers():
    # The default action gives a warning once per line (its module's registry): once eager's call gave it, dealias's
    # calls give it no more, as eager's next calls would not; dealias's first call gives it, as eager's; "error"
    # raises it.
    fn, make = WARNING_CASES["index_put_"]
    jf = dealias.jit(fn, executor="torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jf(*make())  # (compiled)
    for calls in ([fn, jf, jf], [jf, jf, fn]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            for f in calls:
                f(*make())
        assert len([w for w in caught if "expanded tensors" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with pytest.raises(UserWarning, match="index_put_ on expanded tensors"):
            jf(*make())
