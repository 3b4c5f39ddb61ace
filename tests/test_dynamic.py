"""Programs called with changing positions, offsets and sizes (issue 11): compiled a bounded number of times,
every call equal to eager (outputs, every mutated input, aliasing)."""

from __future__ import annotations

import copy
import random
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import dealias
from dealias.runtime.verify import compare_call


def run_calls(fn: Callable[..., Any], calls: list[tuple[Any, ...]], **jit_kw: Any) -> dealias.CacheInfo:
    """Call `fn` eagerly and jitted with each argument tuple of `calls` (fresh copies for each side, so memory
    shared between arguments stays shared); fail at the first difference or fallback warning."""
    jf = dealias.jit(fn, **jit_kw)
    for k, args in enumerate(calls):
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            diff = compare_call(fn, jf, args)
        assert diff is None, f"call {k + 1}: {diff}"
    return dealias.cache_info(jf)


def add_row(x):
    x.add_(1)
    return x * 2


def test_rows_of_one_buffer_compile_once():
    buf = torch.randn(40, 3)
    info = run_calls(add_row, [(buf[i],) for i in range(40)])
    assert info.misses == 1 and info.entries == 1, info


def test_rows_write_their_own_row():
    buf = torch.zeros(6, 3)
    jf = dealias.jit(add_row)
    for i in range(6):
        jf(buf[i])
        jf(buf[i])
    assert torch.equal(buf, torch.full((6, 3), 2.0))
    assert dealias.cache_info(jf).misses == 1


def add_other(a, b):
    a.add_(b)
    return a + b


def test_rows_of_one_buffer_disjoint_and_overlapping():
    buf = torch.randn(8, 4)
    pairs = [(0, 3), (5, 1), (2, 2), (7, 6), (4, 4), (1, 0)]
    info = run_calls(add_other, [(buf[i], buf[j]) for i, j in pairs])
    assert info.entries == 2, info  # disjoint rows, and the same row twice


def scale_then_read(a, b):
    a.mul_(2)
    return b + 1


def test_partly_overlapping_windows_specialize_on_their_distance():
    # a and b overlap partly; the distance between them decides what a's write does to b: guarded exactly.
    flat = torch.randn(32)
    calls = [(flat[i : i + 6], flat[i + d : i + d + 6]) for i, d in [(0, 2), (5, 2), (9, 3), (1, 3), (4, 7)]]
    info = run_calls(scale_then_read, calls)
    assert info.entries == 3, info  # distance 2, 3 and 7 (disjoint)


def strided_window(x):
    y = x.as_strided((2,), (1,), 5)  # an absolute storage offset: the program depends on where x sits
    y.mul_(2)
    return x + 1


def test_absolute_offsets_stay_keyed():
    flat = torch.randn(16)
    info = run_calls(strided_window, [(flat[i : i + 8],) for i in (0, 1, 2)])
    assert info.entries == 3, info


def window_at_its_own_offset(x):
    v = x[1]
    return v.as_strided((3,), (1,), v.storage_offset())


@pytest.mark.parametrize("dynamic", [None, True])
def test_storage_offset_of_an_input_is_read_at_each_call(dynamic):
    # With dynamic shapes dynamo computes v.storage_offset() from x's offset at the first call (0) without a guard,
    # with every backend (fuzz seeds 1290232, 1320641): dealias's compiles break the graph there, as static ones do.
    flat = torch.randn(40)
    jf = dealias.jit(window_at_its_own_offset, dynamic=dynamic)
    for off in (0, 0, 5, 7):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            diff = compare_call(window_at_its_own_offset, jf, (flat[off : off + 12].view(4, 3),))
        assert diff is None, f"offset {off}: {diff}"
        falls = [w for w in caught if issubclass(w.category, dealias.FallbackWarning)]
        assert all("storage_offset()" in str(w.message) for w in falls), falls  # (a graph break: nothing else)


def offset_of_a_row(x):
    v = x[1:]
    return v.storage_offset(), v * 2


