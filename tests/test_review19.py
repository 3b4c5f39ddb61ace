"""Review of the aligned snapshot (hazards.py `_fusable` / `_in_place`), the grad-mode switches of a graph handed
to AOTAutograd (grad_modes.py) and the ring buffer's remainder range (index_ranges.py), each against eager.

`_aligned` compared a value's read of a memory with a write's region by sizes, strides and storage offset alone,
which count elements of each tensor's own dtype: a float16 view of a float32 buffer laid out as the buffer reads
other bytes at each position than the write stores there. The fused executor refuses dtype views today, so the
program-level tests below hold either way; the unit test on a hand-built graph is what fails without the check."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

import dealias
from dealias.runtime.hazards import _in_place

aten = torch.ops.aten


def _node(graph: fx.Graph, target, args, val):
    n = graph.call_function(target, args)
    n.meta["val"] = val
    return n


def test_aligned_needs_the_same_element_size():
    """value = x.view(float16)[:8] * 2 (x: float32 [8]), a later write of x whole: each element of the value reads
    bytes 2i..2i+1 where the write's element i stores bytes 4i..4i+3 (value element 2 reads what write element 1
    stores). Not aligned, and not apart either."""
    x = torch.zeros(8)
    g = fx.Graph()
    ph = g.placeholder("x")
    ph.meta["val"] = x
    half = _node(g, aten.view.dtype, (ph, torch.float16), x.view(torch.float16))
    part = _node(g, aten.slice.Tensor, (half, 0, 0, 8), x.view(torch.float16)[:8])
    value = _node(g, aten.mul.Tensor, (part, 2), x.view(torch.float16)[:8] * 2)
    reads = {n: frozenset([ph]) for n in (ph, half, part, value)}
    root = {ph: ph, half: ph, part: ph}
    assert not _in_place(value, x, ph, reads, root)
    # The same value read through a float32 view laid out as the write is aligned (the check still passes it).
    g2 = fx.Graph()
    ph2 = g2.placeholder("x")
    ph2.meta["val"] = x
    part2 = _node(g2, aten.slice.Tensor, (ph2, 0, 0, 8), x[:8])
    value2 = _node(g2, aten.mul.Tensor, (part2, 2), x[:8] * 2)
    reads2 = {n: frozenset([ph2]) for n in (ph2, part2, value2)}
    assert _in_place(value2, x, ph2, reads2, {ph2: ph2, part2: ph2})


# Programs the review ran against eager that held (kept as guards of the merged paths; few, each an inductor compile).


def _randn(*shape, seed=0, **kw):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), **kw)


def _against_eager(f, make, calls=2, **kw):
    jf = dealias.jit(f, executor="inductor", **kw)
    for c in range(calls):
        args = make(c)
        mine, ref = [a.clone() for a in args], [a.clone() for a in args]
        out, want = jf(*mine), f(*ref)
        torch.testing.assert_close(out, want)
        for a, b in zip(mine, ref):
            torch.testing.assert_close(a, b)
    return jf


def reread_after_writes(x, y):
    d = x * 2 + y  # read before x's write, used after it (a cycle through y): an aligned snapshot
    x.copy_(y * 3 + x)
    y.copy_(d + x)  # reads the new x where a fused loop loaded the old one for d
    x.copy_(d * x + y)
    return d.flip(0)  # the snapshot read at other positions after the writes


def transposed_cycle(x, y):
    d = x.t() * 2 + y
    x.t().copy_(y * 3 + x.t())
    y.copy_(d + x.t() * 7)
    return d


@pytest.mark.inductor
@pytest.mark.parametrize("dynamic", [False, True])
def test_aligned_cycles_against_eager(dynamic):
    n = 1003
    _against_eager(reread_after_writes, lambda c: [_randn(n + c, seed=c), _randn(n + c, seed=c + 9)], dynamic=dynamic)


@pytest.mark.inductor
def test_aligned_transposed_against_eager():
    _against_eager(transposed_cycle, lambda c: [_randn(37, 45, seed=c), _randn(45, 37, seed=c + 9)])


def ring(buf, x, ptr):
    idx = (ptr - 20 + torch.arange(x.shape[0], dtype=ptr.dtype)) % 5  # a negative dividend: still 0 .. 4
    buf[idx] = x
    return buf[(idx % 5) + 1] * 2  # shifted out of the remainder's range: checked, eager's error where 5 > rows


@pytest.mark.inductor
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_ring_negative_dividend_against_eager(dtype):
    def make(c):
        return [_randn(6 - (c == 2), 2, seed=c), _randn(3, 2, seed=c + 5), torch.tensor([0, -7, 2][c], dtype=dtype)]

    jf = _against_eager(ring, make, calls=2)
    args = make(2)  # 5 rows: idx + 1 reaches 5
    with pytest.raises(IndexError):
        ring(*[a.clone() for a in args])
    with pytest.raises(IndexError):
        jf(*[a.clone() for a in args])


def ema_under_no_grad(w, buf):
    a = w.sin()
    with torch.no_grad():
        buf.mul_(0.5).add_(a)
    return a * a, buf


@pytest.mark.inductor
def test_no_grad_write_double_backward_against_eager():
    """A buffer written under no_grad beside a recorded op (fused with grad-mode switches), then a double
    backward, which recomputes the forward with eager's ops (the switches in it)."""
    jf = dealias.jit(ema_under_no_grad, executor="inductor")
    for c in range(2):
        res = []
        for fn in (ema_under_no_grad, jf):
            w = _randn(5, seed=c).requires_grad_()
            buf = _randn(5, seed=c + 3)
            out, b = fn(w, buf)
            (gw,) = torch.autograd.grad(out.sum(), w, create_graph=True)
            (gw * gw).sum().backward()
            assert torch.is_grad_enabled()
            assert not b.requires_grad
            res.append((out.detach(), buf, gw.detach(), w.grad))
        for a, b in zip(*res):
            torch.testing.assert_close(a, b)
    assert dealias.cache_info(jf).tiers == ("fused",)
