"""Random draws of in-place ops in functional graphs.

Eager's in-place draw (`y.bernoulli_(p)`, `y.uniform_()`) fills `y`'s memory in an order its kernel picks from
`y`'s layout: the default CPU kernels walk memory order (TensorIterator); MKL's bernoulli, on Intel CPUs, draws in
logical order into a contiguous buffer. An out-of-place form may draw into memory laid out otherwise
(`bernoulli.p` allocates its result contiguous), and the same generator state then puts the same numbers on other
elements: `F.dropout(x.t())` or a batch-first TransformerEncoderLayer in training differed from eager.

`draw_like(op, self, ...)` runs eager's own in-place kernel on fresh memory laid out as `self` (`empty_like` keeps
a dense tensor's strides and a sparse one's order of dimensions), so the same numbers land on the same elements,
whichever kernel the machine has. The draw writes only memory it allocated: the graph stays functional.
"""

from __future__ import annotations

from typing import Any

import torch


def draw_like(op: torch._ops.OpOverload, self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if torch.is_grad_enabled() and self.requires_grad:
        fresh = self.clone()  # (the draw's own backward then reaches `self`, as eager's does)
    else:
        fresh = torch.empty_like(self)
    op(fresh, *args, **kwargs)
    return fresh


draw_like._dealias_effect = True  # type: ignore[attr-defined]  # a draw: never dropped or merged
draw_like.dealias_draw = True  # type: ignore[attr-defined]  # runtime.fused.unfusable
