"""User-style programs of bench/user_programs.py (issue 38) where the fused call did Python work torch.compile's does
not: a replay buffer's write position `(ptr + torch.arange(n)) % capacity` is in 0 .. capacity - 1 whatever ptr is
(runtime/index_ranges.py: no index computed with aten calls before the call), and an index checked for several
reads or writes is read once (runtime/prologue.py). Each compared with eager: outputs and every buffer written, and
eager's error with the caller's tensors untouched where an index is out of range."""

from __future__ import annotations

import pytest
import torch

import dealias

pytestmark = pytest.mark.inductor


class Replay:
    def __init__(self, capacity=16, obs=3):
        self.obs = torch.zeros(capacity, obs)
        self.reward = torch.zeros(capacity)
        self.ptr = torch.zeros((), dtype=torch.long)


def add_and_sample(buf, obs, reward, idx, capacity: int):
    pos = (buf.ptr + torch.arange(obs.shape[0])) % capacity
    buf.obs.index_copy_(0, pos, obs)
    buf.reward[pos] = reward
    buf.ptr.add_(obs.shape[0]).remainder_(capacity)
    return buf.obs[idx], buf.reward[idx], buf.obs[idx].sum(1)  # (idx read three times)


def _state(buf):
    return [buf.obs.clone(), buf.reward.clone(), buf.ptr.clone()]


def _same(a, b, atol=1e-6):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=atol)


def _batch(n=5, samples=70, g=torch.Generator().manual_seed(0)):
    # (70 sampled rows: more than the prologue reads entry by entry in Python)
    return torch.randn(n, 3, generator=g), torch.randn(n, generator=g), torch.randint(0, 16, (samples,), generator=g)


def test_a_ring_buffers_position_is_the_graphs_and_each_index_is_read_once():
    ours, eagers = Replay(), Replay()
    jf = dealias.jit(add_and_sample, executor="inductor")
    for _ in range(5):  # 25 rows into 16: the position wraps
        obs, reward, idx = _batch()
        got, expected = jf(ours, obs, reward, idx, 16), add_and_sample(eagers, obs, reward, idx, 16)
        _same(got, expected)
        _same(_state(ours), _state(eagers))
        assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]
    run = jf.last.run_graph
    # The position is left to the graph (its range 0 .. 15 inside the buffer's 16 rows: nothing to check), the
    # sampled rows are reduced once for the three reads.
    assert not [n.name for n in run.graph.graph.find_nodes(op="placeholder") if n.name.endswith("_computed_first")]
    source = run.prologue.source
    assert "compute(" not in source and source.count("extremes(") == 1, source
    with torch.profiler.profile() as prof:
        jf(ours, *_batch(), 16)
    ops = [e.name for e in prof.events()]
    assert not {"aten::arange", "aten::add", "aten::remainder"} & set(ops), ops
    assert ops.count("aten::aminmax") == 1, ops
    assert dealias.cache_info(jf).misses == 1


def test_a_remainder_past_the_buffer_is_checked_entry_by_entry():
    # `% 20` into 16 rows: the range 0 .. 19 is not inside the rows, so the position is computed and checked before
    # the call: eager's error where an entry is past the rows (ptr 12: rows 12 .. 16; ptr 19: 19, 0 ..), none where
    # none is.
    jf = dealias.jit(add_and_sample, executor="inductor")
    for ptr, raises in ((0, False), (12, True), (8, False), (19, True)):
        ours, eagers = Replay(), Replay()
        for b in (ours, eagers):
            b.ptr.fill_(ptr)
            b.obs.copy_(torch.arange(48.0).view(16, 3))
        obs, reward, idx = _batch()
        saved = _state(ours)
        if raises:
            with pytest.raises(IndexError) as expected:
                add_and_sample(eagers, obs, reward, idx, 20)
            with pytest.raises(IndexError, match="index_copy_") as got:
                jf(ours, obs, reward, idx, 20)
            assert str(got.value).startswith(str(expected.value).splitlines()[0])
            _same(_state(ours), saved, atol=0)
        else:
            _same(jf(ours, obs, reward, idx, 20), add_and_sample(eagers, obs, reward, idx, 20))
            _same(_state(ours), _state(eagers))
        assert jf.last.tier == "fused"


@pytest.mark.parametrize("bad", [16, -17])
def test_a_sampled_index_read_once_still_gives_eagers_error(bad):
    ours, eagers = Replay(), Replay()
    jf = dealias.jit(add_and_sample, executor="inductor")
    obs, reward, idx = _batch()
    _same(jf(ours, obs, reward, idx, 16), add_and_sample(eagers, obs, reward, idx, 16))
    obs, reward, idx = _batch()
    idx[40] = bad
    with pytest.raises(IndexError) as expected:
        add_and_sample(eagers, obs, reward, idx, 16)
    with pytest.raises(IndexError) as got:
        jf(ours, obs, reward, idx, 16)
    assert str(got.value).startswith(str(expected.value).splitlines()[0])
    assert dealias.cache_info(jf).misses == 1
