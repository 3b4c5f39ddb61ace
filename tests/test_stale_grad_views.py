"""Views made with grad on, returned after a later write of their memory (view_grad_modes.GradViews): eager's
recorded version is behind its memory's, so its grad_fn is made afresh from its base's when first read. Where the
base is detached in place before that read (in the program after a graph break, or by the caller after the call),
eager's reaches nothing: no gradient flows to the base's history. dealias made such a view from the caller's tensor
after the graph, current, and its gradient went on to the base's history (fuzz seeds 2476014, 2476161: a silent
wrong gradient on every executor). A read of the view's grad_fn with grad on in the program (an op on it, a view of
it), or a write through it with grad on, makes eager's current again: those stay as they were. Against eager, first
and cached call: each output's requires_grad and whether its history reaches anything, and the leaf's gradient."""

from __future__ import annotations

import pytest
import torch

import dealias


def written_then_detached(x):  # fuzz seed 2476014's shape
    v = x.t()
    x.mul_(2)
    x.detach_()
    return v, x


def written_through_detach_then_detached(x):
    v = x.t()
    x.detach().mul_(2)
    x.detach_()
    return (v,)


def another_view_changed_in_place(x):  # fuzz seed 2476161's shape: t_() of another view moves the counter
    v = x.t()
    w = x[:]
    w.t_()
    x.detach_()
    return (v,)


def written(x):  # the caller detaches x after the call (DETACHED_AFTER)
    v = x[1:].t()[0]
    x.add_(1)
    return (v,)


def read_after_the_write(x):  # `v * 3` reads v's grad_fn after the write: eager's v is current from there on
    v = x.t()
    x.mul_(2)
    return v, v * 3


def viewed_after_the_write(x):
    v = x.t()
    x.mul_(2)
    return v, v[0]


def written_through_itself(x):  # rebased by its own write with grad on: current
    v = x.t()
    v.mul_(2)
    return (v,)


def written_through_itself_under_no_grad(x):
    v = x.t()
    with torch.no_grad():
        v.mul_(2)
    return (v,)


def written_again_after_a_read(x):
    v = x.t()
    x.mul_(2)
    u = v + 1
    x.add_(1)
    return v, u


def _reaches(t: torch.Tensor) -> bool:
    """Whether `t`'s history reaches a node past its own (a dead edge: none)."""
    fn = t.grad_fn
    return fn is not None and any(n is not None for n, _ in fn.next_functions)


def _run(fn, detach_after: bool):
    leaf = torch.randn(4, 6, generator=torch.Generator().manual_seed(3), requires_grad=True)
    x = leaf * 1
    out = fn(x)
    if detach_after:
        x.detach_()
    seen = [(o.requires_grad, _reaches(o)) for o in out]
    losses = [(o * (1 + torch.arange(o.numel()).view(o.shape) % 3)).sum() for o in out if o.requires_grad]
    (grad,) = torch.autograd.grad(sum(losses), leaf, allow_unused=True) if losses else (None,)
    return seen, grad


PROGRAMS = [
    written_then_detached,
    written_through_detach_then_detached,
    another_view_changed_in_place,
    written,
    read_after_the_write,
    viewed_after_the_write,
    written_through_itself,
    written_through_itself_under_no_grad,
    written_again_after_a_read,
]


@pytest.mark.parametrize("detach_after", [False, True], ids=["kept", "detached_after"])
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_a_view_returned_after_a_write_of_its_memory_is_as_stale_as_eagers(fn, detach_after):
    jf = dealias.jit(fn, executor="torch")
    for call in range(2):
        expected, mine = _run(fn, detach_after), _run(jf, detach_after)
        assert mine[0] == expected[0], (call, mine[0], expected[0])
        if expected[1] is None:
            assert mine[1] is None, call
        else:
            assert mine[1] is not None and torch.allclose(mine[1], expected[1]), call


def of_an_intermediate(x):
    y = x * 2
    v = y[0]
    y.add_(1)
    return v, y


def _run_detaching_the_intermediate(fn):
    leaf = torch.randn(4, 6, generator=torch.Generator().manual_seed(4), requires_grad=True)
    v, y = fn(leaf * 1)
    y.detach_()  # (eager's v, stale, is then made afresh from a base with no history)
    (grad,) = torch.autograd.grad(v.sum(), leaf, allow_unused=True)
    return (v.requires_grad, _reaches(v)), grad


@pytest.mark.parametrize("executor", ["torch", "inductor"])
def test_a_view_of_an_intermediate_returned_with_it_goes_stale_on_every_executor(executor):
    jf = dealias.jit(of_an_intermediate, executor=executor)
    for call in range(2):
        expected, mine = _run_detaching_the_intermediate(of_an_intermediate), _run_detaching_the_intermediate(jf)
        assert expected == ((True, False), None), expected
        assert mine == expected, (call, mine)
    assert dealias.cache_info(jf).tiers == ("fused" if executor == "inductor" else "torch",)


def test_the_stale_view_is_eagers_kind():
    """The view's grad_fn, read after the call, is made afresh as eager's: an AsStridedBackward0 on the base's."""
    jf = dealias.jit(written, executor="torch")
    for f in (written, jf):
        x = torch.randn(4, 6, requires_grad=True) * 1
        (v,) = f(x)
        assert type(v.grad_fn).__name__ == "AsStridedBackward0" and v._version == x._version