def test_storage_offset_over_dynamic_sizes_compiles_with_the_inputs_offsets_guarded():
    # Inputs at one placement (their offsets guarded, static): v.storage_offset() is dynamo's expression of the
    # sizes, right for each call, one compile for all sizes; another placement compiles again (or breaks there,
    # where dynamo then makes the input's offset a symbol of its own), eager's values either way.
    jf = dealias.jit(offset_of_a_row, dynamic=True)
    flat = torch.randn(60)
    for rows, cols in ((4, 3), (5, 3), (5, 4)):
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            assert compare_call(offset_of_a_row, jf, (flat[: rows * cols].view(rows, cols),)) is None
    assert dealias.cache_info(jf).misses == 1 and dealias.graph_breaks(jf) == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dealias.FallbackWarning)
        for off in (5, 7):
            assert compare_call(offset_of_a_row, jf, (flat[off : off + 12].view(4, 3),)) is None


def pad_then_unify(x, y):
    p = torch.nn.functional.pad(x, (0, 1), value=-1.0)  # x's length is a symbol of its own here
    return p[:, 1:] * (x + y)  # and is unified with y's after


def test_choosing_tensor_methods_leaves_the_programs_symbols_alone():
    # The torch executor chooses a Tensor method for an aten call by running it on the capture's fake values; the
    # pad's C++ kernel read concrete sizes (a fake-tensor cache miss, as the symbols were unified after the
    # capture ran it), which pinned the length symbols to the compiling call's values and emptied the program's
    # shape guard to `True` (inductor, compiling over the same ShapeEnv, then assumed that length).
    jf = dealias.jit(pad_then_unify, dynamic=True)
    for n in (8, 12, 5, 3):
        x, y = torch.randn(2, n), torch.randn(2, n)
        assert torch.equal(jf(x, y), pad_then_unify(x, y))
    guard = jf.last.shape_guard.text
    assert "y.size()[1] == x.size()[1]" in guard and "2 <= x.size()[1]" in guard, guard
    assert dealias.cache_info(jf).misses == 1


# --- Python ints that change every call: positions, step counts ------------------------------------------------


def decode_write(cache, k, pos):
    cache.select(2, pos).copy_(k)  # one token's slot
    cache.narrow(2, pos, 1).mul_(0.5)
    return cache[:, :, : pos + 1].sum(2)


def test_decode_position_compiles_at_most_twice():
    cache = torch.randn(2, 3, 40, 4)
    k = torch.randn(2, 3, 4)
    info = run_calls(decode_write, [(cache, k, pos) for pos in range(39)])
    assert info.misses <= 2, info
    assert info.dynamic == ("pos",), info
    # At the last position the slice read is the whole buffer, a contiguous tensor: torch's shape functions
    # guard on that, and it is one more program.
    info = run_calls(decode_write, [(cache, k, pos) for pos in (0, 5, 39, 38, 39)])
    assert info.misses <= 3, info


def index_copy_at_a_tensor_of_the_position(cache, k, pos):
    # dynamo builds `torch.tensor([pos])` of a symbolic pos with `detach_()` of the fresh tensor (a no-op)
    cache.index_copy_(1, torch.tensor([pos]), k)
    return cache


def test_a_tensor_of_a_symbolic_position_compiles_at_most_twice():
    cache = torch.zeros(2, 6, 3)
    info = run_calls(index_copy_at_a_tensor_of_the_position, [(cache, torch.randn(2, 1, 3), p) for p in range(6)])
    assert info.misses <= 2 and info.eager_entries == 0, info
    assert info.dynamic == ("pos",), info


def test_symbolic_position_stays_a_region_write():
    jf = dealias.jit(decode_write)
    cache, k = torch.zeros(2, 3, 40, 4), torch.ones(2, 3, 4)
    for pos in range(5):
        jf(cache, k, pos)
    (report,) = dealias.explain(jf)
    assert report.mode == "in place" and report.nbytes == 2 * 3 * 4 * 4 * 2, report  # the slot, written twice
    assert "pos" in " ".join(report.regions), report
    execution = dealias.last_traces(jf)[-1].text
    assert "cache[:, :, pos] = k" in execution and "cache.copy_" not in execution, execution
    assert "float32[2, 3, pos + 1, 4]" in execution, execution  # symbolic sizes shown by the input's name


