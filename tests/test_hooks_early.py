"""A hook on a graph input registered before anything wrote it, then a write of it (compat/dynamo_hooks.py): the
hook is registered before the graph runs, on the version eager hooks, and the frame compiles as one graph; the
hook sees eager's gradient, first and cached call."""

from __future__ import annotations

import pytest
import torch
from harness import grads_like_eager

import dealias
from dealias import compat

SEEN: list[torch.Tensor] = []


def _args(*shapes):
    def make():
        g = torch.Generator().manual_seed(0)
        return tuple(torch.randn(*s, generator=g, requires_grad=True) * 1 for s in shapes)

    return make


def hook_then_write(x):
    x.register_hook(lambda g: g + 1)  # eager: hooks x's version before the write
    x.mul_(0.25)
    return x


def hook_then_write_through_a_view(x, w):  # fuzz seed 1100276
    x.register_hook(lambda g: SEEN.append(g.clone()) or g * 3)
    y = x + w  # (saves nothing: eager's backward would raise after the write otherwise)
    x.diagonal().add_(3.0)
    with torch.no_grad():
        x.add_(x)
    return x * y


def two_hooks_then_writes(x):  # fuzz seed 1100513
    with torch.no_grad():
        x.register_hook(lambda g: g + 1)
    x.register_hook(lambda g: g * -1)
    v = x.cumsum(1)
    x[0].mul_(2.0)
    return v, x


def handle_removed_after_the_write(x):
    h = x.register_hook(lambda g: g * 10)
    x.add_(1.0)
    h.remove()  # eager: the hook is gone before backward
    return x * 2


def triple(g):
    return g * 3


def hook_from_a_global(x):
    x.register_hook(triple)
    x.sub_(1.0)
    return x * x


def written_under_no_grad_then_hooked(x):  # fuzz seed 1100354
    with torch.no_grad():
        torch.exp(x, out=x)  # (no history: x's grad_fn, which the hook attaches to, stays the one it came with)
    x.register_hook(lambda g: g + 1)
    x += x
    return torch.where(x > 0, x, x * 2)


def written_with_grad_then_hooked(x):
    x.mul_(2.0)  # (history: the hook attaches to this version, which exists only inside the graph)
    x.register_hook(lambda g: g + 1)
    x.add_(1.0)
    return x * 3


CASES = [
    (hook_then_write, _args((3,))),
    (hook_then_write_through_a_view, _args((3, 3), (3, 3))),
    (two_hooks_then_writes, _args((3, 4))),
    (handle_removed_after_the_write, _args((3,))),
    (written_under_no_grad_then_hooked, _args((4, 6))),
]


@pytest.mark.parametrize("fn, make", CASES, ids=[c[0].__name__ for c in CASES])
def test_the_hook_is_registered_before_the_graph_as_eager_hooks_it(fn, make):
    jf = dealias.jit(fn)
    assert grads_like_eager(fn, jf, make) == []  # (values, inputs, gradients; no FallbackWarning, no break)
    assert dealias.graph_breaks(jf) == [] and len(jf.stats.graphs) == 1
    assert dealias.cache_info(jf).misses == 1


def test_the_hook_sees_eagers_gradient():
    for f in (hook_then_write_through_a_view, dealias.jit(hook_then_write_through_a_view)):
        for _ in range(2):  # (first and cached call)
            x, w = _args((3, 3), (3, 3))()
            SEEN.clear()
            f(x, w).sum().backward()
            seen = [g.clone() for g in SEEN]
            if f is hook_then_write_through_a_view:
                expected = seen
            else:
                assert len(seen) == len(expected) == 1 and torch.equal(seen[0], expected[0])


def test_a_hook_function_from_a_global():
    jf = dealias.jit(hook_from_a_global)
    assert grads_like_eager(hook_from_a_global, jf, _args((4,))) == []
    assert dealias.graph_breaks(jf) == []


def test_without_the_correction_the_graph_breaks_before_the_write():
    with compat.forced_off("hook_early", "hook_split"):  # (with hook_split, at the registration: test_hooks_split.py)
        jf = dealias.jit(hook_then_write_through_a_view)
        told = grads_like_eager(hook_then_write_through_a_view, jf, _args((3, 3), (3, 3)))
    assert told and "a write after a hook on a graph input" in str(told[0].message)


def hook_with_a_closure(x, k: float = 2.0):
    scale = k * 3
    x.register_hook(lambda g: g * scale)  # a closure over the frame's local: built after the graph only
    x.mul_(0.5)
    return x


def _split_at_the_registration(jf):
    """The one break of `jf` is a split at the hook's registration (compat/dynamo_hook_split.py), not warned about."""
    breaks = dealias.graph_breaks(jf)
    assert len(breaks) == 1 and breaks[0].startswith(dealias.api.SPLIT) and "register_hook" in breaks[0], breaks


@pytest.mark.parametrize("fn", [hook_with_a_closure, written_with_grad_then_hooked])
def test_what_cannot_be_hooked_before_the_graph_splits_the_graph_at_the_registration(fn):
    jf = dealias.jit(fn)
    assert grads_like_eager(fn, jf, _args((3,))) == []
    _split_at_the_registration(jf)


def test_other_backends_hook_after_the_graph_as_before():
    # dynamo's own behaviour, unchanged by dealias: the eager backend hooks the written version (gradient
    # (1 + 1) * 0.25), where eager and dealias hook the version before the write (1 * 0.25 + 1).
    grads = []
    for f in (hook_then_write, dealias.jit(hook_then_write), torch.compile(hook_then_write, backend="eager")):
        b = torch.ones(3, requires_grad=True)
        f(b * 1).sum().backward()
        grads.append(b.grad[0].item())
    assert grads == [1.25, 1.25, 0.5]


def written_then_hooked_then_written_through_a_later_input(x0, x1):  # fuzz seed 1204098
    x0.mul_(-2.0)  # (with grad on, before the registration: the break must stay)
    x0.register_hook(lambda g: g + 1)
    x1.copy_(x1)  # x1 is a view of x0 read first here: dynamo puts its input node ahead of x0's ops
    return (x0,)


def test_an_input_first_read_after_the_registration_does_not_hide_an_earlier_write():
    def make():
        g = torch.Generator().manual_seed(0)
        a = torch.randn(3, 4, 2, generator=g, requires_grad=True) * 1
        return a, a[:1]

    fn = written_then_hooked_then_written_through_a_later_input
    jf = dealias.jit(fn)
    told = grads_like_eager(fn, jf, make)  # (was: the leaf's gradient differed, the hook on the written version)
    assert told == []
    _split_at_the_registration(jf)
