"""Exactness against eager on the classes of bugs an OpInfo sweep and PyTorch's own mutation tests found
(issue 13): each test is one root cause, run on a first and on cached calls."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import check, clone_args, grads_like_eager

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


def test_mm_into_its_operand_compiles_as_eagers_kernel_computes_it():
    # Eager's mm(out=) computes into a temporary where out is an operand, so it agrees with copies: the probe says
    # so (once it compared the written argument's copy, not the read one's, for a node given twice) and it compiles.
    check(mm_into_operand, torch.randn(5, 5), torch.randn(5, 5), calls=3)


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


def write_through_unsafe_chunk(x):
    a, b = x.unsafe_chunk(2)
    a.mul_(2)  # the input's memory: eager's unsafe_chunk elements share it, without being autograd views
    return x + 1, b * 3


def return_unsafe_elements(x):
    y = x * 1
    a, b = y.unsafe_split_with_sizes([1, 3])
    b.add_(1)
    c, d = x.unsafe_split(2)
    with torch.no_grad():
        e = c.t()  # a view made under no_grad of an element: its base is the element, not x
    return y, a, b, d.t(), e


def whole_unsafe_chunk_of_a_slice(x0, x1):  # fuzz seed 983778
    v1 = x1.narrow(0, 0, 1)
    return v1.unsafe_chunk(2, 0)[0]  # one chunk: the same slice again, not a view in eager (its _base is None)


def test_unsafe_element_equal_to_an_earlier_step_is_rebuilt_at_its_own_step():
    # The element's step was looked up in the output's chain by equality, and the narrow's equal slice came first:
    # unsafe_split was replayed there and the element's own slice after it, which returned a view.
    base = torch.randn(4, 6)
    jf = check(whole_unsafe_chunk_of_a_slice, base, base.t())
    out = jf(base, base.t())
    assert out._base is None and out.data_ptr() == base.data_ptr()


@pytest.mark.parametrize("fn", [write_through_unsafe_chunk, return_unsafe_elements])
def test_unsafe_split_elements_share_their_inputs_memory(fn):
    jf = check(fn, torch.randn(4, 3))  # (alias analysis refused these before: the schema declares no alias)
    if fn is return_unsafe_elements:
        y, a, b, dt, e = jf(torch.randn(4, 3))
        assert not a._is_view() and not b._is_view() and dt._base is not None  # eager's elements are not views
        assert e._base is not None and not e._base._is_view()
        assert a.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()


def self_copy_of_unsafe_element(x0):  # fuzz seed 996505: x.copy_(x) writes nothing but is recorded on the element
    v4 = (x0 * 2).t().squeeze()
    v6 = v4.unsafe_chunk(2, 0)[0]
    v6.copy_(v6)
    return (v4.sin(),)


# (relu_after_unsafe_chunk compiles since the element, only returned, is given its history at the split:
# test_unsafe_split_views.py)
@pytest.mark.parametrize("fn", [write_through_unsafe_chunk, self_copy_of_unsafe_element])
def test_unsafe_split_of_a_tensor_that_requires_grad_then_written_runs_eagerly(fn):
    # Eager's autograd does not see a write through an element as a write of the input: not compiled yet.
    jf = dealias.jit(fn)
    x = torch.randn(4, 4, requires_grad=True) * 1
    with pytest.warns(dealias.FallbackWarning, match="unsafe_split from a tensor that requires grad|saves a tensor"):
        assert compare_call(fn, jf, (x,)) is None
    check(fn, torch.randn(4, 4, requires_grad=True) * 1, allow_fallback=True)


def unsafe_elements_read(x):
    y = x * 1
    p, q = y.unsafe_split(2, 0)
    return p.sin() + q, p, q.t(), x.unsafe_chunk(2, 1)[1]


def unsafe_split_under_no_grad(x):
    with torch.no_grad():
        p, q = x.unsafe_split(2, 0)  # eager's elements do not require grad (they are not views of x)
    return p * 2, q


def test_unsafe_split_of_a_tensor_that_requires_grad_compiles_when_nothing_writes_it():
    # Each element's gradient reaches the input as through split's views; a returned one is rebuilt by
    # unsafe_split itself, a tensor of its own with eager's grad_fn (fuzz seeds 996039, 990053).
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        jf = check(unsafe_elements_read, torch.randn(4, 3, requires_grad=True) * 1)
    s, p, qt, c = jf(torch.randn(4, 3, requires_grad=True) * 1)
    assert not p._is_view() and type(p.grad_fn).__name__.startswith("UnsafeSplit")
    assert not c._is_view() and type(c.grad_fn).__name__.startswith("UnsafeSplit")
    with pytest.warns(dealias.FallbackWarning, match="under no_grad"):
        dealias.jit(unsafe_split_under_no_grad)(torch.randn(4, 3, requires_grad=True) * 1)
    check(unsafe_split_under_no_grad, torch.randn(4, 3, requires_grad=True) * 1, allow_fallback=True)


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


def unsafe_element_of_input_unsqueezed(x):
    a, b = x.unsafe_split(2)
    a.unsqueeze_(0)
    return a, b


def unsafe_element_of_intermediate_transposed(x):
    a, b = (x * 2).unsafe_split(2)
    a.t_()
    return a, b[0]


@pytest.mark.parametrize("fn", [unsafe_element_of_input_unsqueezed, unsafe_element_of_intermediate_transposed])
@pytest.mark.parametrize("grad", [False, True])
def test_unsafe_split_element_restrided_in_place_is_no_view(fn, grad):
    # Review finding: eager's element is a tensor of its own, its metadata changed in place; dealias returned a
    # view of the input. It is rebuilt by unsafe_split, then re-strided.
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        check(fn, torch.randn(4, 3, requires_grad=grad) * 1)


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


def two_results_of_one_unsafe_element(x0):  # fuzz seed 987725, shrunk
    v3 = x0.unsafe_chunk(2, 0)[0]
    v5 = v3.movedim(0, -1)
    return v3, v5  # eager: v5._base is v3, an element of its own (with its own version counter)


def test_two_results_of_one_unsafe_element_run_eagerly():
    # Each was rebuilt by an unsafe_split of its own: v5 became a view of another element than the v3 returned,
    # so a later write of v3 (x.copy_(x) in the fuzz program) left v5's views unaware of it.
    x = torch.randn(6, requires_grad=True) * 1
    jf = dealias.jit(two_results_of_one_unsafe_element)
    with pytest.warns(dealias.FallbackWarning, match="two results are views of one unsafe_split element"):
        v3, v5 = jf(x)
    assert v5._base is v3
    # Without autograd too: eager's v5 is a view of the v3 returned (its `_base`, its counter, requires_grad through
    # it once the caller calls v3.requires_grad_()); see test_unsafe_split_views.py
    jf = dealias.jit(two_results_of_one_unsafe_element)
    with pytest.warns(dealias.FallbackWarning, match="two results are views of one unsafe_split element"):
        v3, v5 = jf(torch.randn(6))
    assert v5._base is v3
    check(two_results_of_one_unsafe_element, torch.randn(6), allow_fallback=True)


def split_of_an_unsafe_element(x):  # fuzz seed 988806, shrunk
    return x.unsafe_chunk(2, 2)[0].split(2, 1)[0]


def test_split_of_an_unsafe_element_is_no_view_of_the_input():
    # Rebuilt with the split replayed as made but the element as a slice of x, the result shared x's version
    # counter: a write of x after the call made reading its grad_fn raise, where eager's (a view of an element
    # with a counter of its own) does not. It runs eagerly now.
    for fn in (split_of_an_unsafe_element, dealias.jit(split_of_an_unsafe_element)):
        x = torch.randn(3, 4, 2, requires_grad=True) * 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            v = fn(x)
        with torch.no_grad():
            x.fill_(3.0)
        assert v.grad_fn is not None


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


# --- the bullets of issue 13 an audit found without a test of their own ---------------------------------------


def resize_storage_then_copy(x, y):
    torch.ops.inductor.resize_storage_bytes_(x, 32)
    x.copy_(y)
    return x


def test_a_resized_empty_storage_is_written_as_eager_writes_it():
    # The execution graph dropped the resize and the copy wrote into the 0-byte storage: a segfault.
    def make():
        x = torch.zeros(8)
        x.untyped_storage().resize_(0)
        return x, torch.ones(8)

    jf = dealias.jit(resize_storage_then_copy)
    for _ in range(2):
        x, y = make()
        assert torch.equal(jf(x, y), torch.ones(8)) and x.untyped_storage().nbytes() == 32


def linear_into_a_column(x, w, b, ob):
    torch._C._nn.linear(x, w, b, out=ob[:, 0])  # eager resizes the strided out= to a contiguous (4,)
    return ob


def test_linear_into_a_strided_out_is_eagers():
    check(
        linear_into_a_column, torch.randn(3), torch.randn(4, 3), torch.randn(4), torch.zeros(4, 2), allow_fallback=True
    )


def observe_into_own_elements(x):
    # running_min and running_max are elements of the input the op also quantizes
    flag = torch.tensor([1])
    scale, zero = torch.tensor([0.1]), torch.tensor([0], dtype=torch.int32)
    return torch.ops.aten._fused_moving_avg_obs_fq_helper(x, flag, flag, x[0], x[1], scale, zero, 0.01, 0, 255, 0)


def observe_scale_into_input(x, scale):
    flag = torch.tensor([1])
    zero = torch.tensor([0], dtype=torch.int32)
    lo, hi = torch.tensor(-1.0), torch.tensor(1.0)
    return torch.ops.aten._fused_moving_avg_obs_fq_helper(x, flag, flag, lo, hi, scale, zero, 0.01, 0, 255, 0)


def test_a_mutable_op_whose_written_argument_aliases_a_read_one_runs_eagerly():
    # Eager's kernel updates the running statistics, then quantizes x with them: with x[0] as running_min the
    # functional form (which reads x before any write) returned other values; the probe's zero-filled integer
    # flags turned the observer off, so it found the aliasing harmless.
    for fn, make in [
        (observe_into_own_elements, lambda: (torch.randn(5),)),
        (observe_scale_into_input, lambda: (lambda x: (x, x[2:3]))(torch.randn(5))),
    ]:
        jf = dealias.jit(fn)
        with pytest.warns(dealias.OverlapFallbackWarning, match="reads memory it writes"):
            for _ in range(2):
                assert compare_call(fn, jf, make()) is None


def max_into_own_first_element(x):
    v = x[:2]
    torch.amax(v, 0, keepdim=True, out=v[:1])
    return v


def test_a_reduction_into_its_own_input_is_eagers_whatever_the_values():
    # Eager's amax.out starts from its identity in v[0], then reads v[0] too: on copies v[0] takes part. The probe
    # on random values agreed whenever v[0] was not the largest (fuzz seed 931112: 1.82 off on the 1 in 16 fills
    # where all four did); values falling through memory show it. It runs as an eager island (ir/island.py).
    for values in ([5.0, 1.0, 3.0], [1.0, 5.0, 3.0]):
        check(max_into_own_first_element, torch.tensor(values))


def read_out_of_range_unused(x, i):
    x.add_(1)
    x[i]  # unused, but eager raises IndexError
    return x


def test_an_unused_read_out_of_range_raises_as_eager():
    for i in (9, torch.tensor(9), 2, torch.tensor(2)):
        check(read_out_of_range_unused, torch.zeros(4), i, allow_fallback=True)


def message_of_the_input(x):
    raise ValueError(f"{x}")


def test_a_users_exception_shows_the_real_tensor():
    jf = dealias.jit(message_of_the_input)
    with pytest.raises(ValueError) as eager:
        message_of_the_input(torch.ones(2))
    with pytest.raises(ValueError) as got:
        jf(torch.ones(2))
    assert str(got.value) == str(eager.value) and "Fake" not in str(got.value)


@pytest.mark.parametrize(
    "write",
    [
        lambda x, p: x.index_copy_(0, p, x),
        lambda x, p: x.index_reduce_(0, p, x, "prod"),
        lambda x, p: x.scatter_add_(0, p, x),
        lambda x, p: x.scatter_reduce_(0, p, x, "sum"),
        lambda x, p: x.put_(p, x),
        lambda x, p: torch.cross(x.view(1, 3), x.view(1, 3).flip(1), dim=1, out=x.view(1, 3)),
    ],
    ids=["index_copy_", "index_reduce_", "scatter_add_", "scatter_reduce_", "put_", "cross-out"],
)
def test_a_source_that_is_the_written_tensor_is_eagers_error(write):
    def fn(x, p):
        write(x, p)
        return x * 2

    check(fn, torch.randn(3), torch.tensor([1, 0, 2]), allow_fallback=True)


def scatter_add_out_of_range(x):
    x.scatter_add_(0, torch.tensor([7]), torch.ones(1))
    return x


def add_needing_a_resize(x, other):
    x.add_(other)  # the result's broadcast shape (0, 10, 3) is not x's: eager raises
    return x


def test_errors_of_scatter_add_and_of_a_broadcast_in_place_op_are_eagers():
    with pytest.raises(RuntimeError):
        scatter_add_out_of_range(torch.zeros(4))
    check(scatter_add_out_of_range, torch.zeros(4))
    check(add_needing_a_resize, torch.zeros(0, 1, 3), torch.zeros(0, 10, 3))


@pytest.mark.parametrize(
    "write",
    [
        lambda x: x.fill_(2.0),
        lambda x: x.scatter_(0, torch.tensor(0), 2.0),
        lambda x: x.scatter_add_(0, torch.tensor(0), torch.tensor(3.0)),
        lambda x: x.scatter_reduce_(0, torch.tensor(0), torch.tensor(3.0), "prod"),
        lambda x: x.addbmm_(torch.ones(2, 1, 3), torch.ones(2, 3, 1)),
    ],
    ids=["fill_", "scatter_", "scatter_add_", "scatter_reduce_", "addbmm_"],
)
def test_writes_of_a_zero_dim_tensor_compile(write):
    # Tracing them crashed ("tuple index out of range") and they ran eagerly.
    def fn(x):
        write(x)
        return x * 2

    check(fn, torch.tensor(1.0))


def draw_integers(x):
    x.random_(0, 5)
    return x + 1, torch.empty(8).random_(0, 5)


def test_random_integers_in_place_are_eagers():
    # dynamo breaks the graph at Tensor.random_ (it runs eagerly, with eager's generator)
    check(draw_integers, torch.zeros(8), allow_fallback=True)


def test_a_gru_compiles(monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "allow_rnn", True)  # (dynamo breaks the graph at an RNN without it)
    torch.manual_seed(0)
    gru = torch.nn.GRU(4, 8)

    def step(x):
        return gru(x)[0]

    with torch.no_grad():
        check(step, torch.randn(5, 1, 4))
    jf = dealias.jit(step)
    x = torch.randn(5, 1, 4)
    step(x).sum().backward()
    expected = [p.grad.clone() for p in gru.parameters()]
    gru.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dealias.FallbackWarning)
        jf(x).sum().backward()
    for p, e in zip(gru.parameters(), expected):
        torch.testing.assert_close(p.grad, e, rtol=0, atol=0)


def scale_by_next(x, a, it):
    return x + torch.from_numpy(a) * next(it)


def test_verify_takes_numpy_arrays_and_iterators():
    # verify's eager run takes its own copies of tensors, not of other arguments: an iterator must advance once.
    import numpy as np

    jf = dealias.jit(scale_by_next, verify=True)
    it = iter([2.0, 3.0, 4.0])
    got = jf(torch.ones(3), np.ones(3, dtype=np.float32), it)
    assert torch.equal(got, torch.full((3,), 3.0)) and next(it) == 3.0


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.mul_(1.5),
        lambda t: t.mul_(torch.tensor(2.5)),
        lambda t: t.addcmul_(t, torch.tensor(2.5)),
        lambda t: t.lerp_(t, torch.tensor(2.5)),
    ],
)
def test_in_place_result_of_a_wider_kind_raises_eagers_error_and_writes_nothing(op):
    # int.mul_(2.5): eager refuses to cast the float result into the int tensor; fake tensors do not check it for
    # these ops, and dealias cast it down and wrote the truncated value (found in review of real code).
    def f(t):
        op(t)
        return t

    jf = dealias.jit(f)
    for make in (lambda: torch.ones(3, dtype=torch.int32), lambda: torch.ones(3, dtype=torch.bool)):
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type") as raised:
            f(make())
        t = make()
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
            jf(t)
        assert torch.equal(t, make()), raised


def zero_a_complex_view(x):
    torch.view_as_complex(x).zero_()
    return (x * 3,)


def test_zero_of_a_complex_view_under_autograd():
    # zero_'s functional form aten.zero has no derivative for complex results ("zero does not support automatic
    # differentiation for outputs with complex dtype") where eager's zero_ has: fill is emitted (fuzz seed 1930400).
    assert (
        grads_like_eager(
            zero_a_complex_view, dealias.jit(zero_a_complex_view), lambda: (torch.randn(3, 2, requires_grad=True) * 1,)
        )
        == []
    )


def zero_a_slice_of_a_complex_view(x):
    v = torch.view_as_complex(x).narrow(0, 2, 1)
    v.zero_()
    torch.view_as_complex(x)[0].mul_(2j)
    return (v, x * 3)


def test_write_of_a_slice_of_a_complex_view_under_autograd():
    # slice_scatter and select_scatter have no derivative for complex results where eager's write of a complex
    # slice has (CopySlices): dealias raised at the call (fuzz seed 2400360).
    fn = zero_a_slice_of_a_complex_view
    make = lambda: (torch.randn(3, 4, 2, requires_grad=True) * 1,)  # noqa: E731
    assert grads_like_eager(fn, dealias.jit(fn, executor="torch"), make) == []


REDUCTIONS_INTO = {
    "sum": lambda x, o: torch.sum(x, 1, out=o),
    "prod": lambda x, o: torch.prod(x, 1, out=o),
    "mean": lambda x, o: torch.mean(x, 1, out=o),
    "nansum": lambda x, o: torch.nansum(x, 1, out=o),
    "cumsum": lambda x, o: torch.cumsum(x, 1, out=o),
    "cumprod": lambda x, o: torch.cumprod(x, 1, out=o),
    "std": lambda x, o: torch.std(x, 1, out=o),
    "var": lambda x, o: torch.var(x, 1, correction=0, out=o),
    "amax": lambda x, o: torch.amax(x, 1, out=o),  # (raises: "Expected the dtype for input and out to match")
    "index_select": lambda x, o: torch.index_select(x, 1, torch.tensor([3, 1]), out=o),  # (raises)
    "sum_all": lambda x, o: torch.ops.aten.sum.out(x, out=o),  # (raises: the out= dtype must be the input's)
    "vector_norm": lambda x, o: torch.linalg.vector_norm(x, 2, dim=1, out=o),  # (raises too)
}


@pytest.mark.parametrize("name", list(REDUCTIONS_INTO))
@pytest.mark.parametrize(
    "dtypes", [(torch.float16, torch.float32), (torch.float32, torch.int64), (torch.float32, torch.float64)]
)
def test_reductions_into_an_out_of_another_dtype(name, dtypes):
    # Eager computes these in the out= tensor's dtype (opfacts.COMPUTES_IN_OUT_DTYPE): a float16 sum into float32
    # sums in float32, a float sum into int64 casts 1.7 to 1 first; mean into int64 raises eager's cast error; others
    # raise eager's own error for any other dtype.
    fn = REDUCTIONS_INTO[name]
    x = (torch.arange(300) % 7 * 0.1 + 1.7).reshape(3, 100).to(dtypes[0])
    shape = fn(x, torch.empty(0, dtype=x.dtype)).shape  # (an out= of the result's shape: eager resizes no other)
    check(lambda x, o: (fn(x, o), o)[1], x, torch.zeros(shape, dtype=dtypes[1]))