def test_position_out_of_range_raises_eagers_error():
    jf = dealias.jit(decode_write)
    cache, k = torch.zeros(2, 3, 8, 4), torch.ones(2, 3, 4)
    for pos in range(4):
        jf(cache, k, pos)
    before = cache.clone()
    with pytest.raises(IndexError):
        decode_write(cache.clone(), k, 9)
    with pytest.raises(IndexError):
        jf(cache, k, 9)
    assert torch.equal(cache, before)


class Counter:
    def __init__(self, cache):
        self.cache = cache
        self.length = 0

    def append(self, row):
        self.cache[self.length] = row  # integer indexing: dynamo specializes it
        self.cache.narrow(0, self.length, 1).add_(1)
        self.length += 1
        return self.length


def test_int_attribute_of_a_cache_object_stays_a_plain_int():
    obj, ref = Counter(torch.zeros(12, 3)), Counter(torch.zeros(12, 3))
    jf = dealias.jit(obj.append)
    for _ in range(12):
        row = torch.randn(3)
        got, want = jf(row), ref.append(row)
        assert type(got) is int and got == want
        assert type(obj.length) is int and obj.length == ref.length
    assert torch.equal(obj.cache, ref.cache)


class KCache:
    def __init__(self, k):
        self.k = k


def cache_object_step(cache, k, pos):
    cache.k[:, :, pos] = k  # a symbolic int inside a tuple index: dynamo alone specializes it (`pos == 7`)
    return (cache.k[:, :, : pos + 1] * 2).sum(-1)


def test_tuple_index_with_a_symbolic_position_compiles_at_most_twice():
    jf = dealias.jit(cache_object_step)
    ours, ref = KCache(torch.zeros(1, 2, 16, 4)), KCache(torch.zeros(1, 2, 16, 4))
    for pos in range(12):  # more positions than the cache limit (8)
        k = torch.randn(1, 2, 4)
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            got = jf(ours, k, pos)
        assert torch.equal(got, cache_object_step(ref, k, pos)) and torch.equal(ours.k, ref.k), pos
    info = dealias.cache_info(jf)
    assert info.misses <= 2 and info.dynamic == ("pos",), info
    (report,) = dealias.explain(jf)
    assert report.mode == "in place" and report.nbytes == 2 * 4 * 4, report  # the slot, not the buffer


def index_reads(x, p, q):
    return x[..., p] * 2, x[None, p, 1:3], x[p, -1], x[p, :, q], x[:, 1:3, q]


def index_writes(x, v, w, p, q):
    x[:, p] = 2.5  # a scalar fills
    x[p, :, q] += 1  # read, add, write back through the same view
    x[-1, p] = v  # v is (1, 1, 6): its leading 1-dims are dropped, as eager's assignment does
    x[..., q] = w  # an int tensor into a float view: converted
    return x[p, q]


@pytest.mark.parametrize("fn", [index_reads, index_writes], ids=["reads", "writes"])
def test_tuple_indexes_with_symbols_match_eager(fn):
    values = (torch.randn(1, 1, 6), torch.arange(36).view(6, 6))
    # Negative positions too, every one in range; not 0 or 1, which dynamo specializes (one more program each).
    positions = [(2, 3), (3, 2), (4, 2), (-1, -2), (-5, -4), (-2, -6), (5, 3)]
    calls = [(torch.randn(6, 6, 6), *(values if fn is index_writes else ()), p, q) for p, q in positions]
    info = run_calls(fn, calls)
    # One program for the first call, one for positive positions, one for negative ones (select's range guard).
    assert info.misses <= 3 and set(info.dynamic) == {"p", "q"}, info


def test_tuple_index_out_of_range_raises_eagers_error_and_writes_nothing():
    jf = dealias.jit(index_writes)
    x, v, w = torch.zeros(6, 6, 6), torch.randn(1, 1, 6), torch.arange(36).view(6, 6)
    for p in range(3):
        jf(x, v, w, p, p)
    before = x.clone()
    with pytest.raises(IndexError):
        index_writes(x.clone(), v, w, 7, 1)
    with pytest.raises(IndexError):
        jf(x, v, w, 7, 1)
    assert torch.equal(x, before)


def row_to_row(x, p, q):
    x[p, :] = x[q, :]  # overlapping exactly when p == q
    return x


