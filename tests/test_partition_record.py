"""The verdict "the default partition" kept on disk per joint graph (runtime/partition.py, issue 38: the warm first
call): a later compile of the same joint graph makes the default partition alone, not the min-cut one it would drop;
another dtype, size, requires_grad or partitioner misses; a damaged record is ignored; results and gradients stay
eager's."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch._functorch.partitioners as partitioners
from harness import ConvBnRelu as Block

import dealias
from dealias.runtime import partition


def loss(m, x):
    return m(x).mean()


def _record_on_counting(monkeypatch, tmp_path, partitioner: str) -> list[int]:
    """The record on, in a fresh directory (inductor's caches too); the partitions `partitioner` makes, counted."""
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path / "dealias"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(partition, "RECORD", True)
    made = []
    original = getattr(partitioners, partitioner)

    def counted(*args, **kwargs):
        made.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(partitioners, partitioner, counted)
    return made


@pytest.fixture
def record(monkeypatch, tmp_path):
    """The record on, in a fresh directory; the min-cut partitions made, counted; the default one taken (as
    resnet18's training forward takes it, for the boolean masks min-cut's saves)."""
    made = _record_on_counting(monkeypatch, tmp_path, "min_cut_rematerialization_partition")
    monkeypatch.setattr(partition, "_copies_store_less", lambda *args: False)
    return tmp_path / "dealias" / "partitions", made


def compiled_step(m, x):
    """A fresh compile of `loss` (dynamo's caches dropped) on `m`, `x`; its result and gradients against eager's,
    checked; the backward after the compile only (a compiled backward would let AOTAutograd's own cache answer the
    next compile, partitioning nothing)."""
    torch._dynamo.reset()
    em, ex = copy.deepcopy(m), x.clone()
    out = dealias.jit(loss, executor="inductor")(m, x)
    expected = loss(em, ex)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(m.bn.running_mean, em.bn.running_mean)
    return out, expected, em


def backward_checked(out, expected, m, em):
    out.backward()
    expected.backward()
    for p, e in zip(m.parameters(), em.parameters()):
        torch.testing.assert_close(p.grad, e.grad)


def test_default_verdict_read_back_skips_min_cut(record):
    path, made = record
    torch.manual_seed(0)
    m, x = Block(), torch.randn(2, 3, 8, 8)
    compiled_step(m, x)
    assert made == [1] and len(list(path.glob("*.json"))) == 1  # (the default taken: recorded)
    second = compiled_step(m, x)
    assert made == [1]  # (read back: the min-cut partition not made again)
    backward_checked(second[0], second[1], m, second[2])


def test_other_inputs_or_damage_miss(record):
    path, made = record
    torch.manual_seed(0)
    m, x = Block(), torch.randn(2, 3, 8, 8)
    compiled_step(m, x)
    assert made == [1]
    compiled_step(m, torch.randn(2, 3, 6, 6))  # (another size)
    assert made == [1, 1]
    compiled_step(m.double(), x.double())  # (another dtype)
    assert made == [1, 1, 1]
    m.float()
    x.requires_grad_()  # (another input requiring grad)
    compiled_step(m, x)
    assert made == [1, 1, 1, 1]
    x.requires_grad_(False)
    for f in path.glob("*.json"):  # (damaged: ignored, partitioned both ways again)
        f.write_text("{not json")
    out, expected, em = compiled_step(m, x)
    assert made == [1, 1, 1, 1, 1]
    backward_checked(out, expected, m, em)


def test_record_off_reads_nothing(record, monkeypatch):
    path, made = record
    torch.manual_seed(0)
    m, x = Block(), torch.randn(2, 3, 8, 8)
    compiled_step(m, x)
    monkeypatch.setattr(partition, "RECORD", False)
    compiled_step(m, x)
    assert made == [1, 1]


class SixBlock(torch.nn.Module):
    """conv + BatchNorm + ReLU6 in training: min-cut's partition saves the BatchNorm's bias (a copy) where the default
    one saves the normalized result, and is taken (fewer bytes, no boolean mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.nn.functional.relu6(self.bn(self.conv(x)))


def test_min_cut_verdict_read_back_skips_the_default(monkeypatch, tmp_path):
    made = _record_on_counting(monkeypatch, tmp_path, "default_partition")
    torch.manual_seed(0)
    m, x = SixBlock(), torch.randn(2, 3, 8, 8)
    compiled_step(m, x)
    (record,) = (tmp_path / "dealias" / "partitions").glob("*.json")
    assert "min_cut" in json.loads(record.read_text()) and made == [1]
    read_back = compiled_step(m, x)
    assert made == [1]  # (read back: the default partition not made again)
    # A record whose sets do not match what min-cut saves is not taken: both partitions made again, as before.
    # (Before any backward: a compiled backward would let AOTAutograd's own cache answer, partitioning nothing.)
    data = json.loads(record.read_text())
    data["min_cut"][0].append(99)
    record.write_text(json.dumps(data))
    out, expected, em = compiled_step(m, x)
    assert made == [1, 1]
    backward_checked(*read_back[:2], m, read_back[2])
    m.zero_grad()
    backward_checked(out, expected, m, em)
