"""The process's switches that choose which of eager's kernels runs an op, for keys of what a kernel did
(runtime/kernel_verdicts.py): an op's kernel may accept under one setting what it rejects under another.
`aten.convolution` with a bfloat16 input and weight and a float32 bias: oneDNN's path (`torch.backends.mkldnn`
enabled, the default) raises "Input type ... and bias type ... should be the same", the native one computes.
None where a switch cannot be read on this torch (the caller then keeps nothing)."""

from __future__ import annotations

from typing import Any

import torch

from .registry import Missing, require


def kernel_flags() -> tuple[Any, ...] | None:
    b = torch.backends
    try:
        return (
            b.mkldnn.enabled,
            b.mkldnn.deterministic,
            require(torch._C, "_get_nnpack_enabled")(),
            b.cudnn.enabled,
            b.cudnn.deterministic,
            b.cuda.flash_sdp_enabled(),
            b.cuda.mem_efficient_sdp_enabled(),
            b.cuda.math_sdp_enabled(),
            b.cuda.cudnn_sdp_enabled(),
        )
    except (Missing, AttributeError):
        return None
