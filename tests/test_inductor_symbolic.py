"""Fused programs over symbols (executor="inductor"): a decode position, sizes and batch sizes that change between
calls compile one fused program for all their values, compared with eager (values, caches, gradients, double
backward, BatchNorm's running stats)."""

from __future__ import annotations

import copy

import pytest
import torch
from harness import AddsItsInput, decode_prefix, grads_like_eager

import dealias


def test_a_decode_loop_over_int_positions_is_fused_for_every_position():
    # pos changes every call: after its first value, one program over a symbolic pos serves every position,
    # fused, writing one row of each cache in place.
    jf = dealias.jit(decode_prefix, executor="inductor")
    caches, eager_caches = [torch.zeros(1, 2, 16, 8) for _ in range(2)], [torch.zeros(1, 2, 16, 8) for _ in range(2)]
    for pos in range(8):
        q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 8), torch.randn(1, 2, 8)
        got = jf(*caches, q, k, v, pos)
        expected = decode_prefix(*eager_caches, q, k, v, pos)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(caches, eager_caches)
        assert got.stride() == expected.stride()
    info = dealias.cache_info(jf)
    assert (info.misses, info.dynamic, info.tiers) == (2, ("pos",), ("fused", "fused"))
    assert [(r.mode, r.nbytes) for r in dealias.explain(jf)] == [("in place", 64), ("in place", 64)]
    assert "pos <= 15" in jf.last.shape_guard.text


def double_then_add(x, y):
    x.mul_(2)
    return x + y


def double_then_add_transposed(x, y):
    x.mul_(2)
    return x.t() * 3 + y.t()  # eager lays the result out as x.t(): not dense for symbolic sizes


@pytest.mark.parametrize("fn", [double_then_add, double_then_add_transposed])
def test_a_program_over_symbolic_sizes_is_fused_when_its_results_are_dense(fn):
    jf = dealias.jit(fn, executor="inductor", dynamic=True)
    for n in (3, 5, 9):
        x, y = torch.randn(n, 4), torch.randn(n, 4)
        x_eager = x.clone()
        got, expected = jf(x, y), fn(x_eager, y)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(x, x_eager)
        assert got.stride() == expected.stride()
    info = dealias.cache_info(jf)
    assert info.misses == 1 and "x.size(0)" in info.dynamic
    if fn is double_then_add:
        assert info.tiers == ("fused",)
    else:
        assert info.tiers == ("torch",)
        assert "not fused, result 0 has symbolic sizes and a layout other than a dense one" in str(
            dealias.last_traces(jf)[3]
        )


def scaled_sin(x, n: int):
    return (x * n).sin()


def test_a_graph_autograd_records_over_a_symbol_is_fused_with_double_backward():
    jf = dealias.jit(scaled_sin, executor="inductor")
    for n in (2, 3, 4):
        x = torch.randn(5, requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        got, expected = jf(x, n), scaled_sin(x_eager, n)
        torch.testing.assert_close(got, expected)
        (g,) = torch.autograd.grad(got.sum(), x, create_graph=True)
        (g_eager,) = torch.autograd.grad(expected.sum(), x_eager, create_graph=True)
        torch.testing.assert_close(g, g_eager)
        torch.testing.assert_close(torch.autograd.grad(g.sum(), x), torch.autograd.grad(g_eager.sum(), x_eager))
    info = dealias.cache_info(jf)
    assert (info.misses, info.dynamic, info.tiers) == (2, ("n",), ("fused", "fused"))


def test_batchnorm_training_over_a_changing_batch_size_is_fused():
    torch._dynamo.reset()  # (dynamo's automatic dynamic remembers the modules' code from other tests' batch sizes)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(inplace=True))
    ref = copy.deepcopy(net)
    jnet = dealias.jit(net, executor="inductor")
    for batch in (3, 16, 5, 9):
        x = torch.randn(batch, 4)
        jnet(x).pow(2).mean().backward()
        ref(x).pow(2).mean().backward()
        torch.testing.assert_close(net.state_dict(), ref.state_dict())
        torch.testing.assert_close([p.grad for p in net.parameters()], [p.grad for p in ref.parameters()])
        net.zero_grad()
        ref.zero_grad()
    info = dealias.cache_info(jnet)
    assert (info.misses, info.dynamic, info.tiers) == (2, ("args[0].size(0)",), ("fused", "fused"))


def expand_of_input(x):
    return x.expand(2, *x.shape)


def test_a_fused_graph_over_symbols_returning_sizes_records_autograd():
    # (fuzz seed 1220032) The graph returns the symbolic sizes of its result's view besides tensors; the Function
    # wrapping AOTAutograd's detached every result.
    jf = dealias.jit(expand_of_input, executor="inductor", dynamic=True)
    assert grads_like_eager(expand_of_input, jf, lambda: (torch.randn(5, 5, requires_grad=True) * 1,)) == []
    assert dealias.cache_info(jf).tiers == ("fused",)


def function_of_a_view_of_a_written_base(x):
    t = torch.linspace(-1, 1, 24).view(2, 3, 4)
    v = t.diagonal()  # made before the write makes t, and so v, require grad
    t.mul_(x + x)
    return AddsItsInput.apply(v)  # (its backward, g * 3 + x, is not its forward's derivative)


def test_a_function_of_a_view_whose_base_comes_to_require_grad_keeps_its_backward():
    # (fuzz seed 1220114, here fused over symbols) dynamo traced the Function's forward alone: wrong gradients.
    jf = dealias.jit(function_of_a_view_of_a_written_base, executor="inductor", dynamic=True)
    make_args = lambda: (torch.randn(1, 3, 4, requires_grad=True) * 1,)  # noqa: E731
    assert grads_like_eager(function_of_a_view_of_a_written_base, jf, make_args) == []
    assert dealias.cache_info(jf).tiers == ("fused",)
