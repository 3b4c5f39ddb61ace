"""Differential tests: each program runs eagerly and through dealias.jit (first and cached call) on copies
of the same inputs; outputs, inputs after the call and output aliasing must match. (The programs that write on
intermediates, on inputs and through views of inputs are in view_write_programs.py.)"""

from __future__ import annotations

import pytest
import torch
from harness import check
from view_write_programs import VIEW_WRITE_PROGRAMS, r

from dealias.tools.demo import seed_program as seed

torch.manual_seed(0)


# --- setitem --------------------------------------------------------------------------------------
def setitem_int(x, v):
    x[2] = v


def setitem_slice(x, v):
    x[1:3] = v


def setitem_tensor_index(x, idx, v):
    x[idx] = v


def setitem_bool_mask(x):
    x[x > 0] = 0.0


def setitem_mask_tensor_value(x, m, v):
    x[m] = v


def setitem_broadcast(x):
    x[:, 1] = torch.arange(4.0)


def setitem_ellipsis(x, v):
    x[..., 0] = v


def index_put_accumulate(x, idx, v):
    x.index_put_((idx,), v, accumulate=True)


def index_copy_(cache, pos, k):
    cache.index_copy_(1, pos, k)


def index_add_intermediate(x, idx):
    y = torch.zeros(5, 3)
    y.index_add_(0, idx, x)
    return y


def masked_fill_(x):
    x.masked_fill_(x < 0, -1.0)


def scatter_(x, idx):
    x.scatter_(1, idx, 1.0)


# --- out= -----------------------------------------------------------------------------------------
def out_arg(x, y, o):
    torch.add(x, y, out=o)
    return o


def out_intermediate(x):
    o = torch.empty(3, 4)
    torch.mul(x, 2, out=o)
    return o + 1


def out_into_view(x, y):
    torch.sin(y, out=x[1])


def out_multi(x, vals, idx):
    torch.max(x, 1, out=(vals, idx))
    return vals, idx


# --- copy_ ----------------------------------------------------------------------------------------
def copy_broadcast(x, y):
    x.copy_(y)


def copy_dtype(x, y):
    x.copy_(y)
    return x


def copy_into_slice(x, y):
    x[1:3].copy_(y.t())


# --- maybe-aliasing ops ---------------------------------------------------------------------------
def reshape_noncontig_copy(x):
    y = x.t().reshape(-1)
    y.add_(100)
    return y


def reshape_contig_alias(x):
    y = x.reshape(-1)
    y.add_(100)
    return y


def contiguous_copy(x):
    y = x.t().contiguous()
    y.zero_()
    return y


def contiguous_alias(x):
    y = x.contiguous()
    y.mul_(2)
    return y


def to_same_dtype_alias(x):
    y = x.to(torch.float32)
    y.add_(1)
    return y


def to_other_dtype_copy(x):
    y = x.to(torch.float64)
    y.add_(1)
    return y


# --- shapes and dtypes ----------------------------------------------------------------------------
def zero_dim(x):
    x.add_(1)
    return x * 2


def empty_tensor(x):
    x.add_(1)
    return x.sum()


def int_inplace(x):
    x.mul_(3).add_(1)
    return x // 2


def bool_inplace(x, y):
    x.logical_and_(y)


def half_inplace(x, y):
    x.add_(y)


def ge_inplace(x):
    x.ge_(0)


def iand_op(x, y):
    x &= y


def scalar_arg(x, alpha: float, n: int):
    x.add_(alpha * n)
    return x * alpha


def kwargs_and_pytree(xs, *, scale):
    xs["a"].mul_(scale)
    xs["b"][0].add_(xs["a"])
    return [xs["a"], (xs["b"][1], None, 3)]


def non_tensor_output(x):
    x.add_(1)
    return x.shape[0], "tag"


def closure_constant_read(x):
    return x + _CONST


_CONST = torch.arange(4.0)


def foreach_inplace(a, b):
    torch._foreach_add_([a, b], 1.0)
    torch._foreach_mul_([a, b], [b, a])


def addcmul_lerp(p, g, m):
    m.lerp_(g, 0.1)
    p.addcmul_(m, g, value=-0.01)


def clamp_inplace(x):
    x.clamp_(-0.5, 0.5)


def where_after_write(x):
    y = x.clone()
    y[0] = 1.0
    return torch.where(y > 0, y, x)


def matmul_into_slice(a, b, c):
    c[:, :2] = a @ b


