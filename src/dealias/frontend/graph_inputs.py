"""What a graph from dynamo says about its inputs, read once when the backend takes it (backend.GraphProgram): each
placeholder's name as the user wrote it, the tensors the graph holds as attributes lifted to trailing inputs, which
ints and sizes dynamo made symbolic, which inputs dynamo guards statically, and whether the program may depend on
where an input sits in its storage."""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.fx as fx

from ..compat.internals import GRAD_SOURCE
from ..ir.plan import Symbolic


def source_name(node: fx.Node) -> str:
    """A graph input named as the user wrote it: `self.lin.weight`, `cache`, `opt.state[..]` (from dynamo's
    `Source` of the input), or the placeholder's own name."""
    arg = node.meta.get("grapharg")
    source = getattr(arg, "source", None)
    if source is None:
        return node.name
    text = source.name() if callable(getattr(source, "name", None)) else str(source.name)
    text = re.sub(r"^[LG]\['([^']*)'\]", r"\1", text)
    text = re.sub(r"\._(?:modules|parameters|buffers)\['([^']*)'\]", r".\1", text)
    text = re.sub(r"\['([A-Za-z_][A-Za-z0-9_]*)'\]", r".\1", text)
    return text


def lift_attributes(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """A copy of `gm` whose tensor attributes (`get_attr` nodes) are trailing placeholders, and those tensors."""
    attrs = [n for n in gm.graph.find_nodes(op="get_attr") if isinstance(_attribute(gm, n.target), torch.Tensor)]
    if not attrs:
        return gm, []
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    old_placeholders = gm.graph.find_nodes(op="placeholder")
    for n in old_placeholders:
        env[n] = graph.node_copy(n, env.__getitem__)
    values = []
    for n in attrs:
        env[n] = graph.placeholder(re.sub(r"\W", "_", n.target))
        env[n].meta.update(n.meta)
        values.append(_attribute(gm, n.target))
    for n in gm.graph.nodes:
        if n not in env:
            env[n] = graph.node_copy(n, env.__getitem__)
    return fx.GraphModule(gm, graph), values


def _attribute(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def reads_offsets(gm: fx.GraphModule) -> bool:
    """Whether a graph may depend on its inputs' absolute storage offsets: it calls an `as_strided` op (whose
    offset argument is absolute), reads `storage_offset()`, or views memory as a wider dtype (`view_as_complex`,
    `x.view(torch.float64)` of float32 memory), which eager refuses at an offset not a multiple of the ratio."""
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method"):
            name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
            if "as_strided" in name or "storage_offset" in name or name == "view_as_complex":
                return True
            if name == "view" and _widens(n):
                return True
    return False


def _widens(n: fx.Node) -> bool:
    """`x.view(dtype)` to a dtype of larger elements than x's."""
    x = n.args[0].meta.get("example_value") if n.args and isinstance(n.args[0], fx.Node) else None
    dtypes = [a for a in (*n.args[1:], *n.kwargs.values()) if isinstance(a, torch.dtype)]
    return isinstance(x, torch.Tensor) and any(d.itemsize > x.dtype.itemsize for d in dtypes)


def symbolic_inputs(placeholders: list[fx.Node]) -> Symbolic:
    """What dynamo made symbolic (automatic dynamic: it changed between calls): tensor dims with symbolic sizes,
    int inputs that are one of those sizes, and free int inputs (a position, a step count)."""
    dims: dict[int, frozenset[int]] = {}
    size_of: dict[Any, tuple[int, int]] = {}  # symbol -> (tensor, dim) whose size it is
    for i, n in enumerate(placeholders):
        val = n.meta.get("example_value")
        if isinstance(val, torch.Tensor):
            symbolic = frozenset(d for d, s in enumerate(val.shape) if isinstance(s, torch.SymInt))
            if symbolic:
                dims[i] = symbolic
            for d in symbolic:
                size_of.setdefault(val.shape[d].node.expr, (i, d))
    scalars, sizes = [], {}
    for i, n in enumerate(placeholders):
        val = n.meta.get("example_value")
        if isinstance(val, torch.SymFloat) and val.node.expr.free_symbols:
            scalars.append(i)  # (a float dynamo made dynamic: floats.py)
        elif isinstance(val, torch.SymInt) and val.node.expr.free_symbols:
            if val.node.expr in size_of:
                sizes[i] = size_of[val.node.expr]
            elif not val.node.expr.free_symbols & set(size_of):
                scalars.append(i)
            else:
                return Symbolic()  # an expression over sizes (`2 * s0`): specialize everything
    return Symbolic(dims, tuple(scalars), sizes)


def statically_guarded(node: fx.Node) -> bool:
    """An input dynamo took from the user's frame (it has a source, so dynamo guards it), with static sizes. Not a
    gradient (`p.grad`): dynamo guards an optimizer's gradients as not None only (compat.internals.GRAD_SOURCE), so
    a gradient of another layout or dtype would pass its guards (a transposed `p.grad` was read as the compiled
    layout's: an SGD step's parameters wrong by 10 with no error)."""
    arg = node.meta.get("grapharg")
    val = node.meta.get("example_value")
    if arg is None or getattr(arg, "source", None) is None or not isinstance(val, torch.Tensor):
        return isinstance(val, (int, float, bool)) and arg is not None  # a specialized scalar: guarded by value
    if GRAD_SOURCE is None or isinstance(arg.source, GRAD_SOURCE):
        return False
    return static_tensor(node)


def static_tensor(node: fx.Node) -> bool:
    """A tensor input of static sizes and strides (a check of its layout needs no symbol)."""
    val = node.meta.get("example_value")
    return isinstance(val, torch.Tensor) and all(isinstance(s, int) for s in (*val.shape, *val.stride()))
