"""The differential harness must be able to fail: sabotage dealias in one way at a time and check that
`check` notices."""

from __future__ import annotations

import pytest
import torch
from harness import check, compare_call

import dealias
import dealias.ir.viewops as viewops
import dealias.runtime.generated_call as generated_call
from dealias import compat


def add_input(x):
    x.add_(1)


def returns_input(x):
    x.mul_(2)
    return x, x[0]


def select_write(x):
    x[1] = 0.0
    return x.sum()


def select_write_of_intermediate(x):
    y = x * 2
    y[1] = 0.0
    return y.sum()


def test_notices_missing_write_back(monkeypatch):
    # The graph (which writes inputs in place) runs on copies: the caller's tensors never see the writes.
    monkeypatch.setattr(
        "dealias.passes.pipeline.torch_executor", lambda gm, grad: lambda *ts: gm(*[t.clone() for t in ts])
    )
    with pytest.raises(AssertionError, match="input 0 after the call"):
        check(add_input, torch.randn(3))


def _same_memory_own_counter(t: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.empty(0, dtype=t.dtype).set_(t)


def test_notices_a_write_that_leaves_the_version_counter(monkeypatch):
    # The graph writes the caller's memory through tensors with counters of their own: values are right, but
    # what autograd saved of the input before the call would pass backward's version check.
    monkeypatch.setattr(
        "dealias.passes.pipeline.torch_executor",
        lambda gm, grad: lambda *ts: gm(*[_same_memory_own_counter(t) for t in ts]),
    )
    with pytest.raises(AssertionError, match="version counter"):
        check(add_input, torch.randn(3))


def write_then_factor(x, m):
    x.add_(1)
    return torch.linalg.cholesky(m)  # raises on its values: m is not positive definite


def test_notices_an_input_a_failed_call_left_in_neither_state(monkeypatch):
    # A failed call may leave the inputs as eager had them after some prefix of its ops (as they were, as eager
    # left them, or where the failing graph began after a graph break); never scaled by 7.
    def broken(gm, grad):
        def run(*ts):
            ts[0].mul_(7)
            return gm(*ts)

        return run

    monkeypatch.setattr("dealias.passes.pipeline.torch_executor", broken)
    with pytest.raises(AssertionError, match="changed by a failed call"):
        check(write_then_factor, torch.randn(3) + 2, -torch.eye(2))


def unsqueeze_then_write_then_fail(x0, x1):
    v = x0.unbind(0)[3].view(1)
    x0.unsqueeze_(0)  # a graph break where compat's input_metadata is out of force (below): dynamo runs it eagerly
    v[0:] = 0.25
    x0.add_(x1)  # x1 is the same memory with the old shape: eager raises here, after its write of v


def add_then_sine_then_fail(x0, x1):
    x0.add_(x0.roll(1, 0))
    v = x0.as_strided((3,), (1,), x0.storage_offset())  # a graph break at storage_offset() out of force (below)
    v.sin_()
    x0.t().copy_(x1.view(1))  # x1 is x0[0]: eager raises here, after its sin_


@pytest.mark.parametrize("fn", [unsqueeze_then_write_then_fail, add_then_sine_then_fail])
def test_accepts_a_failed_graph_after_a_break_that_wrote_nothing(fn):
    # The graph after the break raises before writing anything where eager had written before failing, after the
    # graphs before and the code at the break did what eager did (fuzz seeds 933780 and 934977: x0 with eager's
    # unsqueezed shape and its old values; x0 added to, not yet sined).
    b = torch.randn(6)
    args = (b, b.view(6)) if fn is unsqueeze_then_write_then_fail else (b, b[0])
    jf = dealias.jit(fn)
    off = ("input_metadata",) if fn is unsqueeze_then_write_then_fail else ("storage_offset",)  # (in force: no break)
    with compat.forced_off(*off), pytest.warns(dealias.FallbackWarning):
        assert compare_call(fn, jf, args) is None
    torch._dynamo.reset()
    assert compare_call(fn, dealias.jit(fn), args) is None  # (and with every correction in force)


def copies_instead_of_views(monkeypatch):
    """Every view step the generated call replays on an output made a copy."""
    real = generated_call._Call.step
    monkeypatch.setattr(generated_call._Call, "step", lambda *a: f"{real(*a)}.clone()")


def test_notices_lost_output_aliasing(monkeypatch):
    copies_instead_of_views(monkeypatch)
    with pytest.raises(AssertionError, match="aliasing"):
        check(returns_input, torch.randn(3))


def returns_a_view_of_an_intermediate(x):
    y = x * 2
    return y[0]


def test_notices_an_output_that_is_no_longer_a_view(monkeypatch):
    # Same values, no input memory either way: only `_is_view()` (autograd's `_base`) tells them apart.
    copies_instead_of_views(monkeypatch)
    with pytest.raises(AssertionError, match="aliasing"):
        check(returns_a_view_of_an_intermediate, torch.randn(3, 2))


def test_notices_wrong_view_inverse(monkeypatch):
    real = viewops.inverse

    def broken(step, base, view, base_node, value_node, call):
        if step.op is torch.ops.aten.select.int:
            return base_node  # drop the write
        return real(step, base, view, base_node, value_node, call)

    monkeypatch.setattr("dealias.ir.regions.inverse", broken)
    with pytest.raises(AssertionError):  # (under autograd the region write runs as its view inverses)
        check(select_write_of_intermediate, torch.randn(3, 2, requires_grad=True))


def test_notices_extra_recompile(monkeypatch):
    monkeypatch.setattr("dealias.frontend.backend.lean_check", lambda *_: None)  # every call takes the general lookup
    monkeypatch.setattr(
        "dealias.frontend.backend.lookup_key",
        lambda leaves, *_: ((object(),), [x for x in leaves if torch.is_tensor(x)]),
    )
    with pytest.raises(AssertionError, match="one compile"):
        check(add_input, torch.randn(3))
