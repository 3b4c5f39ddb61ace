"""Fuzz seeds of the twenty-second session (`dealias fuzz --autograd --wide`, 2026-12-07; torch 2.13 `--executor
tiered` 2479000-2479399 and `--executor inductor` 2479800-2480199, torch 2.14.1 `--executor inductor` 2479400-2479799
and `--executor tiered` 2480200-2480599, after the change that runs results in parts eager's graph keeps apart in a
TwiceDifferentiable):
- 2479046 (open, torch 2.13 only; strict xfail): `with torch.no_grad(): v2 = x0.mT`, then writes of x0 with grad on,
  v2 returned: eager's v2 raises reading its grad_fn (a view made under no_grad whose base was written in place);
  torch 2.13's dynamo makes the returned view outside its graph in the grad mode at the return
  (`torch.compile(backend="eager")` gives TransposeBackward0 too), as for seeds 2474043, 2476071 (tests/test_fuzz23.py,
  test_fuzz24.py). torch 2.14.1 returns it from the graph: exact.
- 2479938 (open, both torches, every executor, at the session's start too; strict xfail): `v3 = x0.data; with
  no_grad: v5 = x0.chunk(2, 0)[-1]; v6 = v3.mul_(-2.0); v6.masked_fill_(..)`, v5 returned: eager's v5 has no
  grad_fn (the writes go through `.data`, which moves no counter of x0's), dealias's raises reading it ("A view was
  created in no_grad mode and its base ... modified inplace"): the write through `v6`, the in-place result of a
  write through `.data` rather than a view of it, is counted as a version move of x0's memory (autograd_facts
  `_through_data` walks views only, opfacts.data_node). An error where eager has none, not a wrong value."""

from __future__ import annotations

import pytest
import torch
from harness import wide_autograd_seed

_ON_213 = torch.__version__.startswith("2.13")


@pytest.mark.parametrize(
    "seed",
    [
        pytest.param(2479046, marks=pytest.mark.xfail(_ON_213, strict=True, reason="torch 2.13's dynamo: docstring")),
        pytest.param(2479938, marks=pytest.mark.xfail(strict=True, reason="a write through .data's alias: docstring")),
    ],
)
def test_wide_autograd_seed_matches_eager(seed):
    outcome = wide_autograd_seed(seed)
    assert outcome.status != "mismatch", outcome.detail
