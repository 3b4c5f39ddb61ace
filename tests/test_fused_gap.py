"""What a fused call runs in Python around inductor's code (issue 38: GPT-2's forward, fused against torch.compile).
The generated code of both was the same; the difference was dealias's per-call Python: an index view computed
only to be checked, a `reshape` before the check, a Python context manager around a returned view."""

from __future__ import annotations

import re

import pytest
import torch
from harness import check


def embed_rows(ids, wte, wpe, out):
    # GPT-2's embedding of its token ids: a view of the call's ids read as the index, then a write of the caller's
    # memory (so that an index out of range must raise before anything is written)
    pos = torch.arange(ids.shape[-1])
    out.copy_(torch.nn.functional.embedding(ids.view(-1, ids.shape[-1]), wte) + torch.nn.functional.embedding(pos, wpe))


def write_at_flattened(cache, pos, v):
    cache.index_copy_(0, pos.view(-1), v)  # (pos is 2-D: the written rows in row-major order)


def _aten_calls(jf, args, calls=3):
    with torch.profiler.profile() as prof:
        for _ in range(calls):
            jf(*args)
    return [e.name for e in prof.events() if e.name in ("aten::view", "aten::reshape", "aten::_reshape_alias")]


@pytest.mark.inductor
def test_an_index_reshaped_from_an_input_is_checked_as_the_input():
    # The prologue computed `ids.view(-1, n)` on every call (an FX call and an aten view) only to check it, and the
    # check reshaped it again: checking the call's ids themselves reads the same elements in the same order.
    make = lambda: (torch.tensor([[1, 0, 2], [2, 2, 1]]), torch.randn(3, 4), torch.randn(5, 4), torch.zeros(2, 3, 4))  # noqa: E731
    jf = check(embed_rows, *make(), executor="inductor")
    assert jf.last.tier == "fused"
    assert _aten_calls(jf, make()) == []
    for _ in range(2):  # out of range: eager's error on every call, before the write
        ids, wte, wpe, out = make()
        ids[1, 0] = 3
        with pytest.raises(IndexError, match="index out of range"):
            embed_rows(ids.clone(), wte, wpe, out.clone())
        with pytest.raises(IndexError, match="index out of range"):
            jf(ids, wte, wpe, out)
        assert not out.any()


@pytest.mark.inductor
def test_a_flattened_write_index_names_eagers_first_bad_entry():
    # The error names the first entry out of range in the view's order, which is the input's row-major order.
    make = lambda pos: (torch.zeros(5, 2), pos, torch.randn(4, 2))  # noqa: E731
    jf = check(write_at_flattened, *make(torch.tensor([[0, 3], [1, 4]])), executor="inductor")
    assert jf.last.tier == "fused"
    assert _aten_calls(jf, make(torch.tensor([[0, 3], [1, 4]]))) == []
    bad = torch.tensor([[0, 7], [9, 1]])
    torch.manual_seed(0)
    eager_args = make(bad.clone())
    with pytest.raises(IndexError) as eager:
        write_at_flattened(*eager_args)
    torch.manual_seed(0)
    cache, pos, v = make(bad)
    with pytest.raises(IndexError, match=re.escape(str(eager.value).splitlines()[0])):
        jf(cache, pos, v)
    # (eager's kernel wrote the rows before the bad entry: the refused call ran the graph eagerly)
    assert torch.equal(cache, eager_args[0]) and cache._version == eager_args[0]._version


def logits_no_grad(w, x):
    with torch.no_grad():
        return (x @ w).reshape(2, 3, -1)  # (a view of the product, made under no_grad: replayed after the graph)


def test_a_view_made_in_another_grad_mode_switches_the_mode_without_a_context_manager():
    jf = check(logits_no_grad, torch.randn(4, 5, requires_grad=True), torch.randn(6, 4))
    source = jf.last.source
    assert "set_grad_enabled(False)" in source and "with torch" not in source, source
    assert torch.is_grad_enabled()
    out = jf(torch.randn(4, 5, requires_grad=True), torch.randn(6, 4))
    assert not out.requires_grad and torch.is_grad_enabled()


def logits(w, x):
    with torch.no_grad():
        return x @ w  # (3-D by 2-D: `_unsafe_view` of the 2-D product, a tensor of its own)


def logits_and_a_view(w, x):
    with torch.no_grad():
        y = x @ w
        return y, y.view(-1)  # (the second a view of the first, in eager as here)


@pytest.mark.inductor
def test_a_reshaped_result_is_returned_by_the_fused_graph():
    # The generated call replayed `_unsafe_view` on the graph's 2-D product after the kernels ran (an aten call from
    # Python: 40-60 us of a GPT-2 call); inductor returns the reshaped buffer without a kernel.
    make = lambda: (torch.randn(4, 5, requires_grad=True), torch.randn(2, 3, 4))  # noqa: E731
    jf = check(logits, *make(), executor="inductor")
    assert jf.last.tier == "fused"
    assert "aten__unsafe_view(" not in jf.last.source, jf.last.source
    out = jf(*make())
    assert out._base is None and out._version == 0 and not out.requires_grad
    # Read by another output too: replayed as before, so that the view's base is the first output as in eager.
    jf = check(logits_and_a_view, *make(), executor="inductor")
    assert jf.last.tier == "fused" and "aten__unsafe_view(" in jf.last.source
    y, v = jf(*make())
    assert v._base is y
