"""Readable traces: every stage's graph printed as Python, with the user's source line beside each op.

A trace is data: the stage's graph itself (each stage keeps its own: later passes do not rewrite it), which passes
made it and how long they took. It is printed only when asked (`dealias.last_traces`), so a compile does not pay
for formatting graphs nobody reads.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from ..errors import node_location
from .opfacts import op_name
from .viewops import contiguous_strides


class Trace:
    """One stage's program: `render()` prints it; `passes` are the (name, seconds) of the passes that made it from
    the previous trace's program, and `graph` is the stage's graph (None for dynamo's, shown as its code)."""

    def __init__(
        self,
        name: str,
        render: Callable[[], str],
        passes: list[tuple[str, float]] | None = None,
        graph: fx.GraphModule | None = None,
    ) -> None:
        self.name = name
        self.graph = graph
        self.passes = list(passes or [])
        self._render = render
        self._text: str | None = None

    @property
    def text(self) -> str:
        if self._text is None:
            header, _, body = self._render().partition("\n")
            self._text = "\n".join([header, self.provenance, body] if self.passes else [header, body])
        return self._text

    @property
    def provenance(self) -> str:
        """`# made by functionalize (2.1 ms), optimize (0.3 ms)`."""
        return "# made by " + ", ".join(f"{name} ({seconds * 1e3:.1f} ms)" for name, seconds in self.passes)

    def __str__(self) -> str:
        return self.text


def _arg(a: Any) -> str:
    if isinstance(a, fx.Node):
        return a.name
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, torch.dtype):
        return str(a)
    if isinstance(a, torch.device):
        return f"device({str(a)!r})"
    if isinstance(a, torch._ops.OpOverload):  # (an op a graph function calls: ir.draws.draw_like)
        return f"aten.{a.__name__}" if a.namespace == "aten" else str(a)
    return repr(a)


def _index_text(index: tuple[Any, ...]) -> str:
    def one(i: Any) -> str:
        if isinstance(i, slice):
            open_end = i.stop is None or (isinstance(i.stop, int) and i.stop >= 2**62)
            text = f"{'' if i.start is None else _arg(i.start)}:{'' if open_end else _arg(i.stop)}"
            return text + (f":{_arg(i.step)}" if i.step not in (None, 1) else "")
        return _arg(i)

    return ", ".join(one(i) for i in index)


def _target(t: Any) -> str:
    if isinstance(t, torch._ops.OpOverload):
        name = f"{t.namespace}.{op_name(t)}"
        return name if t._overloadname == "default" else f"{name}.{t._overloadname}"
    return op_name(t)


def _meta(node: fx.Node) -> str:
    """`float32[2, 3]`, with the strides when they are not the contiguous ones (`float32[3, 2] strides [1, 3]`)."""
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor):
        return ""
    text = f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
    # (Only static layouts are compared: a comparison of symbolic sizes would add a guard to the program.)
    if all(type(x) is int for x in (*v.shape, *v.stride())) and v.stride() != contiguous_strides(v.shape):
        text += f" strides {list(v.stride())}"
    return text


_INFIX = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.floordiv: "//", operator.mod: "%"}


def format_graph(gm: fx.GraphModule, name: str, header: str) -> str:
    lines = [f"# {header}"]
    params = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    # Symbolic sizes are shown by the name of the input they come from (`[2, pos + 1]`, not `[2, s33 + 1]`).
    symbols = {
        str(n.meta["val"].node.expr): n.name
        for n in gm.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.SymInt) and n.meta["val"].node.expr.is_Symbol
    }
    lines.append(f"def {name}({', '.join(params)}):")
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            stmt = f"{node.name} = self.{node.target}"
        elif node.target is operator.getitem and isinstance(node.args[1], tuple):
            stmt = f"{node.name} = {_arg(node.args[0])}[{_index_text(node.args[1])}]"
        elif node.target is operator.setitem:
            stmt = f"{_arg(node.args[0])}[{_index_text(node.args[1])}] = {_arg(node.args[2])}"
        elif node.target in _INFIX and len(node.args) == 2:  # arithmetic on sizes and positions
            stmt = f"{node.name} = {_arg(node.args[0])} {_INFIX[node.target]} {_arg(node.args[1])}"
        elif node.op == "call_function":
            args = [_arg(a) for a in node.args] + [f"{k}={_arg(v)}" for k, v in node.kwargs.items()]
            stmt = f"{node.name} = {_target(node.target)}({', '.join(args)})"
        elif node.op == "call_method":
            args = [_arg(a) for a in node.args[1:]] + [f"{k}={_arg(v)}" for k, v in node.kwargs.items()]
            stmt = f"{node.name} = {_arg(node.args[0])}.{node.target}({', '.join(args)})"
        elif node.op == "output":
            lines.append(f"    return {_arg(node.args[0])}")
            continue
        else:
            continue
        shape = _meta(node)
        for symbol, input_name in symbols.items():
            shape = re.sub(rf"\b{symbol}\b", input_name, shape)
        notes = "  ".join(x for x in (shape, node_location(node)) if x)
        lines.append(f"    {stmt:<60}  # {notes}" if notes else f"    {stmt}")
    return "\n".join(lines)
