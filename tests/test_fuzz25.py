"""Fuzz seeds of the twenty-second session (`dealias fuzz --autograd --wide`, 2026-12-07; torch 2.13 `--executor
tiered` 2479000-2479399, torch 2.14.1 `--executor inductor` 2479400-2479799, after the change that runs results in
parts eager's graph keeps apart in a TwiceDifferentiable):
- 2479046 (open, torch 2.13 only; strict xfail): `with torch.no_grad(): v2 = x0.mT`, then writes of x0 with grad on,
  v2 returned: eager's v2 raises reading its grad_fn (a view made under no_grad whose base was written in place);
  torch 2.13's dynamo makes the returned view outside its graph in the grad mode at the return
  (`torch.compile(backend="eager")` gives TransposeBackward0 too), as for seeds 2474043, 2476071 (tests/test_fuzz23.py,
  test_fuzz24.py). torch 2.14.1 returns it from the graph: exact."""

from __future__ import annotations

import pytest
import torch
from harness import wide_autograd_seed

_ON_213 = torch.__version__.startswith("2.13")


@pytest.mark.parametrize(
    "seed",
    [pytest.param(2479046, marks=pytest.mark.xfail(_ON_213, strict=True, reason="torch 2.13's dynamo: docstring"))],
)
def test_wide_autograd_seed_matches_eager(seed):
    outcome = wide_autograd_seed(seed)
    assert outcome.status != "mismatch", outcome.detail
