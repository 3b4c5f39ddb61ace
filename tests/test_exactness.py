"""Exactness against eager on the classes of bugs an OpInfo sweep and PyTorch's own mutation tests found
(issue 13): each test is one root cause, run on a first and on cached calls. (unsafe_split's elements:
test_exactness_unsafe_split.py; the bullets of issue 13 an audit found without a test: test_exactness_audit.py.)"""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import check, clone_args

import dealias
from dealias.runtime.verify import compare_call


def write_through_own_as_strided(x):
    y = torch.zeros(4)
    y.as_strided((2,), (2,), 0).add_(1)  # a tensor made inside the program, written through a view
    return x + y


def write_through_split_element(x):
    y = torch.zeros(4)
    a, _ = y.split(2)
    a.add_(1)  # an element of a multi-output view
    return x + y


def test_created_tensor_written_through_a_view_is_not_folded():
    # "Is this a view" was decided in several places; constant folding missed dealias's own as_strided_rel and
    # folded a tensor the program writes: [1,0,1,0], then [2,0,2,0], ... on successive calls.
    check(write_through_own_as_strided, torch.zeros(4), calls=3)
    check(write_through_split_element, torch.zeros(4), calls=3)


def out_into_view_of_input(x, s):
    torch.slice_scatter(x, s, out=x.view(x.shape))
    return x  # eager returns x itself, not the view make_fx names it by


def out_into_slice_of_input(x, s):
    torch.slice_scatter(x, s, out=x[:])
    return x


def test_out_into_a_view_returns_the_input_itself():
    check(out_into_view_of_input, torch.zeros(4), torch.ones(4))
    check(out_into_slice_of_input, torch.zeros(4), torch.ones(4))


def unused_index_select(x, i):
    torch.index_select(x, 0, i)  # unused, but eager raises on an index out of range
    return x + 1


def unused_cholesky(x):
    torch.linalg.cholesky(x)  # unused, but eager raises when x is not positive-definite
    return x + 1


def test_ops_that_raise_on_their_values_are_not_dead():
    check(unused_index_select, torch.zeros(4), torch.tensor([9]))
    check(unused_index_select, torch.zeros(4), torch.tensor([2]))
    check(unused_cholesky, -torch.eye(3))
    check(unused_cholesky, torch.eye(3))


def index_add_own_source(x, i):
    x.index_add_(0, i, x)
    return x


def index_select_into_source(x, i):
    torch.index_select(x, 0, i, out=x)
    return x


def test_writes_whose_source_is_the_written_tensor_raise_eagers_error():
    # Full overlap through a second argument: pointwise kernels allow it, these kernels refuse it.
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        index_add_own_source(torch.ones(4), torch.arange(4))
    check(index_add_own_source, torch.ones(4), torch.arange(4))
    check(index_select_into_source, torch.arange(4.0), torch.tensor([3, 2, 1, 0]))


def scatter_value(x, i):
    x.scatter_(0, i, 1.0)
    return x


def index_fill_last(x, i):
    x.index_fill_(0, i, 5.0)
    return x


def index_copy_row(x, i, s):
    x.index_copy_(0, i, s)
    return x


@pytest.mark.parametrize(
    "fn, index",
    [(scatter_value, 7), (scatter_value, -1), (index_fill_last, -1), (index_fill_last, -5), (index_copy_row, -1)],
)
def test_index_bounds_follow_each_ops_own_rule(fn, index):
    # scatter_ raises RuntimeError, index_fill_ takes -1, index_copy_ does not: eager's answers, learned by
    # probing each write when compiling.
    args = (torch.zeros(4), torch.tensor([index])) + ((torch.ones(1),) if fn is index_copy_row else ())
    check(fn, *args)


