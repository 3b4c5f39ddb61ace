"""A reshape's copy (`flatten()` of a transposed tensor: `clone` + `_unsafe_view`, a tensor with a version counter of
its own) that an op saves for backward, returned: eager's backward raises once the caller writes it in place. The
torch executor made the returned tensor afresh from the graph's buffer, another tensor than the one the op saved, so
the caller's write moved no counter the backward checks and it gave gradients (fuzz seed 2477619). The graph now
returns its own node (outputs._graphs_own_copy). Against eager, first and cached call, on the default and the two
executors: the backward's outcome with and without the caller's write, the gradients, and the returned tensor's
kind (no view, contiguous, its grad_fn)."""

from __future__ import annotations

import pytest
import torch

import dealias


def sin_of_a_copy(x):
    v = x.movedim(0, -1).flatten()
    return v.sin(), v


def mul_by_a_copy(x, w):  # (mul saves both operands)
    v = x.transpose(0, 1).reshape(-1)
    return v * w, v


def _outcome(fn, write: bool, with_w: bool):
    leaf = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(9), requires_grad=True)
    args = (leaf * 1, torch.randn(24, generator=torch.Generator().manual_seed(10))) if with_w else (leaf * 1,)
    y, v = fn(*args)
    kind = (v._base is None, v.is_contiguous(), type(v.grad_fn).__name__)
    if write:
        v.mul_(2)
    try:
        (grad,) = torch.autograd.grad(y.sum(), leaf)
    except RuntimeError as e:
        return kind, f"raises: {str(e)[:60]}"
    return kind, grad


@pytest.mark.parametrize("executor", ["torch", "inductor", None], ids=["torch", "inductor", "default"])
@pytest.mark.parametrize("write", [True, False], ids=["written", "kept"])
@pytest.mark.parametrize("fn", [sin_of_a_copy, mul_by_a_copy], ids=lambda f: f.__name__)
def test_a_saved_copy_returned_is_the_tensor_saved(fn, write, executor):
    with_w = fn is mul_by_a_copy
    jf = dealias.jit(fn) if executor is None else dealias.jit(fn, executor=executor)
    for call in range(2):
        expected, mine = _outcome(fn, write, with_w), _outcome(jf, write, with_w)
        assert mine[0] == expected[0], (call, mine[0], expected[0])
        if isinstance(expected[1], str):
            assert mine[1] == expected[1], (call, mine[1])
        else:
            assert isinstance(mine[1], torch.Tensor) and torch.allclose(mine[1], expected[1]), (call, mine[1])