def test_rows_at_two_symbolic_positions_are_apart_under_a_guard():
    calls = [(torch.randn(8, 8), p, q) for p, q in ((2, 3), (3, 2), (4, 7), (7, 5), (6, 2))]
    info = run_calls(row_to_row, calls)
    assert info.misses <= 2 and set(info.dynamic) == {"p", "q"}, info
    info = run_calls(row_to_row, [*calls, (torch.randn(8, 8), 5, 5), (torch.randn(8, 8), 3, 3)])
    assert info.misses <= 5, info  # (the same row: its own program per value)


def assigned_then_branch(x, v, p):
    x[:, p] = v  # v requires grad: after the assignment, so does x
    return x * (2 if x.requires_grad else 3)


def test_assignment_at_a_symbolic_position_updates_what_python_reads_of_the_tensor():
    calls = [(torch.zeros(4, 4), torch.randn(4, requires_grad=True), p) for p in (1, 2, 3, -1)]
    info = run_calls(assigned_then_branch, calls)
    assert info.dynamic == ("p",), info


def write_under_grad(x, v, p, q):
    y = x * 2
    y[:, p] = v
    return y[q, :] * 3


def test_write_at_a_symbolic_position_under_autograd_compiles_at_most_twice():
    # The check of what backward saved before a write probes the op on real tensors: a symbol handed to it was
    # specialized (a compile per position, then eager past the cache limit).
    make = lambda p: (torch.randn(12, 12, requires_grad=True), torch.randn(12, requires_grad=True), p, 11 - p)  # noqa: E731
    jf = dealias.jit(write_under_grad)
    for p in range(2, 12):
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            ours, ref = make(p), make(p)
            for a, b in zip(ours[:2], ref[:2]):
                b.data.copy_(a.data)
            out, want = jf(*ours), write_under_grad(*ref)
            assert torch.equal(out, want), p
            out.sum().backward()
            want.sum().backward()
            assert torch.equal(ours[0].grad, ref[0].grad) and torch.equal(ours[1].grad, ref[1].grad), p
    info = dealias.cache_info(jf)
    assert info.misses <= 2 and set(info.dynamic) == {"p", "q"}, info


def adamw_int_step(params, grads, ms, vs, step):
    b1, b2, lr, wd = 0.9, 0.999, 1e-3, 1e-2
    bc1 = 1 - b1**step
    bc2 = 1 - b2**step
    for p, g, m, v in zip(params, grads, ms, vs):
        p.mul_(1 - lr * wd)
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v / bc2).sqrt_().add_(1e-8)
        p.addcdiv_(m, denom, value=-lr / bc1)


def test_adamw_with_an_int_step_compiles_at_most_twice():
    torch.manual_seed(0)
    params = [torch.randn(5, 3), torch.randn(7)]
    ms = [torch.zeros_like(p) for p in params]
    vs = [torch.zeros_like(p) for p in params]
    calls = [(params, [torch.randn_like(p) for p in params], ms, vs, step) for step in range(1, 101)]
    info = run_calls(adamw_int_step, calls)
    assert info.misses <= 2, info


# --- sizes that change: sequence lengths, batch sizes -----------------------------------------------------------


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a)
        x.relu_()
        return x


def test_sequence_lengths_1_to_64_compile_at_most_twice():
    torch.manual_seed(0)
    m = Attention()
    info = run_calls(m, [(torch.randn(2, n, 16),) for n in range(1, 65)])
    assert info.misses <= 2, info
    assert info.dynamic == ("x.size(1)",), info


def fill_prefix(buf, x):
    buf[: x.shape[0]].copy_(x)  # a region whose size is symbolic
    buf[x.shape[0] :].zero_()
    return buf.sum()


def test_prefix_write_of_symbolic_size():
    buf = torch.randn(32, 3)
    info = run_calls(fill_prefix, [(buf, torch.randn(n, 3)) for n in (2, 5, 9, 17, 30)])
    assert info.misses <= 2, info


def test_shape_guard_failure_recompiles_and_says_why():
    def f(x, n):
        x.narrow(0, n, 2).mul_(2)
        return x

    jf = dealias.jit(f)
    for n in (0, 3, 4, 5):
        assert compare_call(f, jf, (torch.randn(8), n)) is None
    assert dealias.cache_info(jf).misses == 2
    x = torch.randn(8)
    with pytest.raises(RuntimeError) as eager:
        f(x.clone(), 7)  # the narrow reaches past the end
    with pytest.raises(RuntimeError) as compiled:
        jf(x, 7)
    assert str(compiled.value) == str(eager.value)
    reason = dealias.cache_info(jf).last_miss_reason
    assert "n <= 6" in reason, reason  # dynamo or dealias guarded the range the program holds for