def test_index_bounds_error_is_eagers_and_names_the_op_and_line():
    x = torch.zeros(4)
    # (the torch executor's own message; dynamo's graph, which executor="auto" may run instead, raises eager's)
    jf = dealias.jit(index_copy_row, executor="torch")
    jf(x, torch.tensor([1]), torch.ones(1))
    with pytest.raises(IndexError) as eager:
        index_copy_row(torch.zeros(4), torch.tensor([7]), torch.ones(1))
    with pytest.raises(IndexError) as compiled:
        jf(x, torch.tensor([7]), torch.ones(1))
    message = str(compiled.value)
    assert message.startswith(str(eager.value)), message
    assert "index_copy_" in message and "test_exactness.py" in message, message
    assert torch.equal(x, torch.tensor([0.0, 1.0, 0.0, 0.0]))  # untouched by the failing call


def add_into_first(a, b):
    a.add_(1)
    return a + b


def double(z):
    return z * 2


def plus_one(m):
    return m + 1


@pytest.mark.parametrize(
    "fn, make",
    [
        (add_into_first, lambda: (lambda x: (x, x))(torch.zeros(3))),  # the same tensor twice
        (double, lambda: (torch.randn(3, dtype=torch.cfloat).conj(),)),  # a lazily conjugated input
        (double, lambda: (-torch.randn(3, dtype=torch.cfloat).conj().imag,)),  # a negative-bit view
        (plus_one, lambda: (torch.empty(3, device="meta"),)),  # meta tensors have no values to compare
    ],
    ids=["same-tensor-twice", "conj-bit", "neg-bit", "meta"],
)
def test_verify_raises_no_false_alarm(fn, make):
    jf = dealias.jit(fn, verify=True)
    for _ in range(2):
        args = make()
        expected = fn(*(args if args[0].device.type == "meta" else clone_args(args)))
        got = jf(*args)
        if got.device.type != "meta":
            torch.testing.assert_close(got.resolve_conj().resolve_neg(), expected.resolve_conj().resolve_neg())


def polygamma_in_place(x):
    x.polygamma_(1)  # the functional form takes its arguments in another order: polygamma(n, self)
    return x


def factories_into_out(a, b, c, d):
    torch.arange(4, out=a)  # out= factories: the functional form takes dtype and device instead
    torch.full((4,), 2.5, out=b)
    torch.eye(3, out=c)
    torch.linspace(0, 1, 4, out=d)
    return a, b, c, d


def test_ops_whose_functional_form_differs_compile():
    check(polygamma_in_place, torch.rand(3) + 0.5)
    check(factories_into_out, torch.zeros(4, dtype=torch.float64), torch.zeros(4), torch.zeros(3, 3), torch.zeros(4))
    check(factories_into_out, torch.zeros(4, dtype=torch.int32), torch.zeros(4), torch.zeros(3, 3), torch.zeros(4))


def composites_into_out(x, o1, o2):
    torch.linalg.inv(x, out=o1)  # inside, an empty out= tensor the kernel resizes
    torch.msort(x, out=o2)
    return o1, o2


def split_into_rows(x, rows):
    torch.split_with_sizes_copy(x, [2, 2], out=[rows[0], rows[1]])  # out= a list of views of an input
    torch.unbind_copy(x.view(2, 2), out=[rows[1], rows[0]])
    return rows


def test_out_arguments_inside_composites_and_lists_of_views():
    x = torch.eye(3) * 2 + 0.1
    check(composites_into_out, x, torch.zeros(3, 3), torch.zeros(3, 3))
    check(split_into_rows, torch.arange(4.0), torch.zeros(2, 2))


def fill_everything(x):
    x.fill_(2)  # eager writes each element of memory once per repeat, all with one value
    return x


def zero_everything(x):
    x.zero_()
    return x


def fill_a_row(x):
    x[1].fill_(3)
    return x * 1


def test_uniform_writes_into_expanded_inputs():
    check(fill_everything, torch.zeros(4).expand(3, 4))
    check(zero_everything, torch.ones(4, 1).expand(4, 5))
    check(fill_a_row, torch.zeros(4).expand(3, 4))


def matrix_rank_into_out(x, o):
    torch.linalg.matrix_rank(x, out=o)  # its composite traces to ops that never write out=
    return o


def test_out_call_that_traces_without_writing_out_runs_eagerly():
    jf = dealias.jit(matrix_rank_into_out)
    args = (torch.randn(4, 4), torch.zeros((), dtype=torch.int64))
    with pytest.warns(dealias.FallbackWarning, match="without writing its out="):
        assert compare_call(matrix_rank_into_out, jf, args) is None
    assert compare_call(matrix_rank_into_out, jf, args) is None


