"""Clean-up passes on the functional graph: common-subexpression elimination (functionalization replays
the same view chains many times) and dead-code elimination (regenerated views nobody reads).

Random ops are never merged and never dropped: each draw advances the generator exactly as in eager.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from ..ir.opfacts import has_effect, removable_if_unused


def _keep(node: fx.Node) -> bool:
    """Random draws, checks and (should a verifier have let one through) writes are never merged or dropped."""
    return has_effect(node.target)


def _freeze(a: Any) -> Any:
    if isinstance(a, (list, tuple)):
        return (type(a).__name__,) + tuple(_freeze(x) for x in a)
    if isinstance(a, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in a.items()))
    if isinstance(a, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return (type(a).__name__, str(a))
    if isinstance(a, float):
        return ("float", repr(a))  # -0.0 and nan must not merge with 0.0 / each other
    return a


def cse(gm: fx.GraphModule) -> fx.GraphModule:
    seen: dict[Any, fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or _keep(node):
            continue
        if any(u.op == "output" for u in node.users):
            # A returned tensor is computed on its own: merged with an equal one, one of the two would be a clone
            # of the other, and a hook registered on it after the graph (segments.py) would see both gradients.
            continue
        try:
            key = (node.target, _freeze(node.args), _freeze(node.kwargs), node.meta.get("grad"))
            hash(key)
        except TypeError:
            continue
        if key in seen:
            node.replace_all_uses_with(seen[key])
            gm.graph.erase_node(node)
        else:
            seen[key] = node
    return gm


def dce(gm: fx.GraphModule) -> fx.GraphModule:
    """Drop unused values, except ops with an effect and ops that raise on their values (an unused
    `index_select` with an index out of range raises in eager)."""
    gm.graph.eliminate_dead_code(
        is_impure_node=lambda n: n.op not in ("call_function", "get_attr") or not removable_if_unused(n.target)
    )
    return gm


def distinct_outputs(gm: fx.GraphModule, first: int) -> fx.GraphModule:
    """Outputs from `first` on are the bases of distinct storages; CSE may have merged two equal ones
    (`a = x + 1; b = x + 1`), and eager's `a` and `b` do not alias: give each its own tensor."""
    out = gm.graph.output_node()
    values = list(out.args[0])
    seen: set[fx.Node] = set()
    for i in range(first, len(values)):
        if values[i] in seen and isinstance(values[i].meta.get("val"), torch.Tensor):
            with gm.graph.inserting_before(out):
                clone = gm.graph.call_function(torch.ops.aten.clone.default, (values[i],))
            clone.meta = dict(values[i].meta)
            values[i] = clone
        seen.add(values[i])
    out.args = (tuple(values),)
    return gm


def optimize(gm: fx.GraphModule, first_output: int = 0) -> fx.GraphModule:
    """CSE and DCE; outputs from `first_output` on stay distinct tensors."""
    gm = distinct_outputs(dce(cse(gm)), first_output)
    gm.graph.lint()
    gm.recompile()
    return gm