# --- random positions, sizes and placements against eager --------------------------------------------------------


def window_update(buf, x, i):
    buf.narrow(0, i, x.shape[0]).add_(x)
    y = buf[i : i + 2].t()  # a view of the caller's tensor at a symbolic position, returned
    y.mul_(2)
    return buf.sum(0), y


def prefix_copy(a, b, n):
    a[:n].copy_(b[:n])
    a.select(0, n).zero_()
    return a[: n + 1].clone(), b


def cache_prefix(cache, k, pos):
    cache.select(1, pos).copy_(k)
    out = cache[:, : pos + 1]  # returned: a view of the input whose size is symbolic
    return out, out.mean(1)


RANDOM_PROGRAMS = [
    (window_update, lambda r: (torch.randn(r.randint(6, 12), 3), torch.randn(r.randint(1, 3), 3), r.randint(0, 3))),
    (prefix_copy, lambda r: (torch.randn(10, 2), torch.randn(10, 2), r.randint(0, 8))),
    (cache_prefix, lambda r: (torch.zeros(2, 12, 3), torch.randn(2, 3), r.randint(0, 11))),
]


@pytest.mark.parametrize("fn, make", RANDOM_PROGRAMS, ids=[f.__name__ for f, _ in RANDOM_PROGRAMS])
def test_random_positions_sizes_and_rows_match_eager(fn, make):
    r = random.Random(0)
    calls = []
    for _ in range(40):
        args = make(r)
        if r.random() < 0.3:  # the first argument as a row of a bigger buffer
            big = torch.randn(3, *args[0].shape)
            big[1] = args[0]
            args = (big[1], *args[1:])
        calls.append(args)
    info = run_calls(fn, calls)
    assert info.misses <= 6, info


def made_from_an_int(n):
    x = torch.arange(n, dtype=torch.float32)  # no tensor input: the symbol's ShapeEnv comes from dealias
    y = torch.zeros(n + 2)
    y[1 : n + 1] = x
    return y.cumsum(0), torch.full((n, 2), 1.5)


def test_tensors_sized_by_an_int_compile_at_most_twice():
    info = run_calls(made_from_an_int, [(n,) for n in (3, 4, 5, 9, 2, 7, 12)])
    assert info.misses <= 2 and info.dynamic == ("n",), info


def test_training_with_changing_batch_sizes_matches_eager():
    # Dynamo remembers which sizes changed per code object: a Sequential of another width run earlier in the
    # process (another test) would make size(1) dynamic too.
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(inplace=True), torch.nn.Linear(8, 1)
    )
    ref = copy.deepcopy(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, foreach=False)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, foreach=False)
    jnet, jstep = dealias.jit(net), dealias.jit(opt.step)
    for batch in (3, 16, 5, 9, 12, 4, 7):
        x = torch.randn(batch, 4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)  # the optimizer's own graph breaks
            jnet(x).pow(2).mean().backward()
            jstep()
        ref(x).pow(2).mean().backward()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        for (name, a), b in zip(net.state_dict().items(), ref.state_dict().values()):
            assert torch.equal(a, b), f"batch {batch}: {name}"
    info = dealias.cache_info(jnet)
    assert info.misses <= 2 and info.dynamic == ("args[0].size(0)",), info


def test_symbolic_position_with_the_inductor_executor():
    info = run_calls(
        decode_write, [(torch.randn(2, 3, 12, 4), torch.randn(2, 3, 4), p) for p in (1, 4, 6, 9)], executor="inductor"
    )
    assert info.misses <= 2, info
    assert info.tiers[-1] == "fused", info  # (the program over a symbolic position)


def cumsum_exp_relu_(x):  # fuzz seed 1100010 --dynamic
    v = x.cumsum(2).exp()
    v.relu_()  # exp saved its result
    return v


def row_squared_(x):  # fuzz seed 1100060 --dynamic
    row = x[:, :, 1]
    row.mul_(row)  # mul saves both factors, which it writes
    return x


