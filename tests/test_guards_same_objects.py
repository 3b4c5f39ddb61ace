"""The cached-call check on calls with the very same tensor objects (a module's parameters and buffers) whose storage or
autograd kind changed in place between calls. Dynamo guards such an input by its type, shapes, strides, dtype and
requires_grad, none of which these changes touch; the object's identity, `_cdata` (its TensorImpl) and version counter
stay too, so a check cached per object (identity plus a counter), in place of reading each input's storage and autograd
kind on every call as the lean lookup (frontend/guards.lean_check) does, would let these calls through. Each call
compared with eager's on a twin module.

What each pins: the `.data =` test fails on the fused executor without the lean lookup's storage check (the program
of separate storages serves the call and returns another result than eager's). The parameter tests pass even without
the lean lookup's autograd-kind check (the program's own in-place write raises eager's error, and gradients follow the
real inputs' autograd edges): they hold the whole call to eager's behaviour for a Parameter object turned non-leaf,
made a leaf again, or with requires_grad flipped."""

from __future__ import annotations

import warnings

import pytest
import torch

import dealias
from dealias.compat.internals import storage_id

EXECUTORS = ["torch", pytest.param("inductor", marks=pytest.mark.inductor)]


class Running(torch.nn.Module):
    """Writes one buffer, then reads the other: where they share memory, the read sees the write (eager)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(4))
        self.register_buffer("seen", torch.arange(4.0))

    def forward(self, x):
        self.total.add_(x)
        return self.seen * 2 + self.total


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dealias.FallbackWarning)  # (an alias group may leave the fused executor)
        return fn(*args)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_buffers_made_to_share_memory_with_data_assignment(executor):
    ours, theirs = Running(), Running()
    jm = dealias.jit(ours, executor=executor)
    for call in range(5):
        if call == 2:  # `.data =`: the same objects, their version counters and TensorImpls unchanged
            for m in (ours, theirs):
                version, impl = m.seen._version, m.seen._cdata
                m.seen.data = m.total.data
                assert (m.seen._version, m.seen._cdata) == (version, impl)
        x = torch.randn(4)
        torch.testing.assert_close(_quiet(jm, x.clone()), theirs(x.clone()), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours.total, theirs.total, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours.seen, theirs.seen, rtol=1e-5, atol=1e-6)
    assert storage_id(ours.seen) == storage_id(ours.total)


class Doubling(torch.nn.Module):
    """Writes its parameter in place: eager raises for a leaf that requires grad (grad mode on), not for a non-leaf."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))
        # a non-leaf that requires grad, still the module's Parameter object: its grad turned off, then written in
        # place with a value that requires grad
        self.w.requires_grad_(False)
        self.w.mul_(torch.full((4,), 3.0, requires_grad=True))

    def forward(self, x):
        self.w.mul_(2)
        return x * self.w


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_parameter_made_a_leaf_again_between_calls(executor):
    ours, theirs = Doubling(), Doubling()
    assert ours.w.requires_grad and not ours.w.is_leaf and type(ours.w) is torch.nn.Parameter
    jm = dealias.jit(ours, executor=executor)
    for call in range(4):
        x = torch.randn(4)
        if call < 2:
            torch.testing.assert_close(_quiet(jm, x.clone()), theirs(x.clone()))
            torch.testing.assert_close(ours.w.detach(), theirs.w.detach())
            continue
        if call == 2:  # the same object, type, shape and requires_grad (what dynamo guards): a leaf now
            for m in (ours, theirs):
                m.w.detach_().requires_grad_()
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad") as expected:
            theirs(x.clone())
        with pytest.raises(type(expected.value), match="leaf Variable that requires grad"):
            _quiet(jm, x.clone())
        torch.testing.assert_close(ours.w.detach(), theirs.w.detach())  # (neither wrote it)


class Scaling(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((4,), 2.0))

    def forward(self, x):
        return (x * self.w).sum()


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_parameter_turned_non_leaf_between_calls(executor):
    """Its gradient then goes to what it was made from, not to its `.grad`, as eager's does. (One call after the
    change: a second backward would go through the history the first freed.)"""
    ours, theirs = Scaling(), Scaling()
    jm = dealias.jit(ours, executor=executor)
    sources = []
    for call in range(3):
        if call == 2:  # the same Parameter object, requiring grad again, with a history of its own
            for m in (ours, theirs):
                source = torch.full((4,), 0.5, requires_grad=True)
                m.w.requires_grad_(False)
                m.w.mul_(source)
                sources.append(source)
        x = torch.randn(4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # (reading a non-leaf's .grad warns)
            _quiet(jm, x.clone()).backward()
            theirs(x.clone()).backward()
            assert (ours.w.grad is None) == (theirs.w.grad is None) and ours.w.is_leaf == theirs.w.is_leaf
            if theirs.w.grad is not None:
                torch.testing.assert_close(ours.w.grad, theirs.w.grad)
    torch.testing.assert_close(sources[0].grad, sources[1].grad)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_parameter_whose_requires_grad_is_flipped_between_calls(executor):
    """Dynamo guards requires_grad (the lean lookup leaves it to dynamo): off, the write is legal and the program runs;
    on again, eager's error again."""
    ours, theirs = Doubling(), Doubling()
    for m in (ours, theirs):
        m.w.detach_()  # a leaf that requires no grad: the write is legal
    jm = dealias.jit(ours, executor=executor)
    for call in range(5):
        if call == 2:
            for m in (ours, theirs):
                m.w.requires_grad_()
        if call == 4:
            for m in (ours, theirs):
                m.w.requires_grad_(False)
        x = torch.randn(4)
        if call in (2, 3):
            with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
                theirs(x.clone())
            with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
                _quiet(jm, x.clone())
        else:
            torch.testing.assert_close(_quiet(jm, x.clone()), theirs(x.clone()))
        torch.testing.assert_close(ours.w.detach(), theirs.w.detach())
