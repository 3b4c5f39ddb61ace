"""Python floats that change between calls (issue 39): an LR schedule, a sampler's coefficients, `x * scale`. Each
compiles at most twice (the first value specialized; on a change, a program taking the float as an input) and
gives eager's bits: dtype promotion as eager's wrapped-number float (not a 0-d float64 tensor), signs of zero,
nan and inf, a branch on the float."""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

import dealias

VALUES = [0.5, 1.25, -3.0, 2.0**-20, 7.75, 1e3, -0.125, 3.3, 0.1, 42.0]  # 10 distinct values


def _bits(x: Any) -> Any:
    """What eager's result is, bit for bit: a tensor's dtype, layout and bytes; a float's repr (0.0 vs -0.0, nan)."""
    if isinstance(x, torch.Tensor):
        raw = x.detach().reshape(-1).view(torch.uint8) if x.dtype.is_floating_point else x.detach()
        return (x.dtype, tuple(x.shape), x.stride(), raw.tolist())
    if isinstance(x, (tuple, list)):
        return type(x)(_bits(v) for v in x)
    return repr(x)


def _clone(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def run_values(fn: Callable[..., Any], make_args: Callable[[float], tuple[Any, ...]], values: list[float], **kw: Any):
    """Call `fn` eagerly and jitted with `make_args(v)` for each value (fresh copies each side): outputs and every
    argument afterwards equal bit for bit, no fallback; returns (dealias's cache_info, dynamo's graphs)."""
    jf = dealias.jit(fn, **kw)
    before = _graphs()
    for v in values:
        args = make_args(v)
        eager_args, jit_args = _clone(args), _clone(args)
        expected = fn(*eager_args)
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            got = jf(*jit_args)
        assert _bits(got) == _bits(expected), f"s={v!r}: {got} != {expected}"
        assert _bits(jit_args) == _bits(eager_args), f"s={v!r}: inputs {jit_args} != {eager_args}"
    return dealias.cache_info(jf), _graphs() - before


def mul_(x, s):
    x.mul_(s)
    return x


def add_alpha(x, y, s):
    x.add_(y, alpha=s)
    return x + 1


def addcdiv_step(p, m, d, lr, bc):
    p.addcdiv_(m, d, value=-lr / bc)
    return p


CASES = {
    "mul_": (mul_, lambda s: (torch.randn(5, generator=torch.Generator().manual_seed(0)), s)),
    "add_alpha": (add_alpha, lambda s: (torch.ones(4), torch.linspace(-1, 1, 4), s)),
    "addcdiv_": (
        addcdiv_step,
        lambda s: (torch.linspace(-2, 2, 6), torch.linspace(0, 1, 6), torch.linspace(1, 2, 6), s, 1 - 0.9**3),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_changing_float_compiles_at_most_twice(name):
    fn, make = CASES[name]
    info, graphs = run_values(fn, make, VALUES)
    assert info.misses <= 2 and info.eager_entries == 0, info
    assert graphs <= 2, graphs
    assert info.dynamic  # (the float is a symbol of the second program)


def test_through_torch_compile_backend_dealias():
    counters.clear()
    cf = torch.compile(mul_, backend="dealias")
    for v in VALUES:
        x = torch.arange(6, dtype=torch.float32)
        expected = mul_(x.clone(), v)
        assert _bits(cf(x, v)) == _bits(expected)
    assert _graphs() <= 2


def scale_ops(x, s):
    return x * s, x + s, s - x, torch.add(x, s), torch.mul(x, s), x.div(s), torch.where(x > 1, x, s)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8, torch.float64])
def test_promotion_is_eagers_wrapped_number(dtype):
    """A Python float with an integer tensor gives float32 (a 0-d float64 tensor would give float64); a 0-d half
    tensor stays half (with a 0-d float64 tensor, float64); a half tensor stays half, in eager's rounding."""
    shapes = [(4,), ()]
    for shape in shapes:

        def make(s, shape=shape):
            return ((torch.arange(1, 5).reshape(4) if shape else torch.tensor(3)).to(dtype), s)

        info, graphs = run_values(scale_ops, make, [v for v in VALUES if v != 2.0**-20])
        assert info.misses <= 2 and graphs <= 2, (info, graphs)
        torch._dynamo.reset()


def inplace_scale(x, s):
    x.mul_(s)
    x.add_(s)
    return x


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_inplace_half_with_a_changing_float(dtype):
    info, graphs = run_values(inplace_scale, lambda s: (torch.linspace(-3, 3, 7, dtype=dtype), s), VALUES)
    assert info.misses <= 2 and graphs <= 2, (info, graphs)


def divide(x, s):
    return x / s, s * x, torch.full((2,), s), x.copysign(torch.tensor(s))


@pytest.mark.parametrize(
    "values",
    [
        [0.0, -0.0, 0.0, -0.0],  # told apart while specialized (the signed-zero guard)
        [1.5, 2.5, 0.0, -0.0, 0.0, -0.0, 3.5],  # and once the float is an input
        [2.0, -0.0, 4.0, 0.0, -0.0],
    ],
)
def test_signs_of_zero(values):
    info, graphs = run_values(divide, lambda s: (torch.ones(3), s), values)
    assert info.eager_entries == 0, info


def test_nan_and_inf():
    values = [1.5, 2.5, float("nan"), float("inf"), -float("inf"), float("nan"), 3.0, float("inf")]
    info, graphs = run_values(divide, lambda s: (torch.ones(3), s), values)
    # (dynamo itself compiles a nan and an inf apart: its guards cannot reason about them; torch.compile does too)
    assert info.misses <= 5 and graphs <= 5, (info, graphs)


def test_a_negative_nan_keeps_its_sign():
    """Dynamo bakes a nan into the graph, whose generated code prints it as `nan`: a negative nan's frame runs
    eagerly (with a warning), and the positive nan's program does not serve it."""
    jf = dealias.jit(divide)
    for s in [1.5, float("nan"), -float("nan"), float("nan"), -float("nan")]:
        x = torch.ones(3)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            got = jf(x.clone(), s)
        assert _bits(got) == _bits(divide(x.clone(), s)), s
        fallbacks = [str(w.message) for w in record if issubclass(w.category, dealias.FallbackWarning)]
        assert all("negative nan" in m for m in fallbacks), fallbacks


def branch(x, s):
    if s > 0:
        return x * s
    return x - s


def test_a_branch_on_the_float_is_guarded():
    values = [1.0, 2.0, -1.0, 3.0, -2.0, 0.5, -0.5, 0.0, -0.0]
    info, graphs = run_values(branch, lambda s: (torch.ones(3), s), values)
    assert info.eager_entries == 0 and graphs <= 4, (info, graphs)


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.scale = 1.0

    def forward(self, x):
        return self.lin(x) * self.scale


def test_a_module_attribute_float():
    torch.manual_seed(0)
    m = Scaled()
    ref = copy.deepcopy(m)
    jm = dealias.jit(m)
    before = _graphs()
    x = torch.randn(2, 3)
    for v in VALUES:
        m.scale = ref.scale = v
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            assert _bits(jm(x)) == _bits(ref(x))
    assert dealias.cache_info(jm).misses <= 2 and _graphs() - before <= 2


def sampler(x, coefficients):
    """A diffusion sampler's loop: per-step Python float coefficients, `x = a * x + b * eps`."""
    for a, b in coefficients:
        eps = torch.tanh(x)
        x = x.mul(a).add_(eps, alpha=b)
    return x


def test_a_sampler_step_with_per_step_coefficients():
    torch.manual_seed(0)
    alphas = [1 - 0.02 * (k + 1) for k in range(10)]
    step = lambda x, a, b: sampler(x, [(a, b)])
    calls = [(math.sqrt(a), -math.sqrt(1 - a)) for a in alphas]
    jf = dealias.jit(step)
    before = _graphs()
    x = y = torch.randn(4, 4)
    for a, b in calls:
        x, y = jf(x, a, b), step(y, a, b)
        assert _bits(x) == _bits(y)
    info = dealias.cache_info(jf)
    assert info.misses <= 2 and _graphs() - before <= 2, info


# --- torch.optim with LambdaLR: lr lives in param_groups, a new float every step -------------------------------


def _optimizer(name: str):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    kw = {"momentum": 0.9} if name == "SGD" else {}
    opt = getattr(torch.optim, name)(params, lr=0.05, foreach=False, **kw)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.8**e)
    return params, opt, sched