def cumsum_out_of_place_after_write(x):
    y = x.exp()
    y[1:].mul_(0.5)
    return y.cumsum(0)


def loop_writes(x):
    for i in range(4):
        x[i].add_(i)
    return x


def kv_cache_step(kc, vc, k, v, pos):
    kc[:, :, pos] = k
    vc[:, :, pos] = v
    return kc[:, :, : pos + 1].sum(), vc


def zero_sized_view_write(x):
    x[2:2].fill_(1.0)


def write_then_view_returned(x):
    y = x * 1
    z = y[1:]
    z.add_(1)
    return y, z


def metadata_t_(x):
    x.t_()
    return x.shape[0]


def unsqueeze_transpose_squeeze(x):
    y = x * 1
    y.unsqueeze_(0)
    y.transpose_(0, 1)
    y.squeeze_(1)
    return y, y.shape[0]


def dropout_eval(x):
    return torch.nn.functional.dropout(x, 0.5, training=False).add_(1)


def random_inplace(x):
    y = torch.empty(4, 4)
    y.uniform_()
    x.add_(y)
    return y


def dropout_of_a_transpose(x):
    # bernoulli_ on empty_like(x.t()): eager's kernel draws into memory laid out as x.t(); its out-of-place form
    # (bernoulli.p) allocates contiguous memory, and the same numbers landed on other elements.
    return torch.nn.functional.dropout(x.t(), 0.5)


def draws_through_views(x):
    x.t().bernoulli_(0.3)
    y = torch.empty(6, 8)[:, ::2].t()  # (not dense: drawn in the order of its strides)
    y.exponential_()
    z = torch.empty(2, 3, 4).permute(2, 0, 1)
    z.normal_()
    return y, z


def draws_with_bounds(x):
    x.uniform_(-1.0, 2.0)  # (`from` is a Python keyword: passed by position)
    torch.nn.init.kaiming_uniform_(x[:2])
    return x


def normal_of_a_column(x):
    # normal_ fills a contiguous tensor of 16 or more elements by vectorized Box-Muller, another one element by
    # element: the draw runs on memory of the column's own strides
    x[:, 0].normal_()
    y = x * 1
    y[:, ::2].normal_()
    return y


PROGRAMS = [
    (seed, lambda: (r(3, 4), r(3, 4))),
    *VIEW_WRITE_PROGRAMS,
    (setitem_int, lambda: (r(4, 3), r(3))),
    (setitem_slice, lambda: (r(4, 3), r(2, 3))),
    (setitem_tensor_index, lambda: (r(5, 3), torch.tensor([0, 3]), r(2, 3))),
    (setitem_bool_mask, lambda: (r(4, 4),)),
    (setitem_mask_tensor_value, lambda: (r(4), torch.tensor([True, False, True, False]), torch.tensor(7.0))),
    (setitem_broadcast, lambda: (r(4, 3),)),
    (setitem_ellipsis, lambda: (r(2, 3, 4), r(2, 3))),
    (index_put_accumulate, lambda: (r(4), torch.tensor([1, 1, 2]), r(3))),
    (index_copy_, lambda: (torch.zeros(2, 6, 3), torch.tensor([4]), r(2, 1, 3))),
    (index_add_intermediate, lambda: (r(3, 3), torch.tensor([0, 2, 2]))),
    (masked_fill_, lambda: (r(3, 3),)),
    (scatter_, lambda: (r(3, 4), torch.tensor([[0], [2], [3]]))),
    (out_arg, lambda: (r(3), r(3), torch.empty(3))),
    (out_intermediate, lambda: (r(3, 4),)),
    (out_into_view, lambda: (r(3, 2), r(2))),
    (out_multi, lambda: (r(3, 4), torch.empty(3), torch.empty(3, dtype=torch.long))),
    (copy_broadcast, lambda: (r(3, 4), r(4))),
    (copy_dtype, lambda: (r(3), torch.tensor([1, 2, 3]))),
    (copy_into_slice, lambda: (r(4, 3), r(3, 2))),
    (reshape_noncontig_copy, lambda: (r(3, 4),)),
    (reshape_contig_alias, lambda: (r(3, 4),)),
    (contiguous_copy, lambda: (r(3, 4),)),
    (contiguous_alias, lambda: (r(3, 4),)),
    (to_same_dtype_alias, lambda: (r(3),)),
    (to_other_dtype_copy, lambda: (r(3),)),
    (zero_dim, lambda: (torch.tensor(3.0),)),
    (empty_tensor, lambda: (torch.empty(0, 3),)),
    (int_inplace, lambda: (torch.arange(6),)),
    (bool_inplace, lambda: (torch.tensor([True, True, False]), torch.tensor([True, False, False]))),
    (half_inplace, lambda: (r(4, dtype=torch.float16), r(4))),
    (ge_inplace, lambda: (r(5),)),
    (iand_op, lambda: (torch.tensor([3, 5, 7]), torch.tensor([1, 4, 6]))),
    (scalar_arg, lambda: (r(3), 0.5, 3)),
    (kwargs_and_pytree, None),
    (non_tensor_output, lambda: (r(2),)),
    (closure_constant_read, lambda: (r(4),)),
    (foreach_inplace, lambda: (r(3), r(3))),
    (addcmul_lerp, lambda: (r(4), r(4), r(4))),
    (clamp_inplace, lambda: (r(6),)),
    (where_after_write, lambda: (r(2, 3),)),
    (matmul_into_slice, lambda: (r(3, 4), r(4, 2), r(3, 5))),
    (cumsum_out_of_place_after_write, lambda: (r(4),)),
    (loop_writes, lambda: (r(4, 2),)),
    (kv_cache_step, lambda: (torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4), r(1, 2, 4), r(1, 2, 4), 3)),
    (zero_sized_view_write, lambda: (r(4),)),
    (write_then_view_returned, lambda: (r(3, 2),)),
    (metadata_t_, lambda: (r(2, 3),)),
    (unsqueeze_transpose_squeeze, lambda: (r(2, 3),)),
    (dropout_eval, lambda: (r(4),)),
    (random_inplace, lambda: (r(4, 4),)),
    (dropout_of_a_transpose, lambda: (r(4, 6),)),
    (draws_through_views, lambda: (r(5, 7),)),
    (draws_with_bounds, lambda: (r(4, 6),)),
    (normal_of_a_column, lambda: (r(20, 5),)),
]


