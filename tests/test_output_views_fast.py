"""Output views replayed by the generated call as Tensor methods (`addmm.view([..]).transpose(1, 0)`, runtime/
generated_call.py `_view_method`) where the method dispatches to exactly the chain's aten overload with its
arguments: the same views as eager's (`_base`, sizes, strides, offset, a version counter shared with the base, grad_fn
and gradients), at half the aten call's Python dispatch (MultiheadAttention's output after its kernels); and the
fused call's backward node of its own for a result (its attention weights) made by the Function's C apply."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from harness import check, grads_like_eager

import dealias
from dealias.runtime import fused_autograd


def projected_heads(x, w, b):  # MultiheadAttention's output: a linear's 2-D result viewed and transposed
    return torch.addmm(b, x, w.t()).view(4, 2, 12).transpose(1, 0)


def views_of_an_input(x):  # views of the caller's tensor, one under no_grad
    with torch.no_grad():
        n = x.t()
    return x.view(-1), x.t().select(0, 1), n


def narrowed(x):  # slice has no Tensor method: its aten call stays
    return (x * 2)[:, 1:3].unsqueeze(0)


def _args():
    return torch.randn(8, 5), torch.randn(12, 5, requires_grad=True), torch.randn(12, requires_grad=True)


def _lines(jf) -> list[str]:
    return [line.strip() for line in jf.last.source.splitlines() if line.strip().startswith("out")]


def _same_view(got: torch.Tensor, want: torch.Tensor) -> None:
    assert (got._base is None) == (want._base is None)
    assert got.shape == want.shape and got.stride() == want.stride()
    assert got.storage_offset() == want.storage_offset()
    assert torch.equal(got, want)
    if want._base is not None:
        assert got._base.shape == want._base.shape and got._base.stride() == want._base.stride()
        assert got.untyped_storage().data_ptr() == got._base.untyped_storage().data_ptr()
    assert got.requires_grad == want.requires_grad
    assert type(got.grad_fn).__name__ == type(want.grad_fn).__name__
    if want.grad_fn is not None:  # (the chain of view nodes back to the op that made the base)
        got_next = [type(f).__name__ for f, _ in got.grad_fn.next_functions]
        want_next = [type(f).__name__ for f, _ in want.grad_fn.next_functions]
        assert got_next == want_next


def _counters_shared(out: torch.Tensor) -> None:
    """A write into the view is seen by its base (memory and version counter), and one into the base by the view."""
    base = out._base
    with torch.no_grad():
        before = base._version
        out.add_(1)
        assert base._version == out._version == before + 1
        base.mul_(2)
        assert out._version == base._version == before + 2
    return out.detach().clone()


def test_mha_output_view_replayed_as_methods_like_eager():
    jf = check(projected_heads, *_args(), executor="torch")
    assert _lines(jf) == ["out0 = addmm.view([4, 2, 12]).transpose(1, 0)"], jf.last.source
    grads_like_eager(projected_heads, jf, _args)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            args = _args()
            got, want = jf(*args), projected_heads(*args)
            _same_view(got, want)
            assert torch.equal(_counters_shared(got), _counters_shared(want))


def test_views_of_an_input_as_methods_in_both_grad_modes():
    make = lambda: (torch.randn(3, 4, requires_grad=True).clone(),)  # noqa: E731 - a non-leaf: views write through
    jf = check(views_of_an_input, *make(), executor="torch")
    assert _lines(jf)[:2] == ["out0 = x.view([-1])", "out1 = x.t().select(0, 1)"], jf.last.source
    assert "n = x.t()" in jf.last.source or "x.t()" in jf.last.source.split("set_grad_enabled(False)")[1]
    grads_like_eager(views_of_an_input, jf, make)
    x, xe = make()[0], make()[0]
    with torch.no_grad():
        xe.copy_(x)
    got, want = jf(x), views_of_an_input(xe)
    for g, w in zip(got, want):
        assert g._base is x and w._base is xe
        _same_view(g, w)
    # eager's no_grad view of a tensor requiring grad raises when written with grad on; the replayed one too
    for n in (got[2], want[2]):
        with pytest.raises(RuntimeError, match="no_grad mode"):
            n.mul_(2)


def test_an_op_without_a_method_keeps_its_aten_call():
    jf = check(narrowed, torch.randn(3, 4), executor="torch")
    (line,) = _lines(jf)
    assert line.startswith("out0 = aten_slice_Tensor(mul, 1, 1, 3).unsqueeze(0)"), jf.last.source
    x = torch.randn(3, 4)
    _same_view(jf(x), narrowed(x))


@pytest.mark.inductor
def test_fused_multihead_attention_output_like_eager(monkeypatch):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(2, 5, 16)

    def attend(m, x):
        return m(x, x, x)

    jf = dealias.jit(attend, executor="inductor")
    jf(mha, x)
    # The weights' backward node of their own (fused_autograd._OwnNode) made by the Function's C apply, not through
    # Function.apply's Python: the same node, its hooks run only for a gradient into the weights, as eager's.
    monkeypatch.setattr(fused_autograd._OwnNode, "apply", classmethod(lambda cls, t: pytest.fail("Function.apply")))
    got, want = jf(mha, x), attend(mha, x)
    monkeypatch.undo()
    assert type(got[1].grad_fn).__name__ == "_OwnNodeBackward"
    ran = {"dealias": 0, "eager": 0}
    got[1].register_hook(lambda g: ran.__setitem__("dealias", ran["dealias"] + 1))
    want[1].register_hook(lambda g: ran.__setitem__("eager", ran["eager"] + 1))
    torch.autograd.grad(got[0].sum(), mha.in_proj_weight, retain_graph=True)
    torch.autograd.grad(want[0].sum(), mha.in_proj_weight, retain_graph=True)
    assert ran == {"dealias": 0, "eager": 0}
    torch.autograd.grad(got[1].sum(), mha.in_proj_weight, retain_graph=True)
    torch.autograd.grad(want[1].sum(), mha.in_proj_weight, retain_graph=True)
    assert ran == {"dealias": 1, "eager": 1}
    assert dealias.cache_info(jf).tiers == ("fused",), dealias.cache_info(jf)
    assert "out0 = addmm.view([5, 2, 16]).transpose(1, 0)" in jf.last.source, jf.last.source
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
        assert (g._base is None) == (w._base is None)
        torch.testing.assert_close(g, w)
    assert type(got[0].grad_fn).__name__ == "TransposeBackward0"
    assert type(got[0].grad_fn.next_functions[0][0]).__name__ == "ViewBackward0"
    assert got[0]._base.shape == want[0]._base.shape and got[0]._base.stride() == want[0]._base.stride()
    grads = torch.autograd.grad(got[0].sum() + got[1].sum(), list(mha.parameters()))
    expected = torch.autograd.grad(want[0].sum() + want[1].sum(), list(mha.parameters()))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    with torch.no_grad():  # (the other grad mode: its own source, the same methods)
        got, want = jf(mha, x), attend(mha, x)
    assert got[0]._base is not None and got[0].grad_fn is None and not got[0].requires_grad
    torch.testing.assert_close(_counters_shared(got[0]), _counters_shared(want[0]))
