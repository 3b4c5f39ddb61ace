"""An `unsafe_chunk` / `unsafe_split` element returned after a write of its memory whose eager op saved a tensor it
then wrote (`x0.mul_(x0)`: backward of that write raises in eager, and eager never reaches it from the element).
Eager's element keeps the history it had at the split (UnsafeSplitBackward); dealias rebuilds it after the
write-back and gives it that history (gradops.attach_history). The rebuilt element's own grad_fn, to its input
as written, was left as an edge autograd still walked (with no gradient): the write's stale_saved node raised
"modified by an inplace operation" in backward, on every executor, where eager's backward gave gradients (fuzz
seed 1262072). Against eager: outputs, the caller's tensors after the call, gradients of the leaves (None where
eager's is None), and errors (at the call or at backward). The autograd views of the same shape (`chunk`,
`split`, `split_with_sizes`, `unbind`, `narrow`) raise in eager's backward: dealias raises too."""

from __future__ import annotations

import pytest
import torch
from harness import grads_like_eager

import dealias


def _group(n=6, step=2):
    """(x0, x1): a tensor computed from a leaf, and a strided view of it (the fuzz program's arguments)."""

    def make():
        g = torch.Generator().manual_seed(1262072)
        b = torch.randn(n, generator=g, requires_grad=True)
        a = b * 1
        return (a, a[::step])

    return make


def _group_2d():
    def make():
        g = torch.Generator().manual_seed(7)
        b = torch.randn(4, 6, generator=g, requires_grad=True)
        a = b * 1
        return (a, a.t()[::2])  # (3, 4), strides (2, 6)

    return make


def _group_and_weight():
    def make():
        g = torch.Generator().manual_seed(8)
        b = torch.randn(6, generator=g, requires_grad=True)
        w = torch.randn(6, generator=g, requires_grad=True)
        a = b * 1
        return (a, a[::2], w)

    return make


def fuzz_1262072(x0, x1):  # shrunk from the fuzz program (its `v3 = x0.transpose(0, 0)` is x0 itself)
    v4 = x1.unsafe_chunk(2, 0)[0]
    x0.mul_(x0)  # eager's MulBackward saves x0 and then writes it: stale, never reached from v4
    return (v4,)


def element_of_a_strided_view_made_in_the_program(x0):  # (no alias group)
    v = x0[::2].unsafe_chunk(2, 0)[0]
    x0.mul_(x0)
    return (v,)


def unsafe_chunk_last(x0, x1):
    v = x1.unsafe_chunk(2, 0)[1]
    x0.mul_(x0)
    return (v,)


def unsafe_split_of_a_column_view(x0, x1):
    v = x1.unsafe_split(2, 0)[0]
    x0.mul_(x0)
    return (v,)


def unsafe_split_with_sizes_of_a_column_view(x0, x1):
    v = torch.ops.aten.unsafe_split_with_sizes.default(x1, [1, 2], 0)[1]
    x0.mul_(x0)
    return (v,)


def unsafe_chunk_then_a_write_of_the_view(x0, x1):
    v = x1.unsafe_chunk(2, 1)[1]
    x1.mul_(x1)  # (through the view: the base's CopySlices, and a stale MulBackward)
    return (v, x0 * 1)


def unsafe_chunk_then_sin_(x0, x1):
    v = x1.unsafe_chunk(2, 0)[0]
    x0.sin_()  # (sin_ saves its input: stale after the write)
    return (v,)


def element_of_an_intermediate(x0, x1):
    y = x0 * 2
    v = y[::2].unsafe_chunk(2, 0)[0]
    y.mul_(y)
    return (v, y)


def unsafe_chunk_then_a_write_by_a_leaf(x0, x1, w):
    v = x1.unsafe_chunk(2, 0)[0]
    x0.mul_(w)  # eager's w gets no gradient from v (None, not zeros)
    return (v,)


def _one(n=6):
    def make():
        g = torch.Generator().manual_seed(9)
        return (torch.randn(n, generator=g, requires_grad=True) * 1,)

    return make


CASES = [
    (fuzz_1262072, _group()),
    (element_of_a_strided_view_made_in_the_program, _one()),
    (unsafe_chunk_last, _group()),
    (unsafe_split_of_a_column_view, _group_2d()),
    (unsafe_split_with_sizes_of_a_column_view, _group_2d()),
    (unsafe_chunk_then_a_write_of_the_view, _group_2d()),
    (unsafe_chunk_then_sin_, _group(8, 2)),
    (unsafe_chunk_then_a_write_by_a_leaf, _group_and_weight()),
    (element_of_an_intermediate, _group()),
]


