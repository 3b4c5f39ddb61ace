"""The fusing executor (inductor): few and small, each compile costs seconds on CPU."""

from __future__ import annotations

import pytest
import torch
from harness import check

import dealias
from dealias.demo import kv_cache_write, seed_program
from dealias.errors import InternalError
from dealias.executor import verify_functional


def test_seed_program_and_kv_write_match_eager():
    jf = check(seed_program, torch.randn(8, 8), torch.randn(8, 8), executor="inductor")
    assert "inductor" in str(dealias.last_traces(jf)[3])
    jk = check(
        kv_cache_write,
        torch.zeros(1, 2, 8, 4),
        torch.zeros(1, 2, 8, 4),
        torch.randn(1, 2, 4),
        torch.randn(1, 2, 4),
        3,
        executor="inductor",
    )
    assert [r.mode for r in dealias.explain(jk)] == ["whole copy", "whole copy"]


def test_graph_handed_to_inductor_must_not_write():
    gm = torch.fx.symbolic_trace(lambda x: x)
    x = next(iter(gm.graph.nodes))
    with gm.graph.inserting_after(x):
        gm.graph.call_function(torch.ops.aten.add_.Tensor, (x, 1))
    with pytest.raises(InternalError, match="writes memory"):
        verify_functional(gm)


def test_unknown_executor_is_refused():
    with pytest.raises(ValueError, match="executor"):
        dealias.jit(seed_program, executor="xla")
