# ruff: noqa: E501 - golden traces are kept as the tools print them
"""Golden traces: what each stage makes of a dozen representative programs, compared as text.

A change to a pass shows up here as a diff of the functional and execution traces, to be read and accepted on
purpose: `EXPECTTEST_ACCEPT=1 pytest tests/test_golden.py` rewrites the expected strings in this file. Source
notes are kept without their file and line number (which move when this file is edited), and the passes' times
without their values; shapes, strides and the user's statement stay.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from expecttest import TestCase

import dealias
from dealias.runtime.verify import clone_args
from dealias.tools.demo import seed_program


def traces(fn, *args) -> str:
    """The functional and execution traces of `fn`'s one graph, after checking it against eager."""
    expected_args = clone_args(list(args))  # (tensors sharing memory keep sharing it)
    expected = fn(*expected_args)
    # Sizes static from the first call, whatever sizes other tests called the same function with (dynamo's automatic
    # dynamic remembers them per code object).
    jf = dealias.jit(fn, strict=True, dynamic=False)
    got = jf(*args)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for a, b in zip(args, expected_args):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    text = "\n".join(str(t) for t in dealias.last_traces(jf)[2:])
    text = re.sub(r"\S+\.py:\d+  ", "", text)
    return re.sub(r"\(\d+\.\d ms\)", "(.. ms)", text)  # (the passes' times vary)


def cache_write(cache, k, pos: int):
    cache[:, pos] = k
    return cache.sum()


def write_through_transpose(x):
    x.t()[0].add_(1)
    return x


def intermediate_writes(x):
    y = x.clone()
    y[0].mul_(2)
    y.t()[1].add_(1)
    return y.sum()


def index_copy_cache(cache, idx, k):
    cache.index_copy_(1, idx, k)
    return cache[:, :2]


def adam_step(p, g, m, v, lr: float):
    m.mul_(0.9).add_(g, alpha=0.1)
    v.mul_(0.999).addcmul_(g, g, value=0.001)
    p.addcdiv_(m, v.sqrt().add_(1e-8), value=-lr)


def old_value_read_after_write(x):
    old = x[0] * 1
    x[0] = x[1]
    x[1] = old
    return x


def returns_a_view_of_a_written_input(x):
    x.add_(1)
    return x.view(-1)


def out_into_a_row(x, a, b):
    torch.add(a, b, out=x[1])
    return x


def same_tensor_twice(x, y):
    x.mul_(2)
    return y + 1


def zero_the_diagonal(x):
    x.diagonal().zero_()
    return x.sum(0)


def batch_norm_training(x, mean, var):
    return F.batch_norm(x, mean, var, training=True, momentum=0.1)


def write_under_autograd(x):
    y = x * 2
    y[1] = y[0] * 3
    return y


def write_after_a_no_grad_view(x):
    with torch.no_grad():
        v = x[0]
    x.mul_(2)
    return v


def overlapping_writes(a, b):
    a.add_(1)
    b.mul_(2)
    return a.sum()


def t_between_views(x):
    y = x * 2
    z = y[0]
    y.t_()
    return y, z, y[1]


