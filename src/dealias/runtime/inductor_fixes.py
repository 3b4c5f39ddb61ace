"""Where inductor's code is slower than it needs to be on dealias's graphs, corrected for dealias's compiles only.

A view of a computed value handed to an ATen kernel (`mm(view(h, [1, 256]), w.t())`, the decode step of every
linear layer) is passed as `reinterpret_tensor(buf, (1, 256), (0, 1))`: inductor derives the view's strides from
its index expression, where a dim of size 1 has no variable, so its stride comes out 0 (pytorch issue 174869).
Any stride is valid for a dim of size 1, but ATen's `mm` takes its BLAS path only for a leading stride of at
least the row's length, and copies a (0, 1)-strided matrix first: 25 of the 29 matmuls of a 4-layer Llama decode
step made such a copy (torch.compile's graph, whose views are not shared between consumers, 9). Such strides are
set to the ones a contiguous layout gives those dims (the next inner dim's stride times its size), which changes
no element's address.

The correction is installed on the first fused compile and applies only while dealias compiles (a flag of the
compiling thread); other compiles in the process see inductor unchanged. (A graph autograd records: its forward;
AOTAutograd compiles the backward at the first backward call, outside dealias's compile, with inductor's strides.)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

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
        _installed = True


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