def _leaves(args):
    """The leaves the arguments were computed from (before the program writes them)."""
    out = []
    for a in args:
        leaf = a if a.is_leaf else None
        fn = a.grad_fn
        while leaf is None and fn is not None:
            nxt = [f for f, _ in fn.next_functions if f is not None]
            if not nxt:
                break
            fn = nxt[0]
            leaf = getattr(fn, "variable", None)
        if leaf is not None and all(leaf is not o for o in out):
            out.append(leaf)
    return out


def _run(f, make):
    """What the caller sees: outputs, its tensors after the call, each leaf's .grad after backward (or the error
    and where it was raised)."""
    args = make()
    leaves = _leaves(args)
    try:
        outs = f(*args)
    except Exception as e:  # noqa: BLE001
        return ("call raised", type(e).__name__)
    seen = [o.detach().clone() for o in outs] + [a.detach().clone() for a in args]
    try:
        sum((o * (1 + torch.arange(o.numel()).view(o.shape) % 3)).sum() for o in outs if o.requires_grad).backward()
    except RuntimeError as e:
        return ("backward raised", seen, "modified by an inplace operation" in str(e))
    return ("grads", seen, [None if leaf.grad is None else leaf.grad.clone() for leaf in leaves])


def _assert_same(got, expected):
    assert got[0] == expected[0], (got, expected)
    if got[0] == "call raised":
        assert got[1] == expected[1]
        return
    for g, e in zip(got[1], expected[1], strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    if got[0] == "backward raised":
        assert got[2] == expected[2]
        return
    for g, e in zip(got[2], expected[2], strict=True):
        assert (g is None) == (e is None), (g, e)
        if e is not None:
            torch.testing.assert_close(g, e, rtol=0, atol=0)


@pytest.mark.parametrize("fn,make", CASES, ids=[f.__name__ for f, _ in CASES])
def test_element_after_a_stale_write_like_eager(fn, make):
    jf = dealias.jit(fn, executor="torch")
    for _ in range(2):  # first call and cached
        _assert_same(_run(jf, make), _run(fn, make))
    assert grads_like_eager(fn, jf, make) == []  # (and compiled: no fallback)


@pytest.mark.inductor
@pytest.mark.parametrize("executor", ["inductor", "tiered"])
@pytest.mark.parametrize(
    "fn,make",
    [(fuzz_1262072, _group()), (element_of_a_strided_view_made_in_the_program, _one())],
    ids=["alias_group", "one_input"],
)
def test_on_the_fused_executors(fn, make, executor):
    # (Both run on the torch executor whatever the executor asked: an alias group, and the Python node raising
    # mul_'s stale saved tensor; the generated call, which attaches the history, is the same on all.)
    jf = dealias.jit(fn, executor=executor)
    for _ in range(2):
        _assert_same(_run(jf, make), _run(fn, make))


def chunk(x0, x1):
    v = x1.chunk(2, 0)[0]
    x0.mul_(x0)
    return (v,)


def split(x0, x1):
    v = x1.split(2, 0)[0]
    x0.mul_(x0)
    return (v,)


def split_with_sizes(x0, x1):
    v = x1.split_with_sizes([1, 2], 0)[1]
    x0.mul_(x0)
    return (v,)


def unbind(x0, x1):
    v = x1.unbind(0)[1]
    x0.mul_(x0)
    return (v,)


def narrow(x0, x1):
    v = x1.narrow(0, 1, 2)
    x0.mul_(x0)
    return (v,)


def narrow_of_an_unsafe_chunk_element(x0, x1):
    v = x1.unsafe_chunk(2, 0)[0].narrow(0, 0, 1)
    x0.mul_(x0)
    return (v,)


VIEW_CASES = [chunk, split, split_with_sizes, unbind, narrow, narrow_of_an_unsafe_chunk_element]


@pytest.mark.parametrize("fn", VIEW_CASES, ids=[f.__name__ for f in VIEW_CASES])
@pytest.mark.parametrize("make", [_group(), _group_2d()], ids=["1d", "2d"])
def test_views_after_a_stale_write_like_eager(fn, make):
    # Autograd views of x1 (multi-output or not): their history goes through the write, so eager's backward raises
    # (a view of a multi-output view whose base was written, or MulBackward's stale saved x0); dealias's too, or it
    # runs the graph eagerly.
    jf = dealias.jit(fn, executor="torch")
    for _ in range(2):
        _assert_same(_run(jf, make), _run(fn, make))
