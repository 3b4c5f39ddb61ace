"""A branch on an input's leaf-ness (`w.is_leaf`, `w.grad_fn is None`) or view-ness (`w._base is None`):
dynamo answers it from the first call's tensor without guarding it, so with every backend the program compiled
for a leaf served a later non-leaf (compat/dynamo_leaf.py guards it for dealias's compiles); `w.retains_grad`
dynamo answers False always. Each test compares
with eager, call after call, the other leaf-ness last."""

import contextlib
import warnings

import pytest
import torch

import dealias
from dealias import compat


def _on_leaf(x, w):
    return x * 2 + w if w.is_leaf else x * 3 + w


def _on_grad_fn(x, w):
    if w.grad_fn is None:
        return x * 2 + w
    return x * 3 + w


def _on_base(x, w):
    return x * 2 + w if w._base is None else x * 3 + w


def _on_retains_grad(x, w):
    return x * 2 + w if w.retains_grad else x * 3 + w


def _on_requires_grad(x, w):
    return x * 2 + w if w.requires_grad else x * 3 + w


def _leaf():
    return torch.linspace(-1, 1, 3, requires_grad=True)


def _non_leaf():
    return torch.linspace(-2, 2, 3, requires_grad=True) * 1  # (requires grad too: dynamo's guards see no difference)


def _retaining():
    w = _non_leaf()
    w.retain_grad()
    return w


def _view():
    return torch.linspace(-1, 1, 6)[1:4]


def _plain():
    return torch.linspace(-2, 2, 3)


def _same(got, expected, executor):
    if executor == "inductor":  # (inductor's kernels: within a few ulps; the other branch is far off)
        return torch.allclose(got, expected)
    return torch.equal(got, expected)


def _compare(fn, inputs, executor="tiered"):
    jf = dealias.jit(fn, executor=executor)
    x = torch.linspace(0.5, 1.5, 3)
    for make in inputs:
        w = make()
        got = jf(x, w)
        expected = fn(x, w)
        assert _same(got, expected, executor), (fn.__name__, make.__name__, got, expected)
        assert got.requires_grad == expected.requires_grad
    return jf


@pytest.mark.parametrize("executor", ["tiered", "torch"])
@pytest.mark.parametrize("fn", [_on_leaf, _on_grad_fn])
def test_a_branch_on_leafness_follows_each_calls_input(fn, executor):
    _compare(fn, [_leaf, _non_leaf, _leaf], executor)


@pytest.mark.parametrize("fn", [_on_leaf, _on_grad_fn])
def test_a_non_leaf_first_then_a_leaf(fn):
    _compare(fn, [_non_leaf, _leaf, _non_leaf], "torch")


@pytest.mark.parametrize("executor", ["tiered", "torch"])
def test_a_branch_on_the_base_follows_each_calls_input(executor):
    _compare(_on_base, [_view, _plain, _view], executor)


@pytest.mark.parametrize("executor", ["tiered", "torch"])
def test_a_branch_on_retains_grad_reads_each_calls_input(executor):
    # (dynamo answers False from its fake value, which retains none: wrong from the first call)
    _compare(_on_retains_grad, [_retaining, _non_leaf, _retaining], executor)


def test_requires_grad_is_guarded_by_dynamo_itself():
    # (dynamo's tensor guards check requires_grad: exact without the correction too)
    with compat.forced_off("leaf_guards"):
        _compare(_on_requires_grad, [_leaf, _plain, _leaf], "torch")


def test_gradients_through_a_non_leaf_after_a_leaf():
    jf = dealias.jit(_on_leaf, executor="torch")
    x = torch.linspace(0.5, 1.5, 3)
    for make in (_leaf, _non_leaf):
        p, q = torch.linspace(-1, 1, 3, requires_grad=True), torch.linspace(-1, 1, 3, requires_grad=True)
        w, v = (p, q) if make is _leaf else (p * 1, q * 1)
        jf(x, w).pow(2).sum().backward()
        _on_leaf(x, v).pow(2).sum().backward()
        assert torch.equal(p.grad, q.grad)


class _Scaled(torch.nn.Module):
    """A parameter and a plain tensor attribute, which may be a tensor made from the parameter (as a
    reparametrization makes)."""

    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.linspace(-1, 1, 3))
        self.w = torch.linspace(-2, 2, 3, requires_grad=True)

    def forward(self, x):
        y = x * 2 + self.w if self.w.is_leaf else x * 3 + self.w
        return y + self.p if self.p.is_leaf else y - self.p


def test_a_modules_attribute_made_non_leaf_between_calls():
    m = _Scaled()
    jm = dealias.jit(m, executor="torch")
    x = torch.linspace(0.5, 1.5, 3)
    for w in (m.w, m.p * 1, m.w.detach().requires_grad_(), m.p * 2):
        m.w = w
        assert torch.equal(jm(x), m(x))


@pytest.mark.inductor
def test_the_fused_executor_follows_leafness():
    _compare(_on_leaf, [_leaf, _non_leaf], "inductor")


def test_without_the_correction_the_leafs_program_serves_a_non_leaf():
    # (what every backend does: the guard above is what changes it)
    with compat.forced_off("leaf_guards"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jf = dealias.jit(_on_leaf, executor="torch")
        x = torch.linspace(0.5, 1.5, 3)
        jf(x, _leaf())
        w = _non_leaf()
        assert torch.equal(jf(x, w), x * 2 + w) and not torch.equal(jf(x, w), _on_leaf(x, w))


def test_other_backends_trace_as_without_dealias():
    """The guards are added for dealias's compiles only: another backend compiles and answers as before, the
    correction in force or not (dynamo's own behaviour: for now, the leaf's program serving the non-leaf)."""
    x = torch.linspace(0.5, 1.5, 3)

    def run(forced_off: bool) -> list:
        compiles = []

        def record(gm, example):
            compiles.append(len(gm.graph.nodes))
            return gm.forward

        torch._dynamo.reset()
        dealias.jit(_on_leaf)(x, _leaf())  # (a dealias compile in the same process)
        with compat.forced_off("leaf_guards") if forced_off else contextlib.nullcontext():
            f = torch.compile(_on_leaf, backend=record)
            results = [f(x, make()).tolist() for make in (_leaf, _non_leaf, _view, _plain)]
        return [compiles, results]

    assert run(False) == run(True)
