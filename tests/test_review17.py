"""Review of the moved write (hazards._sink_write, branch optimsweep): what it costs and that it stays exact.
Compared with eager; inductor compiles are few and small."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import dealias
from dealias.runtime import hazards
from dealias.runtime.hazards import SNAPSHOT


def _old_value_through_a_chain(k):
    def program(a, b):
        v = a * 2  # a's old contents, read after a's write through every op of the chain
        a.copy_(a * 3)
        for _ in range(k):
            v = v + 1
        b.copy_(v)

    return program


@pytest.mark.inductor
def test_write_moves_past_a_chain_in_one_round(monkeypatch):
    # Each op of the chain is computed from `v` before the write's new place and read after it: a hazard of its
    # own, found one per round of insert_snapshots (each a pass over the whole graph). 800 ops took 6 s of the
    # compile (one snapshot took 0.01 s before the write could move); the move now goes past the chain at once.
    k = 200
    gm = make_fx(_old_value_through_a_chain(k), tracing_mode="fake")(torch.randn(8), torch.randn(8))
    rounds = []
    found = hazards.hazards
    monkeypatch.setattr(hazards, "hazards", lambda g: (rounds.append(1), found(g))[1])
    assert hazards.insert_snapshots(gm) == 0
    hazards.check_hazards(gm)
    assert len(rounds) <= 3, len(rounds)
    # and through dealias's fused executor, against eager
    program = _old_value_through_a_chain(k)
    torch.manual_seed(0)
    args = [torch.randint(-9, 9, (16,)) for _ in range(2)]
    expected = [a.clone() for a in args]
    program(*expected)
    rounds.clear()
    jf = dealias.jit(program, executor="inductor")
    for _ in range(2):
        got = [a.clone() for a in args]
        jf(*got)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=0, atol=0)
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert SNAPSHOT not in [n.target for n in jf.last.run_graph.graph.graph.nodes]
    assert len(rounds) <= 3, len(rounds)
