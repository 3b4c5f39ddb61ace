"""A graph whose tracing fails where eager raises too runs eagerly on copies to tell (eager_runs.raises_in_eager):
that run must not print fx's traceback to stderr (a lazy graph module's forward is its __call__, which prints it),
as eager prints nothing. Found by fuzz seed 1800147 (call 3, arguments at an odd storage offset)."""

import torch
from harness import Ident

import dealias


def program(x0, x1):
    v2 = torch.view_as_complex(x1)
    torch.neg(v2, out=v2)
    x0.mul_(2)
    return (v2,)


def _args(offset):
    base = torch.arange(24.0 + offset)[offset:].view(3, 4, 2)
    return base, base[:1]


def test_eager_error_check_prints_no_traceback(capfd):
    jitted = dealias.jit(program, executor="torch")
    results = []
    for offset in (0, 0, 1):
        args, eager_args = _args(offset), _args(offset)
        try:
            expected = program(*eager_args)
        except RuntimeError as e:
            expected = e
        try:
            got = jitted(*args)
        except RuntimeError as e:
            got = e
        if isinstance(expected, Exception):
            assert isinstance(got, Exception) and str(got).splitlines()[0] == str(expected).splitlines()[0]
        else:
            assert not isinstance(got, Exception), (offset, got)
            torch.testing.assert_close(got, expected)
            torch.testing.assert_close(args[0], eager_args[0])
        results.append(isinstance(expected, Exception))
    assert results == [False, False, True]  # the third call raises in eager
    assert "Call using an FX-traced Module" not in capfd.readouterr().err


def _split_program(x0):
    v3 = x0 * 2
    v5 = v3.new_zeros((1, 3))
    v7 = v5.movedim(0, -1)
    Ident.apply(x0)  # (the graph is split here: v5 and v7 are the second piece's inputs)
    v7.transpose_(0, 1)  # a layout change while v5 does not require grad...
    v5.mul_(v3)  # ...then a write that makes it require grad
    return v5, v7


# fuzz seed 1808283: the epilogue set v7's layout (as_strided_) with grad on after the write-back that made its
# base require grad, and autograd refused it; eager changed it before the write (tests/test_xfail1808.py).
def test_layout_change_before_a_write_that_brings_grad():
    x = torch.randn(1, 3, requires_grad=True)
    expected = _split_program(x * 1)
    got = dealias.jit(_split_program, executor="torch")(x * 1)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
        assert (g.stride(), g.requires_grad) == (e.stride(), e.requires_grad)
