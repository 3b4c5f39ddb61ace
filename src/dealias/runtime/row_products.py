"""Which matrix products of a few rows the fused executor hands to inductor as code, measured on this host.

A decode step multiplies one row (a token's activations) by each weight matrix of the model. Inductor passes
every `mm` to ATen's BLAS call as an extern kernel; for one row that call is a matrix-vector product bound by
reading the weight, and on the host this was written on, ATen's took 2-3x as long as the reduction inductor
generates for the same product (`x.unsqueeze(2) * w.unsqueeze(0)` summed over the shared dimension; 1x1,024 by
1,024x1,024 in float32: 91 us against 38), which it also fuses with the ops around it (a norm before, an
activation after). The HF Llama decode step of bench/run.py went from 1.9 ms to 0.67 ms.

Only where the reduction reads the weight along its contiguous dimension: `x @ w.t()` for a weight stored as
nn.Linear stores it. Over the other dimension inductor's reduction is 2-3x slower than ATen's. How many rows
still gain depends on the dtype and the host's BLAS (float32 here: 0.42x at 1 row, 0.77x at 8; bfloat16 1.97x
at 4 rows), so each (dtype, rows) is measured once per host, like the keep-ATen list (keep_aten.py), as inductor's
code for an MLP block both ways (`measure`); the verdict is kept on disk with the keep-ATen ones. The rows are
realized before the reduction reads them (`row`). The sums are accumulated in another order than ATen's: results
differ from eager's in the last bits, as other fused kernels' do.

`DEALIAS_ROW_PRODUCTS` overrides the measurement: `inductor` (every such product as a reduction), `aten` (none);
another value raises.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from ..compat.inductor import ensure  # (imported from there: that module registers the correction ensured)
from ..ir.viewops import surely
from .keep_aten import MIN_NUMEL, best_of, inductor_code, measured, measuring

aten = torch.ops.aten

MAX_ROWS = 8  # more rows read the weight once per row in the reduction: a BLAS kernel is made for those
_WIDTH = 512  # the measured block's width (measure)


def _mm_by_reduction(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`mm(x, w)` as code inductor generates and fuses: products summed over the shared dimension. A half-precision
    product is summed in float32 and rounded once, as ATen's kernel does."""
    if x.dtype in _HALF:
        return _sum_of_products(x.float(), w.float()).to(x.dtype)
    return _sum_of_products(x, w)


