"""runtime/graph_order.py: the views of a value a fused graph computes moved next to their source before inductor
lowers the graph (in inductor's graph order, a value stored before its readers are lowered is read back, not
computed again inside each reader's kernel), values unchanged."""

from __future__ import annotations

import copy

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from dealias.runtime.graph_order import views_after_their_source

aten = torch.ops.aten


def packed_attention(x, w):
    # MultiheadAttention's packed projection: one buffer for q, k and v, q scaled before k and v are taken
    p = (x @ w).view(4, 3, 8).transpose(0, 1).contiguous()
    q = p[0] * 0.5
    k = p[1]
    v = p[2]
    return (q @ k.t()).softmax(-1) @ v, x.t()


def test_views_of_a_computed_value_follow_it_in_order():
    x, w = torch.randn(4, 6), torch.randn(6, 24)
    gm = make_fx(packed_attention)(x, w)
    selects = [n for n in gm.graph.nodes if n.target is aten.select.int]
    assert [u.target for u in selects[0].users] == [aten.mul.Tensor]
    assert selects[0].next.target is aten.mul.Tensor  # (the capture's order: a view where it is used)
    input_view = next(n for n in gm.graph.nodes if n.target is aten.t.default and n.args[0].op == "placeholder")
    before = list(gm.graph.nodes)
    moved = copy.deepcopy(gm)
    views_after_their_source(moved)
    nodes = list(moved.graph.nodes)
    names = [n.name for n in nodes]
    clone = next(n for n in nodes if n.target is aten.clone.default)
    # the three views of the packed buffer right after it, in their order (views of them right after each), the
    # scaling after them
    after = names[names.index(clone.name) + 1 : names.index("mul")]
    assert [a for a in after if a.startswith("select")] == [s.name for s in selects]
    assert {n.target for n in nodes if n.name in after} == {aten.select.int, aten.t.default}
    # a view of an input stays where it was (the caller's memory: its place is the plan's)
    assert names.index(input_view.name) == [n.name for n in before].index(input_view.name)
    for a, b in zip(moved(x, w), packed_attention(x, w)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_graph_in_that_order_already_is_unchanged():
    gm = make_fx(lambda x: (x.exp().view(2, 3)[0] * 2, x.sin().t()))(torch.randn(6))
    code = gm.code
    views_after_their_source(gm)
    assert gm.code == code
