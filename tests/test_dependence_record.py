"""Which arguments a decomposition's results read (double_backward.written_inputs_read's traces of a training batch
norm) kept on disk (runtime/dependence_record.py, issue 38: the warm first call): a later process asking for the
same signature reads the answer and traces nothing; another layout is traced; a damaged file is ignored; a fused
training forward compiled again traces none of its batch norms, its results, running statistics and gradients
eager's."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from harness import ConvBnRelu
from test_op_signatures import _batch_norm_graph

import dealias
from dealias.runtime import dependence_record, double_backward


@pytest.fixture
def traced(monkeypatch, tmp_path):
    """The record on, in a fresh directory, nothing remembered in this process; the decomposition traces counted."""
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path / "dealias"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(dependence_record, "ENABLED", True)
    monkeypatch.setattr(dependence_record, "counts", {"read": 0, "written": 0})
    made = []
    trace = double_backward._dependence_by_position
    monkeypatch.setattr(double_backward, "_dependence_by_position", lambda *a: made.append(a[0]) or trace(*a))
    new_process()
    yield made
    new_process()


def new_process() -> None:
    """What a new process starts from: nothing traced or read in memory (the disk file stays)."""
    double_backward._traced_dependence.clear()
    dependence_record.clear()


def test_a_later_process_reads_the_traces_and_traces_nothing(traced):
    gm, written = _batch_norm_graph(2), frozenset(range(10))
    reads = double_backward.written_inputs_read(gm, written)
    assert len(traced) == 1 and dependence_record.counts["written"] == 1
    new_process()
    assert double_backward.written_inputs_read(gm, written) == reads
    assert len(traced) == 1 and dependence_record.counts["read"] == 1
    out, _, _, new_rm, new_rv = reads[:5]
    assert out == {0, 1, 2} and 3 in new_rm and 4 in new_rv  # (training: the output reads no running statistic)


def test_another_layout_is_traced(traced):
    double_backward.written_inputs_read(_batch_norm_graph(1), frozenset(range(5)))
    new_process()
    reads = double_backward.written_inputs_read(_batch_norm_graph(1, channels=8), frozenset(range(5)))
    assert len(traced) == 2 and dependence_record.counts["read"] == 0
    assert reads[0] == {0, 1, 2}


def test_a_damaged_file_is_ignored(traced):
    gm, written = _batch_norm_graph(1), frozenset(range(5))
    reads = double_backward.written_inputs_read(gm, written)
    (path,) = (p for p in dependence_record._path().parent.iterdir() if p.name.startswith("dependence-"))
    stored = json.loads(path.read_text())
    path.write_text(json.dumps({k: [["x"]] for k in stored}))  # (an answer that is no list of positions)
    new_process()
    assert double_backward.written_inputs_read(gm, written) == reads
    assert len(traced) == 2
    path.write_text("{[")
    new_process()
    assert double_backward.written_inputs_read(gm, written) == reads
    assert len(traced) == 3


@pytest.mark.inductor
def test_a_fused_training_forward_compiled_again_traces_no_batch_norm(traced):
    torch.manual_seed(0)
    m, x = ConvBnRelu(), torch.randn(2, 3, 8, 8)
    for compile_ in range(2):
        torch._dynamo.reset()
        if compile_:
            new_process()
        em = copy.deepcopy(m)
        out = dealias.jit(m, executor="inductor")(x)
        expected = em(x)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(m.bn.running_mean, em.bn.running_mean, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(m.bn.running_var, em.bn.running_var, rtol=1e-4, atol=1e-6)
        out.mean().backward()
        expected.mean().backward()
        for p, ep in zip(m.parameters(), em.parameters()):
            torch.testing.assert_close(p.grad, ep.grad, rtol=1e-4, atol=1e-5)
        m.zero_grad()
    assert len(traced) == 1  # (the first compile's trace; the second read it)
    assert dependence_record.counts["read"] >= 1
