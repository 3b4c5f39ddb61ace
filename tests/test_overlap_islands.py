"""Eager islands (ir/island.py, passes/functionalize/island.py): a write whose eager result is its kernel's
visiting order (it reads memory it writes through another view, writes a tensor whose elements share memory, or
writes an out= tensor sharing memory with an input) compiles as eager's own kernel run on a copy of the base laid
out as the caller's memory. Eager's values, written inputs, aliasing and version counters, first and cached call,
one compile, no FallbackWarning."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import check, compare_call, functional_ops

import dealias
from dealias.ir.island import island

ISLAND = str(island)


def compiled_with_an_island(fn, *args, calls=2, **jit_kw):
    jf = check(fn, *args, calls=calls, **jit_kw)  # (fails on a FallbackWarning, a difference, a second compile)
    assert ISLAND in functional_ops(jf)
    return jf


# -- reads memory it writes through another view ---------------------------------------------------------------


def mul_by_own_row_of_permuted_view(x):
    v = x.permute(1, 2, 0)
    v.mul_(v.narrow(0, 1, 1))  # row 1 squares first, then the rows after it read the squared row (fuzz 1100058)
    return v


def add_own_shifted_columns(x):
    x[:, 1:].add_(x[:, :-1])  # (not dense: eager cannot tell the overlap) each column reads the one just written
    return x * 2


def addcmul_by_own_column(x):
    x.addcmul_(x.narrow(1, 2, 1), x.narrow(1, 0, 1), value=0.5)
    return x


def mul_by_own_diagonal_of_intermediate(a):
    x = a * 3
    x.mul_(x.diagonal())
    return x.sum(0), x


@pytest.mark.parametrize(
    "fn, make",
    [
        (mul_by_own_row_of_permuted_view, lambda: (torch.randn(3, 4, 2),)),
        (add_own_shifted_columns, lambda: (torch.randn(3, 6),)),
        (addcmul_by_own_column, lambda: (torch.randn(4, 5),)),
        (mul_by_own_diagonal_of_intermediate, lambda: (torch.randn(4, 4),)),
    ],
)
def test_a_write_reading_its_own_memory_through_another_view(fn, make):
    compiled_with_an_island(fn, *make())


def test_integer_and_complex_writes_reading_their_own_memory():
    for dtype in (torch.int64, torch.complex64):
        compiled_with_an_island(add_own_shifted_columns, torch.randint(1, 9, (3, 6)).to(dtype))


def add_into_other_input(x, y):
    y.add_(x.t())  # x and y share memory (an alias group): x = b[:5, :5], y = b[1:, 1:]
    return x.sum(), y


def test_two_inputs_sharing_memory():
    base = torch.randn(6, 6)
    jf = dealias.jit(add_into_other_input)
    for _ in range(2):
        b = base.clone()
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            assert compare_call(add_into_other_input, jf, (b[:5, :5], b[1:, 1:])) is None
    assert ISLAND in functional_ops(jf)


# -- writes a tensor whose elements overlap in memory -------------------------------------------------------------


def index_fill_expanded(x):
    x.add_(1.5)
    v = x.expand(2, *x.shape)
    v.index_fill_(1, torch.tensor([0]), -2.0)  # (fuzz 1100131)
    x.neg_()
    return v.sum(0, keepdim=True)


def masked_fill_expanded(x, m):
    v = x.unsqueeze(0).expand(3, *x.shape)
    v.masked_fill_(m, 0.5)  # which of the aliases the kernel writes last decides each element
    return x


def test_index_fill_of_an_expanded_view():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (eager's own: "index_fill_ on expanded tensors is deprecated")
        compiled_with_an_island(index_fill_expanded, torch.randn(5, 5))


def test_masked_fill_of_an_expanded_view():
    m = torch.rand(3, 4, 5) > 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        compiled_with_an_island(masked_fill_expanded, torch.randn(4, 5), m)


def bernoulli_of_unfold(x):
    v = x.unfold(1, 2, 1)  # elements of neighbouring windows share memory
    x.neg_()
    v.bernoulli_(0.5)  # (fuzz 1100047)
    return x, torch.rand(3)  # a draw after it: from the generator as eager leaves it


def test_a_draw_into_an_overlapping_view_in_program_order():
    jf = compiled_with_an_island(bernoulli_of_unfold, torch.randn(2, 5))
    torch.manual_seed(3)
    got = jf(torch.zeros(2, 5))
    after = torch.rand(2)
    torch.manual_seed(3)
    expected = bernoulli_of_unfold(torch.zeros(2, 5))
    assert torch.equal(after, torch.rand(2))  # (the generator moved as in eager)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


# -- out= into memory an input shares ---------------------------------------------------------------------------


def sum_into_own_element(x):
    v = x.view(-1)
    torch.sum(v, 0, out=v[16])  # (fuzz 1100169)
    return x.unbind(0)[2], x


def max_into_own_first_element(x):
    v = x[:2]
    torch.amax(v, 0, keepdim=True, out=v[:1])  # starts from its identity in v[0], then reads v[0] too
    return v


def where_into_shifted_self(x):
    c = x[:, 1]  # a column, read while the rows it crosses are written (fuzz 1100370)
    torch.where(c > 0, x[1:], c, out=x[1:])
    return x


def masked_scatter_own_values(x):
    y = x * 1
    y.masked_scatter_(y > 0, y)  # (fuzz 1100041 without grad) reads its source as it writes
    return y


@pytest.mark.parametrize(
    "fn, make",
    [
        (sum_into_own_element, lambda: (torch.randn(4, 6),)),
        (max_into_own_first_element, lambda: (torch.tensor([[5.0, 1.0], [1.0, 3.0], [2.0, 2.0]]),)),
        (where_into_shifted_self, lambda: (torch.randn(5, 5),)),
        (masked_scatter_own_values, lambda: (torch.randn(3, 4),)),
    ],
)
def test_an_out_or_source_argument_sharing_the_written_memory(fn, make):
    compiled_with_an_island(fn, *make())


# -- structure and limits -----------------------------------------------------------------------------------------


def test_the_island_buffer_is_as_big_as_the_base():
    jf = compiled_with_an_island(add_own_shifted_columns, torch.randn(3, 6)[:, :5])  # a view: base 3 x 5, stride 6
    (node,) = [n for n in jf.last.functional_gm.graph.nodes if n.target is island]
    _, base, size, stride, _views, *_ = node.args
    assert (size, stride) == ([3, 5], [6, 1])
    val = node.meta["val"]
    assert val.untyped_storage().nbytes() == (2 * 6 + 4 + 1) * 4  # the base's span, not its storage's


def add_own_column_with_grad(x):
    x.add_(x.narrow(1, 3, 1))
    return x


def test_autograd_keeps_the_fallback():
    jf = dealias.jit(add_own_column_with_grad)
    with pytest.warns(dealias.OverlapFallbackWarning, match="reads memory it writes"):
        for _ in range(2):
            assert compare_call(add_own_column_with_grad, jf, (torch.randn(4, 6, requires_grad=True) * 1,)) is None


def test_a_large_write_keeps_the_fallback():
    # Over ATen's grain size eager's kernel runs in several threads: its own result varies run to run.
    jf = dealias.jit(add_own_column_with_grad)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert compare_call(add_own_column_with_grad, jf, (torch.randn(2048, 32),)) is None
    assert any(issubclass(w.category, dealias.OverlapFallbackWarning) for w in record)


@pytest.mark.inductor
def test_the_fused_executor_calls_the_island_as_an_extern_kernel():
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.NotFusedWarning)
        warnings.simplefilter("ignore", UserWarning)  # (eager's own: "index_fill_ on expanded tensors is deprecated")
        jf = compiled_with_an_island(index_fill_expanded, torch.randn(5, 5), executor="inductor")
    handed = jf.last.run_graph.graph  # (what inductor was given)
    assert torch.ops.dealias.island.default in [n.target for n in handed.graph.nodes]


@pytest.mark.inductor
def test_a_draw_in_an_island_stays_on_the_torch_executor():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dealias.NotFusedWarning)
        compiled_with_an_island(bernoulli_of_unfold, torch.randn(2, 5), executor="inductor")
    told = [str(w.message) for w in caught if issubclass(w.category, dealias.NotFusedWarning)]
    assert told and "draws random numbers" in told[0]
