"""`out=` into a non-contiguous tensor (compat/dynamo_out.py): compiled as the op and a copy where eager's kernel
only fills the strided `out`, left to dynamo's graph break everywhere else, and eager's result either way."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import captured_targets, check, compare_call, fallback_messages, functional_ops

import dealias
from dealias import compat


def add_into_transpose(x, y):
    r = torch.add(x, 1, out=y.t())
    return r, y


def sum_into_column(x, buf):
    torch.sum(x, 1, out=buf[:, 0])
    return buf


def mm_into_strided(a, b, buf):
    r = torch.mm(a, b, out=buf[::2])
    return r * 1, buf


def mul_into_view_then_read_base(x, buf):
    v = buf[:, 1::2]
    torch.mul(x, 2, out=v)
    return buf.sum(), v


def _breaks(fn, *args):
    jf = dealias.jit(fn)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        jf(*args)
    return jf, fallback_messages(record)


@pytest.mark.parametrize(
    "fn, make",
    [
        (add_into_transpose, lambda: (torch.randn(3, 3), torch.zeros(3, 3))),
        (sum_into_column, lambda: (torch.randn(4, 5), torch.full((4, 2), 7.0))),
        (mm_into_strided, lambda: (torch.randn(3, 4), torch.randn(4, 2), torch.full((6, 2), 3.0))),
        (mul_into_view_then_read_base, lambda: (torch.randn(2, 3), torch.ones(2, 6))),
    ],
)
def test_a_strided_out_is_compiled_and_matches_eager(fn, make):
    jf = check(fn, *make(), calls=3)  # (no FallbackWarning: no graph break)
    assert dealias.graph_breaks(jf) == []
    assert "copy_" not in " ".join(functional_ops(jf))


def test_the_result_is_out_itself_as_in_eager():
    y = torch.zeros(3, 3)
    r, _ = dealias.jit(add_into_transpose)(torch.randn(3, 3), y)
    assert r.data_ptr() == y.data_ptr() and r.stride() == (1, 3)


def narrow_into_strided(x, buf):
    torch.narrow_copy(x, 1, 2, 2, out=buf[..., 0])  # eager's kernel writes it contiguously, over buf[..., 1]
    return buf


def test_a_kernel_that_ignores_the_strides_keeps_dynamos_break_and_eagers_result():
    jf = check(narrow_into_strided, torch.randn(5, 6), torch.full((5, 2, 2), 3.0), allow_fallback=True)
    assert dealias.graph_breaks(jf), "eager's narrow_copy(out=) does not honour the strides: no rewrite"


def add_into_overlapping(x):
    torch.add(x, 1, out=x.t())  # eager: partial overlap of input and out, an error
    return x


def add_into_expanded(x, y):
    torch.add(x, 1, out=y.expand(3, 3))  # eager: out repeats its memory, an error
    return y


def add_with_cast(x, y):
    torch.add(x, 1, out=y.t())  # float into int64: eager raises (result type can't be cast)
    return y


def add_with_grad(x, y):
    torch.add(x, 1, out=y.t())  # eager: out= does not support autograd
    return y


def normal_into_strided(m, y):
    torch.normal(m, 1.0, out=y.t())  # random draws: left to dynamo
    return y


@pytest.mark.parametrize(
    "fn, make",
    [
        (add_into_overlapping, lambda: (torch.randn(3, 3),)),
        (add_into_expanded, lambda: (torch.randn(3, 3), torch.zeros(3, 1))),
        (add_with_cast, lambda: (torch.randn(3, 3), torch.zeros(3, 3, dtype=torch.long))),
        (add_with_grad, lambda: (torch.randn(3, 3, requires_grad=True), torch.zeros(3, 3))),
    ],
)
def test_what_eager_refuses_is_still_refused(fn, make):
    with pytest.raises(RuntimeError):
        fn(*make())
    jf = dealias.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError):
            jf(*make())


def test_random_draws_into_a_strided_out_are_left_to_dynamo():
    jf, messages = _breaks(normal_into_strided, torch.zeros(3, 3), torch.zeros(3, 3))
    assert messages and "non-contiguous" in messages[0]


def test_out_of_force_it_is_dynamos_break():
    with compat.forced_off("out_views"):
        jf, messages = _breaks(add_into_transpose, torch.randn(3, 3), torch.zeros(3, 3))
    assert messages and "non-contiguous" in messages[0]


def test_other_backends_still_break():
    targets = captured_targets(add_into_transpose, torch.randn(3, 3), torch.zeros(3, 3))
    assert torch.add not in targets  # dynamo's own graph break at the out= call, as without dealias imported


def clamp_in_place_of_intermediate(x):
    v = x.cumsum(1)
    torch.clamp(v[:, ::2], -1, 1, out=v[:, ::2])  # out is the argument's very elements: eager allows it
    return v


def clamp_in_place_of_input(w):
    torch.clamp(w[:, ::2], -1, 1, out=w[:, ::2])
    return w * 1


@pytest.mark.parametrize("fn", [clamp_in_place_of_intermediate, clamp_in_place_of_input])
def test_an_out_that_is_its_arguments_elements_is_compiled(fn):
    jf = check(fn, torch.randn(4, 6), calls=3)
    assert dealias.graph_breaks(jf) == []


def clamp_from_another(a, b):
    torch.clamp(b[:, ::2], -1, 1, out=a[:, ::2])
    return a


def test_an_out_aliasing_its_argument_through_another_input_is_checked_at_every_call():
    # Traced with b the same memory as a (two inputs): later calls with b apart, and b overlapping a partly, are
    # each eager's (the calls sharing memory run the restored out= call eagerly).
    jf = dealias.jit(clamp_from_another)
    base = torch.randn(4, 8)
    calls = [
        lambda: (lambda t: (t, t.view(4, 8)))(base.clone()),
        lambda: (base.clone(), base.clone() * 2),
        lambda: (lambda t: (t[:, :6], t[:, 1:7]))(base.clone()),  # (one memory, no element in common)
        lambda: (lambda t: (t[:, :6], t[:, 2:8]))(base.clone()),  # (columns 2 and 4 in common: eager's kernel decides)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for make in calls:
            assert compare_call(clamp_from_another, jf, make()) is None


# --- out= tuples into strided views: each out probed, eager's return_types object holding the outs themselves ----


def max_into_columns(x, vb, ib):
    v, i = vb[..., 0], ib[..., 0]
    r = torch.max(x, 1, out=(v, i))
    return r, vb, ib, r.values is v, r[1] is i, type(r).__name__


def cummax_into_transposes(x, ab, bb):
    r = torch.cummax(x, 1, out=(ab.t(), bb.t()))
    return r.values * 1, ab, bb


def frexp_into_strided(x, mb, eb):
    m, e = torch.frexp(x, out=(mb[::2], eb[:, 1]))
    return m.sum(), e, mb, eb


@pytest.mark.parametrize(
    "fn, make",
    [
        (max_into_columns, lambda: (torch.randn(3, 4), torch.full((3, 2), 3.0), torch.full((3, 2), 3))),
        (cummax_into_transposes, lambda: (torch.randn(3, 4), torch.full((4, 3), 3.0), torch.full((4, 3), 3))),
        (
            frexp_into_strided,
            lambda: (torch.randn(3, 4), torch.full((6, 4), 3.0), torch.full((3, 2, 4), 3, dtype=torch.int32)),
        ),
    ],
)
def test_an_out_tuple_into_strided_views_is_compiled_and_matches_eager(fn, make):
    jf = check(fn, *make(), calls=3)  # (no FallbackWarning: no graph break)
    assert dealias.graph_breaks(jf) == []


def test_an_out_tuple_call_returns_eagers_structseq_of_the_outs():
    x, vb, ib = torch.randn(3, 4), torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.long)
    jf = dealias.jit(max_into_columns)
    for _ in range(2):  # first and cached call
        r, _, _, values_is_v, indices_is_i, kind = jf(x, vb, ib)
        assert (values_is_v, indices_is_i, kind) == (True, True, "max_out")
        assert type(r) is torch.return_types.max_out
        assert r.values.data_ptr() == vb.data_ptr() and r.indices.stride() == (2,)


def test_out_of_force_an_out_tuple_is_dynamos_break():
    with compat.forced_off("out_views"):
        jf, messages = _breaks(
            max_into_columns, torch.randn(3, 4), torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.long)
        )
    assert messages and "non-contiguous" in messages[0]


def max_into_shared(x, b):
    torch.max(x, 1, out=(b[:, 0], b.view(torch.int64)[:, 1]))  # (float values and int64 indices, one memory)
    return b


def test_an_out_tuple_whose_outs_share_memory_is_left_to_dynamo():
    b = torch.zeros(3, 2, dtype=torch.float64)
    jf, messages = _breaks(max_into_shared, torch.randn(3, 4, dtype=torch.float64), b)
    assert messages and "non-contiguous" in messages[0]
    assert (
        compare_call(
            max_into_shared, jf, (torch.randn(3, 4, dtype=torch.float64), torch.zeros(3, 2, dtype=torch.float64))
        )
        is None
    )


# --- inputs sharing memory as at the traced call: the compiled program, not the eager one ------------------------


def test_inputs_sharing_memory_as_at_the_traced_call_run_the_compiled_program():
    # Traced with b the very memory of a: a later call shaped alike (and one moved elsewhere in memory) runs the
    # compiled program; eager's values either way.
    jf = dealias.jit(clamp_from_another)
    base = torch.randn(4, 8)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for pad in (0, 0, 3):
            t = torch.cat([torch.zeros(pad), base.clone().view(-1)])[pad:].view(4, 8)
            assert compare_call(clamp_from_another, jf, (t, t.view(4, 8))) is None
    assert fallback_messages(record) == []
    assert dealias.cache_info(jf).misses == 1


def cat_into_strided(a, b, ob):
    torch.cat([a, b], 0, out=ob[..., 0])  # a list of tensors among the arguments
    return ob


def where_into_transpose(c, a, b, ob):
    torch.where(c, a, b, out=ob.t())  # a bool mask among the arguments: random masks are valid ones
    return ob


@pytest.mark.parametrize(
    "fn, make",
    [
        (cat_into_strided, lambda: (torch.randn(2, 3), torch.randn(1, 3), torch.zeros(3, 3, 2))),
        (
            where_into_transpose,
            lambda: (torch.randn(3, 3) > 0, torch.randn(3, 3), torch.randn(3, 3), torch.zeros(3, 3)),
        ),
    ],
)
def test_list_and_mask_arguments_are_probed_too(fn, make):
    jf = check(fn, *make(), calls=3)
    assert dealias.graph_breaks(jf) == []


def randn_into_every_other(ob):
    r = torch.randn(3, 4, out=ob[..., 0])  # eager's kernel draws these in the result's order: compiled
    return r, ob, torch.rand(2)  # (and leaves the generator where the functional draw leaves it)


def randn_large_into_every_other(ob):
    torch.randn(30, 40, out=ob[..., 0])  # another algorithm for a strided out of this size: eager's break
    return ob, torch.rand(2)


def test_random_draws_into_a_strided_out_that_eager_draws_alike_are_compiled():
    jf = check(randn_into_every_other, torch.zeros(3, 4, 2), calls=3)
    assert dealias.graph_breaks(jf) == []
    jf = check(randn_large_into_every_other, torch.zeros(30, 40, 2), allow_fallback=True)
    assert dealias.graph_breaks(jf)


def neg_into_neighbouring_column(x):
    torch.neg(x[:, 0], out=x[:, 1])  # one memory, no element in common
    return x


def maximum_into_every_other(x, y):
    torch.maximum(x[1::2], y, out=x[::2])  # reads the odd elements, writes the even ones of one memory
    return x


@pytest.mark.parametrize(
    "fn, make",
    [
        (neg_into_neighbouring_column, lambda: (torch.randn(4, 3),)),
        (maximum_into_every_other, lambda: (torch.randn(6), torch.randn(3))),
    ],
)
def test_an_out_sharing_memory_with_an_argument_is_probed_on_memory_shared_alike(fn, make):
    jf = check(fn, *make(), calls=3)
    assert dealias.graph_breaks(jf) == []


# An `out=` whose kernel reads what it already wrote runs as an eager island: tests/test_out_islands.py.


def kron_into_strided(a, b, buf):
    r = torch.kron(a, b, out=buf[..., 0])  # eager fills it, but leaves buf's version counter where it was
    return r, buf


def test_an_out_kernel_that_moves_no_version_counter_keeps_dynamos_break():
    # (the rewrite's copy would move it: OpInfo sweep, kron's second sample)
    jf = check(kron_into_strided, torch.randn(2, 2), torch.randn(2, 3), torch.full((4, 6, 2), 3.0), allow_fallback=True)
    assert dealias.graph_breaks(jf), "eager's kron(out=) moves no version counter: no rewrite"


def eig_into(o0, o1, a):
    r = torch.linalg.eig(a, out=(o0, o1))
    return r, o0, o1


def triangular_solve_into(o0, o1, b, a):
    r = torch.triangular_solve(b, a, out=(o0, o1))
    return r, o0, o1


@pytest.mark.parametrize(
    "fn, make",
    [
        (
            eig_into,
            lambda: (
                torch.full((0, 5), 3, dtype=torch.complex64),
                torch.full((0, 5, 5), 3, dtype=torch.complex64),
                torch.randn(0, 5, 5),
            ),
        ),
        (
            triangular_solve_into,
            lambda: (torch.zeros(0, 5, 1), torch.zeros(0, 5, 5), torch.randn(0, 5, 1), torch.randn(0, 5, 5)),
        ),
    ],
)
def test_out_tensors_of_no_elements_are_laid_out_as_eagers(fn, make):
    # Over an empty batch eager's kernels re-stride the outs column-major, the fake kernels do not (aot_eager returns
    # the given strides): compare_call checks the outs' strides
    check(fn, *make(), allow_fallback=True)


def sum_into_column_of(ob, x):
    return torch.sum(x, 1, out=ob[..., 0]), ob


def test_a_strided_out_of_symbolic_strides_is_left_to_dynamo():
    # ob's last size changes: dynamo makes it symbolic, and out's strides with it. The probe's verdicts are keyed by
    # layouts: hashing a symbolic stride raised inside dynamo (OpInfo sweep, multinomial's samples through one
    # shared frame), and the whole frame ran eagerly; now that call keeps dynamo's own break
    jf = dealias.jit(sum_into_column_of)
    for k in (2, 3, 4):
        x = torch.randn(3, 5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.GraphBreakWarning)
            diff = compare_call(sum_into_column_of, jf, (torch.zeros(3, k), x))
        assert diff is None, (k, diff)
    info = dealias.cache_info(jf)
    assert info.eager_entries == 0, info


def linspace_into_empty(a, b, o):
    return torch.linspace(a, b, 0, out=o), o


def test_an_out_of_no_elements_laid_out_as_eager_compiles():
    # (eager's kernel is asked on zeros of the call's layouts: small arguments that are not empty are fine)
    jf = check(linspace_into_empty, torch.tensor(0.0), torch.tensor(1.0), torch.zeros(0))
    assert dealias.cache_info(jf).eager_entries == 0
