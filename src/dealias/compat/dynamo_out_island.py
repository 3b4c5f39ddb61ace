"""An `out=` whose kernel reads what it already wrote, traced as the call itself for dealias's compiles
(dynamo_out.py's rewrite).

`torch.sum(x, 0, out=x.diagonal())`, `torch.maximum(x[:4], x[::2], out=x[::2])`: an `out=` sharing memory with the
op's arguments, where eager's kernel reads elements it already wrote, so that eager's result is the order its
kernel visits memory in. The call without `out=` and a copy (dynamo_out.py's rewrite) computes something else, and
dynamo refuses a non-contiguous `out=` anyway (a graph break). For dealias's compiles such a call is traced as
dynamo would trace it without its refusal: one node, the op with `out=`, returning `out` itself as eager does.
dealias's capture then sees an out= op writing memory its arguments read: writecheck refuses it as order-dependent
and it runs as an eager island (passes/functionalize/island.py: eager's own kernel on a copy of the base laid out
as the caller's memory), exactly eager's writes; where an island would not be exact, the graph runs eagerly with an
OverlapFallbackWarning (eager's result, the whole graph eager rather than the rest of the frame).

Only where the island can apply: one `out` tensor, no tensor requiring grad (an island records no autograd), no
random draw, every tensor of the call on the CPU and under ATen's grain size (dynamo_out.py checks the last before
probing), and, where eager runs several intra-op threads, an op whose kernel keeps to one thread under that size
(a pointwise op or a reduction, as island.py's list). Elsewhere the graph breaks as before, saying why.
"""

from __future__ import annotations

from typing import Any

import torch

from .dynamo_tensor import aten_tags
from .registry import require, require_module

_wrap: Any = None
_proxies: Any = None
# Reductions whose out= kernel runs one thread under ATen's grain size (parallel_reduce), as island.py's list.
_REDUCTIONS = {"sum", "prod", "mean", "amax", "amin"}


def install() -> None:
    global _wrap, _proxies
    _wrap = require(require_module("torch._dynamo.variables.builder"), "wrap_fx_proxy", "tx", "proxy")
    _proxies = require(require_module("torch._dynamo.utils"), "proxy_args_kwargs", "args", "kwargs")


def applies(
    fn: Any, tensors: list[torch.Tensor], outs: list[torch.Tensor], single: bool, seeded: bool, limit: int
) -> bool:
    """Whether the call may run as an island (module docstring): `limit` is ATen's grain size. An `out` whose
    elements share memory only for `_one_thread` ops: the probe that the kernel honours out's strides ran on memory
    of another layout, or not at all."""
    if _wrap is None or not single or seeded:
        return False
    every = [*tensors, *outs]
    if any(t.requires_grad or t.device.type != "cpu" for t in every) or sum(t.numel() for t in every) >= limit:
        return False
    return (torch.get_num_threads() == 1 and not repeats(outs[0])) or _one_thread(fn)


def _one_thread(fn: Any) -> bool:
    """A pointwise op or one of `_REDUCTIONS`: TensorIterator kernels, which honour out's strides element by
    element and run one thread under ATen's grain size whatever the thread count."""
    name = getattr(fn, "__name__", "")
    return name in _REDUCTIONS or torch.Tag.pointwise in (aten_tags(name) or ())


def repeats(t: torch.Tensor) -> bool:
    """Whether `t`'s elements may share memory without a stride of 0 (`x.unfold(0, 2, 1)`: eager's TensorIterator
    cannot tell, and writes it element by element; a stride of 0 it refuses)."""
    from ..ir.viewops import internal_overlap

    return internal_overlap(t) == "maybe"


def trace_or_break(tx: Any, fn: Any, args: list[Any], kwargs: dict[str, Any], out_vt: Any, island: bool) -> Any:
    """`trace` where the call may run as an island (`applies`), else a graph break saying why: eager's `out=` kernel
    reads memory it already wrote, which the call without `out=` and a copy does not."""
    if island:
        return trace(tx, fn, args, kwargs, out_vt)
    from .dynamo_tensor import _break

    _break(
        "dealias: `out=` sharing memory with the op's arguments, where eager's kernel reads what it already wrote",
        getattr(fn, "__name__", repr(fn)),
        "eager's result is the kernel's order of reads and writes, which a compiled graph keeps only as an eager "
        "island, and that would not be exact here: the call runs eagerly",
    )
    raise AssertionError("unreachable: _break raises")


def trace(tx: Any, fn: Any, args: list[Any], kwargs: dict[str, Any], out_vt: Any) -> Any:
    """The call traced as one node, `fn(*args, **kwargs)` with its `out=` (dynamo's own node, without the refusal
    of a non-contiguous `out`), returning `out_vt` (eager returns `out` itself)."""
    proxy = tx.output.create_proxy("call_function", fn, *_proxies(args, kwargs))
    _wrap(tx=tx, proxy=proxy)
    return out_vt
