"""`out=` into a tensor of another shape, which eager resizes, traced for dealias's compiles (dynamo_out.py's rewrite).

`torch.cumsum(v, 0, out=x)` with `x` of another shape than the result: eager resizes `x` to the result's shape
(with a UserWarning where `x` had elements: "An output with one or more elements was resized ..."), may re-stride
it after the resize (to the strides of the inputs' layout: `torch.add(a.t(), 1, out=o)` leaves `o` transposed) and
writes it. Dynamo refuses every such call ("Shape mismatch with out= tensor variant"): a graph break.

Where eager's resize stays within the elements `out` spans (the same storage offset, no element beyond out's last
one: on every later call out's own elements are in its storage, as dynamo guards its sizes and strides, so eager
never reallocates there either), dealias traces the call as
- `dealias::out_resized(old sizes, new sizes)` where eager warned: its kernel runs eager's own check on a meta
  tensor of those sizes (`torch._resize_output_`), so each call gives eager's UserWarning, text and category;
- the op without `out=`, then `out.as_strided_(sizes, strides)` (the storage offset kept, as a resize keeps it: an
  in-place metadata change dealias writes back to the caller's tensor, compat/dynamo_inputs.py), then
  `out.copy_(result)`, the copy marked as dynamo_out.py's (the overlap checks of later calls apply alike).
The final layout is learned as dynamo_out.py learns its rewrites: eager's kernel is run with `out=` on tensors of
the call's own layouts and its result compared, every byte of out's memory and out's layout afterwards, with the
rewrite's. Everything else (a resize beyond out's memory, where eager reallocates; an `out` that is not contiguous,
`x[::2]`, whose resize would be a write through `as_strided` of a non-contiguous tensor, which dealias's capture
refuses; an `out=` tuple; symbolic sizes; a result that requires grad) keeps dynamo's break.
"""

from __future__ import annotations

from typing import Any

import torch

_LIB: Any = None
_TEXT = "An output with one or more elements was resized"


def _resize_warning(message: Any) -> bool:
    return _TEXT in str(message)


def inside(after: tuple[Any, ...], before: tuple[Any, ...]) -> bool:
    """Whether the layout `after` (sizes, strides, offset) lies within the elements `before` spans, at its offset."""
    (sizes, strides, offset), (old_sizes, old_strides, old_offset) = after, before
    if any(n == 0 for n in sizes):
        return offset == old_offset
    if offset != old_offset or any(n == 0 for n in old_sizes) or any(st < 0 for st in strides):
        return False
    last = lambda ns, sts: sum((n - 1) * st for n, st in zip(ns, sts))
    return last(sizes, strides) <= last(old_sizes, old_strides)


def _define() -> None:
    global _LIB
    if _LIB is not None:
        return
    _LIB = torch.library.Library("dealias", "FRAGMENT")
    # (no results: dealias's dead-code elimination keeps it, as an op that exists for its check: opfacts.may_raise)
    _LIB.define("out_resized(SymInt[] old, SymInt[] new) -> ()")

    def out_resized(old: list[int], new: list[int]) -> None:
        # Eager's own check (ATen's resize_output, through torch's Python binding, which turns its warning into a
        # Python UserWarning as eager's call does), on a meta tensor: no memory.
        torch._resize_output_(torch.empty(old, device="meta"), new, torch.device("meta"))

    _LIB.impl("out_resized", out_resized, "CompositeExplicitAutograd")
    torch.library.register_fake("dealias::out_resized", lambda old, new: None, lib=_LIB)


def trace(tx: Any, call: Any, out_vt: Any, out: torch.Tensor, verdict: Any, build: Any, constant: Any) -> Any:
    """Trace the resizing call (`call()` traces the op without `out=`), or None where the traced result does not
    have the layout eager's probe gave (dynamo's own handling then breaks the graph). `build` is dynamo's
    VariableTracker.build, `constant` its ConstantVariable."""
    _, layouts, warned = verdict
    sizes, strides = layouts[0]
    result = call()
    value = result.as_proxy().node.meta.get("example_value") if result.is_tensor() else None
    if not (
        isinstance(value, torch.Tensor)
        and tuple(value.shape) == sizes
        and value.dtype == out.dtype
        and value.device == out.device
        and not value.requires_grad
    ):
        return None
    as_tuple = lambda values: build(tx, tuple(values))
    if warned:
        _define()
        build(tx, torch.ops.dealias.out_resized.default).call_function(tx, [as_tuple(out.shape), as_tuple(sizes)], {})
    method = build(tx, getattr).call_function(tx, [out_vt, constant.create("as_strided_")], {})
    method.call_function(tx, [as_tuple(sizes), as_tuple(strides)], {})
    return result
