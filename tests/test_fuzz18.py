"""Findings of the eighteenth fuzzing session (seeds 1900000-1969999, the default path with FUSE_FIRST and the other
executors, both torches) and of its probes by hand of the fused executor's values. Each against eager."""

from __future__ import annotations

import pytest
import torch

import dealias


def _values(dtype, seed):
    """Values where a float floor division's ways part: multiples of 0.1 and 0.7 (inexact), infinities, NaN,
    signed zeros, large and tiny magnitudes, and random ones."""
    special = [1.0, -1.0, 0.3, 7.0, -0.7, 1e30, float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 5.0, 1e-30]
    g = torch.Generator().manual_seed(seed)
    rand = (torch.randn(51, generator=g) * 10).tolist()
    return torch.tensor(special + rand, dtype=torch.float64).to(dtype)


def _divisors(dtype, seed):
    special = [0.1, 0.1, 0.1, 0.7, 0.1, 3.0, 3.0, -3.0, 2.0, -0.0, 0.0, -0.1, 0.1]
    g = torch.Generator().manual_seed(seed)
    rand = (torch.randn(51, generator=g) * 2).tolist()
    return torch.tensor(special + rand, dtype=torch.float64).to(dtype)


def _floor_div_mode(x, y):
    return x.div(y, rounding_mode="floor")


def _floor_divide(x, y):
    return torch.floor_divide(x, y)


def _floordiv_operator(x, y):
    return x // y


def _floor_divide_scalar(x, y):
    return x.div(0.1, rounding_mode="floor"), y.floor_divide(-0.7)  # (apart: a sum in half precision rounds once fused)


def _floor_divide_inplace(x, y):
    x.floor_divide_(y)
    return x * 1


def _remainder(x, y):
    return torch.remainder(x, y)


def _remainder_scalars(x, y):
    return x % 0.1, torch.remainder(0.7, y)


def _remainder_inplace(x, y):
    x.remainder_(y)
    return y * 2


def _int_by_float(x, y):
    return x.to(torch.int32).div(0.1, rounding_mode="floor"), x.to(torch.int64) % 0.7


def _same(a, b):
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.isnan(), b.isnan())
        and torch.equal(a.nan_to_num(), b.nan_to_num())
        and torch.equal(a.signbit() & ~a.isnan(), b.signbit() & ~b.isnan())
    )  # (zeros signed as eager's; a NaN's sign is the kernel's)


@pytest.mark.inductor
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "fn",
    [
        _floor_div_mode,
        _floor_divide,
        _floordiv_operator,
        _floor_divide_scalar,
        _floor_divide_inplace,
        _remainder,
        _remainder_scalars,
        _remainder_inplace,
        _int_by_float,
    ],
)
def test_fused_float_floor_division_and_remainder_are_eagers(fn, dtype):
    # (found by hand: inductor lowers a float floor division as floor(a / b) and a remainder as a - b * floor(a / b),
    # eager's kernels start from fmod: `1.0 // 0.1` gave 10 where eager's is 9, `inf // 3` inf where eager's is NaN,
    # `-1.0 % 0.1` 0 where eager's is 1.5e-8; torch.compile's alike)
    def args():
        return _values(dtype, 0), _divisors(dtype, 1)

    eager_args, dealias_args = args(), args()
    expected = fn(*eager_args)
    got = dealias.jit(fn, executor="inductor")(*dealias_args)
    for e, g in zip(
        expected if isinstance(expected, tuple) else (expected,), got if isinstance(got, tuple) else (got,)
    ):
        assert _same(e, g), (e, g)
    for e, g in zip(eager_args, dealias_args):
        assert _same(e, g)  # (the in-place ones' write-back)


@pytest.mark.inductor
def test_fused_remainder_gradients_are_eagers():
    # remainder's backward takes -floor_divide(a, b) for b's gradient: through the fused autograd path's table too
    def fn(x, y):
        return torch.remainder(x * 1, y) * 2

    def args():
        return (
            _values(torch.float32, 0)[:13].nan_to_num(0.0, 0.0, 0.0).clamp(-1e3, 1e3).requires_grad_(),
            _divisors(torch.float32, 1)[:13].abs().clamp(min=0.1).requires_grad_(),
        )

    eager_args, dealias_args = args(), args()
    fn(*eager_args).sum().backward()
    out = dealias.jit(fn, executor="inductor")(*dealias_args)
    torch.testing.assert_close(out, fn(*args()), rtol=0, atol=0)
    out.sum().backward()
    for e, g in zip(eager_args, dealias_args):
        assert torch.equal(e.grad, g.grad), (e.grad, g.grad)


def test_integer_floor_division_keeps_inductors_own_decomposition():
    # (the float decomposition leaves integers to inductor's entry, floor_divide as div(.., "floor"), which inductor
    # lowers: without it the op was left to an ATen fallback kernel inside the fused graph)
    from torch.fx.experimental.proxy_tensor import make_fx

    from dealias.runtime.inductor_fixes import decompositions

    def fn(x, y):
        return torch.floor_divide(x, y), x // 3

    x, y = torch.tensor([-7, 7, 5]), torch.tensor([2, -2, 3])
    gm = make_fx(fn, decomposition_table=decompositions())(x, y)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert targets == {torch.ops.aten.div.Tensor_mode}
    for e, g in zip(fn(x, y), gm(x, y)):
        assert torch.equal(e, g)


@pytest.mark.inductor
def test_default_path_with_fused_fastest_floor_divides_as_eager(monkeypatch):
    # The default executor as users run it: the fused program compiled in the first call and timed on copies; the
    # timing faked so that fused wins wherever it is a candidate.
    from dealias.frontend import tiers

    monkeypatch.setattr(tiers, "FUSE_FIRST", True, raising=False)
    monkeypatch.setattr(tiers, "measure", lambda tier, run, leaves: (run(leaves), 1e-6 if tier == "fused" else 2e-6))
    jitted = dealias.jit(_floor_divide_inplace)
    for call in range(3):
        eager_args = _values(torch.float32, call), _divisors(torch.float32, 1)
        dealias_args = _values(torch.float32, call), _divisors(torch.float32, 1)
        expected = _floor_divide_inplace(*eager_args)
        assert _same(expected, jitted(*dealias_args))
        assert _same(eager_args[0], dealias_args[0])
    assert dealias.cache_info(jitted).tiers == ("fused",)
