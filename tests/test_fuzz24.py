"""Fuzz seeds of the twenty-first session (`dealias fuzz --autograd --wide --executor inductor`, 2026-12-07; torch
2.13: 2476000-2476199 and 2476600-2476999, torch 2.14.1: 2476200-2476599), each mismatching before on every executor:
- 2476014, 2476161 (fixed; both torches, every executor): a view made with grad on of an input, then a write of the
  input's memory (`x1.normal_()`, `v3.t_()` of another view), then `x.detach_()`, the view returned. Eager's view is
  stale, its grad_fn made afresh from the detached base when read: no gradient reaches the input's history; dealias's,
  made current after the graph, gave one (view_grad_modes.GradViews; tests/test_stale_grad_views.py);
- 2476318, 2476542 (fixed; both torches): a returned `x.data` (traced as `detach`) was made as `x.detach()`,
  sharing x's version counter, so a later graph's write through it moved x's (OutputSlot.data_step;
  tests/test_data_counters.py);
- 2476980 (fixed; both torches): a write through `v.data` counted as a version move of v's memory, so a view of a
  no_grad view raised reading its grad_fn where eager's did not (autograd_facts._through_data);
- 2476071, 2476689 (open, torch 2.13 only; strict xfails): a view made under no_grad of an input requiring grad
  (`x0.mT`), returned after a later write: eager's raises reading its grad_fn; torch 2.13's dynamo makes the
  returned view outside its graph, in the grad mode at the return (`torch.compile(backend="eager")` gives the same
  history), as for seeds 2474043 and 2474052 (tests/test_fuzz23.py). torch 2.14.1's dynamo returns it from the
  graph: exact;
- 2477701 (open, torch 2.13 only; strict xfail): `v1 = x1.mT; x0.pow_(2); x0.detach_()`, x1 a view of x0: the same
  torch 2.13 dynamo rebuilding of `x1.mT` after its graph (2.14.1: fixed by the stale grad views above);
- 2477454 (open, both torches; strict xfail): dynamo's with every backend (`backend="eager"` too): `v3 = x0.data.data`
  made to require grad by `v3.mul_(x0)` comes back from dynamo's graph without it;
- 2477619 (fixed; both torches): eager's backward raises, dealias's gave gradients. Reduced: `v2 =
  x.movedim(0, -1).flatten(); return v2.sin(), v2`, then the caller writes `v2` in place: sin saved v2, a reshape's
  copy with a version counter of its own, and the torch executor returned it made afresh from the graph's buffer
  (`_unsafe_view`), not the tensor sin saved, so the write moved no counter sin's backward checks (the fused
  executor refuses the graph: a result computed from another). The graph returns its own node now
  (outputs._graphs_own_copy; tests/test_saved_copy_returned.py)."""

from __future__ import annotations

import pytest
import torch
from harness import wide_autograd_seed

_ON_213 = torch.__version__.startswith("2.13")


@pytest.mark.parametrize(
    "seed",
    [
        2476014,
        2476161,
        2476318,
        2476542,
        2476980,
        pytest.param(2476071, marks=pytest.mark.xfail(_ON_213, strict=True, reason="torch 2.13's dynamo: docstring")),
        pytest.param(2476689, marks=pytest.mark.xfail(_ON_213, strict=True, reason="torch 2.13's dynamo: docstring")),
        pytest.param(2477701, marks=pytest.mark.xfail(_ON_213, strict=True, reason="torch 2.13's dynamo: docstring")),
        pytest.param(2477454, marks=pytest.mark.xfail(strict=True, reason="dynamo's, every backend: docstring")),
        2477619,
    ],
)
def test_wide_autograd_seed_matches_eager(seed):
    outcome = wide_autograd_seed(seed)
    assert outcome.status != "mismatch", outcome.detail
