"""Findings of the seventeenth fuzzing session (seeds 1820000-1899999, the default path with FUSE_FIRST and the other
executors, both torches), and of its audit by hand of the default path's first call. Each against eager."""

from __future__ import annotations

import pytest
import torch

import dealias
from dealias.frontend import tiers


def _neg_bit_input():
    """A real tensor with a negative bit: its values are its memory's negated (the imaginary part of a conjugate)."""
    z = torch.randn(4, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    x = z.conj().imag
    assert x.is_neg() and not x.is_complex()
    return z, x


def _written(x):
    x.mul_(2)
    return x + 1


def _read(x):
    return (x * 3).sum(0)


@pytest.mark.inductor
@pytest.mark.parametrize("fn", [_written, _read], ids=["written", "read"])
def test_fused_executor_reads_an_input_with_a_negative_bit_as_eager_does(fn):
    # (found by hand: inductor's kernels read the memory as it is, `x + 1` gave `1 - x`, torch.compile's too; such
    # an input now runs on the torch executor)
    z_eager, x_eager = _neg_bit_input()
    expected = fn(x_eager)
    z, x = _neg_bit_input()
    got = dealias.jit(fn, executor="inductor")(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(z, z_eager)  # (the write-back through the bit, for _written)


@pytest.mark.inductor
def test_default_path_with_fused_fastest_on_a_negative_bit_input(monkeypatch):
    # The default executor as users run it: the fused program compiled in the first call and timed on copies; the
    # timing faked so that fused wins wherever it is a candidate.
    monkeypatch.setattr(tiers, "FUSE_FIRST", True, raising=False)
    monkeypatch.setattr(tiers, "measure", lambda tier, run, leaves: (run(leaves), 1e-6 if tier == "fused" else 2e-6))
    jitted = dealias.jit(_written)
    for _ in range(3):
        z_eager, x_eager = _neg_bit_input()
        expected = _written(x_eager)
        z, x = _neg_bit_input()
        got = jitted(x)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(z, z_eager)


def _floor_divide_after_a_write(x, y, z):
    z.add_(1)
    x.floor_divide_(y)
    return x * 2


@pytest.mark.inductor
def test_an_integer_division_by_zero_raises_before_writing_as_eager_does():
    # (found by hand: inductor's kernel raised in its loop, the elements before the zero divisor already stored:
    # x came back half divided; eager raises "ZeroDivisionError" before writing x)
    def args():
        return torch.arange(-3, 3), torch.tensor([1, 0, 2, -1, 0, 3]), torch.zeros(3)

    eager_args, dealias_args = args(), args()
    with pytest.raises(RuntimeError, match="ZeroDivisionError") as eager_error:
        _floor_divide_after_a_write(*eager_args)
    with pytest.raises(RuntimeError) as got:
        dealias.jit(_floor_divide_after_a_write, executor="inductor")(*dealias_args)
    assert str(got.value) == str(eager_error.value)
    for a, b in zip(dealias_args, eager_args):
        assert torch.equal(a, b)


_TRUNCATING_DIVISION = """
import sys
import torch
import dealias
from dealias.frontend import tiers

def f(x, y):
    return torch.div(x, y, rounding_mode="trunc") + 1

if sys.argv[1] == "tiered":  # (the default path: fused compiled in the first call and chosen, timing faked)
    tiers.FUSE_FIRST = True
    tiers.measure = lambda tier, run, leaves: (run(leaves), 1e-6 if tier == "fused" else 2e-6)
jitted = dealias.jit(f, executor=sys.argv[1])
for y in ([1, 2, 3], [1, 2, 3], [1, 0, 3]):
    try:
        print(jitted(torch.tensor([4, -5, 6]), torch.tensor(y)).tolist())
    except RuntimeError as e:
        print(str(e))
"""


@pytest.mark.inductor
@pytest.mark.parametrize("executor", ["inductor", "tiered"])
def test_a_truncating_integer_division_by_zero_raises_and_does_not_stop_the_process(executor, tmp_path):
    # (found by hand: inductor's truncating division has no check, a zero divisor stopped the process with SIGFPE,
    # torch.compile's too; eager raises "ZeroDivisionError")
    import os
    import subprocess
    import sys

    env = {**os.environ, "DEALIAS_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", _TRUNCATING_DIVISION, executor], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.splitlines() == ["[5, -1, 3]", "[5, -1, 3]", "ZeroDivisionError"]


def _one_hot_then_write(x, out):
    out.add_(1)
    return torch.nn.functional.one_hot(x, 4).mul_(3)


@pytest.mark.parametrize("executor", ["torch", "tiered"])
@pytest.mark.parametrize("classes", [[0, 5, 1], [0, -1, 1], [3, 0, 2]], ids=["too-large", "negative", "valid"])
def test_one_hot_checks_its_classes_as_eager_does(executor, classes, monkeypatch):
    # (found by hand: a static trace took one_hot's C++ composite, which skips its checks on fake tensors: rows of
    # zeros where eager raises "Class values must be smaller than num_classes", every executor; the symbolic trace,
    # torch's Python decomposition, asserted them)
    monkeypatch.setattr(tiers, "FUSE_FIRST", True, raising=False)
    jitted = dealias.jit(_one_hot_then_write, executor=executor)
    for _ in range(2):
        eager_args, args = (torch.tensor(classes), torch.zeros(2)), (torch.tensor(classes), torch.zeros(2))
        try:
            expected = _one_hot_then_write(*eager_args)
        except RuntimeError as e:
            with pytest.raises(RuntimeError) as got:
                jitted(*args)
            assert str(e) in str(got.value), (str(e), str(got.value))
        else:
            assert torch.equal(jitted(*args), expected)
        assert torch.equal(args[1], eager_args[1])  # (written before the check, in eager as here)


def _repeat(x, counts):
    return x.repeat_interleave(counts, output_size=4).mul_(2)


@pytest.mark.inductor
@pytest.mark.parametrize("executor", ["inductor", "tiered"])
def test_repeat_interleave_with_output_size_runs_where_its_counts_add_up(executor, monkeypatch):
    # (found by hand: kernel_checks' probe ran the op on zeros, ones, large and rising counts, none adding up to 4,
    # took eager's "allocated size does not match required size" for an error of the metadata, and the fused
    # program raised it at every call; the default path raised from the call that chose fused)
    monkeypatch.setattr(tiers, "FUSE_FIRST", True, raising=False)
    monkeypatch.setattr(tiers, "measure", lambda tier, run, leaves: (run(leaves), 1e-6 if tier == "fused" else 2e-6))
    jitted = dealias.jit(_repeat, executor=executor)
    for call in range(3):
        x, counts = torch.randn(2, generator=torch.Generator().manual_seed(call)), torch.tensor([1, 3])
        torch.testing.assert_close(jitted(x, counts), _repeat(x, counts))


def _cholesky_between_writes(x, a, y):
    x.add_(1)
    r = torch.cholesky(a)
    y.add_(1)
    return r * 2


@pytest.mark.inductor
def test_a_cholesky_that_raises_leaves_the_later_write_undone_as_eager_does():
    # (found by hand: fused, y was written though eager's cholesky raised before y.add_(1); the deprecated op raises
    # on a matrix that is not positive-definite with nothing in its schema to say so)
    try:
        torch.cholesky(torch.eye(1))
    except RuntimeError:
        pytest.skip("torch.cholesky is removed in this torch (2.14)")

    def args():
        return torch.zeros(2), -torch.eye(3), torch.zeros(2)

    eager_args, dealias_args = args(), args()
    with pytest.raises(RuntimeError, match="positive-definite") as eager_error:
        _cholesky_between_writes(*eager_args)
    with pytest.raises(RuntimeError) as got:
        dealias.jit(_cholesky_between_writes, executor="inductor")(*dealias_args)
    assert str(got.value) == str(eager_error.value)
    for a, b in zip(dealias_args, eager_args):
        assert torch.equal(a, b)
