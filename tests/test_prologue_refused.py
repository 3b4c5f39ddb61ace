"""A fused program checks every index before anything of its call happens (runtime/prologue.py), where eager's ops
raise at the failing one, after the writes before it. A call its prologue refuses runs dynamo's graph eagerly instead
(frontend/backend.py `_eagerly`): eager's writes, eager's error, eager's version counters. (Before, the caller's
tensors came back untouched: `buf.add_(1); return buf[i]` left buf as it was where eager had incremented it.)"""

from __future__ import annotations

import pytest
import torch

import dealias
from dealias import errors

pytestmark = pytest.mark.inductor


def bump_then_read(buf, i):
    buf.add_(1)
    return buf[i]


def scale_then_gather(buf, x, i):
    buf.mul_(2)  # (a running statistic's kind of write: stored by the compiled graph, fused_autograd.py)
    return x[i] * 2


def outcome(fn, make):
    args = make()
    try:
        out = fn(*args)
    except (IndexError, RuntimeError) as e:
        out = ("raised", type(e), str(e).splitlines()[0].split("(")[0].strip())
    return out, args


def same_as_eager(f, jf, make):
    want, eager_args = outcome(f, make)
    got, args = outcome(jf, make)
    if isinstance(want, tuple):
        assert got == want
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for a, b in zip(args, eager_args):
        assert torch.equal(a, b), (a, b)
        assert a._version == b._version, (a._version, b._version)
    return want


def test_writes_before_the_failing_index_are_eagers():
    """(The default's fused tier: test_review11.py.)"""
    jf = dealias.jit(bump_then_read, executor="inductor")
    for idx in ([1, 3], [1, 9], [2, 3], [1, -20]):
        out = same_as_eager(bump_then_read, jf, lambda idx=idx: (torch.zeros(8), torch.tensor(idx)))
        assert isinstance(out, tuple) == (idx in ([1, 9], [1, -20]))
    assert dealias.cache_info(jf).tiers == ("fused",)  # (the refused calls ran eagerly; the program stays)


def test_a_graph_autograd_records():
    jf = dealias.jit(scale_then_gather, executor="inductor")
    x0 = torch.randn(4)
    for idx in ([0, 2], [5, 1], [1, 3]):
        make = lambda idx=idx: (torch.ones(4), x0.clone().requires_grad_(), torch.tensor(idx))  # noqa: E731
        want = same_as_eager(scale_then_gather, jf, make)
        if not isinstance(want, tuple):
            assert jf(*make()).grad_fn is not None
    assert dealias.cache_info(jf).tiers == ("fused",)


def test_the_prologue_marks_its_errors_and_bumps_versions_after_every_check():
    """Structure: a prologue whose graph bumps a version counter (`x.copy_(x)`) does so after its checks, so a
    refused call has moved nothing before the graph runs eagerly (which moves it once, as eager)."""

    def self_copy_then_read(x, buf, i):
        x.copy_(x)
        return buf[i]

    jf = dealias.jit(self_copy_then_read, executor="inductor")
    make = lambda idx: (torch.ones(3), torch.arange(4.0), torch.tensor(idx))  # noqa: E731
    same_as_eager(self_copy_then_read, jf, lambda: make([1]))
    same_as_eager(self_copy_then_read, jf, lambda: make([7]))
    program = dealias.cache_info(jf)
    assert program.tiers == ("fused",)
    e = IndexError("x")
    errors.mark_refused(e)
    assert errors.refused(e) and not errors.refused(IndexError("y"))


def put_after_a_write(buf, x, i, v):
    buf.add_(1)
    x.index_put_((i,), v)  # (v float64 into float32 x: eager's kernel raises, after buf's write)
    return x.sum()


def test_a_program_raising_eagers_kernel_error_makes_eagers_writes_first():
    """runtime/kernel_checks.py's raising program (eager's kernel rejects these dtypes at every call) raised before
    any write: buf came back untouched where eager had incremented it."""
    jf = dealias.jit(put_after_a_write, executor="inductor")

    def make():
        return torch.zeros(3), torch.zeros(4), torch.tensor([1]), torch.ones(1, dtype=torch.float64)

    for _ in range(2):
        want, eager_args = outcome_any(put_after_a_write, make)
        got, args = outcome_any(jf, make)
        assert got == want and want[0] == "raised"
        for a, b in zip(args, eager_args):
            assert torch.equal(a, b) and a._version == b._version
    assert dealias.cache_info(jf).tiers == ("fused",)  # (the raising program: kernel_checks.py)


def outcome_any(fn, make):
    args = make()
    try:
        return fn(*args), args
    except RuntimeError as e:
        return ("raised", str(e).splitlines()[0]), args


# ---- the torch executor: a bounds check moved before the first write --------------------------------------------


def read_then_write(x, cache, c, v):
    pos = torch.arange(2) + c
    c.add_(2)  # (eager writes the count before the read below raises)
    g = x.gather(1, pos.unsqueeze(0).expand(2, 2))
    cache.index_copy_(0, pos, v)
    return g * 1


@pytest.mark.parametrize("executor", ["torch", "inductor"])
def test_a_check_moved_before_the_first_write_leaves_eagers_writes(executor):
    """The torch executor checks these positions before `c.add_(2)` (ir/checks.guard_index_writes): its error, with
    nothing observable before it in the graph, is marked, and the graph runs eagerly (the count moved, as eager)."""
    jf = dealias.jit(read_then_write, executor=executor)
    for c in (0, 4, 3):
        make = lambda c=c: (torch.arange(10.0).view(2, 5), torch.zeros(5), torch.tensor(c), torch.tensor([1.0, 2.0]))  # noqa: E731
        same_as_eager(read_then_write, jf, make)
    assert dealias.cache_info(jf).misses == 1


CALLS: list[int] = []


@torch.library.custom_op("prologue_refused::counted", mutates_args=())
def counted(x: torch.Tensor) -> torch.Tensor:
    CALLS.append(1)
    return x + 1


@counted.register_fake
def _(x):
    return torch.empty_like(x)


def count_then_write(x, cache, c, v):
    y = counted(x)  # (an effect before the check: the graph is not run again after it)
    pos = torch.arange(2) + c
    c.add_(2)
    cache.index_copy_(0, pos, v)
    return y


def test_a_check_after_an_effect_does_not_run_the_graph_again():
    jf = dealias.jit(count_then_write, executor="torch")
    for c, raises in ((0, False), (4, True)):
        calls = []
        for fn in (count_then_write, jf):
            CALLS.clear()
            args = (torch.ones(2), torch.zeros(5), torch.tensor(c), torch.tensor([1.0, 2.0]))
            try:
                fn(*args)
            except IndexError:
                assert raises
            calls.append(len(CALLS))
        assert calls == [1, 1], calls
