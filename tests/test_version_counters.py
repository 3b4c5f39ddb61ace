"""Version counters, as autograd's "modified by an inplace operation" check reads them: a compiled call moves
the counter of every caller's tensor eager's moves (a write, an in-place layout change) and leaves the others
where eager leaves them (writes through `x.data` or an `unsafe_chunk` element, a mutable op's writes such as
BatchNorm's running statistics), so a backward through what autograd saved before the call raises, or runs, as
eager's does."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import HalvesGradient, check, grads_like_eager

import dealias


def _non_leaf(*shape):
    def make():
        g = torch.Generator().manual_seed(0)
        return (torch.randn(*shape, generator=g, requires_grad=True) * 1,)

    return make


def test_metadata_change_moves_the_version_counter():
    # Eager's in-place metadata ops move the version counter of the tensor's memory, as writes do: what exp saved
    # of its result is then stale (backward raises), and an element of a split goes stale (reading its grad_fn
    # raises, fuzz seed 997150).
    def saved_result_then_t_(x):
        e = (x * 1).exp()
        e.t_()
        return e

    def split_then_squeeze_other_view(x0, x1):
        v1 = x1.chunk(2, 0)[-1]
        v2 = x0.permute(1, 2, 0)
        v2.squeeze_()
        return (v1,)

    x = torch.randn(2, 3, requires_grad=True)
    for fn in (saved_result_then_t_, dealias.jit(saved_result_then_t_)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            out = fn(x)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
    base = torch.randn(2, 3, 4, requires_grad=True) * 1
    check(split_then_squeeze_other_view, base, base[:1], allow_fallback=True)

    def unsqueeze_view_of_input(x):  # of a caller's tensor: its version counter moves, what sin saved is stale
        v = x[1:]
        v.unsqueeze_(0)
        return v * 2

    for fn in (unsqueeze_view_of_input, dealias.jit(unsqueeze_view_of_input)):
        y = torch.randn(3, 2, requires_grad=True) * 1
        saved = y.sin()
        out = fn(y)
        assert y._version == 1
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            (saved.sum() + out.sum()).backward()


def chunk_after_a_detached_view_changed(x0, x1):  # fuzz seed 1310504
    v = x0.movedim(0, -1)
    d = v.detach()
    d.t_()  # eager moves the counter of x0's memory here, before the chunk is made
    return v.chunk(2, 0)[-1], d


def chunk_after_an_intermediate_changed(x):
    y = x * 2
    y.t_()
    return y.chunk(2)[1], y


def no_grad_view_after_a_detached_intermediate_changed(x):
    y = x * 2
    w = y.detach()
    w.t_()
    with torch.no_grad():
        v = y[1:]
    return v, w


def saved_after_an_intermediate_changed(x):
    y = x * 2
    y.t_()
    return y * y, y


@pytest.mark.parametrize(
    "fn",
    [
        chunk_after_a_detached_view_changed,
        chunk_after_an_intermediate_changed,
        no_grad_view_after_a_detached_intermediate_changed,
        saved_after_an_intermediate_changed,
    ],
)
def test_a_returned_tensor_restrided_after_the_graph_keeps_its_counter(fn):
    # A tensor made as no view (`x.detach()`, `x * 2`) and changed in place (`t_()`) is returned and given its
    # layout by `as_strided_` after the outputs are made; a second move of the counter there made a split's element
    # or a no_grad view made after the change raise when its grad_fn was read, and what the graph saved stale.
    def make_args():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4, 4, generator=g, requires_grad=True) * 1
        return (x, x.t()) if fn is chunk_after_a_detached_view_changed else (x,)

    jf = dealias.jit(fn)
    assert grads_like_eager(fn, jf, make_args) == []
    for out in (fn(*make_args()), jf(*make_args())):
        assert out[0].grad_fn is None or out[0].grad_fn.name()  # (reading it raises nothing)


def sgd_through_data(params, lr):
    for p in params:
        p.data.add_(p.grad, alpha=-lr)  # hidden from autograd: no parameter's version counter moves


def test_a_step_through_data_leaves_the_parameters_counters():
    # The write-back moved each parameter's counter, so a backward through a graph made before the step raised
    # "modified by an inplace operation" where eager's runs (with the new weights, as eager's does).
    torch.manual_seed(0)
    jf = dealias.jit(sgd_through_data)
    for step in (sgd_through_data, jf, jf):
        lin = torch.nn.Linear(4, 3)
        x = torch.randn(2, 4)
        lin(x).sum().backward()
        pending = lin(x).square().sum()  # saves the weight
        expected = [p.detach().clone().add_(p.grad, alpha=-0.1) for p in lin.parameters()]
        versions = [p._version for p in lin.parameters()]
        step(list(lin.parameters()), 0.1)
        assert all(torch.equal(p, e) for p, e in zip(lin.parameters(), expected))
        assert [p._version for p in lin.parameters()] == versions
        pending.backward()
    assert dealias.cache_info(jf).misses == 1


def batch_norm_train(bn, x):
    return bn(x)


@pytest.mark.parametrize("executor", ["torch", "inductor"])
def test_running_statistics_keep_their_counters(executor):
    # Eager's native_batch_norm writes its running statistics without moving their version counters (a mutable
    # op, not an in-place one: OpFacts.counted); the write-back moved them, so a backward through a graph that
    # saved one before the step raised where eager's runs.
    jf = dealias.jit(batch_norm_train, executor=executor)
    for f in (batch_norm_train, jf, jf):
        bn, x, w = torch.nn.BatchNorm1d(3), torch.randn(4, 3), torch.ones(3, requires_grad=True)
        pending = (bn.running_mean * w).sum()  # saves the running mean
        f(bn, x)
        pending.backward()
        assert torch.equal(w.grad, bn.running_mean)  # (eager's backward reads the new values)
    assert dealias.cache_info(jf).misses == 1


def sine_of_a_chunk(x):
    return x.unsafe_chunk(2, 0)[0].sin()  # sin saves the chunk, whose version counter is its own


def sine_of_a_chunk_then_a_graph_break(x):
    y = x.unsafe_chunk(2, 1)[0].t().sin()
    torch._dynamo.graph_break()
    x.fill_(-2.0)  # written in the next graph
    return y


def test_what_backward_saves_of_an_unsafe_chunk_is_not_stale_after_its_base_is_written():
    # The chunk was replayed as a view of x, sharing x's counter: a write of x after the graph made backward raise
    # "modified by an inplace operation" where eager's goes on with the new values (fuzz seed 1040427).
    def grads(f, after):
        b = torch.randn(5, 5, generator=torch.Generator().manual_seed(0), requires_grad=True)
        x = b * 1
        out = f(x)
        after(x)
        out.sum().backward()
        return b.grad

    for fn, after in ((sine_of_a_chunk, lambda x: x.fill_(-2.0)), (sine_of_a_chunk_then_a_graph_break, lambda x: x)):
        jf = dealias.jit(fn)
        for _ in range(2):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", dealias.GraphBreakWarning)
                torch.testing.assert_close(grads(jf, after), grads(fn, after))


def unsqueeze_a_chunk(x):
    c = x.unsafe_chunk(2, 0)[0]
    c.unsqueeze_(0)  # moves c's version counter, not x's (an unsafe_chunk element has a counter of its own)
    return c.shape[0]


def relu_then_unsqueeze_a_chunk(x):
    x.relu_()  # saves x for backward
    y = HalvesGradient.apply(x * 1)  # (a graph break: the next piece only changes the chunk's layout)
    c = x.unsafe_chunk(2, 0)[0]
    c.unsqueeze_(0)
    return (y,)


def test_a_layout_change_of_an_unsafe_chunk_moves_its_own_counter_only():
    # The graph moved x's counter, so what autograd saved of x before it (relu_'s result) was stale and backward
    # raised "modified by an inplace operation" where eager's runs (fuzz seed 1760323).
    assert grads_like_eager(relu_then_unsqueeze_a_chunk, dealias.jit(relu_then_unsqueeze_a_chunk), _non_leaf(6)) == []
    jf = dealias.jit(unsqueeze_a_chunk)
    for f in (unsqueeze_a_chunk, jf, jf):
        x = torch.randn(6)
        w = torch.ones(6, requires_grad=True)
        y = w * x  # saves x
        assert f(x) == 1 and x._version == 0
        y.sum().backward()
    assert dealias.cache_info(jf).misses == 1


def double_a_chunk(x):
    x.unsafe_chunk(2, 0)[0].mul_(2)  # moves the element's own counter, not x's
    return x.sum()


def double_a_chunk_then_x(x):
    x.unsafe_chunk(2, 0)[0].mul_(2)
    x[3:].add_(1)  # through x: its counter moves
    return x.sum()


@pytest.mark.parametrize("executor", ["torch", "inductor"])
def test_a_write_through_an_unsafe_chunk_leaves_the_callers_counter(executor):
    # The write-back into x moved x's counter, so a backward through what autograd saved of x before the call
    # raised "modified by an inplace operation" where eager's runs (and reads x's new values, as dealias's must).
    for fn in (double_a_chunk, double_a_chunk_then_x):
        expected = torch.arange(6.0)
        fn(expected)
        jf = dealias.jit(fn, executor=executor)
        for f in (fn, jf, jf):
            x = torch.arange(6.0)
            w = torch.ones(6, requires_grad=True)
            y = (w * x).sum()  # saves x
            f(x)
            assert torch.equal(x, expected)
            if fn is double_a_chunk:
                assert x._version == 0
                y.backward()
                assert torch.equal(w.grad, x)
            else:
                assert x._version > 0
                with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                    y.backward()
        assert dealias.cache_info(jf).misses == 1


def double_a_chunk_read_another_member(x, c):
    x.unsafe_chunk(2)[1].mul_(2)  # moves no member's counter
    return c + 1


def double_through_data_of_a_member(x, c):
    c.data.mul_(2)  # `.data` has a counter of its own
    return x + 1


def chunk_write_and_a_direct_write(a, b):
    a.unsafe_chunk(3)[0].mul_(2)  # a's counter stays...
    b.add_(1)  # ...but b shares it, and eager moves it here
    return a + 1


def _with_chunk():
    x = torch.randn(6)
    return x, x.unsafe_chunk(2)[0]


def _with_view():
    x = torch.randn(6)
    return x, x[:3]


def _halves():
    x = torch.randn(6)
    return x[:3], x[3:]


@pytest.mark.parametrize(
    "fn, make",
    [
        (double_a_chunk_read_another_member, _with_chunk),
        (double_a_chunk_read_another_member, _with_view),
        (double_through_data_of_a_member, _with_chunk),
        (double_through_data_of_a_member, _with_view),
    ],
)
def test_inputs_sharing_memory_keep_the_counters_eager_keeps(fn, make):
    # The write-back into an alias group's base moved the counter of the member it views, where eager's writes
    # moved none (compare_call checks counters both ways).
    assert grads_like_eager(fn, dealias.jit(fn), make) == []


def test_a_counter_shared_with_a_written_tensor_ends_moved():
    # a's counter is set back after the call; b shares it (compare_call's copies do not) and eager moved it.
    jf = dealias.jit(chunk_write_and_a_direct_write)
    for f in (chunk_write_and_a_direct_write, jf, jf):
        a, b = _halves()
        f(a, b)
        assert a._version == b._version > 0


def shift_indices(idx, s):
    idx <<= s  # aten.__ilshift__: in place, eager moves idx's counter
    return idx.sum()


def test_a_dunder_in_place_op_moves_the_counter():
    # OpFacts.counted took `__ilshift__` for no in-place op and the call set idx's counter back: a gather that
    # saved idx before it then read the shifted indices at backward, a silently wrong gradient (found in review).
    jf = dealias.jit(shift_indices)
    for f in (shift_indices, jf, jf):
        w, idx = torch.zeros(5, requires_grad=True), torch.tensor([0, 1])
        out = torch.gather(w, 0, idx)  # saves idx
        f(idx, torch.tensor(1))
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def relu_of_a_member(x, y):
    y.relu_()  # run in place on the caller's tensor (relu_ saves its result)
    return x.sum()


def copy_onto_itself_after_a_data_write(x, w):
    x.data.add_(1)  # hidden from autograd...
    x.copy_(x)  # ...but this moves x's counter
    return (x * w).sum()


def test_writes_run_in_place_or_standing_for_a_self_copy_move_the_counter():
    # Neither path recorded its counter move: the call set the counter back, and a graph made before it read the
    # new values at backward where eager's raises (found in review).
    def group_args():
        b = torch.randn(4, requires_grad=True) * 1
        return b, b[:2]

    def data_args():
        return torch.randn(4), torch.randn(4, requires_grad=True)

    for fn, make in ((relu_of_a_member, group_args), (copy_onto_itself_after_a_data_write, data_args)):
        assert grads_like_eager(fn, dealias.jit(fn), make) == []
        jf = dealias.jit(fn)
        for f in (fn, jf, jf):
            args = make()
            pending = (args[0] * args[0].detach().clone().requires_grad_()).sum()  # saves args[0]
            f(*args)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                pending.backward()


def data_write_then_saved(x, w):
    x.data.mul_(w)
    return (x * x).sum()  # saves x, after its hidden write


def chunk_write_then_saved(x, w):
    x.unsafe_chunk(2)[0].add_(1)
    return (x * w).sum()


def statistics_then_saved(x, mean, var, w):
    y = torch.nn.functional.batch_norm(x, mean, var, training=True)
    return (y * mean).sum() + (w * var).sum()


def noise_then_saved(x, noise, w):
    torch.ops.aten.rrelu_with_noise_(x, noise, 0.1, 0.3, True)
    return (noise * w).sum()


@pytest.mark.parametrize(
    "fn, make",
    [
        (data_write_then_saved, lambda: (torch.randn(4, requires_grad=True), torch.randn(4))),
        (chunk_write_then_saved, lambda: (torch.randn(4), torch.randn(4, requires_grad=True))),
        (
            statistics_then_saved,
            lambda: (
                torch.randn(3, 4, requires_grad=True),
                torch.zeros(4),
                torch.ones(4),
                torch.randn(4, requires_grad=True),
            ),
        ),
        (noise_then_saved, lambda: (torch.randn(4), torch.randn(4), torch.randn(4, requires_grad=True))),
    ],
)
def test_a_tensor_saved_after_writes_that_keep_its_counter_is_not_stale(fn, make):
    # The graph wrote the tensor back before the read autograd saves it for (write_back_now), moving its counter,
    # and the call set the counter back at its end: backward raised where eager's runs (found in review). That
    # write-back now goes through an alias with a counter of its own.
    jf = dealias.jit(fn)
    for _ in range(2):
        torch.manual_seed(0)
        expected_args = make()
        torch.manual_seed(0)
        args = make()
        torch.manual_seed(1)
        expected = fn(*expected_args)
        torch.manual_seed(1)
        got = jf(*args)
        expected.backward()
        got.backward()
        torch.testing.assert_close(got, expected)
        assert [a._version for a in args] == [a._version for a in expected_args]
        for a, e in zip(args, expected_args):
            torch.testing.assert_close(a.grad, e.grad)
