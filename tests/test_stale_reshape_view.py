"""A view made under no_grad of a reshape's copy (`clone` + `_unsafe_view`: a tensor of its own with a version counter
of its own), returned after a write of its memory: eager's is stale (reading its grad_fn, is_leaf, or a backward
through it raises). dealias made it stale by setting back the counter of the graph's result, which the replayed
`_unsafe_view` does not share: the view came back a leaf whose backward went on (fuzz seed 2301728). Now the
counter set back is the one the view shares (generated_call.counter_from). Against eager, on executors torch and
tiered: requires_grad, is_leaf or its error, grad_fn (None, one, or its error), the backward's gradient or its
error, and no fallback but where the graph runs eagerly, named (RUNS_EAGERLY)."""

from __future__ import annotations

import warnings

import pytest
import torch

import dealias


def _make():
    g = torch.Generator().manual_seed(2301728)
    b0 = torch.randn(3, 4, 2, generator=g, requires_grad=True)
    return (b0 * 1,), b0


def fuzz_2301728(x0):  # the fuzz program, reduced
    v1 = x0.permute(2, 1, 0)
    v5 = v1.reshape(-1)  # not viewable: a copy
    with torch.no_grad():
        v7 = v5[::3]
    with torch.no_grad():
        v7.sin_()
    return (v7,)


def reshape_of_a_viewable_tensor(x0):  # a real view: stale before too
    v5 = x0.reshape(-1)
    with torch.no_grad():
        v7 = v5[::3]
    with torch.no_grad():
        v7.sin_()
    return (v7,)


def flatten_of_a_transposed_tensor(x0):  # flatten's copy, written through itself
    v5 = x0.transpose(0, 2).flatten()
    with torch.no_grad():
        v7 = v5[1:5]
    with torch.no_grad():
        v5.mul_(2)
    return (v7,)


def written_with_grad_on(x0):  # eager raises at the write itself
    v5 = x0.permute(2, 1, 0).reshape(-1)
    with torch.no_grad():
        v7 = v5[::3]
    v7.sin_()
    return (v7,)


def returned_with_its_base(x0):  # the copy itself is fresh: UnsafeViewBackward0
    v5 = x0.permute(2, 1, 0).reshape(-1)
    with torch.no_grad():
        v7 = v5[::3]
    with torch.no_grad():
        v7.sin_()
    return (v7, v5)


def a_view_with_grad_on_of_it(x0):  # eager's error names TBackward0's view of the no_grad view
    v5 = x0.permute(2, 1, 0).reshape(6, 4)
    with torch.no_grad():
        v7 = v5[::3]
    v8 = v7.t()
    with torch.no_grad():
        v5.sin_()
    return (v8,)


def copied_under_no_grad_then_written_with_grad(x0):  # no view: eager's requires grad after the write
    with torch.no_grad():
        v5 = x0.permute(2, 1, 0).reshape(-1)
    v5.mul_(x0.sum())
    return (v5,)


CASES = [
    fuzz_2301728,
    reshape_of_a_viewable_tensor,
    flatten_of_a_transposed_tensor,
    written_with_grad_on,
    returned_with_its_base,
    a_view_with_grad_on_of_it,
    copied_under_no_grad_then_written_with_grad,
]


# A reshape's copy made under no_grad, then written with grad on, runs eagerly (eager's behaviour, a fallback
# warning): an earlier form of the fix compiled it by taking `_unsafe_view`'s result as a tensor of its own, which
# lost the `_base` of a view of it returned with it (tests/test_fused_gap.py).
RUNS_EAGERLY = {copied_under_no_grad_then_written_with_grad}


def _raises(f):
    try:
        return f()
    except RuntimeError as e:
        return f"raises: {e}"


def _seen(fn):
    """What a caller sees of one call of `fn` on fresh arguments: per output, requires_grad, is_leaf, grad_fn (None,
    one, or the error reading it raises); then the backward of all outputs, its gradient or its error."""
    args, leaf = _make()
    try:
        outs = fn(*args)
    except RuntimeError as e:
        return f"call raises: {e}"
    seen = []
    for t in outs:
        grad_fn = _raises(lambda t=t: "none" if t.grad_fn is None else "grad_fn")
        seen.append((t.requires_grad, _raises(lambda t=t: t.is_leaf), grad_fn))
    backward = _raises(lambda: sum(t.sum() for t in outs).backward())
    return seen, backward, None if leaf.grad is None else leaf.grad.tolist()


@pytest.mark.parametrize("executor", ["torch", "tiered"])
@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_like_eager(fn, executor):
    eager = _seen(fn)
    jf = dealias.jit(fn, executor=executor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if fn in RUNS_EAGERLY else "error", dealias.FallbackWarning)
        got = [_seen(jf) for _ in range(2)]  # (first call, and the cached program)
    assert got == [eager, eager]


def test_the_fuzz_program_is_stale():
    # (what eager does, which the cases above hold dealias to)
    (v7,) = dealias.jit(fuzz_2301728, executor="torch")(*_make()[0])
    assert v7.requires_grad
    with pytest.raises(RuntimeError, match="A view was created in no_grad mode"):
        _ = v7.grad_fn
    with pytest.raises(RuntimeError, match="A view was created in no_grad mode"):
        v7.sum().backward()