@pytest.mark.parametrize("fn", [cumsum_exp_relu_, row_squared_])
def test_saved_then_written_is_found_over_symbolic_sizes(fn):
    # What an op saves is asked of eager on tensors of the compiling call's sizes; a symbolic size used to skip the
    # question, and backward gave gradients where eager's raises. Eager's message names the saved tensor's sizes:
    # the graph compiles with sizes specialized (passes/stale.py) and its backward raises eager's message.
    jf = dealias.jit(fn, dynamic=True)
    for shape in ((3, 4, 2), (2, 3, 4), (4, 5, 3)):
        x = torch.randn(shape, requires_grad=True)
        expected = fn(x * 1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation") as raised:
            expected.sum().backward()
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            got = jf(x * 1)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        with pytest.raises(RuntimeError) as again:
            got.sum().backward()
        assert str(again.value) == str(raised.value)
    assert dealias.cache_info(jf).eager_entries == 0


def relu_of_the_callers_(x):
    x.mul_(2)
    x.relu_()  # relu_ saves its result, which is the caller's tensor
    return x * 3


def test_a_result_saved_then_written_by_the_caller_over_symbolic_sizes():
    # relu_ runs in place on the caller's tensor, as eager's, so a write of it after the call makes backward raise;
    # one program serves every size.
    jf = dealias.jit(relu_of_the_callers_, dynamic=True)
    for shape in ((2, 3), (4, 5), (3, 7)):
        for f in (relu_of_the_callers_, jf):
            x = torch.randn(shape, requires_grad=True) * 1
            y = f(x)
            with torch.no_grad():
                x.add_(1)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                y.sum().backward()
    assert dealias.cache_info(jf).misses == 1


def returns_a_base_written_through_its_transpose(x):
    v = torch.zeros_like(x)
    v.transpose(0, 1)[0:] = 3.0
    torch.mul(v, -2.0, out=x)
    return v


@pytest.mark.parametrize("dynamic, sizes", [(True, (5,)), (None, (5, 6, 7))])
def test_a_returned_base_written_through_a_view_is_no_view_over_symbolic_sizes(dynamic, sizes):
    # (fuzz --dynamic seed 1100051) The write's decomposition ends in `transpose`, and eager's `v` is a tensor of
    # its own: over symbolic sizes it was returned as that transpose, a view.
    info = run_calls(
        returns_a_base_written_through_its_transpose, [(torch.randn(n, n),) for n in sizes], dynamic=dynamic
    )
    assert info.dynamic, info  # (held symbolic, not specialized)


def diagonal_of_a_member_then_write_the_group(x0, x1):  # fuzz --dynamic seed 1200296
    v = x1.diagonal(-1)
    out = v.expand(2, *v.shape)
    with torch.no_grad():
        x0.sin_()  # x1 is x0[::2]: the output is rebuilt from the alias group's base
    return out


def test_inputs_sharing_memory_over_symbolic_sizes():
    # The graph takes the tensors, then the symbols, then the alias groups' bases; the program looked the bases up
    # among the symbols' values (an int where the group's base was: AttributeError, or an int returned).
    calls = []
    for n in (5, 7):
        x = torch.randn(n, n, requires_grad=True) * 1
        calls.append((x, x[::2]))
    info = run_calls(diagonal_of_a_member_then_write_the_group, calls, dynamic=True)
    assert "x0.size(0)" in info.dynamic, info  # (the group key changes with the sizes: one compile each)


def scatter_then_double(x, idx, src):
    x.scatter_(0, idx, src)
    return x * 2


def test_an_index_out_of_range_over_symbolic_sizes_raises_eagers_error():
    # Which error eager raises (scatter_: RuntimeError, not IndexError) is asked of eager at the symbols' values in
    # the compiling call; it used to be a guess where a size was symbolic. The size in its message is the call's.
    calls = []
    for n in (5, 7):
        calls += [(torch.zeros(n, 3), torch.tensor([[0, 1, 2]]), torch.ones(1, 3))]
        calls += [(torch.zeros(n, 3), torch.tensor([[0, 1, n]]), torch.ones(1, 3))]
    run_calls(scatter_then_double, calls, dynamic=True)
    jf = dealias.jit(scatter_then_double, dynamic=True)
    jf(torch.zeros(5, 3), torch.tensor([[0, 1, 2]]), torch.ones(1, 3))
    with pytest.raises(RuntimeError, match="index 9 is out of bounds for dimension 0 with size 9"):
        jf(torch.zeros(9, 3), torch.tensor([[0, 1, 9]]), torch.ones(1, 3))


def write_a_member_through_a_view_then_the_group(x0, x1):  # fuzz --dynamic seed 1230072
    x1[2] = 1.5
    x1.expand(2, *x1.shape).zero_()  # x1 is x0[1:]: this write reaches the group's base at x1's offset
    x0.clamp_(-1, 1)
    return x0.select(0, 4)


def a_matrix_and_its_tail_rows(pad):
    x = torch.randn(pad + 25)[pad:].view(5, 5)
    return x, x[1:]


@pytest.mark.parametrize("dynamic, pads", [(True, (0, 0, 5)), (True, (2,)), (None, (3,))])
def test_a_write_into_a_group_whose_base_does_not_start_its_storage(dynamic, pads):
    # The second write's scatter offset was the difference of two fake storage offsets that disagreed: its view's,
    # computed before the first write was decomposed, and the decomposition's (the group's start, on a fake-tensor
    # cache miss). The write landed `start` elements early. The cache is cleared so that it misses.
    torch._subclasses.fake_tensor.FakeTensorMode.cache_clear()
    run_calls(
        write_a_member_through_a_view_then_the_group, [a_matrix_and_its_tail_rows(p) for p in pads], dynamic=dynamic
    )


def flatten_in_place(x):  # fuzz seed 1610283 --dynamic --autograd
    v = x.reshape(-1)
    v.unsqueeze_(0)
    return v.expand(2, *v.shape)


def flatten_in_place_beside_its_base(base, x):
    return base * 2, flatten_in_place(x)


@pytest.mark.parametrize("with_base", [False, True])
def test_view_of_a_base_over_symbolic_sizes(with_base):
    # The fake of a view input comes with its base; a base that is no input of the graph used to give the shape
    # guard a name it cannot read (`L['x']._base`): NameError at the next call.
    fn = flatten_in_place_beside_its_base if with_base else flatten_in_place
    jf = dealias.jit(fn, dynamic=True)
    for shape in ((2, 3, 4), (2, 5, 4), (3, 6, 7), (2, 4, 6)):
        grads = []
        for f in (fn, jf):
            leaf = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)), requires_grad=True)
            base = leaf * 1
            args = (base, base[0]) if with_base else (base[0],)
            out = f(*args)
            out = out[1] if with_base else out
            weights = torch.arange(out.numel()).view(out.shape) % 3
            (grad,) = torch.autograd.grad((out * weights).sum(), leaf)
            grads.append((out.detach(), grad))
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    info = dealias.cache_info(jf)
    assert info.dynamic, info
    if not with_base:
        # dynamo makes the sizes that changed symbols; the third view outgrows the storage the second compile was
        # bounded by. (Inputs sharing memory key their compiles by their extent: each size compiles.)
        assert info.misses <= 3 and info.hits >= 1, info


def test_shape_guard_with_a_disjunction_keeps_every_guard():
    # A view of another input gives a guard `x.numel() == 1 or base.size(1) * base.size(2) == x.numel()`; torch's
    # produce_guards_expression joins guards with a bare `and`, so that `or` used to accept a base whose strides
    # break the guards before it.
    jf = dealias.jit(flatten_in_place_beside_its_base, dynamic=True)
    for shape in ((2, 3, 4), (2, 5, 4), (3, 6, 7)):
        base = torch.randn(shape, requires_grad=True) * 1
        jf(base, base[0])
    ((*_, shape_guard, _, _),) = [e for g in jf.stats.graphs for bucket in g.cache.values() for e in bucket][-1:]
    assert " or " in shape_guard.text, shape_guard.text
    fitting = torch.randn(3, 6, 7) * 1
    assert shape_guard([3, 6, 7, fitting, fitting[0]])
    strided = torch.empty_strided((3, 6, 7), (43, 7, 1))  # base.stride(0) is not 6 * 7
    assert not shape_guard([3, 6, 7, strided, strided[0]])
