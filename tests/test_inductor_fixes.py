"""runtime/inductor_fixes.py: a view of a computed value handed to ATen's matmul is passed with the strides a
contiguous layout gives its dims of size 1, not inductor's 0 (with which ATen's mm copies the matrix first); for
dealias's compiles only."""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

import dealias


def decode_linears(x, g, w1, w2, w3):
    # The head of a Llama layer at one token: RMS norm, then three projections of the same normed row.
    h = g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    return F.linear(h, w1), F.linear(h, w2), F.linear(h, w3)


def ops_of_a_call(fn, args):
    with torch.profiler.profile() as prof:
        fn(*args)
    return [e.name for e in prof.events()]


def test_a_decode_steps_linears_call_atens_mm_without_copying_their_row(monkeypatch):
    # (Left to ATen's mm, as one-row products are where inductor's reduction is not faster: row_products.py.)
    monkeypatch.setenv("DEALIAS_ROW_PRODUCTS", "aten")
    args = (torch.randn(1, 1, 256), torch.randn(256), *(torch.randn(256, 256) for _ in range(3)))
    jf = dealias.jit(decode_linears, executor="inductor")
    torch.testing.assert_close(jf(*args), decode_linears(*args))
    assert jf.last.tier == "fused"
    ops = ops_of_a_call(jf, args)
    assert ops.count("aten::mm") == 3
    # Before the fix each mm copied its (1, 256) row, strided (0, 1), into a contiguous one.
    assert "aten::clone" not in ops and "aten::copy_" not in ops
    torch.testing.assert_close(jf(*args), decode_linears(*args))


def test_other_compiles_in_the_process_see_inductor_unchanged():
    args = (torch.randn(1, 1, 256), torch.randn(256), *(torch.randn(256, 256) for _ in range(3)))
    dealias.jit(decode_linears, executor="inductor")(*args)  # (the correction is installed by now)
    tc = torch.compile(_own_code(decode_linears), backend="inductor")
    torch.testing.assert_close(tc(*args), decode_linears(*args))
    # inductor's own strides (0, 1) for torch.compile's graph: ATen's mm copies the row of at least one matmul
    # (should torch fix pytorch issue 174869, this fails: the correction is then to be removed).
    assert "aten::clone" in ops_of_a_call(tc, args)


def _own_code(fn):
    return types.FunctionType(fn.__code__.replace(co_name=f"{fn.__name__}_tc"), fn.__globals__, fn.__name__)
