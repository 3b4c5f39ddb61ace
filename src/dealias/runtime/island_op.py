"""An eager island (ir/island.py) as an op the fused executor hands to inductor: `dealias::island(base, tensors,
spec)`, an extern kernel inductor calls in program order, with a fake kernel of the base's layout.

The torch executor calls `island` itself, a Python function taking the op and its arguments as they are. Inductor
calls ops with a schema, so the call is encoded: the tensors of other memory as a list, the rest (the op's name,
the base's layout, the views, constant arguments) as a JSON `spec`. A call with an argument JSON cannot state
exactly (a symbol, a dtype) is not encoded, and the graph stays on the torch executor.

Inductor may hand an extern kernel its tensor inputs in another layout than eager's; the visiting order of eager's
kernel follows the strides of every operand, so each tensor of other memory is re-laid out as traced (a copy in
its traced strides) when it comes otherwise. The base is copied into the island's buffer whatever its layout.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import torch
import torch.fx as fx

from ..ir.island import island


@functools.lru_cache(maxsize=256)
def _decode(spec: str) -> dict[str, Any]:
    d = json.loads(spec)
    ns, _, rest = d["op"].partition("::")
    name, _, overload = rest.partition(".")
    d["op_overload"] = getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
    return d


def _fill(x: Any, tensors: list[torch.Tensor]) -> Any:
    """The argument `x` of a spec with its tensor markers ({"tensor": i, "stride": [...]}) as the tensors."""
    if isinstance(x, dict) and "tensor" in x:
        t = tensors[x["tensor"]]
        if list(t.stride()) != x["stride"]:
            t = torch.empty_strided(t.shape, x["stride"], dtype=t.dtype, device=t.device).copy_(t)
        return t
    if isinstance(x, dict) and "float" in x:
        return float(x["float"])
    if isinstance(x, list):
        return [_fill(a, tensors) for a in x]
    return x


@torch.library.custom_op("dealias::island", mutates_args=())
def island_op(base: torch.Tensor, tensors: list[torch.Tensor], spec: str) -> torch.Tensor:
    d = _decode(spec)
    args = [_fill(a, tensors) for a in d["args"]]
    kwargs = {k: _fill(a, tensors) for k, a in d["kwargs"].items()}
    views = [tuple(v) for v in d["views"]]
    return island(d["op_overload"], base, d["size"], d["stride"], views, *args, **kwargs)


@island_op.register_fake
def _(base: torch.Tensor, tensors: list[torch.Tensor], spec: str) -> torch.Tensor:
    d = _decode(spec)
    return base.new_empty_strided(d["size"], d["stride"])


class _NotEncodable(Exception):
    pass


def encode(node: fx.Node) -> tuple[fx.Node, list[fx.Node], str] | None:
    """`node`, an `island(...)` call of a lowered graph, as the arguments of `island_op`; None where an argument
    cannot be stated exactly in JSON."""
    op, base, size, stride, views, *args = node.args
    tensors: list[fx.Node] = []

    def enc(x: Any) -> Any:
        if isinstance(x, fx.Node):
            val = x.meta.get("val")
            if not isinstance(val, torch.Tensor) or any(isinstance(s, torch.SymInt) for s in val.stride()):
                raise _NotEncodable
            tensors.append(x)
            return {"tensor": len(tensors) - 1, "stride": list(val.stride())}
        if isinstance(x, (list, tuple)):
            return [enc(a) for a in x]
        if isinstance(x, float):
            # (JSON has no inf or nan; repr keeps -0.0 and every bit of a float)
            return {"float": repr(x)} if not math.isfinite(x) or x == 0 else x
        if x is None or isinstance(x, (bool, int, str)):
            return x
        raise _NotEncodable

    try:
        spec = {
            "op": op._schema.name + (f".{op._overloadname}" if op._overloadname != "default" else ""),
            "size": enc(size),
            "stride": enc(stride),
            "views": enc([list(v) for v in views]),
            "args": enc(list(args)),
            "kwargs": {k: enc(a) for k, a in node.kwargs.items()},
        }
    except _NotEncodable:
        return None
    if any(isinstance(v, dict) for v in (spec["size"], spec["stride"])):
        return None
    return base, tensors, json.dumps(spec)