def solve_into_out(a, b, o):
    torch.linalg.solve(a, b, out=o)  # inside: LU and pivots are empty out= tensors the kernel restrides
    return o


def test_internal_out_tensors_take_the_kernels_layout():
    a = torch.randn(5, 5) + 5 * torch.eye(5)
    check(solve_into_out, a, torch.randn(5), torch.zeros(5))


def sum_into_own_row(x):
    torch.sum(x, 0, out=x[1])  # a reduction writing memory it reads: eager's kernel order decides
    return x


def amax_into_itself(v):
    torch.amax(v, 0, keepdim=True, out=v)
    return v


def mm_into_operand(a, x):
    torch.mm(a, x, out=x)
    return x


@pytest.mark.parametrize(
    "fn, make",
    [
        (sum_into_own_row, lambda: (torch.randn(2, 3, 4),)),
        (amax_into_itself, lambda: (torch.randn(1, 2),)),
    ],
    ids=["sum-out-row", "amax-out-self"],
)
def test_non_pointwise_ops_reading_what_they_write_are_eagers(fn, make):
    # Found by the fuzzer once it generated out= and aliased arguments: dealias raised an overlap error eager does
    # not raise, or computed the functional result where eager reads memory it already overwrote. Now eager's
    # kernel runs on a copy of the memory laid out as the caller's (an eager island, ir/island.py).
    check(fn, *make())


def _mm_into_operand_agrees_with_copies() -> bool:
    """Whether this host's mm(out=) computes into a temporary where out is an operand (so its result is the
    product of the operands as they were): the BLAS and the CPU decide (it does on some x86 hosts; on an AMD EPYC
    with AVX-512 and MKL, mm writes out while it still reads it)."""
    a, x = torch.randn(5, 5), torch.randn(5, 5)
    product = a @ x
    torch.mm(a, x, out=x)
    return torch.equal(product, x)


def test_mm_into_its_operand_compiles_as_eagers_kernel_computes_it():
    # Where eager's mm(out=) computes into a temporary, it agrees with copies: the probe says so (once it compared
    # the written argument's copy, not the read one's, for a node given twice) and it compiles. Where this host's
    # kernel reads what it already wrote, the probe sees eager disagree with copies and the graph runs eagerly, with
    # its warning: matching eager either way.
    if _mm_into_operand_agrees_with_copies():
        check(mm_into_operand, torch.randn(5, 5), torch.randn(5, 5), calls=3)
    else:
        jf = dealias.jit(mm_into_operand)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                assert compare_call(mm_into_operand, jf, (torch.randn(5, 5), torch.randn(5, 5))) is None
        said = [str(w.message) for w in caught if isinstance(w.message, dealias.OverlapFallbackWarning)]
        assert said and "aten.mm.out reads memory it writes" in said[0]


def masked_scatter_from_itself(x0, x1):  # fuzz seed 102337: x1 is a view of x0
    x1.masked_scatter_(x1 > 0, x1)  # eager reads source elements it already overwrote
    x0 += x0
    return x1


def test_masked_scatter_from_itself_through_overlapping_inputs():
    # The probe that asks eager whether the aliasing is harmless used one random mask, for which eager happened
    # to agree with copies; several masks of several densities show it does not: the graph runs eagerly.
    b = torch.tensor([0.3, -1.2, 2.0, -0.5, 1.1, 0.7])
    assert compare_call(masked_scatter_from_itself, dealias.jit(masked_scatter_from_itself), (b, b[1:])) is None


def copy_from_an_overlapping_select(x0):  # fuzz seed 100425: tracing failed before eager's own error
    v1 = torch.tensor([1.5, -2.0, 0.25, -2.0, -2.0, 3.0])
    v1.index_copy_(0, torch.tensor([2, 5, 1, 0, 4, 3]), v1.flip(0))
    v1.copy_(v1.select(0, -2))  # eager: "some elements of the input tensor and the written-to tensor ..."
    return x0


