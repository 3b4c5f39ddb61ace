"""The fused executor's index checks: indices read from inputs, computed in the graph or from nothing of the
call's are checked before any write, with eager's error (naming the op and the program's line), and leave the
caller's tensors untouched. Few and small: each compile costs seconds on CPU."""

from __future__ import annotations

import types

import pytest
import torch
from fused_harness import kv_write
from harness import check

import dealias


@pytest.mark.parametrize("dynamic", [None, True])
def test_index_bounds_checked_before_any_write(dynamic):
    # With dynamic=True the caches' length is a symbol: the check reads it from the call's cache tensor.
    def args(p, n=8):
        return torch.zeros(1, 2, n, 4), torch.zeros(1, 2, n, 4), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), p

    fn = types.FunctionType(kv_write.__code__.replace(co_name=f"kv_write_{dynamic}"), globals())
    jf = check(fn, *args(torch.tensor([3])), executor="inductor", dynamic=dynamic)
    assert jf.last.tier == "fused"
    assert [r.mode for r in dealias.explain(jf)] == ["in place", "in place"]
    for n in (8, 11):
        kc, vc, k, v, pos = args(torch.tensor([n + 1]), n)
        with pytest.raises(IndexError):
            kv_write(kc.clone(), vc.clone(), k, v, pos)
        with pytest.raises(IndexError, match="index_copy_"):
            jf(kc, vc, k, v, pos)
        assert not kc.any() and not vc.any()


def embed_and_cache(w, tok, cache, pos, x, g):
    cache.index_copy_(0, pos, w[tok] * 2)
    return torch.embedding(w, tok) + x.index_select(0, tok) + x.gather(0, g)


@pytest.mark.parametrize("dynamic", [None, True])
def test_indices_read_from_inputs_are_checked_before_any_write(dynamic):
    # Inductor checks them inside its kernels (after the cache write, with its own error): a read index that is a
    # graph input is checked in the prologue instead, with eager's error, and the graph stays fused. (dynamic=True:
    # against the symbolic sizes of the tensors read, taken from the call's.)
    def args(tok, g):
        return torch.randn(10, 3), tok, torch.zeros(5, 3), torch.tensor([1, 3]), torch.randn(10, 3), g

    fn = types.FunctionType(embed_and_cache.__code__.replace(co_name=f"embed_and_cache_{dynamic}"), globals())
    ok = args(torch.tensor([1, 9]), torch.tensor([[0, 9, 2]]))
    jf = check(fn, *ok, executor="inductor", dynamic=dynamic)
    assert jf.last.tier == "fused"
    ok_tok, ok_g = torch.tensor([1, 2]), torch.tensor([[0, 1, 2]])
    bad = [(torch.tensor([1, 10]), ok_g), (torch.tensor([-1, 2]), ok_g), (ok_tok, torch.tensor([[0, 10, 2]]))]
    written = []
    for tok, g in bad:
        a = args(tok, g)
        eager_args = [t.clone() for t in a]
        with pytest.raises(Exception) as expected:
            embed_and_cache(*eager_args)
        with pytest.raises(type(expected.value), match=r"\(aten\.\w+\.\w+\)\n.*test_inductor_indices.py:\d+"):
            jf(*a)
        # The cache as eager leaves it: untouched where a read before the write raises (`w[tok]`), written where
        # the failing read comes after it (`x.gather`): the refused call ran the graph eagerly (errors.refused).
        assert torch.equal(a[2], eager_args[2]) and a[2]._version == eager_args[2]._version
        written.append(bool(a[2].any()))
    assert written == [False, True, True]  # (`w[-1]` is an index eager takes; `embedding` raises at -1, later)
    assert dealias.cache_info(jf).misses == 1


class StaticLayer:
    """HF transformers' StaticLayer.update (5.x): the write position is computed inside the step, from a count the
    step itself moves before writing."""

    def __init__(self, n=8):
        self.keys, self.values, self.cumulative_length = (
            torch.zeros(1, 2, n, 4),
            torch.zeros(1, 2, n, 4),
            torch.zeros(1, dtype=torch.long),
        )

    def update(self, k, v):
        cache_position = torch.arange(k.shape[-2]) + self.cumulative_length
        self.cumulative_length.add_(k.shape[-2])
        self.keys.index_copy_(2, cache_position, k)
        self.values.index_copy_(2, cache_position, v)
        return self.keys, self.values


def decode_step(layer, k, v):
    keys, values = layer.update(k, v)
    return (keys * values).sum(-1)