def _steps(name: str, compile_step: Callable[[Callable[[], Any]], Callable[[], Any]]):
    params, opt, sched = _optimizer(name)
    g = torch.Generator().manual_seed(1)
    step = compile_step(opt.step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.optim's own graph breaks: test_real_programs covers them)
        for _ in range(10):
            for p in params:
                p.grad = torch.randn(p.shape, generator=g)
            step()
            sched.step()
    state = [{k: _bits(v) for k, v in opt.state[p].items()} for p in params]
    return [_bits(p) for p in params], state, step


@pytest.mark.parametrize("name", ["Adam", "SGD", "AdamW"])
def test_optimizer_with_lambda_lr(name):
    # Under dynamo, torch.optim computes Adam's bias corrections as tensors (`_get_value(step)`), so eager's bits
    # are those of dynamo's graph run eagerly (test_real_programs.py says more); SGD's graph is eager's op sequence.
    with torch._dynamo.config.patch(enable_dynamo_decompositions=False):
        reference = _steps(name, lambda s: torch.compile(s, backend="eager"))
    eager = _steps(name, lambda s: s)
    torch._dynamo.reset()
    jitted = []
    before = _graphs()
    got = _steps(name, lambda s: jitted.append(dealias.jit(s)) or jitted[0])
    assert got[:2] == reference[:2]
    if name == "SGD":
        assert got[:2] == eager[:2]
    info = dealias.cache_info(jitted[0])
    assert info.misses <= 2 and info.eager_entries == 0, info
    assert _graphs() - before <= 2


def test_gradients_through_a_changing_float():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)

    def f(x, s):
        y = lin(x) * s
        y.mul_(s)
        return (y**2).sum() * s

    jf = dealias.jit(f)
    for s in [0.5, 1.5, -2.0, 0.0, -0.0, 3.25]:
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        grads = []
        for fn, inp in ((jf, x), (f, xe)):
            lin.zero_grad()
            with warnings.catch_warnings():
                warnings.simplefilter("error", dealias.FallbackWarning)
                out = fn(inp, s)
            out.backward()
            grads.append(_bits([out, inp.grad, *(p.grad for p in lin.parameters())]))
        assert grads[0] == grads[1], s
    assert dealias.cache_info(jf).misses <= 2
