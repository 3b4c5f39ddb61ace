"""Where inductor's code is slower than it needs to be on dealias's graphs, corrected for dealias's compiles only.

A view of a computed value handed to an ATen kernel (`mm(view(h, [1, 256]), w.t())`, the decode step of every
linear layer) is passed as `reinterpret_tensor(buf, (1, 256), (0, 1))`: inductor derives the view's strides from
its index expression, where a dim of size 1 has no variable, so its stride comes out 0 (pytorch issue 174869).
Any stride is valid for a dim of size 1, but ATen's `mm` takes its BLAS path only for a leading stride of at
least the row's length, and copies a (0, 1)-strided matrix first: 25 of the 29 matmuls of a 4-layer Llama decode
step made such a copy (torch.compile's graph, whose views are not shared between consumers, 9). Such strides are
set to the ones a contiguous layout gives those dims (the next inner dim's stride times its size), which changes
no element's address.

A variance (batch norm's statistics in training, layer and group norm) is computed on CPU by a Welford reduction
over more than 1,024 elements per result (`config.cpp.use_two_step_variance_threshold`), by a mean and then a sum
of squared differences (ATen's own algorithm on CPU) under it. Welford does several times the arithmetic per
element; the two passes read the input twice, which costs only once it is out of the caches. On this host, CPU
time of a normalization at 1 thread: BatchNorm2d statistics over 16x64x32x32, 713 us Welford against 352 two-step
(0.49x); 8x256x28x28 0.66x; rows of 16,384 0.72x; rows of 4,096 0.48x; over 51 and 64 MB inputs (DRAM-bound)
0.96-1.05x. For dealias's compiles the two-step algorithm is taken for any reduction of an input of at most
TWO_STEP_MAX_BYTES.

The corrections are installed on the first fused compile and apply only while dealias compiles (a flag of the
compiling thread); other compiles in the process see inductor unchanged (the variance's threshold is raised by
patching inductor's config for the moment of that one decision: another thread deciding at that very moment may
take the two-step algorithm too, which is as exact). (A graph autograd records: its forward;
AOTAutograd compiles the backward at the first backward call, outside dealias's compile, with inductor's strides.)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import sympy

TWO_STEP_MAX_BYTES = 16 << 20

_local = threading.local()
_installed = False
_install_lock = threading.Lock()


@contextlib.contextmanager
def dealias_compile() -> Iterator[None]:
    """While inductor compiles a graph of dealias's (on this thread)."""
    _install()
    before = getattr(_local, "active", False)
    _local.active = True
    try:
        yield
    finally:
        _local.active = before


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        from torch._inductor import ir

        original = ir.ExternKernel.convert_to_reinterpret_view.__func__

        def convert_to_reinterpret_view(cls: Any, x: Any) -> Any:
            view = original(cls, x)
            if not getattr(_local, "active", False) or view is x:
                return view
            return _unit_dims_strided(ir, view)

        ir.ExternKernel.convert_to_reinterpret_view = classmethod(convert_to_reinterpret_view)
        _install_two_step_variance()
        _installed = True


def _install_two_step_variance() -> None:
    from torch._inductor import config, lowering

    original = lowering.use_two_step_variance  # (looked up in lowering's globals at each var_mean lowered)

    def use_two_step_variance(x: Any, axis: Any, keepdim: Any, input_dtype: Any) -> bool:
        if not getattr(_local, "active", False) or x.get_device() is None or x.get_device().type != "cpu":
            return original(x, axis, keepdim, input_dtype)
        size = sympy.Mul(*x.get_size())
        if not isinstance(size, sympy.Integer) or int(size) * x.get_dtype().itemsize > TWO_STEP_MAX_BYTES:
            return original(x, axis, keepdim, input_dtype)
        with config.patch({"cpp.use_two_step_variance_threshold": int(size)}):
            return original(x, axis, keepdim, input_dtype)

    lowering.use_two_step_variance = use_two_step_variance


def _unit_dims_strided(ir: Any, view: Any) -> Any:
    """`view` with each stride of 0 on a dim of size 1 set to the next inner dim's stride times its size (1 for
    the innermost), as a contiguous layout has it."""
    layout = view.layout
    sizes, strides = list(layout.size), list(layout.stride)
    changed = False
    for i in reversed(range(len(sizes))):
        if sizes[i] == 1 and strides[i] == 0:
            strides[i] = strides[i + 1] * sizes[i + 1] if i + 1 < len(sizes) else 1
            changed = True
    if not changed:
        return view
    fixed = ir.FixedLayout(layout.device, layout.dtype, sizes, strides, layout.offset, layout.is_pinned)
    return ir.ReinterpretView(data=view.data, layout=fixed)