def _addmm_by_reduction(bias: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`addmm(bias, x, w)`: in half precision the bias is added in float32 before the one rounding (ATen's)."""
    if x.dtype in _HALF:
        return (bias.float() + _sum_of_products(x.float(), w.float())).to(x.dtype)
    return bias + _sum_of_products(x, w)


def _sum_of_products(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if ensure("inductor_snapshot_lowering"):  # (`row` as a generated copy; else a custom op called through Python)
        x = ROW(x)
    return (x.unsqueeze(2) * w.unsqueeze(0)).sum(1)


@torch.library.custom_op("dealias::row", mutates_args=())
def row(x: torch.Tensor) -> torch.Tensor:
    """The rows of a product by reduction, computed once into a buffer of their own (compat/inductor.py lowers it
    to a copy inductor generates and realizes). Inductor inlines a pointwise expression where it is read, and the
    reduction reads each row element once per column of the weight: a layer norm's or a GELU's row was computed
    again for each of them (1,024 erf per element of a decode step's MLP row; an MLP block of width 256, 4x wider
    inside, ran 8x slower than with ATen's products, and 1.5x faster with the row realized)."""
    return x.clone()


@row.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


ROW = torch.ops.dealias.row.default


_HALF = (torch.float16, torch.bfloat16)
_BY_REDUCTION: dict[Any, Callable[..., torch.Tensor]] = {
    aten.mm.default: _mm_by_reduction,
    aten.addmm.default: _addmm_by_reduction,  # (beta and alpha are keyword-only: `not n.kwargs` is their default)
}
_SETTINGS = ("measure", "inductor", "aten")


def by_reduction(n: fx.Node) -> Callable[..., torch.Tensor] | None:
    """The function computing the product `n` as a reduction, if that is faster here than ATen's kernel."""
    if n.op != "call_function" or n.target not in _BY_REDUCTION or n.kwargs:
        return None
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in n.args]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return None
    x, w = vals[-2:]
    if x.device.type != "cpu" or not x.dtype.is_floating_point or x.dtype != w.dtype:
        return None
    rows = x.shape[0]
    if not isinstance(rows, int) or rows > MAX_ROWS:  # (a symbolic row count: its product is ATen's)
        return None
    if not surely(w.stride(0) == 1) or not surely(w.numel() >= MIN_NUMEL):
        return None  # (over w's other dimension, or a weight small enough for the BLAS call to cost nothing)
    if n.target is aten.addmm.default and not _bias_of(vals[0], rows, w.shape[1], x.dtype):
        return None
    setting = os.environ.get("DEALIAS_ROW_PRODUCTS", "measure").strip().lower()
    if setting not in _SETTINGS:
        raise ValueError(f"DEALIAS_ROW_PRODUCTS={setting!r}: expected one of {', '.join(_SETTINGS)}")
    if setting == "measure":
        key = f"row products in a block|{x.dtype}|rows={rows}|threads={torch.get_num_threads()}"
        aten_s, inductor_s = measured(key, lambda: measure(x.dtype, rows))
        faster = aten_s > inductor_s  # (a measurement that failed is a tie: ATen's, as before)
    else:
        faster = setting == "inductor"
    return _BY_REDUCTION[n.target] if faster else None


def _bias_of(bias: torch.Tensor, rows: int, cols: Any, dtype: torch.dtype) -> bool:
    """Whether addmm's kernel accepts `bias` for a (rows, cols) product: of the product's dtype, and expanding to its
    shape. Fake tensors check neither (a (3, N) bias gave a (3, N) result, a float64 one a float64 result), and
    `bias + product` would broadcast and promote where ATen's kernel raises eager's error: such a product stays
    ATen's, which raises it."""
    if bias.dtype != dtype or bias.dim() > 2:
        return False
    return all(surely(b == 1) or surely(b == t) for b, t in zip(reversed(bias.shape), (cols, rows)))


def measure(dtype: torch.dtype, rows: int) -> tuple[float, float]:
    """Seconds per call of inductor's code for a decode step's MLP block over `rows` rows of width 512 (a layer
    norm, a product by a 2,048 x 512 weight stored as nn.Linear's, its bias and a GELU, a product by a 512 x 2,048
    weight, its bias and the residual; 4 MB weights in float32, as the 1,024 x 1,024 one measured before): with
    ATen's products, as inductor calls them, and with them as reductions. Best of interleaved rounds, on the
    thread's CPU time where torch runs one thread.

    Inside a fused graph the choice is between these two: an extern call of ATen's kernel from inductor's wrapper,
    with the ops around it in kernels of their own, or one kernel computing them with the product. A product timed
    alone against ATen's called alone saw neither, and its verdict came out each way on one host, process to
    process (ATen's time over the reduction's 0.88-1.99 against the 1.15 asked; in this block 1.2-1.4).
    The block still understates what a program gains: timed warm in a loop, where after a program's milliseconds
    of kernels each call from Python costs more (docs/architecture.md: 40-60 us an aten call against ~5), and
    where a whole decode step fuses into one kernel (gpt-fast's: 0.83x eager with ATen's products, 0.38-0.44x
    with reductions: ~40 us a product, the block's ~12). So the reduction is taken wherever the block runs faster
    with it (`by_reduction`), with no margin asked; a tie (a measurement that failed) leaves ATen's."""

    def inputs() -> tuple[torch.Tensor, ...]:
        x, g, b = torch.randn(rows, _WIDTH), torch.randn(_WIDTH), torch.randn(_WIDTH)
        w1, b1 = torch.randn(4 * _WIDTH, _WIDTH) / _WIDTH**0.5, torch.randn(4 * _WIDTH)
        w2, b2 = torch.randn(_WIDTH, 4 * _WIDTH) / (2 * _WIDTH), torch.randn(_WIDTH)
        return tuple(t.to(dtype) for t in (x, g, b, w1.t(), b1, w2.t(), b2))

    def block(addmm: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def fn(x, g, b, w1, b1, w2, b2):  # (the weights transposed, as a linear layer's `x @ w.t()`)
            h = torch.nn.functional.gelu(addmm(b1, torch.nn.functional.layer_norm(x, (_WIDTH,), g, b), w1))
            return x + addmm(b2, h, w2)

        return fn

    with measuring():
        xs = inputs()
        by_aten, by_reduction = (inductor_code(block(f), xs) for f in (torch.addmm, _addmm_by_reduction))
        clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
        return best_of(lambda: by_aten(list(xs)), lambda: by_reduction(list(xs)), clock=clock)
