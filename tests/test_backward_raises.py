"""Graphs whose op saves a tensor for backward that the program then writes in place compile (passes/stale.py):
eager's forward succeeds and its backward raises "modified by an inplace operation" only where it reaches that
op's node; the compiled graph's backward raises eager's exact error there, and one that does not reach it gets
eager's gradients. Everything against eager, on the first and the cached call."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import grads_like_eager

import dealias
from dealias.runtime.verify import compare_call


def exp_then_add_(x):
    y = x.exp()  # saves its result...
    y.add_(1)  # ...which is written: eager's ExpBackward0 raises when reached
    return y


def mul_itself_(x):
    x.mul_(x)  # saves x as its other factor, and writes x
    return x * 2


def row_squared_(x):
    row = x[:, :, 1]
    row.mul_(row)  # a write of a view: eager's MulBackward0 inside the base's CopySlices
    return x


def relu_then_written(x):
    y = x * 2
    y.relu_()  # saves its result
    with torch.no_grad():
        y.add_(1)  # a write autograd does not record still moves the version counter
    return y.sum(0, keepdim=True)


def saved_input_then_written(x, w):
    s = x.sin()  # saves x
    x.add_(w)  # x written after: SinBackward0 raises, reporting x's grad_fn at backward
    return s, x


def topk_values_then_shift_(x):
    values, indices = x.topk(2, dim=1)  # one node for both results: it saves the indices...
    indices.add_(1)  # ...which are written
    return values * 2, indices


def two_branches(x, y):
    a = x.exp()
    a.add_(1)  # a backward reaching exp raises...
    b = y * 3  # ...one from b alone does not
    return a, b


PROGRAMS = [
    (exp_then_add_, lambda: (torch.randn(3, 4, requires_grad=True) * 1,)),
    (mul_itself_, lambda: (torch.randn(5, requires_grad=True) * 1,)),
    (row_squared_, lambda: (torch.randn(3, 4, 2, requires_grad=True) * 1,)),
    (relu_then_written, lambda: (torch.randn(4, 6, requires_grad=True) * 1,)),
    (saved_input_then_written, lambda: (torch.randn(6, requires_grad=True) * 1, torch.randn(6, requires_grad=True))),
    (topk_values_then_shift_, lambda: (torch.randn(3, 5, requires_grad=True) * 1,)),
    (two_branches, lambda: (torch.randn(3, requires_grad=True) * 1, torch.randn(3, requires_grad=True))),
]


def _backward(fn, args, pick=None, **kw):
    """The error (type, message) or the gradients of the leaves behind `args` of a backward from `fn`'s
    outputs (those `pick` chooses)."""
    leaves = [a if a.is_leaf else a.grad_fn.next_functions[0][0].variable for a in args]
    out = fn(*args)
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
    if pick is not None:
        outs = [outs[i] for i in pick]
    try:
        return torch.autograd.grad(sum(o.sum() for o in outs), leaves, allow_unused=True, **kw)
    except RuntimeError as e:
        return type(e), str(e)


def _same(a, b):
    if isinstance(a, tuple) and a and isinstance(a[0], type):
        return a == b
    return all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("fn,make", PROGRAMS, ids=[f.__name__ for f, _ in PROGRAMS])
def test_compiles_and_raises_eagers_error_at_backward(fn, make):
    jf = dealias.jit(fn, executor="torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)  # (no EagerRaisesFallbackWarning)
        for call in range(2):
            assert compare_call(fn, jf, make()) is None, call  # outputs, written inputs, aliasing
            torch.manual_seed(call)
            expected = _backward(fn, make())
            torch.manual_seed(call)
            got = _backward(jf, make())
            assert isinstance(expected, tuple) and expected[0] is RuntimeError, expected
            assert got == expected, (call, got, expected)  # eager's type and message, exactly
    info = dealias.cache_info(jf)
    assert info.entries == 1 and info.eager_entries == 0, info
    assert info.misses == 1, info


def test_a_backward_not_reaching_the_node_gets_eagers_gradients():
    jf = dealias.jit(two_branches, executor="torch")
    for call in range(2):
        torch.manual_seed(call)
        expected = _backward(
            two_branches, (torch.randn(3, requires_grad=True) * 1, torch.randn(3, requires_grad=True)), [1]
        )
        torch.manual_seed(call)
        got = _backward(jf, (torch.randn(3, requires_grad=True) * 1, torch.randn(3, requires_grad=True)), [1])
        assert not isinstance(expected[0], type) and _same(got, expected), call
    assert dealias.cache_info(jf).misses == 1


def test_no_backward_at_all_and_the_harness_grads():
    # grads_like_eager: values, written inputs and every leaf's gradient (or eager's error type) on two calls.
    for fn, make in PROGRAMS:
        assert grads_like_eager(fn, dealias.jit(fn, executor="torch"), make) == [], fn.__name__


def test_retain_graph_raises_each_time_as_eager():
    make = PROGRAMS[0][1]
    jf = dealias.jit(exp_then_add_, executor="torch")
    results = []
    for f in (exp_then_add_, jf):
        torch.manual_seed(0)
        x = make()
        y = f(*x)
        errors = []
        for _ in range(2):
            with pytest.raises(RuntimeError) as e:
                y.sum().backward(retain_graph=True)
            errors.append(str(e.value))
        results.append(errors)
    assert results[0] == results[1]


def test_create_graph_backward_raises_as_eager():
    # A backward building a graph for double backward reaches the node as a first-order one does.
    for fn, make in PROGRAMS[:3]:
        jf = dealias.jit(fn, executor="torch")
        torch.manual_seed(0)
        expected = _backward(fn, make(), create_graph=True)
        torch.manual_seed(0)
        assert _backward(jf, make(), create_graph=True) == expected, fn.__name__


def test_default_executor_compiles_too():
    make = PROGRAMS[0][1]
    jf = dealias.jit(exp_then_add_)  # the tiered default: the fused tier cannot hold the raising node
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        for call in range(3):
            torch.manual_seed(call)
            expected = _backward(exp_then_add_, make())
            torch.manual_seed(call)
            got = _backward(jf, make())
            assert got == expected, call
    assert dealias.cache_info(jf).eager_entries == 0


@pytest.mark.parametrize("fn", [mul_itself_, saved_input_then_written])
def test_versions_count_from_the_callers_counter(fn):
    # The saved tensor is the caller's: eager's message counts versions from its counter at the call, which the
    # compiling call's message is for; a later call with the counter elsewhere reports eager's numbers.
    jf = dealias.jit(fn, executor="torch")
    for bumps in (0, 2, 5, 1):
        results = []
        for f in (fn, jf):
            torch.manual_seed(bumps)
            args = PROGRAMS[[g for g, _ in PROGRAMS].index(fn)][1]()
            with torch.no_grad():
                for _ in range(bumps):
                    args[0].add_(0)  # moves the caller's version counter only
            results.append(_backward(f, args))
        assert results[1] == results[0], (bumps, results)
    assert dealias.cache_info(jf).misses == 1