# Programs that run partly eagerly: dynamo breaks the graph at an in-place metadata change of an input, and
# dealias runs a frame with an in-place metadata change of an intermediate eagerly (dynamo's sizes for it go stale).
GRAPH_BREAKS = {"metadata_t_", "unsqueeze_transpose_squeeze"}


@pytest.mark.parametrize("fn,make", PROGRAMS, ids=[p[0].__name__ for p in PROGRAMS])
def test_program(fn, make):
    if make is None:
        check(lambda xs, scale: fn(xs, scale=scale), {"a": r(3), "b": [r(3), r(2)]}, 2.0)
        return
    check(fn, *make(), allow_fallback=fn.__name__ in GRAPH_BREAKS)


def test_enough_programs():
    assert len(PROGRAMS) >= 80


# --- outputs that must stay distinct, and eager's own errors ---------------------------------------
def equal_intermediates(x):
    a = x + 1
    b = x + 1
    return a, b


def expand_write(x):
    x.expand(3, 4).add_(1)


def expand_write_after_other_write(x, y):
    y.add_(1)
    x.expand(3, 4).add_(1)


def partial_overlap_write(x):
    x[1:].add_(x[:-1])


def int_add_float(x):
    x.add_(1.5)


def copy_unbroadcastable(x, y):
    x.copy_(y)


def leaf_requires_grad_inplace(w):
    w.add_(1)


def sdpa_with_mask_kwarg(q, kc, k, mask):
    kc[:, :, 2] = k
    return torch.nn.functional.scaled_dot_product_attention(q, kc, kc, attn_mask=mask)


MORE_PROGRAMS = [
    (
        sdpa_with_mask_kwarg,
        lambda: (r(1, 2, 1, 4), r(1, 2, 6, 4), r(1, 2, 4), torch.tensor([True, True, True, False, False, False])),
    ),
    (equal_intermediates, lambda: (r(3),)),
    (expand_write, lambda: (r(4),)),
    (expand_write_after_other_write, lambda: (r(4), r(2))),
    (partial_overlap_write, lambda: (r(5),)),
    (int_add_float, lambda: (torch.arange(3),)),
    (copy_unbroadcastable, lambda: (r(3), r(4))),
    (leaf_requires_grad_inplace, lambda: (r(3).requires_grad_(),)),
]


@pytest.mark.parametrize("fn,make", MORE_PROGRAMS, ids=[p[0].__name__ for p in MORE_PROGRAMS])
def test_more_programs(fn, make):
    check(fn, *make())