@pytest.mark.parametrize("dynamic", [None, True])
def test_an_index_computed_in_the_graph_is_computed_and_checked_before_any_write(dynamic):
    # The position is computed in the prologue (from memory no earlier write of the graph touched) and handed to
    # the fused graph as an input: the cache writes stay in place, and a position out of range raises eager's
    # error after eager's writes (the count moved: the refused call runs the graph eagerly, errors.refused).
    fn = types.FunctionType(decode_step.__code__.replace(co_name=f"decode_step_{dynamic}"), globals())
    ours, eagers = StaticLayer(), StaticLayer()
    jf = dealias.jit(fn, executor="inductor", dynamic=dynamic)
    for _ in range(8):
        k, v = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
        torch.testing.assert_close(jf(ours, k, v), decode_step(eagers, k, v), rtol=0, atol=1e-6)
        for a, b in zip(vars(ours).values(), vars(eagers).values()):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]
    assert [r.mode for r in dealias.explain(jf)] == ["in place"] * 3
    assert dealias.cache_info(jf).misses == 1
    with pytest.raises(IndexError):
        decode_step(eagers, k, v)
    with pytest.raises(IndexError, match=r"index_copy_"):
        jf(ours, k, v)
    for a, b in zip(vars(ours).values(), vars(eagers).values()):
        assert torch.equal(a, b) and a._version == b._version
    assert int(ours.cumulative_length) == 9  # (eager's own code moved the count before its write raised)


def write_at_a_view_then_move_it(cache, pos, v):
    cache.index_copy_(0, pos[1:], v)  # (a view of an input: computed first as a copy, not as the input's memory)
    pos.add_(1)


def read_at_a_computed_index(w, tok, cache, x):
    cache.index_copy_(0, tok % 4, x)
    return torch.embedding(w, tok + 1)


def write_at_a_constant_index_plus_one(cache, pos, v):
    cache.index_copy_(0, torch.tensor([1, 2]) + pos, v)  # (a constant of the graph, computed first with pos)


def write_at_an_index_written_before(cache, pos, v):
    pos.add_(1)
    cache.index_copy_(0, pos * 1, v)  # (its value is known only after the graph's own write)


@pytest.mark.parametrize(
    "fn, args, tier",
    [
        (write_at_a_view_then_move_it, (torch.zeros(5, 2), torch.tensor([0, 3, 1]), torch.randn(2, 2)), "fused"),
        (
            read_at_a_computed_index,
            (torch.randn(9, 2), torch.tensor([7, 2]), torch.zeros(4, 2), torch.randn(2, 2)),
            "fused",
        ),
        (write_at_a_constant_index_plus_one, (torch.zeros(5, 2), torch.tensor([1]), torch.randn(2, 2)), "fused"),
        (write_at_an_index_written_before, (torch.zeros(5, 2), torch.tensor([0, 3]), torch.randn(2, 2)), "torch"),
    ],
)
def test_indices_computed_in_the_graph(fn, args, tier):
    jf = check(fn, *args, executor="inductor")
    assert jf.last.tier == tier
    if tier == "torch":
        assert "computed from pos after a write to it" in dealias.last_traces(jf)[3].text.splitlines()[0]
    bad = [a.clone() for a in args]
    bad[1].fill_(8)
    eagers = [a.clone() for a in bad]
    with pytest.raises(Exception) as expected:
        fn(*eagers)
    with pytest.raises(type(expected.value), match=r"\(aten\.\w+\.\w+\)\n.*test_inductor_indices.py:\d+"):
        jf(*bad)
    # The writes before the failing op done, as eager: the torch executor's ops make them; the fused program checks
    # before any write, and its refused call runs the graph eagerly.
    assert all(torch.equal(a, b) for a, b in zip(bad, eagers))


def rows_into_zeros(x, idx, acc):
    out = torch.zeros(5, 3)
    out[idx] = x  # (a functional index_put into memory the graph made)
    acc.add_(out.sum(0))
    return out * 2


def one_hot_rows(idx, w):
    hot = w.new_zeros(4, 6).scatter_(1, idx, 1.0)  # (w for its dtype only)
    w.add_(hot.t() @ torch.ones(4, 1))
    return hot


def windows_into_a_new_buffer(x, y):
    buf = torch.zeros(6, 3)
    buf[1:4] = x
    buf[2:5] += buf[1:4].flip(0) * y  # reads of the buffer at other rows than the ones it writes
    x.add_(1)  # and a write of the caller's memory the first write read
    return buf


