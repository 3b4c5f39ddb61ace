"""The keep-ATen list measured per host (runtime/keep_aten.py): an op inductor runs slower than ATen here stays
ATen's kernel inside the fused graph, the verdict is kept on disk, and a later process reads it."""

from __future__ import annotations

import types

import pytest
import torch

import dealias
from dealias.runtime import keep_aten

N = keep_aten.MIN_NUMEL


def tanh_exp(a, b):
    out = torch.tanh(a) + torch.exp(b)
    a.mul_(2)
    return out


def fresh(fn):
    """`fn` under a code object of its own: each test compiles anew (dynamo caches per code object)."""
    return types.FunctionType(fn.__code__.replace(co_name=f"{fn.__name__}_{fresh.count}"), globals())


fresh.count = 0


def fused_targets(fn, *args):
    fresh.count += 1
    jf = dealias.jit(fresh(fn), executor="inductor")
    expected_args = [a.clone() for a in args]
    expected = fn(*expected_args)
    got = jf(*args)
    assert jf.last.tier == "fused"
    torch.testing.assert_close(got, expected)
    for a, b in zip(args, expected_args):
        torch.testing.assert_close(a, b)
    return {n.target for n in jf.last.run_graph.graph.graph.nodes if n.op == "call_function"}


@pytest.fixture
def measuring(monkeypatch, verdict_store):
    monkeypatch.setenv("DEALIAS_KEEP_ATEN", "measure")
    return verdict_store


def test_an_op_inductor_runs_slower_here_stays_atens(measuring, monkeypatch):
    asked = []

    def measure(op, dtype, rank, rest):  # tanh: inductor's code 2x slower than ATen's; exp: 2x faster
        asked.append(op)
        return (1.0, 2.0) if op is torch.ops.aten.tanh.default else (1.0, 0.5)

    monkeypatch.setattr(keep_aten, "measure", measure)
    ops = fused_targets(tanh_exp, torch.randn(N), torch.randn(N))
    assert torch.ops.dealias.aten_tanh.default in ops and torch.ops.aten.tanh.default not in ops
    assert torch.ops.aten.exp.default in ops
    assert sorted(map(str, asked)) == ["aten.exp.default", "aten.tanh.default"]
    (saved,) = measuring.glob("keep_aten-*.json")

    # A later process reads the verdicts instead of measuring.
    monkeypatch.setattr(keep_aten, "_memory", {})
    monkeypatch.setattr(keep_aten, "measure", lambda *a: pytest.fail("measured again"))
    assert torch.ops.dealias.aten_tanh.default in fused_targets(tanh_exp, torch.randn(N), torch.randn(N))
    # Small tensors: inductor's code, whatever the verdict.
    assert torch.ops.dealias.aten_tanh.default not in fused_targets(tanh_exp, torch.randn(N // 2), torch.randn(N // 2))


def test_the_measurement_times_both_kernels_inside_a_compile(measuring):
    # The real measurement, run from inside dynamo's backend call (its tracing context active); it draws its
    # inputs on a generator of its own (the caller's random numbers are eager's).
    x = torch.randn(N)
    torch.manual_seed(0)
    ops = fused_targets(lambda x: torch.sigmoid(x) * 2, x)
    drawn = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(drawn, torch.rand(3))
    verdicts = keep_aten._load()
    ((key, (aten_s, inductor_s)),) = verdicts.items()
    assert key.startswith("aten.sigmoid.default|torch.float32|rank=1|") and 0 < aten_s < 1 and 0 < inductor_s < 1
    kept = inductor_s >= keep_aten.THRESHOLD * aten_s
    assert (torch.ops.aten.sigmoid.default in ops) != kept


def test_a_pinned_list_is_not_measured(monkeypatch):
    monkeypatch.setattr(keep_aten, "measure", lambda *a: pytest.fail("measured"))
    monkeypatch.setenv("DEALIAS_KEEP_ATEN", "none")
    assert torch.ops.aten.tanh.default in fused_targets(tanh_exp, torch.randn(N), torch.randn(N))
    monkeypatch.setenv("DEALIAS_KEEP_ATEN", "exp")
    ops = fused_targets(tanh_exp, torch.randn(N), torch.randn(N))
    assert torch.ops.aten.tanh.default in ops and torch.ops.dealias.aten_exp.default in ops
