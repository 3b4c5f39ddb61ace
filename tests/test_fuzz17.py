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
    monkeypatch.setattr(tiers, "measure", lambda tier, run, leaves: (run(leaves), 1.0 if tier == "fused" else 2.0))
    jitted = dealias.jit(_written)
    for _ in range(3):
        z_eager, x_eager = _neg_bit_input()
        expected = _written(x_eager)
        z, x = _neg_bit_input()
        got = jitted(x)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(z, z_eager)
