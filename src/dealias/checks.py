"""Run-time checks that keep a failing call from touching the caller's tensors.

Shapes, dtypes and overlap are checked when tracing; what can still fail at run time is an index out of
range in an indexed write (`index_put_`, `index_copy_`, `scatter_`...). Eager may then have written part of
its input before raising. dealias checks the indices of every indexed write into the caller's memory before
the first such write, and raises eager's IndexError with the inputs left as they were.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from .errors import UnsupportedError

aten = torch.ops.aten


def check_index_bounds(index: torch.Tensor, size: int, dim: int, allow_negative: bool) -> None:
    """Raise eager's IndexError if an entry of `index` does not address dimension `dim` of size `size`."""
    n = index.numel()
    if n == 0:
        return
    lo = -size if allow_negative else 0
    if n <= 64:  # the usual KV-cache position: a host list is cheaper than two reductions
        values = index.reshape(-1).tolist()
        small, large = min(values), max(values)
    else:
        small, large = (int(v) for v in torch.aminmax(index))
    if small < lo or large >= size:
        bad = small if small < lo else large
        raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


check_index_bounds._dealias_effect = True  # type: ignore[attr-defined]


def _index_args(node: fx.Node) -> list[tuple[fx.Node, int, bool]]:
    """(index tensor, dimension, negative allowed) of an indexed in-place write."""
    name = node.target._schema.name if isinstance(node.target, torch._ops.OpOverload) else ""
    args = node.args
    if name in ("aten::index_put_", "aten::_index_put_impl_"):
        indices = args[1]
        if any(isinstance(i, fx.Node) and i.meta["val"].dtype in (torch.bool, torch.uint8) for i in indices):
            return []  # masks: their shape was checked when tracing
        return [(i, d, True) for d, i in enumerate(indices) if isinstance(i, fx.Node)]
    if name in ("aten::index_copy_", "aten::index_add_", "aten::index_fill_", "aten::index_reduce_"):
        return [(args[2], args[1], False)]
    if name.startswith(("aten::scatter", "aten::scatter_add_", "aten::scatter_reduce_")):
        return [(args[2], args[1], False)]
    return []


def _root(node: Any) -> Any:
    while isinstance(node, fx.Node) and node.op == "call_function" and node.args:
        node = node.args[0]
    return node


def guard_index_writes(graph: fx.Graph, roots: list[fx.Node | None]) -> None:
    """Insert bounds checks for the indexed writes into caller memory (`roots`) before the first write
    into caller memory, or, for indices computed later, right before their own write."""
    roots = {r for r in roots if r is not None}
    writes = [n for n in graph.nodes if n.op == "call_function" and _is_write(n) and _root(n.args[0]) in roots]
    if not writes:
        return
    order = {n: i for i, n in enumerate(graph.nodes)}
    first = writes[0]
    done: set[tuple[Any, ...]] = set()
    for w in writes:
        for index, dim, neg in _index_args(w):
            size = w.args[0].meta["val"].shape[dim]
            if (index, str(size), dim, neg) in done:
                continue
            done.add((index, str(size), dim, neg))
            anchor = first if order[index] < order[first] else w
            with graph.inserting_before(anchor):
                if isinstance(size, torch.SymInt):  # read from the written tensor when it is symbolic
                    if order[w.args[0]] > order[anchor]:
                        raise UnsupportedError("an index bound of symbolic size known only after the first write")
                    size = graph.call_function(torch.ops.aten.sym_size.int, (w.args[0], dim))
                graph.call_function(check_index_bounds, (index, size, dim, neg))


def _is_write(n: fx.Node) -> bool:
    t = n.target
    return isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable
