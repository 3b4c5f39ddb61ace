"""Eager's errors that fake tensors do not raise, on both executors: kernel checks of dtypes, sizes and devices the
fused executor's kernels would skip (runtime/kernel_checks.py), an in-place op on an empty tensor whose operands
broadcast wider (ir/checks.empty_inplace_error), and an unused read at an index tensor (compat/dynamo_reads.py).
Each program is compared with eager on fresh copies of its inputs, on a first and a cached call: the same exception
type and message, and the caller's tensors as eager leaves them (values and version counters: eager's writes before
its failing op made, a refused call running the graph eagerly, frontend/backend.py)."""

from __future__ import annotations

import pytest
import torch

import dealias


def clones(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def same_message(got, eager) -> bool:
    """Eager's message; an index checked before the call (prologue.py) names the op and line after it."""
    return str(got) == str(eager) or str(got).startswith(f"{eager} (aten.")


def raises_like_eager(fn, *args, **jit_kw):
    """Eager raises on `fn(*args)`; the jitted fn raises the same type with the same message, twice, leaving its
    inputs as eager's. Returns the jitted function."""
    jf = dealias.jit(fn, **jit_kw)
    for _ in range(2):
        eagers = clones(args)
        with pytest.raises(Exception) as eager:
            fn(*eagers)
        mine = clones(args)
        with pytest.raises(Exception) as got:
            jf(*mine)
        assert isinstance(got.value, type(eager.value)), (got.value, eager.value)
        assert type(got.value) is type(eager.value) or type(got.value) is dealias.EagerSemanticsError
        assert same_message(got.value, eager.value), (str(got.value), str(eager.value))
        for eagers_after, after in zip(eagers, mine):
            if isinstance(after, torch.Tensor):
                assert torch.equal(eagers_after, after) and after._version == eagers_after._version
    return jf


# --- the fused executor: eager's kernel checks of metadata ----------------------------------------------------


def setitem(buf, idx, v):
    buf[idx] = v  # (an RL replay buffer fed from numpy: v float64, buf float32)


def setitem_big(buf, idx, v):
    buf[idx] = v  # (a function of its own: another size for setitem's code would make dynamo's sizes symbolic)


def put_accumulate(buf, idx, v):
    buf.index_put_((idx,), v, accumulate=True)


def index_copy(buf, idx, v):
    buf.index_copy_(0, idx, v)


def index_add(buf, idx, v):
    buf.index_add_(0, idx, v)


def index_fill(buf, idx, v):
    buf.index_fill_(0, idx, 2.0)


def two_writes(x, buf, i, j, v):
    x.add_(1)  # (written before the failing op, in eager and here: the refused call runs the graph eagerly)
    buf.index_copy_(0, i, x)
    buf[j] = v


def int_pow(x, i, v):
    x.pow_(-1)  # (integers to negative powers: eager's kernel raises, whatever the values)


BUF, I2, F64 = torch.zeros(5, 3), torch.tensor([1, 2]), torch.ones(2, 3, dtype=torch.float64)
METADATA_ERRORS = [
    (setitem, (BUF, I2, F64)),
    # A buffer over the probe's 16 MB: its memory is taken unfilled (pages only where the probe writes).
    (setitem_big, (torch.zeros(1 << 20, 5), I2, torch.ones(2, 5, dtype=torch.float64))),
    (put_accumulate, (BUF, I2, F64)),
    (index_copy, (BUF, I2, F64)),
    (index_add, (BUF, I2, F64)),
    (index_copy, (BUF, I2.int(), torch.ones(2, 3))),
    (index_fill, (BUF, I2.int(), None)),
    (two_writes, (torch.zeros(2, 3), BUF, torch.tensor([0, 1]), I2, F64)),
    # An index out of range in an op before the failing one: eager's first error is that one's IndexError.
    (two_writes, (torch.zeros(2, 3), BUF, torch.tensor([0, 7]), I2, F64)),
    (int_pow, (torch.arange(3), None, None)),
]


@pytest.mark.parametrize(
    "fn, args", METADATA_ERRORS, ids=[f"{f.__name__}-{i}" for i, (f, _) in enumerate(METADATA_ERRORS)]
)
def test_fused_raises_eagers_kernel_checks(fn, args):
    jf = raises_like_eager(fn, *args, executor="inductor")
    assert dealias.cache_info(jf).misses == 1  # (the program raising eager's error is cached: no inductor compile)
    assert "(fused: raises eager's" in dealias.last_traces(jf)[-1].text.splitlines()[0]


def values_decide(a, b, lu, pivots):
    a.add_(b)
    p, lower, upper = torch.lu_unpack(lu, pivots)  # (pivots of zeros and of large values refused alike; of ones not)
    return a, p @ lower @ upper


def test_value_errors_of_zeros_are_not_raised():
    """Ops whose kernels raise on the probe's zeros only (pivots lu_unpack refuses) are compiled. (An integer
    division by a tensor, which raises on zeros too, runs on the torch executor: test_fuzz17.py.)"""
    jf = dealias.jit(values_decide, executor="inductor")
    args = (torch.arange(6), torch.full((6,), 4), *torch.linalg.lu_factor(torch.randn(4, 4)))
    got, expected = jf(*clones(args)), values_decide(*clones(args))
    assert torch.equal(got[0], expected[0]) and torch.allclose(got[1], expected[1])
    first = dealias.last_traces(jf)[-1].text.splitlines()[0]
    assert "fused" in first and "not fused" not in first, first


def grad_and_write(w, buf, idx, v):
    buf.index_add_(0, idx, v)
    return w * 2


def test_fused_autograd_and_symbols_leave_it_to_eagers_kernels():
    """A graph AOTAutograd would compile, and one over symbols, run on the torch executor, whose kernels raise."""
    w = torch.ones(3, requires_grad=True)
    raises_like_eager(grad_and_write, w, BUF, I2, F64, executor="inductor")
    jf = dealias.jit(index_copy, executor="inductor", dynamic=True)
    with pytest.raises(RuntimeError, match="same dtype"):
        jf(BUF.clone(), I2, F64)
    assert "eager's aten.index_copy_.default raises" in dealias.last_traces(jf)[-1].text


# --- error parity on both executors -----------------------------------------------------------------------------


def empty_atan2(x, y):
    x.atan2_(y)


def empty_on_intermediate(x, y):
    z = x.clone()
    z.pow_(y)
    z.lt_(y)
    return z


def empty_fmod(x, y):
    x.fmod_(y)
    return x


def dead_read(x, idx):
    x.add_(1)
    x[idx]


def dead_read_of_list(x):
    x.add_(1)
    x[[9]]


@pytest.mark.parametrize("executor", ["torch", "inductor"])
def test_error_parity(executor):
    e, wide = torch.zeros(0, 1, 3), torch.zeros(0, 10, 3)
    for fn in (empty_atan2, empty_on_intermediate, empty_fmod):
        raises_like_eager(fn, e, wide, executor=executor)
    # (Eager wrote x before its read raised; dealias's program checks the index first.)
    for fn, args in ((dead_read, (torch.zeros(3, 2), torch.tensor([9]))), (dead_read_of_list, (torch.zeros(3, 2),))):
        jf = dealias.jit(fn, executor=executor)
        for _ in range(2):
            with pytest.raises(IndexError) as eager:
                fn(*clones(args))
            with pytest.raises(IndexError) as got:
                jf(*clones(args))
            assert same_message(got.value, eager.value), (str(got.value), str(eager.value))
