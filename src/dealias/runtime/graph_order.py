"""The order of a functional graph's view nodes before inductor lowers it.

dealias's graphs make a view where it is used (the plan replays each view chain before its reader), where dynamo's
graph of the same code has it where the program made it, right after its source. The order is not a detail to
inductor: it lowers nodes in graph order, and a pointwise value not yet stored when a reader is lowered is
computed again inside the reader's kernel, through the reader's index arithmetic. `nn.MultiheadAttention` packs q,
k and v into one buffer (`proj.unflatten(..).transpose(..).contiguous()`) and scales q (`q * 0.125`) before the
bmm that makes inductor store the buffer: with the views of k and v after the scaling, inductor computed the scaled
q from the projection and its bias through divisions and remainders, in a loop it could not vectorize, where
torch.compile's graph, with the three `proj[i]` views first, stores the buffer and scales it in a vectorized loop
(the same kernels otherwise; 4 % of the call).

Moving a view of a value the graph computes next to its source changes no value: nothing writes an intermediate
in place in the graphs handed to inductor this way, and a view reads nothing until its reader runs. Views of inputs
stay where they are (the caller's memory, which the graph may write: their place is the plan's). Nor does a view
move up past a grad-mode switch (runtime/grad_modes.py): a view made under no_grad of a value recorded before it
would be recorded, and require grad, where eager's does not.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..ir.opfacts import is_view_node

aten = torch.ops.aten


def views_after_their_source(gm: fx.GraphModule) -> None:
    """Move each view of a value the graph computes to right after its source (the last node it takes), the views of
    one source in their order, as dynamo's graph of the program has them (`proj[0]`, `proj[1]`, `proj[2]` together).
    A view only moves up, past nodes that do not take it. In place; recompiles `gm` if anything moved."""
    last: dict[fx.Node, fx.Node] = {}  # source -> the view last moved behind it
    moved = False
    # Each node's grad-mode segment: the last switch before it (None before the first). No view moves across one,
    # so the segments stay as they are.
    segment: dict[fx.Node, fx.Node | None] = {}
    current = None
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            current = n
        segment[n] = current
    for n in list(gm.graph.nodes):
        if not is_view_node(n) or _of_an_input(n) or not n.all_input_nodes:
            continue  # (not a reshape, which may copy: where it copies is its readers' business)
        source = _latest(n)
        where = last.get(source, source)
        if segment[where] is not segment[n]:
            where = segment[n]  # (a view made under another grad mode than its source's stays in its own)
        if where.next is not n:
            where.append(n)  # (fx: moves n to right after `where`)
            moved = True
        last[source] = n
    if moved:
        gm.graph.lint()
        gm.recompile()


def _latest(n: fx.Node) -> fx.Node:
    """The input of `n` the graph has last before it."""
    inputs = n.all_input_nodes
    if len(inputs) == 1:
        return inputs[0]
    p = n.prev
    while p not in inputs:
        p = p.prev
    return p


def _of_an_input(n: fx.Node) -> bool:
    """Whether `n` is a view (chain) of a graph input."""
    while (is_view_node(n) or n.target is aten.reshape.default) and isinstance(n.args[0], fx.Node):
        n = n.args[0]
    return n.op == "placeholder"
