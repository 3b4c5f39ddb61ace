"""Python floats dynamo made dynamic, as float inputs of the graph (issue 39: a float that changes every call, an
LR schedule or a sampler's coefficients, compiled once per value up to `cache_limit` and then ran eagerly).

On dealias's frames dynamo specializes a float on the first call and, once its value changed (automatic dynamic,
`specialize_float=False`: compat/settings.py), passes it as a 0-d float64 tensor (`GraphArg.pass_arg_as_tensor`:
dynamo's bytecode calls `torch.as_tensor(s)`) read back in the graph with `.item()`, a SymFloat in dynamo's own
trace. Capture cannot trace `.item()` of a fake tensor, and the tensor must not reach the program anyway: eager's
`x.mul_(s)` gets a Python float, a *wrapped number* that does not promote a float16 tensor, where a 0-d float64
tensor would (`x * torch.tensor(s, dtype=float64)` of a half tensor is half too, but `torch.add(i, t)` of an int
tensor and 0-d float64 is float64, not float32: only a Python float is eager's).

So the graph is rewritten: such a placeholder *is* the float (its `.item()` nodes removed, its example value
dynamo's SymFloat), and each call passes `t.item()`, the caller's float exactly (float64 holds a Python float's
bits, signs of zero and nan included). The backend then treats it as it treats a symbolic int (`Symbolic.scalars`):
capture traces it as a float symbol of its ShapeEnv, the torch executor passes it to eager's kernels as a
Python float, and the program's shape guard says which values it holds for. A program is compiled over a
float symbol only for a finite, non-zero value (capture.py): a zero's sign or a nan is something sympy's
guards cannot tell, so those values compile with the float specialized, guarded by its bits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx


def _item_users(node: fx.Node) -> list[fx.Node] | None:
    users = list(node.users)
    if all(u.op == "call_method" and u.target == "item" and len(u.args) == 1 and not u.kwargs for u in users):
        return users
    return None


def floats_as_scalars(gm: fx.GraphModule) -> tuple[fx.GraphModule, tuple[int, ...]]:
    """`gm` with each float dynamo passes as a 0-d float64 tensor read by `.item()` taken as the float itself, and
    those placeholders' positions (the module docstring). `gm` itself is left alone (dynamo may hold it)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    found = []
    for i, n in enumerate(placeholders):
        arg = n.meta.get("grapharg")
        val = n.meta.get("example_value")
        if not getattr(arg, "pass_arg_as_tensor", False) or not isinstance(val, torch.Tensor):
            continue
        if val.dtype != torch.float64 or val.dim() != 0:
            continue
        users = _item_users(n)
        if users is None:
            continue  # (used as a tensor too: left as dynamo gave it; capture refuses `.item()`)
        symbols = [u.meta.get("example_value") for u in users]
        if users and not all(isinstance(s, torch.SymFloat) for s in symbols):
            continue
        found.append((i, n.name, symbols[0] if symbols else None))
    if not found:
        return gm, ()
    gm = fx.GraphModule(gm, _copy_graph(gm.graph))
    placeholders = gm.graph.find_nodes(op="placeholder")
    for i, _, symbol in found:
        n = placeholders[i]
        for u in _item_users(n) or ():
            u.replace_all_uses_with(n)
            gm.graph.erase_node(u)
        if symbol is not None:
            n.meta["example_value"] = symbol
        n.type = float
    gm.recompile()
    return gm, tuple(i for i, _, _ in found)


def _copy_graph(graph: fx.Graph) -> fx.Graph:
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    out = new.graph_copy(graph, env)
    new.output(out)
    for old, copied in env.items():
        copied.meta = dict(old.meta)
    return new


def with_floats(program: Callable[..., Any], positions: tuple[int, ...]) -> Callable[..., Any]:
    """`program` called with the floats dynamo passes as 0-d tensors at `positions` as Python floats."""

    def call(*args: Any) -> Any:
        args = list(args)
        for p in positions:
            if isinstance(args[p], torch.Tensor):
                args[p] = args[p].item()
        return program(*args)

    call.program = program  # type: ignore[attr-defined]
    return call
