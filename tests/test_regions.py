"""The region write node (regions.py): what it means, and that functionalization emits it, lowering reads it and
no executor runs it."""

from __future__ import annotations

import pytest
import torch
from harness import check

import dealias
from dealias.ir.regions import region_write

aten = torch.ops.aten

# (base, view of it): every kind of view a write goes through.
VIEWS = [
    ("select", lambda: torch.randn(4, 5), lambda b: b.select(1, 2)),
    ("slice with a step", lambda: torch.randn(6, 3), lambda b: b[1::2]),
    ("transpose then select", lambda: torch.randn(4, 5), lambda b: b.t()[3]),
    ("diagonal", lambda: torch.randn(4, 4), lambda b: b.diagonal(1)),
    ("view of another shape", lambda: torch.randn(4, 6), lambda b: b.view(2, 12)[1]),
    ("as_strided with gaps", lambda: torch.randn(16), lambda b: b.as_strided((2, 3), (5, 2), 1)),
    ("dtype view", lambda: torch.randn(4, 4), lambda b: b.view(torch.int32)[2]),
    ("real part of a complex", lambda: torch.randn(3, 4, dtype=torch.cfloat), lambda b: torch.view_as_real(b)[1, :, 0]),
    ("conjugate", lambda: torch.randn(3, 2, dtype=torch.cfloat), lambda b: b.conj()[1]),
    ("transposed base", lambda: torch.randn(5, 4).t(), lambda b: b[:, 1:3]),
    ("expanded region", lambda: torch.randn(3, 1), lambda b: b.expand(3, 4)),
]


@pytest.mark.parametrize("make,view", [v[1:] for v in VIEWS], ids=[v[0] for v in VIEWS])
def test_region_write_means_a_write_through_the_view(make, view):
    base = make()
    region = view(base)
    value = (
        torch.randn(region.shape, dtype=region.dtype)
        if region.dtype.is_floating_point or region.is_complex()
        else torch.randint_like(region, 9)
    )
    expected = base.clone()
    target = view(expected)
    for d in [d for d, st in enumerate(region.stride()) if st == 0]:  # a region repeating memory
        value = value.narrow(d, 0, 1).expand(region.shape)  # receives one value per location, written once
        target = target.narrow(d, 0, 1)
    target.copy_(value.narrow(1, 0, 1) if target.shape != value.shape else value)
    got = region_write(base, region, value)
    assert got.stride() == base.stride() and got.data_ptr() != base.data_ptr()
    real = lambda t: torch.view_as_real(t.resolve_conj()) if t.is_complex() else t
    assert torch.equal(real(got), real(expected))


def cache_write(cache, k, pos: int):
    cache[:, pos] = k
    return cache.sum()


def intermediate_write(x):
    y = x * 2
    y.t()[1].add_(1)
    return y


def test_functionalization_emits_region_writes_and_executors_run_none():
    for fn, args in [
        (cache_write, (torch.zeros(2, 5, 3), torch.ones(2, 3), 2)),
        (intermediate_write, (torch.randn(3, 3),)),
    ]:
        jf = check(fn, *args)
        functional = [n.target for n in jf.last.functional_gm.graph.nodes if n.op == "call_function"]
        executed = [n.target for n in jf.last.functional.gm.graph.nodes if n.op == "call_function"]
        assert region_write in functional, functional
        assert region_write not in executed and aten.copy.default not in executed, executed


def test_a_region_write_left_functional_runs_as_view_inverses():
    # Under autograd nothing is written in place: the region write becomes select_scatter (its backward is
    # right), and the result matches eager's values and gradients.
    def f(x):
        y = x * 2
        y[1] = y[0] * 3
        return y

    x = torch.randn(3, 2, requires_grad=True)
    jf = check(f, x)
    assert "select_scatter" in jf.last.functional.gm.code


def test_functional_graph_as_it_is_computes_the_same_values():
    # The functional graph (region writes not decomposed) run directly: region_write's own meaning.
    def f(x, y):
        x[1:3] = y
        x.t()[0].mul_(2)
        return x.sum(0)

    args = (torch.randn(4, 3), torch.randn(2, 3))
    jf = dealias.jit(f)
    expected_x = args[0].clone()
    expected = f(expected_x, args[1])
    jf(args[0].clone(), args[1])
    results = jf.last.functional_gm(*args)  # write-backs first, then the output
    assert torch.equal(results[0], expected_x) and torch.equal(results[-1], expected)
