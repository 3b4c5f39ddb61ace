"""Review of the fused executor's in-place stores of a write whose source reads other elements of the written
buffer (hazards.py `_apart`, `_disjoint`): several writes into one buffer, sources that are not elementwise, foreach
ops over views of one buffer, dynamic sizes, and the cost of the rule on deep or diamond-shaped sources. Every
program is compared with eager on cloned inputs; inductor compiles are few and small (marked inductor)."""

from __future__ import annotations

import pytest
import torch
from harness import check
from torch.fx.experimental.proxy_tensor import make_fx

import dealias
from dealias.runtime import hazards as H


# --- the hazard rule on traced graphs (no compile) ----------------------------------------------------------------
def _fib_source(steps):
    def f(x):
        a = x[0:4] * 1.0
        b = a + 1
        for _ in range(steps):
            a, b = b, a + b * 0.5
        x[4:8].copy_(b)

    return f


def test_a_diamond_shaped_source_is_checked_once_per_node(monkeypatch):
    # Each value reads the buffer through two paths: without memos `_aligned`/`_apart` walked every path
    # (22 steps: some 170 000 calls, 20 steps took minutes of a compile).
    gm = make_fx(_fib_source(22))(torch.randn(8))
    calls = []
    real = H.foreach_element
    monkeypatch.setattr(H, "foreach_element", lambda n: calls.append(n) or real(n))
    assert list(H.hazards(gm)) == []  # (reads x[0:4] only, writes x[4:8]: stored in place)
    assert len(calls) < 400


def test_a_source_deeper_than_the_recursion_limit_keeps_its_copy():
    def f(x):
        a = x[0:4] * 1.0
        for _ in range(1500):
            a = a + 1
        x[4:8].copy_(a)

    gm = make_fx(f)(torch.randn(8))
    found = [(v.name, at) for v, _, at in H.hazards(gm)]  # (it raised RecursionError)
    assert found == [("add_1499", True)]


def test_a_size_read_before_a_write_is_not_snapshotted():
    # `n = x.shape[0]` under dynamic shapes is a SymInt node reading x: it was snapshotted as a value read before a
    # write and used after it, and inductor failed on `dealias::snapshot(SymInt)` (the program ran unfused).
    def f(x):
        n = x.shape[0]
        x[0:4] = 1.0
        x[4 : n - 1] = 2.0

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(11))
    assert [v.target for v, _, _ in H.hazards(gm)] == []


# --- the fused executor against eager ----------------------------------------------------------------------------
def two_colours_shifted(x):
    # Each colour from its neighbours of the other colour, three sweeps: each write's source reads what the
    # write before it stored (at elements this write does not touch).
    n = x.shape[0]
    x[2 : n - 1 : 2] = x[1 : n - 2 : 2] + x[3:n:2]
    x[1 : n - 1 : 2] = x[0 : n - 2 : 2] * x[2:n:2]
    x[2 : n - 1 : 2] = x[1 : n - 2 : 2] - x[3:n:2]


def source_computed_before_an_earlier_write(x):
    s = x[0:4].sum() + x[0:4]  # reads x[0:4] before it is overwritten
    x[0:4] = 7
    x[4:8] = s


def rows_unbound(x):
    a, b, c = x.unbind(0)
    a.copy_(b + c)
    b.copy_(a * c)
    c.copy_(a - b)


def not_elementwise_sources(x):
    x[4:8] = x.index_select(0, torch.tensor([9, 5, 5, 0])) * 2 + x[0:4].flip(0).cumsum(0)
    x[0:4] = torch.gather(x[4:8], 0, torch.tensor([3, 2, 1, 0])) + x[8:].sum()


def foreach_over_rows(x):
    torch._foreach_add_([x[0], x[2]], [x[1], x[3]])
    torch._foreach_mul_([x[1], x[3]], [x[0], x[2]])


@pytest.mark.inductor
@pytest.mark.parametrize(
    "fn, make",
    [
        (two_colours_shifted, lambda: torch.randn(11)),
        (source_computed_before_an_earlier_write, lambda: torch.randn(8)),
        (rows_unbound, lambda: torch.randn(3, 4)),
        (not_elementwise_sources, lambda: torch.randn(10)),
        (foreach_over_rows, lambda: torch.randn(4, 6)),
    ],
)
def test_writes_reading_other_elements_of_their_buffer_match_eager(fn, make):
    check(fn, make(), executor="inductor")


def odd_from_even(x):
    n = x.shape[0]
    x[1 : n - 1 : 2] = x[0 : n - 2 : 2] + x[2:n:2]
    x[2 : n - 1 : 2] = x[1 : n - 2 : 2] - x[3:n:2]


@pytest.mark.inductor
def test_a_dynamic_size_stays_fused_and_matches_eager():
    from harness import compare_call

    jf = dealias.jit(odd_from_even, executor="inductor")
    for n in (11, 15, 20):
        assert compare_call(odd_from_even, jf, (torch.randn(n),)) is None
    info = dealias.cache_info(jf)
    assert info.dynamic and all(t == "fused" for t in info.tiers), info  # (the dynamic entry was "torch")