def scatter_into_a_copy_of_an_input(x, y):
    c = x.clone()  # inductor may drop the clone: the scatter would run in place into x
    c[1:3] = y
    return c + x


@pytest.mark.parametrize(
    "fn, args, tier",
    [
        (rows_into_zeros, (torch.randn(2, 3), torch.tensor([4, 1]), torch.zeros(3)), "fused"),
        (one_hot_rows, (torch.tensor([[1], [5], [0], [5]]), torch.zeros(6, 1)), "fused"),
        (windows_into_a_new_buffer, (torch.randn(3, 3), torch.randn(3, 3)), "fused"),
        (scatter_into_a_copy_of_an_input, (torch.randn(4, 3), torch.randn(2, 3)), "torch"),
    ],
)
def test_scatters_into_memory_the_graph_made_are_fused(fn, args, tier):
    jf = check(fn, *args, executor="inductor")
    assert jf.last.tier == tier, dealias.last_traces(jf)[3].text.splitlines()[0]
    if fn in (rows_into_zeros, one_hot_rows):  # an index out of range: eager's error, before any write
        bad = [a.clone() for a in args]
        bad[0 if fn is one_hot_rows else 1].fill_(9)
        before = [a.clone() for a in bad]
        with pytest.raises(Exception) as expected:
            fn(*(a.clone() for a in bad))
        with pytest.raises(type(expected.value), match=r"\(aten\.\w+\.\w+\)\n.*test_inductor_indices.py:\d+"):
            jf(*bad)
        assert all(torch.equal(a, b) for a, b in zip(bad, before))


def add_position_embedding(x, wpe, out):
    pos = torch.arange(x.shape[0])  # (GPT-2's position ids: computed from nothing of the call's)
    out.copy_(x + torch.nn.functional.embedding(pos, wpe))


def test_an_index_computed_from_nothing_of_the_calls_is_computed_and_checked_once():
    # The prologue computed such an index with aten calls from Python on every call (GPT-2's forward: 7% of its
    # time), and checked it: its values and its check's outcome are the same on every call.
    jf = check(add_position_embedding, torch.randn(6, 4), torch.randn(8, 4), torch.zeros(6, 4), executor="inductor")
    assert jf.last.tier == "fused"
    args = (torch.randn(6, 4), torch.randn(8, 4), torch.zeros(6, 4))
    with torch.profiler.profile() as prof:
        for _ in range(3):
            jf(*args)
    assert not [e.name for e in prof.events() if e.name == "aten::arange"]
    # Out of range (a table of 5 positions for 6 rows): eager's error on every call, before the write.
    short = dealias.jit(add_position_embedding, executor="inductor")
    for _ in range(3):
        out = torch.zeros(6, 4)
        with pytest.raises(IndexError, match="index out of range"):
            short(torch.randn(6, 4), torch.randn(5, 4), out)
        assert not out.any()


def embed_tokens_and_positions(ids, wte, wpe, out):
    pos = torch.arange(ids.shape[-1])  # (GPT-2's forward: token ids viewed, positions from nothing of the call's)
    emb = torch.nn.functional.embedding
    out.copy_(emb(ids.view(-1, ids.shape[-1]), wte)[0] + emb(pos, wpe))


def test_an_index_from_nothing_is_computed_once_beside_one_of_the_calls():
    # GPT-2's prologue has both: its position ids (the same values on every call) and a view of the call's token ids
    # (checked on every call). The position ids were computed again on every call with the ids' view.
    make = lambda: (torch.tensor([[1, 0, 2, 1]]), torch.randn(3, 4), torch.randn(6, 4), torch.zeros(4, 4))  # noqa: E731
    jf = check(embed_tokens_and_positions, *make(), executor="inductor")
    assert jf.last.tier == "fused"
    args = make()
    with torch.profiler.profile() as prof:
        for _ in range(3):
            jf(*args)
    assert not [e.name for e in prof.events() if e.name == "aten::arange"]
    for _ in range(2):  # the call's ids out of range: eager's error on every call, before the write
        ids, wte, wpe, out = make()
        ids[0, 2] = 3
        with pytest.raises(IndexError, match="index out of range"):
            jf(ids, wte, wpe, out)
        assert not out.any()
        a = make()
        b = tuple(t.clone() for t in a)
        jf(*a)
        embed_tokens_and_positions(*b)
        torch.testing.assert_close(a[3], b[3], rtol=0, atol=0)
