"""A program over symbols whose compile assumed nothing of them has a shape guard that always holds
(passes/pipeline._shape_guard, `always`): the lean check of a call leaves it out (~0.4 us a call, a decode step's
cache length), and the calls' results stay eager's for every value."""

from __future__ import annotations

import torch
from harness import compare_call

import dealias


def scaled(x, n):
    return x.add_(n).sin()


def first_rows(x, n):
    return x[:n].sum(0)


def _lean(jf) -> list[str]:
    """The lean checks of the programs over the symbol (the graph of n's first value has n a constant)."""
    checks = [g.lean[0].source for g in jf.stats.graphs if g.lean is not None and g.unkeyed]
    assert checks
    return checks


def test_a_symbol_assumed_nothing_of_is_not_checked_at_each_call():
    jf = dealias.jit(scaled, executor="torch")
    for n in range(1, 12):  # (n a symbol from its second value: dynamo's automatic dynamic)
        assert compare_call(scaled, jf, (torch.randn(4), n)) is None, n
    assert not any("guard(" in c for c in _lean(jf)), _lean(jf)
    assert dealias.cache_info(jf).misses == 2  # (the first value's program, then the symbolic one)


def test_a_symbol_with_assumptions_is_checked_at_each_call():
    # (x[:n] of 8 rows: the compile assumed n's range, which the lean check keeps checking)
    jf = dealias.jit(first_rows, executor="torch")
    for n in [*range(2, 8), 9, 12, 3]:
        assert compare_call(first_rows, jf, (torch.randn(8, 3), n)) is None, n
    assert all("guard(" in c for c in _lean(jf)), _lean(jf)
