"""A view made under another grad mode than its source stays in its own mode when graph_order.py moves views next to
their sources (review19: the grad-mode switches of runtime/grad_modes.py are put in before the views move; a view of
a recorded value moved above a `no_grad` switch would be recorded, and require grad, where eager's does not)."""

from __future__ import annotations

import torch
import torch.fx as fx

from dealias.runtime.graph_order import views_after_their_source

aten = torch.ops.aten


def _graph() -> tuple[fx.GraphModule, dict[str, fx.Node]]:
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(aten.mul.Tensor, (x, 2))
    off = g.call_function(torch._C._set_grad_enabled, (False,))
    b = g.call_function(aten.sin.default, (x,))
    v = g.call_function(aten.t.default, (a,))  # (made under no_grad, as eager made it)
    w = g.call_function(aten.t.default, (b,))
    on = g.call_function(torch._C._set_grad_enabled, (True,))
    u = g.call_function(aten.cos.default, (x,))
    r = g.call_function(aten.t.default, (a,))  # (made with grad on again)
    g.output((v, w, u, r))
    return fx.GraphModule(torch.nn.Module(), g), {"a": a, "off": off, "b": b, "v": v, "w": w, "on": on, "r": r}


def test_a_view_does_not_move_up_past_a_grad_mode_switch():
    gm, n = _graph()
    views_after_their_source(gm)
    order = list(gm.graph.nodes)
    assert order.index(n["off"]) < order.index(n["v"]) < order.index(n["on"])  # (still under no_grad)
    assert order.index(n["on"]) < order.index(n["r"])  # (still with grad on)
    assert order.index(n["w"]) == order.index(n["b"]) + 1  # (its source in its own mode: moved next to it)
    assert order.index(n["v"]) == order.index(n["off"]) + 1  # (as far up as its mode allows)


def eager(x):
    a = x * 2
    with torch.no_grad():
        b = x.sin()
        v = a.t()
        w = b.t()
    return v, w, x.cos(), a.t()


def test_the_moved_graph_records_as_eager_under_each_mode():
    gm, _ = _graph()
    views_after_their_source(gm)
    x = torch.randn(3, 3, requires_grad=True)
    for got, expected in zip(gm(x), eager(x)):
        assert torch.equal(got, expected)
        assert got.requires_grad == expected.requires_grad
        assert (got.grad_fn is None) == (expected.grad_fn is None)  # (a view made under no_grad: no grad_fn)