class TestGolden(TestCase):
    def test_seed(self):
        self.assertExpectedInline(
            traces(seed_program, torch.randn(2, 2), torch.randn(2, 2)),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(a, b):
    exp = aten.exp(a)                                             # float32[2, 2]  c = torch.exp(a)
    tanh = aten.tanh(b)                                           # float32[2, 2]  d = torch.tanh(b)
    view = aten.view(exp, [4])                                    # float32[4]  e += d.flatten()
    view_1 = aten.view(tanh, [4])                                 # float32[4]  e += d.flatten()
    add = aten.add.Tensor(view, view_1)                           # float32[4]  e += d.flatten()
    region_write = region_write(exp, view, add)                   # float32[2, 2]  e += d.flatten()
    div = aten.div.Tensor(tanh, a)                                # float32[2, 2]  d.div_(a)
    return (region_write, div)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
def execute(a, b):
    exp = a.exp()                                                 # float32[2, 2]  c = torch.exp(a)
    tanh = b.tanh()                                               # float32[2, 2]  d = torch.tanh(b)
    view_1 = tanh.view([4])                                       # float32[4]  e += d.flatten()
    view_3 = exp.view([4])                                        # float32[4]  e += d.flatten()
    add_ = view_3.add_(view_1)                                    # float32[4]  e += d.flatten()
    div_ = tanh.div_(a)                                           # float32[2, 2]  d.div_(a)
    return (exp, tanh)
# the call, generated from the plan (this source runs)
def call(leaves):
    a, b = leaves
    exp, tanh = execute(a, b)
    return (exp, tanh)""",
        )

    def test_cache_write(self):
        self.assertExpectedInline(
            traces(cache_write, torch.zeros(2, 5, 3), torch.ones(2, 3), 2),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(cache, k):
    select = aten.select.int(cache, 1, 2)                         # float32[2, 3] strides [15, 1]  cache[:, pos] = k
    copy = aten.copy(select, k)                                   # float32[2, 3] strides [15, 1]  cache[:, pos] = k
    region_write = region_write(cache, select, copy)              # float32[2, 5, 3]  cache[:, pos] = k
    sum_1 = aten.sum(region_write)                                # float32[]  return cache.sum()
    return (region_write, sum_1)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
# write-back to cache: in place, 24 bytes: x.select(1, 2).copy_(..)
def execute(cache, k):
    cache[:, 2] = k                                               # cache[:, pos] = k
    sum_1 = cache.sum()                                           # float32[]  return cache.sum()
    return (sum_1,)
# the call, generated from the plan (this source runs)
def call(leaves):
    cache, k = leaves
    sum_1, = execute(cache, k)
    return (sum_1,)""",
        )

    def test_write_through_transpose(self):
        self.assertExpectedInline(
            traces(write_through_transpose, torch.randn(3, 2)),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(x):
    t = aten.t(x)                                                 # float32[2, 3] strides [1, 2]  x.t()[0].add_(1)
    select = aten.select.int(t, 0, 0)                             # float32[3] strides [2]  x.t()[0].add_(1)
    add = aten.add.Tensor(select, 1)                              # float32[3]  x.t()[0].add_(1)
    region_write = region_write(x, select, add)                   # float32[3, 2]  x.t()[0].add_(1)
    return (region_write,)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
# write-back to x: in place, 12 bytes: x.t().select(0, 0).add_(..)
def execute(x):
    t_2 = x.t()                                                   # float32[2, 3] strides [1, 2]  x.t()[0].add_(1)
    select_2 = t_2[0]                                             # float32[3] strides [2]  x.t()[0].add_(1)
    add_ = select_2.add_(1)                                       # float32[3] strides [2]  x.t()[0].add_(1)
    return ()
# the call, generated from the plan (this source runs)
def call(leaves):
    x, = leaves
    execute(x)
    return (x,)""",
        )

    def test_intermediate_writes(self):
        self.assertExpectedInline(
            traces(intermediate_writes, torch.randn(3, 3)),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(x):
    clone = aten.clone(x)                                         # float32[3, 3]  y = x.clone()
    select = aten.select.int(clone, 0, 0)                         # float32[3]  y[0].mul_(2)
    mul = aten.mul.Tensor(select, 2)                              # float32[3]  y[0].mul_(2)
    region_write = region_write(clone, select, mul)               # float32[3, 3]  y[0].mul_(2)
    t = aten.t(region_write)                                      # float32[3, 3] strides [1, 3]  y.t()[1].add_(1)
    select_2 = aten.select.int(t, 0, 1)                           # float32[3] strides [3]  y.t()[1].add_(1)
    add = aten.add.Tensor(select_2, 1)                            # float32[3]  y.t()[1].add_(1)
    region_write_1 = region_write(region_write, select_2, add)    # float32[3, 3]  y.t()[1].add_(1)
    sum_1 = aten.sum(region_write_1)                              # float32[]  return y.sum()
    return (sum_1,)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
def execute(x):
    clone = x.clone()                                             # float32[3, 3]  y = x.clone()
    select_4 = clone[0]                                           # float32[3]  y[0].mul_(2)
    mul_ = select_4.mul_(2)                                       # float32[3]  y[0].mul_(2)
    t_2 = clone.t()                                               # float32[3, 3] strides [1, 3]  y.t()[1].add_(1)
    select_5 = t_2[1]                                             # float32[3] strides [3]  y.t()[1].add_(1)
    add_ = select_5.add_(1)                                       # float32[3] strides [3]  y.t()[1].add_(1)
    sum_1 = clone.sum()                                           # float32[]  return y.sum()
    return (sum_1,)
# the call, generated from the plan (this source runs)
def call(leaves):
    x, = leaves
    sum_1, = execute(x)
    return (sum_1,)""",
        )

    def test_index_copy_cache(self):
        cache, k = torch.zeros(2, 6, 4), torch.randn(2, 1, 4)
        self.assertExpectedInline(
            traces(index_copy_cache, cache, torch.tensor([3]), k),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(cache, idx, k):
    index_copy = aten.index_copy(cache, 1, idx, k)                # float32[2, 6, 4]  cache.index_copy_(1, idx, k)
    return (index_copy,)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
# write-back to cache: in place, 32 bytes: x.index_copy_(..)
def execute(cache, idx, k):
    check_index_bounds = check_index_bounds(idx, 6, 1)            # cache.index_copy_(1, idx, k)
    index_copy_ = cache.index_copy_(1, idx, k)                    # float32[2, 6, 4]  cache.index_copy_(1, idx, k)
    return ()
# the call, generated from the plan (this source runs)
def call(leaves):
    if grad_enabled() is not True:
        return call_with_grad_off(leaves)
    cache, idx, k = leaves
    execute(cache, idx, k)
    out0 = aten_slice_Tensor(cache, 1, 0, 2)
    return (out0,)""",
        )

    def test_adam_step(self):
        p, g, m, v = (torch.randn(8) for _ in range(4))
        self.assertExpectedInline(
            traces(adam_step, p, g, m, v.abs(), 0.01),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(m, g, v, p):
    mul = aten.mul.Tensor(m, 0.9)                                 # float32[8]  m.mul_(0.9).add_(g, alpha=0.1)
    add = aten.add.Tensor(mul, g, alpha=0.1)                      # float32[8]  m.mul_(0.9).add_(g, alpha=0.1)
    mul_1 = aten.mul.Tensor(v, 0.999)                             # float32[8]  v.mul_(0.999).addcmul_(g, g, value=0.001)
    addcmul = aten.addcmul(mul_1, g, g, value=0.001)              # float32[8]  v.mul_(0.999).addcmul_(g, g, value=0.001)
    sqrt = aten.sqrt(addcmul)                                     # float32[8]  p.addcdiv_(m, v.sqrt().add_(1e-8), value=-lr)
    add_1 = aten.add.Tensor(sqrt, 1e-08)                          # float32[8]  p.addcdiv_(m, v.sqrt().add_(1e-8), value=-lr)
    addcdiv = aten.addcdiv(p, add, add_1, value=-0.01)            # float32[8]  p.addcdiv_(m, v.sqrt().add_(1e-8), value=-lr)
    return (add, addcmul, addcdiv)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
# write-back to m: in place, 64 bytes: x.mul_(..), x.add_(..)
# write-back to v: in place, 64 bytes: x.mul_(..), x.addcmul_(..)
# write-back to p: in place, 32 bytes: x.addcdiv_(..)
def execute(m, g, v, p):
    mul_ = m.mul_(0.9)                                            # float32[8]  m.mul_(0.9).add_(g, alpha=0.1)
    add_ = m.add_(g, alpha=0.1)                                   # float32[8]  m.mul_(0.9).add_(g, alpha=0.1)
    mul__1 = v.mul_(0.999)                                        # float32[8]  v.mul_(0.999).addcmul_(g, g, value=0.001)
    addcmul_ = v.addcmul_(g, g, value=0.001)                      # float32[8]  v.mul_(0.999).addcmul_(g, g, value=0.001)
    sqrt = v.sqrt()                                               # float32[8]  p.addcdiv_(m, v.sqrt().add_(1e-8), value=-lr)
    add__1 = sqrt.add_(1e-08)                                     # float32[8]  p.addcdiv_(m, v.sqrt().add_(1e-8), value=-lr)
    addcdiv_ = p.addcdiv_(m, sqrt, value=-0.01)                   # float32[8]  p.addcdiv_(m, v.sqrt().add_(1e-8), value=-lr)
    return ()
# the call, generated from the plan (this source runs)
def call(leaves):
    m, g, v, p = leaves
    execute(m, g, v, p)
    return ()""",
        )

    def test_old_value_read_after_write(self):
        self.assertExpectedInline(
            traces(old_value_read_after_write, torch.randn(2, 3)),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(x):
    select = aten.select.int(x, 0, 0)                             # float32[3]  old = x[0] * 1
    mul = aten.mul.Tensor(select, 1)                              # float32[3]  old = x[0] * 1
    select_2 = aten.select.int(x, 0, 1)                           # float32[3]  x[0] = x[1]
    copy = aten.copy(select, select_2)                            # float32[3]  x[0] = x[1]
    region_write = region_write(x, select, copy)                  # float32[2, 3]  x[0] = x[1]
    select_4 = aten.select.int(region_write, 0, 1)                # float32[3]  x[1] = old
    copy_1 = aten.copy(select_4, mul)                             # float32[3]  x[1] = old
    region_write_1 = region_write(region_write, select_4, copy_1)  # float32[2, 3]  x[1] = old
    return (region_write_1,)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
# write-back to x: in place, 24 bytes: x.select(0, 0).copy_(..), x.select(0, 1).copy_(..)
def execute(x):
    select = x[0]                                                 # float32[3]  old = x[0] * 1
    mul = select.mul(1)                                           # float32[3]  old = x[0] * 1
    select_2 = x[1]                                               # float32[3]  x[0] = x[1]
    x[0] = select_2                                               # x[0] = x[1]
    x[1] = mul                                                    # x[1] = old
    return ()
# the call, generated from the plan (this source runs)
def call(leaves):
    x, = leaves
    execute(x)
    return (x,)""",
        )

    def test_returns_a_view_of_a_written_input(self):
        self.assertExpectedInline(
            traces(returns_a_view_of_a_written_input, torch.randn(2, 3)),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(x):
    add = aten.add.Tensor(x, 1)                                   # float32[2, 3]  x.add_(1)
    return (add,)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
# write-back to x: in place, 24 bytes: x.add_(..)
def execute(x):
    add_ = x.add_(1)                                              # float32[2, 3]  x.add_(1)
    return ()
# the call, generated from the plan (this source runs)
def call(leaves):
    if grad_enabled() is not True:
        return call_with_grad_off(leaves)
    x, = leaves
    execute(x)
    out0 = x.view([-1])
    return (out0,)""",
        )

    def test_out_into_a_row(self):
        self.assertExpectedInline(
            traces(out_into_a_row, torch.zeros(3, 4), torch.randn(4), torch.randn(4)),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(x, a, b):
    select = aten.select.int(x, 0, 1)                             # float32[4]  torch.add(a, b, out=x[1])
    add = aten.add.Tensor(a, b)                                   # float32[4]  torch.add(a, b, out=x[1])
    region_write = region_write(x, select, add)                   # float32[3, 4]  torch.add(a, b, out=x[1])
    return (region_write,)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
# write-back to x: in place, 16 bytes: x.select(0, 1).copy_(..)
def execute(x, a, b):
    add = a.add(b)                                                # float32[4]  torch.add(a, b, out=x[1])
    x[1] = add                                                    # torch.add(a, b, out=x[1])
    return ()
# the call, generated from the plan (this source runs)
def call(leaves):
    x, a, b = leaves
    execute(x, a, b)
    return (x,)""",
        )

    def test_same_tensor_twice(self):
        x = torch.randn(4)
        self.assertExpectedInline(
            traces(same_tensor_twice, x, x),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(x):
    mul = aten.mul.Tensor(x, 2)                                   # float32[4]  x.mul_(2)
    add = aten.add.Tensor(mul, 1)                                 # float32[4]  return y + 1
    return (mul, add)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
# write-back to x: in place, 16 bytes: x.mul_(..)
def execute(x):
    mul_ = x.mul_(2)                                              # float32[4]  x.mul_(2)
    add = x.add(1)                                                # float32[4]  return y + 1
    return (add,)
# the call, generated from the plan (this source runs)
def call(leaves):
    x, = leaves
    add, = execute(x)
    return (add,)""",
        )

    def test_zero_the_diagonal(self):
        self.assertExpectedInline(
            traces(zero_the_diagonal, torch.randn(3, 3)),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(x):
    diagonal = aten.diagonal(x)                                   # float32[3] strides [4]  x.diagonal().zero_()
    fill = aten.fill.Scalar(diagonal, 0)                          # float32[3]  x.diagonal().zero_()
    region_write = region_write(x, diagonal, fill)                # float32[3, 3]  x.diagonal().zero_()
    sum_1 = aten.sum.dim_IntList(region_write, [0])               # float32[3]  return x.sum(0)
    return (region_write, sum_1)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
# write-back to x: in place, 12 bytes: x.diagonal().fill_(..)
def execute(x):
    diagonal_2 = x.diagonal()                                     # float32[3] strides [4]  x.diagonal().zero_()
    fill_ = diagonal_2.fill_(0)                                   # float32[3] strides [4]  x.diagonal().zero_()
    sum_1 = x.sum([0])                                            # float32[3]  return x.sum(0)
    return (sum_1,)
# the call, generated from the plan (this source runs)
def call(leaves):
    x, = leaves
    sum_1, = execute(x)
    return (sum_1,)""",
        )

    def test_batch_norm_training(self):
        x, mean, var = torch.randn(4, 3), torch.zeros(3), torch.ones(3)
        self.assertExpectedInline(
            traces(batch_norm_training, x, mean, var),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(x, mean, var):
    _native_batch_norm_legit_functional = aten._native_batch_norm_legit_functional(x, None, None, mean, var, True, 0.1, 1e-05)  # return F.batch_norm(x, mean, var, training=True, momentum=0.1)
    getitem = getitem(_native_batch_norm_legit_functional, 0)     # float32[4, 3]  return F.batch_norm(x, mean, var, training=True, momentum=0.1)
    getitem_3 = getitem(_native_batch_norm_legit_functional, 3)   # float32[3]  return F.batch_norm(x, mean, var, training=True, momentum=0.1)
    getitem_4 = getitem(_native_batch_norm_legit_functional, 4)   # float32[3]  return F.batch_norm(x, mean, var, training=True, momentum=0.1)
    return (getitem_3, getitem_4, getitem)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
# write-back to mean: in place, 12 bytes: x.copy_(..)
# write-back to var: in place, 12 bytes: x.copy_(..)
def execute(x, mean, var):
    _native_batch_norm_legit_functional = aten._native_batch_norm_legit_functional(x, None, None, mean, var, True, 0.1, 1e-05)  # return F.batch_norm(x, mean, var, training=True, momentum=0.1)
    getitem = getitem(_native_batch_norm_legit_functional, 0)     # float32[4, 3]  return F.batch_norm(x, mean, var, training=True, momentum=0.1)
    getitem_3 = getitem(_native_batch_norm_legit_functional, 3)   # float32[3]  return F.batch_norm(x, mean, var, training=True, momentum=0.1)
    copy_ = mean.copy_(getitem_3)                                 # float32[3]  return F.batch_norm(x, mean, var, training=True, momentum=0.1)
    getitem_4 = getitem(_native_batch_norm_legit_functional, 4)   # float32[3]  return F.batch_norm(x, mean, var, training=True, momentum=0.1)
    copy__1 = var.copy_(getitem_4)                                # float32[3]  return F.batch_norm(x, mean, var, training=True, momentum=0.1)
    return (getitem,)
# the call, generated from the plan (this source runs)
def call(leaves):
    x, mean, var = leaves
    kept = (mean, var)
    versions = (mean._version, var._version)
    getitem, = execute(x, mean, var)
    set_version_counters(kept, versions)
    return (getitem,)""",
        )

    def test_write_under_autograd(self):
        self.assertExpectedInline(
            traces(write_under_autograd, torch.randn(3, 2, requires_grad=True)),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(x):
    mul = aten.mul.Tensor(x, 2)                                   # float32[3, 2]  y = x * 2
    select = aten.select.int(mul, 0, 0)                           # float32[2]  y[1] = y[0] * 3
    mul_1 = aten.mul.Tensor(select, 3)                            # float32[2]  y[1] = y[0] * 3
    select_1 = aten.select.int(mul, 0, 1)                         # float32[2]  y[1] = y[0] * 3
    clone = aten.clone(mul_1)                                     # float32[2]  y[1] = y[0] * 3
    region_write = region_write(mul, select_1, clone)             # float32[3, 2]  y[1] = y[0] * 3
    return (region_write,)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
def execute(x):
    mul = x.mul(2)                                                # float32[3, 2]  y = x * 2
    select = mul[0]                                               # float32[2]  y[1] = y[0] * 3
    mul_1 = select.mul(3)                                         # float32[2]  y[1] = y[0] * 3
    clone = mul_1.clone()                                         # float32[2]  y[1] = y[0] * 3
    select_scatter = mul.select_scatter(clone, 0, 1)              # float32[3, 2]  y[1] = y[0] * 3
    return (select_scatter,)
# the call, generated from the plan (this source runs)
def call(leaves):
    x, = leaves
    select_scatter, = execute(x)
    return (select_scatter,)""",
        )

    # The epilogue as it runs: a view made before the graph in eager's grad mode, a whole write-back with grad on,
    # an alias group's base, a layout set in place after the views of it are made.
    def test_write_after_a_no_grad_view(self):
        self.assertExpectedInline(
            traces(write_after_a_no_grad_view, torch.randn(2, 3, requires_grad=True) * 1),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(x):
    clone_default = aten.clone(x)                                 # float32[2, 3]
    mul = aten.mul.Tensor(clone_default, 2)                       # float32[2, 3]  x.mul_(2)
    return (mul,)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
# write-back to x: whole copy, 24 bytes: x.copy_(..)
def execute(x):
    clone_default = x.clone()                                     # float32[2, 3]
    mul_1 = clone_default.mul_(2)                                 # float32[2, 3]  x.mul_(2)
    return (mul_1,)
# the call, generated from the plan (this source runs)
def call(leaves):
    if grad_enabled() is not True:
        return call_with_grad_off(leaves)
    x, = leaves
    set_grad_enabled(False)
    try:
        out0 = x.select(0, 0)
    finally:
        set_grad_enabled(True)
    mul_1, = execute(x)
    # write-back into the caller's tensors
    x.copy_(mul_1)
    return (out0,)""",
        )

    def test_overlapping_writes(self):
        base = torch.zeros(10)
        self.assertExpectedInline(
            traces(overlapping_writes, base[:6], base[2:]),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(a, b, alias_group0):
    add = aten.add.Tensor(a, 1)                                   # float32[6]  a.add_(1)
    as_strided_rel = as_strided_rel(alias_group0, [6], [1], 0)    # float32[6]  a.add_(1)
    region_write = region_write(alias_group0, as_strided_rel, add)  # float32[10]  a.add_(1)
    bump_version = bump_version(a)                                # a.add_(1)
    as_strided_rel_1 = as_strided_rel(region_write, [8], [1], 2)  # float32[8]  b.mul_(2)
    mul = aten.mul.Tensor(as_strided_rel_1, 2)                    # float32[8]  b.mul_(2)
    region_write_1 = region_write(region_write, as_strided_rel_1, mul)  # float32[10]  b.mul_(2)
    bump_version_1 = bump_version(b)                              # b.mul_(2)
    as_strided_rel_3 = as_strided_rel(region_write_1, [6], [1], 0)  # float32[6]  return a.sum()
    sum_1 = aten.sum(as_strided_rel_3)                            # float32[]  return a.sum()
    return (region_write_1, sum_1)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
# write-back to group 0: in place, 56 bytes: x.as_strided_rel([6], [1], 0).copy_(..), x.as_strided_rel([8], [1], 2).mul_(..)
def execute(a, b, alias_group0):
    add = a.add(1)                                                # float32[6]  a.add_(1)
    as_strided_rel_4 = as_strided_rel(alias_group0, [6], [1], 0)  # float32[6]  a.add_(1)
    copy_ = as_strided_rel_4.copy_(add)                           # float32[6]  a.add_(1)
    bump_version = bump_version(a)                                # a.add_(1)
    as_strided_rel_5 = as_strided_rel(alias_group0, [8], [1], 2)  # float32[8]  b.mul_(2)
    mul_ = as_strided_rel_5.mul_(2)                               # float32[8]  b.mul_(2)
    bump_version_1 = bump_version(b)                              # b.mul_(2)
    as_strided_rel_3 = as_strided_rel(alias_group0, [6], [1], 0)  # float32[6]  return a.sum()
    sum_1 = as_strided_rel_3.sum()                                # float32[]  return a.sum()
    return (sum_1,)
# the call, generated from the plan (this source runs)
def call(leaves):
    a, b = leaves
    alias_group0 = base_of_group0(a, b)
    sum_1, = execute(a, b, alias_group0)
    return (sum_1,)""",
        )

    def test_t_between_views(self):
        self.assertExpectedInline(
            traces(t_between_views, torch.randn(3, 4)),
            """\
# functional trace (no mutation)
# made by alias analysis (.. ms), functionalize (.. ms), optimize (.. ms)
def functional(x):
    mul = aten.mul.Tensor(x, 2)                                   # float32[3, 4]  y = x * 2
    return (mul,)
# execution trace (torch executor)
# made by write-back lowering (.. ms), torch executor (.. ms), call generation (.. ms)
def execute(x):
    mul = x.mul(2)                                                # float32[3, 4]  y = x * 2
    return (mul,)
# the call, generated from the plan (this source runs)
def call(leaves):
    if grad_enabled() is not True:
        return call_with_grad_off(leaves)
    x, = leaves
    mul, = execute(x)
    out1 = mul.select(0, 0)
    out2 = mul.t().select(0, 1)
    as_strided_keeping_version(mul, [4, 3], [1, 4], 0)
    return (mul, out1, out2)""",
        )