def test_eagers_error_when_tracing_fails_too():
    x = torch.randn(6)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        dealias.jit(copy_from_an_overlapping_select)(x)


def rrelu_with_noise_on_an_intermediate(x, noise):
    y = x * 1
    torch.ops.aten.rrelu_with_noise_(y, noise, 0.1, 0.3, True)  # writes y and noise, draws random slopes
    return y, noise


def test_in_place_op_writing_two_arguments_has_a_functional_form():
    # rrelu_with_noise_'s functional form is rrelu_with_noise_functional (not rrelu_with_noise, which writes
    # noise too); the random draws are eager's (the same generator state, the same op).
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        check(rrelu_with_noise_on_an_intermediate, torch.randn(6), torch.empty(6))
        check(lambda x: torch.nn.functional.rrelu(x, training=True, inplace=True), torch.randn(6))


def batch_norm_out_no_stats(x, o1, o2, o3):
    return torch.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5, out=(o1, o2, o3))


def batch_norm_out_with_stats(x, w, b, rm, rv, o1, o2, o3):
    r = torch.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5, out=(o1, o2, o3))
    return r[0] * 2, rm


def batch_norm_legit_out(x, rm, rv, o1, o2, o3):
    out = torch.ops.aten._native_batch_norm_legit.out(
        x, None, None, rm, rv, True, 0.1, 1e-5, out=o1, save_mean=o2, save_invstd=o3
    )
    return out, rm, rv


def batch_norm_out_into_views(x, big):
    torch.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5, out=(big[1], big[2, 0], big[0, 1]))
    return big


def test_mutable_op_with_out_arguments():
    # native_batch_norm.out writes its out= tensors and, unannotated, the running stats; its results are the out=
    # tensors (the schema's alias sets say which). Without running stats it is native_batch_norm.default's out=.
    x = torch.randn(3, 4)
    e = lambda *shape: torch.empty(*shape)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        check(batch_norm_out_no_stats, x, e(3, 4), e(4), e(4))
        check(
            batch_norm_out_with_stats,
            x,
            torch.randn(4),
            torch.randn(4),
            torch.randn(4),
            torch.rand(4),
            e(3, 4),
            e(4),
            e(4),
        )
        check(batch_norm_legit_out, x, torch.randn(4), torch.rand(4), e(3, 4), e(4), e(4))
        check(batch_norm_out_into_views, x, torch.zeros(3, 3, 4))


def constant_written_then_scanned(x0, x1):  # fuzz seed 998800
    v1 = torch.zeros(3, 4)
    v2 = v1.view(-1)
    v2.add_(v2)
    v4 = v2.cumsum(0)
    v2[7] = -2.0  # dynamo lifts -2.0 as a tensor constant, its fake value made in dynamo's own fake mode
    return x0, v1, v4


def test_a_constant_dynamo_lifted_compiles():
    # The constant's fake value came from dynamo's mode: an op on it in dealias's graph raised "Mixing fake modes",
    # and the graph ran eagerly.
    base = torch.randn(2, 3, 4)
    check(constant_written_then_scanned, base, base[0])


def lu_into_given_tensors(a, lu, piv):
    torch.lu(a, out=(lu, piv))  # its composite resizes both outs to their own sizes first (resize_as_)
    return lu, piv


@pytest.mark.filterwarnings("ignore:torch.lu is deprecated")
def test_resize_to_a_tensors_own_size_changes_nothing():
    # `resize_as_` (and `resize_`) to the tensor's own size keeps its strides and its version counter in eager:
    # no view step, no version move. It was refused (out= into lu's tuple ran eagerly).
    jf = check(lu_into_given_tensors, torch.randn(4, 4), torch.empty(4, 4), torch.empty(4, dtype=torch.int32))
    a, lu, piv = torch.randn(4, 4), torch.empty(4, 4).t(), torch.empty(4, dtype=torch.int32)
    before = lu._version
    expected = lu_into_given_tensors(a, lu.clone().t().t(), piv.clone())
    got = jf(a, lu, piv)
    assert got[0] is lu and lu.stride() == (1, 4)
    torch.testing.assert_close(got, expected)
    assert lu._version > before  # (written)
