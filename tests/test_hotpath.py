"""A fused call's Python on a cache hit (issue 38: "stay cheap on a cache hit"): an index the graph computes from a
one-element input (HF's static cache: `torch.arange(n) + self.cumulative_length`) stays in the graph and is checked
by its range, read with `.item()` (runtime/index_ranges.py), not computed with aten calls from Python before the
call; checks read a few-entry index inline (`prologue.source`). Each compared with eager: outputs, the caches and
counts the calls write, eager's error for a position out of range with every caller tensor untouched, compiles."""

from __future__ import annotations

import pytest
import torch
from harness import check

import dealias

pytestmark = pytest.mark.inductor


class StaticLayer:
    """HF transformers' StaticLayer.update (5.x): each step's write positions are computed from a count it keeps."""

    def __init__(self, n=8, count=0):
        self.keys, self.values = torch.zeros(1, 2, n, 4), torch.zeros(1, 2, n, 4)
        self.cumulative_length = torch.tensor(count)

    def update(self, k, v):
        # (`* 1 - 0`: ops the range follows, as a computed position may have them)
        cache_position = (torch.arange(k.shape[-2]) * 1 - 0) + self.cumulative_length
        self.cumulative_length.add_(k.shape[-2])
        self.keys.index_copy_(2, cache_position, k)
        self.values.index_copy_(2, cache_position, v)
        return self.keys, self.values


def decode_step(layer, k, v):
    keys, values = layer.update(k, v)
    return (keys * values).sum(-1)


def _state(layer):
    return [t.clone() for t in (layer.keys, layer.values, layer.cumulative_length)]


def _same(a, b, atol=1e-6):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=atol)


def test_a_computed_position_stays_in_the_graph_and_is_checked_by_its_range():
    ours, eagers = StaticLayer(count=1), StaticLayer(count=1)
    jf = dealias.jit(decode_step, executor="inductor")
    for _ in range(3):  # two positions a step, up to the last slot
        k, v = torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4)
        torch.testing.assert_close(jf(ours, k, v), decode_step(eagers, k, v), rtol=0, atol=1e-6)
        _same(_state(ours), _state(eagers))
        assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]
    run = jf.last.run_graph
    # The position is the graph's (no input computed before the call), its check reads the count with `.item()`.
    assert not [n.name for n in run.graph.graph.find_nodes(op="placeholder") if n.name.endswith("_computed_first")]
    assert ".item()" in run.prologue.source and "compute" not in run.prologue.source
    ours.cumulative_length.sub_(6)
    eagers.cumulative_length.sub_(6)
    with torch.profiler.profile() as prof:
        jf(ours, k, v)
    ops = {e.name for e in prof.events()}
    assert not ops & {"aten::arange", "aten::add", "aten::mul", "aten::sub"}, ops
    decode_step(eagers, k, v)
    _same(_state(ours), _state(eagers))
    # A count whose positions end past the caches (7, 8 of 8 slots): eager's error, the caller's tensors as eager
    # leaves them (its kernel wrote the key at 7 before reaching 8; the refused call ran the graph eagerly).
    ours.cumulative_length.fill_(7)
    eagers.cumulative_length.fill_(7)
    with pytest.raises(IndexError) as expected:
        decode_step(eagers, k, v)
    with pytest.raises(IndexError, match="index_copy_") as got:
        jf(ours, k, v)
    assert str(got.value).startswith(str(expected.value).splitlines()[0])
    _same(_state(ours), _state(eagers), atol=0)
    assert dealias.cache_info(jf).misses == 1


def write_at_a_wide_range(cache, pos, v):
    # Entries all equal to pos, whose range the prologue takes as pos - 3 .. pos + 3: below 0 for pos = 0, where the
    # index is computed and checked entry by entry (it passes), as eager's index_copy_ accepts it.
    cache.index_copy_(0, torch.arange(4) - torch.arange(4) + pos, v)
    return cache.sum()


def test_a_range_wider_than_the_values_is_checked_entry_by_entry():
    make = lambda p: (torch.zeros(5, 2), torch.tensor(p), torch.randn(4, 2))  # noqa: E731
    jf = check(write_at_a_wide_range, *make(0), executor="inductor")
    assert jf.last.tier == "fused"
    assert ".item()" in jf.last.run_graph.prologue.source
    for p in (0, 4, 2):
        a = make(p)
        b = tuple(t.clone() for t in a)
        torch.testing.assert_close(jf(*a), write_at_a_wide_range(*b), rtol=0, atol=1e-6)
        _same(a, b, atol=0)
    a = make(5)
    before = a[0].clone()
    with pytest.raises(IndexError) as expected:
        write_at_a_wide_range(*(t.clone() for t in a))
    with pytest.raises(IndexError, match="index_copy_") as got:
        jf(*a)
    assert str(got.value).startswith(str(expected.value).splitlines()[0])
    assert torch.equal(a[0], before)
    assert dealias.cache_info(jf).misses == 1


def embed(ids, w, out):
    out.copy_(torch.nn.functional.embedding(ids, w).sum(1))


def test_a_few_ids_are_read_inline():
    # GPT-2's token ids (1 x n): one `tolist()` and Python's min and max, the check function only out of range.
    make = lambda: (torch.tensor([[1, 0, 2, 1]]), torch.randn(3, 4), torch.zeros(1, 4))  # noqa: E731
    jf = check(embed, *make(), executor="inductor")
    assert jf.last.tier == "fused"
    assert ".tolist()" in jf.last.run_graph.prologue.source
    for bad in (3, -1):
        ids, w, out = make()
        ids[0, 2] = bad
        with pytest.raises(IndexError) as expected:
            embed(ids, w, out.clone())
        with pytest.raises(IndexError) as got:
            jf(ids, w, out)
        assert str(got.value).startswith(str(expected.value).splitlines()[0])
        assert not out.any()
