"""The fused executor (executor="inductor"): few and small, each compile costs seconds on CPU."""

from __future__ import annotations

import types
import warnings

import pytest
import torch
from harness import check, compare_call, decode_prefix, grads_like_eager

import dealias
from dealias.errors import InternalError
from dealias.runtime.hazards import SNAPSHOT, check_hazards
from dealias.runtime.keep_aten import MIN_NUMEL as KEEP_ATEN_MIN_NUMEL
from dealias.tools.demo import kv_cache_write, seed_program


def fused_graph(jf) -> torch.fx.GraphModule:
    return jf.last.run_graph.graph


def targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def remove_snapshots(gm) -> None:
    for n in list(gm.graph.nodes):
        if n.target is SNAPSHOT:
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)


def swap_rows(buf):
    t = buf[0].clone()
    buf[0] = buf[1]
    buf[1] = t


def scatter_then_zero(x, s):
    y = torch.slice_scatter(x, s, 0, 0, 1)
    x.zero_()
    return y


def read_then_write_region(x):
    a = x[0] * 2
    x[0] = 1.0
    return a + x[0]


def shift_rows(x):
    x[1:] = x[:-1].clone()  # one kernel reading x[i - 1] while it writes x[i] would read what it wrote


def flip_in_place(x):
    x.copy_(x.flip(0))


def fill_then_flipped_update(x):
    # (found by the fuzzer, seed 9128) after a write into x, inductor fused the snapshot's generated copy with
    # the copy_ of it into x: one loop read x[3 - i] after writing it
    x[2:] = 3.0
    x += x.flip(0)


def rolled_update_after_a_write(x):
    # (fuzzer, seed 9137) the same through a rolled view
    v = x[:, 1:]
    torch.abs(v[3, 0], out=v[3, 0])
    v.addcmul_(v.roll(1, 0), v.roll(1, 0), value=0.5)


@pytest.mark.parametrize(
    "fn",
    [
        swap_rows,
        read_then_write_region,
        shift_rows,
        flip_in_place,
        fill_then_flipped_update,
        rolled_update_after_a_write,
    ],
)
def test_read_before_a_write_is_snapshotted(fn):
    # Inductor alone recomputes these values after (or during) the write (both rows equal, y all zeros, every
    # shifted row equal to the first): a snapshot keeps them where the program computed them, and the verifier
    # rejects the graph without it.
    jf = check(fn, torch.randn(4, 3), executor="inductor")
    gm = fused_graph(jf)
    assert SNAPSHOT in targets(gm)
    check_hazards(gm)
    remove_snapshots(gm)
    with pytest.raises(InternalError, match="after .* overwrote"):
        check_hazards(gm)


def foreach_then_overwrite(x):
    a, b = x[0], x[1]
    t = torch._foreach_mul([a, b], 2.0)  # each result read from its own row, then used after that row is written
    a.copy_(b)
    b.zero_()
    return t


def foreach_shifted_into_itself(x):
    # The first result reads x one row above the row it is stored to: one kernel would read rows it already wrote.
    y = x.clone()
    t = torch._foreach_add([x[:-1], y[1:]], [y[:-1], x[:-1]])
    x[1:] = t[0]
    return t[1]


@pytest.mark.parametrize("fn", [foreach_then_overwrite, foreach_shifted_into_itself])
def test_a_foreach_result_read_before_its_memory_is_written_is_snapshotted(fn):
    # A foreach op's i-th result reads only the i-th tensor of its lists (hazards.foreach_element), but that one
    # it does read: these still need their snapshots, and fail the verifier without them.
    jf = check(fn, torch.randn(4, 3), executor="inductor")
    gm = fused_graph(jf)
    assert SNAPSHOT in targets(gm)
    remove_snapshots(gm)
    with pytest.raises(InternalError, match="after .* overwrote"):
        check_hazards(gm)


def test_a_snapshot_is_a_copy_in_inductors_code_not_a_python_call():
    # inductor_fixes lowers dealias::snapshot to a realized copy: no call of the custom op (the dispatcher, then
    # clone, ~25 us each), and the rows still swap as eager's do.
    jf = check(swap_rows, torch.randn(4, 3), executor="inductor")
    assert SNAPSHOT in targets(fused_graph(jf))
    with torch.profiler.profile() as prof:
        jf(torch.randn(4, 3))
    assert not [e.name for e in prof.events() if "snapshot" in e.name]


def neg_then_flipped_update(x, first):
    v = x.squeeze()
    x.neg_()
    first.copy_(first)
    v.addcmul_(v.flip(0), v.flip(0), value=0.5)
    return x


def write_through_a_dtype_view(x):
    x.view(torch.int32)[1].add_(1)  # fuzz seed 910733: inductor stored float(bits + 1) as a float


def square_an_overlapping_input(v2, v1):
    v2.mul_(v1)  # fuzz seed 920403: the two inputs are one view, 12 elements into their storage


@pytest.mark.parametrize(
    "fn", [scatter_then_zero, neg_then_flipped_update, write_through_a_dtype_view, square_an_overlapping_input]
)
def test_what_inductor_gets_wrong_is_not_handed_to_it(fn):
    # Inductor runs a functional scatter in place into its base and read the flipped elements it had already
    # written in the same kernel (fuzz seed 910067: 0.2 off). Only writes dealias lowered in place, under the
    # hazard rule, go to inductor; a graph with a functional scatter runs on the torch executor. So do dtype
    # views, and inputs sharing memory (their views of one base would need as_strided, whose storage offset is
    # absolute: fused, they came back 6.6 off).
    x = torch.randn(6)
    args = (torch.randn(4, 3), torch.randn(1, 3)) if fn is scatter_then_zero else (x, x[:1])
    args = (x,) if fn is write_through_a_dtype_view else args
    if fn is square_an_overlapping_input:
        v = torch.randn(2, 3, 4)[1:].unfold(2, 2, 3)
        args = (v, v)
    jf = check(fn, *args, executor="inductor")
    assert "not fused" in str(dealias.last_traces(jf)[3])


def momentum(p, m, g):
    m.mul_(0.9).add_(g)
    p.sub_(m, alpha=0.1)


def test_stored_value_is_read_back_not_snapshotted():
    # m's new value is read again by p's update: it is read from where it was stored, no extra copy.
    jf = check(momentum, torch.randn(64), torch.randn(64), torch.randn(64), executor="inductor")
    gm = fused_graph(jf)
    assert SNAPSHOT not in targets(gm)
    check_hazards(gm)


def slice_write(buf, row):
    buf[123] = row
    buf[124].add_(row)


def test_slice_write_moves_only_the_written_rows():
    jf = check(slice_write, torch.randn(256, 64), torch.randn(64), executor="inductor")
    assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]
    [report] = dealias.explain(jf)
    assert (report.mode, report.nbytes) == ("in place", 2 * 64 * 4)
    copies = [n for n in fused_graph(jf).graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert copies and all(n.args[0].meta["val"].shape == (64,) for n in copies)


def kv_write(kc, vc, k, v, pos):
    kc.index_copy_(2, pos, k)
    vc.index_copy_(2, pos, v)


@pytest.mark.parametrize("dynamic", [None, True])
def test_index_bounds_checked_before_any_write(dynamic):
    # With dynamic=True the caches' length is a symbol: the check reads it from the call's cache tensor.
    def args(p, n=8):
        return torch.zeros(1, 2, n, 4), torch.zeros(1, 2, n, 4), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), p

    fn = types.FunctionType(kv_write.__code__.replace(co_name=f"kv_write_{dynamic}"), globals())
    jf = check(fn, *args(torch.tensor([3])), executor="inductor", dynamic=dynamic)
    assert jf.last.tier == "fused"
    assert [r.mode for r in dealias.explain(jf)] == ["in place", "in place"]
    for n in (8, 11):
        kc, vc, k, v, pos = args(torch.tensor([n + 1]), n)
        with pytest.raises(IndexError):
            kv_write(kc.clone(), vc.clone(), k, v, pos)
        with pytest.raises(IndexError, match="index_copy_"):
            jf(kc, vc, k, v, pos)
        assert not kc.any() and not vc.any()


def embed_and_cache(w, tok, cache, pos, x, g):
    cache.index_copy_(0, pos, w[tok] * 2)
    return torch.embedding(w, tok) + x.index_select(0, tok) + x.gather(0, g)


@pytest.mark.parametrize("dynamic", [None, True])
def test_indices_read_from_inputs_are_checked_before_any_write(dynamic):
    # Inductor checks them inside its kernels (after the cache write, with its own error): a read index that is a
    # graph input is checked in the prologue instead, with eager's error, and the graph stays fused. (dynamic=True:
    # against the symbolic sizes of the tensors read, taken from the call's.)
    def args(tok, g):
        return torch.randn(10, 3), tok, torch.zeros(5, 3), torch.tensor([1, 3]), torch.randn(10, 3), g

    fn = types.FunctionType(embed_and_cache.__code__.replace(co_name=f"embed_and_cache_{dynamic}"), globals())
    ok = args(torch.tensor([1, 9]), torch.tensor([[0, 9, 2]]))
    jf = check(fn, *ok, executor="inductor", dynamic=dynamic)
    assert jf.last.tier == "fused"
    ok_tok, ok_g = torch.tensor([1, 2]), torch.tensor([[0, 1, 2]])
    bad = [(torch.tensor([1, 10]), ok_g), (torch.tensor([-1, 2]), ok_g), (ok_tok, torch.tensor([[0, 10, 2]]))]
    for tok, g in bad:
        a = args(tok, g)
        with pytest.raises(Exception) as expected:
            embed_and_cache(*(t.clone() for t in a))
        with pytest.raises(type(expected.value), match=r"\(aten\.\w+\.\w+\)\n.*test_inductor.py:\d+"):
            jf(*a)
        assert not a[2].any()  # the cache is untouched
    assert dealias.cache_info(jf).misses == 1


class StaticLayer:
    """HF transformers' StaticLayer.update (5.x): the write position is computed inside the step, from a count the
    step itself moves before writing."""

    def __init__(self, n=8):
        self.keys, self.values, self.cumulative_length = (
            torch.zeros(1, 2, n, 4),
            torch.zeros(1, 2, n, 4),
            torch.zeros(1, dtype=torch.long),
        )

    def update(self, k, v):
        cache_position = torch.arange(k.shape[-2]) + self.cumulative_length
        self.cumulative_length.add_(k.shape[-2])
        self.keys.index_copy_(2, cache_position, k)
        self.values.index_copy_(2, cache_position, v)
        return self.keys, self.values


def decode_step(layer, k, v):
    keys, values = layer.update(k, v)
    return (keys * values).sum(-1)


@pytest.mark.parametrize("dynamic", [None, True])
def test_an_index_computed_in_the_graph_is_computed_and_checked_before_any_write(dynamic):
    # The position is computed in the prologue (from memory no earlier write of the graph touched) and handed to
    # the fused graph as an input: the cache writes stay in place, and a position out of range raises eager's
    # error with every caller tensor untouched.
    fn = types.FunctionType(decode_step.__code__.replace(co_name=f"decode_step_{dynamic}"), globals())
    ours, eagers = StaticLayer(), StaticLayer()
    jf = dealias.jit(fn, executor="inductor", dynamic=dynamic)
    for _ in range(8):
        k, v = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
        torch.testing.assert_close(jf(ours, k, v), decode_step(eagers, k, v), rtol=0, atol=1e-6)
        for a, b in zip(vars(ours).values(), vars(eagers).values()):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]
    assert [r.mode for r in dealias.explain(jf)] == ["in place"] * 3
    assert dealias.cache_info(jf).misses == 1
    saved = [t.clone() for t in vars(ours).values()]
    with pytest.raises(IndexError):
        decode_step(eagers, k, v)
    with pytest.raises(IndexError, match=r"index_copy_"):
        jf(ours, k, v)
    for a, b in zip(vars(ours).values(), saved):
        assert torch.equal(a, b)  # (eager's own code moved the count before its write raised: see the README)


def write_at_a_view_then_move_it(cache, pos, v):
    cache.index_copy_(0, pos[1:], v)  # (a view of an input: computed first as a copy, not as the input's memory)
    pos.add_(1)


def read_at_a_computed_index(w, tok, cache, x):
    cache.index_copy_(0, tok % 4, x)
    return torch.embedding(w, tok + 1)


def write_at_a_constant_index_plus_one(cache, pos, v):
    cache.index_copy_(0, torch.tensor([1, 2]) + pos, v)  # (a constant of the graph, computed first with pos)


def write_at_an_index_written_before(cache, pos, v):
    pos.add_(1)
    cache.index_copy_(0, pos * 1, v)  # (its value is known only after the graph's own write)


@pytest.mark.parametrize(
    "fn, args, tier",
    [
        (write_at_a_view_then_move_it, (torch.zeros(5, 2), torch.tensor([0, 3, 1]), torch.randn(2, 2)), "fused"),
        (
            read_at_a_computed_index,
            (torch.randn(9, 2), torch.tensor([7, 2]), torch.zeros(4, 2), torch.randn(2, 2)),
            "fused",
        ),
        (write_at_a_constant_index_plus_one, (torch.zeros(5, 2), torch.tensor([1]), torch.randn(2, 2)), "fused"),
        (write_at_an_index_written_before, (torch.zeros(5, 2), torch.tensor([0, 3]), torch.randn(2, 2)), "torch"),
    ],
)
def test_indices_computed_in_the_graph(fn, args, tier):
    jf = check(fn, *args, executor="inductor")
    assert jf.last.tier == tier
    if tier == "torch":
        assert "computed from pos after a write to it" in dealias.last_traces(jf)[3].text.splitlines()[0]
    bad = [a.clone() for a in args]
    bad[1].fill_(8)
    eagers = [a.clone() for a in bad]
    with pytest.raises(Exception) as expected:
        fn(*eagers)
    before = [a.clone() for a in bad]
    with pytest.raises(type(expected.value), match=r"\(aten\.\w+\.\w+\)\n.*test_inductor.py:\d+"):
        jf(*bad)
    # Fused: checked before any write. The torch executor leaves the writes before the failing op done, as eager.
    assert all(torch.equal(a, b) for a, b in zip(bad, before if tier == "fused" else eagers))


def rows_into_zeros(x, idx, acc):
    out = torch.zeros(5, 3)
    out[idx] = x  # (a functional index_put into memory the graph made)
    acc.add_(out.sum(0))
    return out * 2


def one_hot_rows(idx, w):
    hot = w.new_zeros(4, 6).scatter_(1, idx, 1.0)  # (w for its dtype only)
    w.add_(hot.t() @ torch.ones(4, 1))
    return hot


def windows_into_a_new_buffer(x, y):
    buf = torch.zeros(6, 3)
    buf[1:4] = x
    buf[2:5] += buf[1:4].flip(0) * y  # reads of the buffer at other rows than the ones it writes
    x.add_(1)  # and a write of the caller's memory the first write read
    return buf


def scatter_into_a_copy_of_an_input(x, y):
    c = x.clone()  # inductor may drop the clone: the scatter would run in place into x
    c[1:3] = y
    return c + x


@pytest.mark.parametrize(
    "fn, args, tier",
    [
        (rows_into_zeros, (torch.randn(2, 3), torch.tensor([4, 1]), torch.zeros(3)), "fused"),
        (one_hot_rows, (torch.tensor([[1], [5], [0], [5]]), torch.zeros(6, 1)), "fused"),
        (windows_into_a_new_buffer, (torch.randn(3, 3), torch.randn(3, 3)), "fused"),
        (scatter_into_a_copy_of_an_input, (torch.randn(4, 3), torch.randn(2, 3)), "torch"),
    ],
)
def test_scatters_into_memory_the_graph_made_are_fused(fn, args, tier):
    jf = check(fn, *args, executor="inductor")
    assert jf.last.tier == tier, dealias.last_traces(jf)[3].text.splitlines()[0]
    if fn in (rows_into_zeros, one_hot_rows):  # an index out of range: eager's error, before any write
        bad = [a.clone() for a in args]
        bad[0 if fn is one_hot_rows else 1].fill_(9)
        before = [a.clone() for a in bad]
        with pytest.raises(Exception) as expected:
            fn(*(a.clone() for a in bad))
        with pytest.raises(type(expected.value), match=r"\(aten\.\w+\.\w+\)\n.*test_inductor.py:\d+"):
            jf(*bad)
        assert all(torch.equal(a, b) for a, b in zip(bad, before))


def test_seed_program_and_kv_cache_write_match_eager():
    check(seed_program, torch.randn(8, 8), torch.randn(8, 8), executor="inductor")
    jk = check(
        kv_cache_write,
        torch.zeros(1, 2, 8, 4),
        torch.zeros(1, 2, 8, 4),
        torch.randn(1, 2, 4),
        torch.randn(1, 2, 4),
        3,
        executor="inductor",
    )
    assert [r.mode for r in dealias.explain(jk)] == ["in place", "in place"]


def double_then_sin(x):
    x.mul_(2)
    return x.sin()


def test_what_cannot_be_fused_runs_on_the_torch_executor():
    jf = dealias.jit(double_then_sin, executor="inductor")
    x = torch.randn(3, requires_grad=True) * 1
    jf(x).sum().backward()
    assert "not fused, write_back_now runs in Python" in str(dealias.last_traces(jf)[3])


def test_unknown_executor_is_refused():
    with pytest.raises(ValueError, match="executor"):
        dealias.jit(seed_program, executor="xla")


def second_moment(v, g):
    v.mul_(0.999).addcmul_(g, g, value=0.001)
    return v.sqrt()


def test_a_tensor_written_whole_twice_is_stored_once():
    jf = check(second_moment, torch.rand(64), torch.randn(64), executor="inductor")
    gm = fused_graph(jf)
    assert targets(gm).count(torch.ops.aten.copy_.default) == 1
    assert SNAPSHOT not in targets(gm)


def scale_rows(x):
    x[1:].mul_(2)
    return x.sum()


def test_a_written_input_saved_by_autograd_before_makes_backward_raise():
    # Inductor's kernels write through pointers and move no version counter: the call moves it, or the
    # backward of `w * x` (saved before the call) would silently take x's new values (it gave grad 2, not an error).
    jf = dealias.jit(scale_rows, executor="inductor")
    jf(torch.ones(3))
    assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]
    for fn in (scale_rows, jf):
        x = torch.ones(3)
        w = torch.ones(3, requires_grad=True)
        y = (w * x).sum()
        version = x._version
        fn(x)
        assert x._version > version
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


def cumsum_of_detached(x):
    return x.detach().cumsum(1)


def test_fused_kernels_record_no_autograd():
    # inductor's decompositions turn detach() into alias, and its aten fallback (cumsum) recorded autograd on
    # the input: the output required grad where eager's does not (fuzz seed 940102).
    check(cumsum_of_detached, torch.randn(3, 4, requires_grad=True), executor="inductor")


def sgd_step(p, g):
    with torch.no_grad():
        p.add_(g, alpha=-0.1)


def test_optimizer_step_on_parameters_is_fused():
    # Parameters require grad, but the step reads and writes them under no_grad: nothing saves them, so the
    # graph takes no protective clone of them and nothing in it records autograd.
    jf = check(sgd_step, torch.randn(16, requires_grad=True), torch.randn(16), executor="inductor")
    assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]


def adam_state(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [t for state in opt.state.values() for t in state.values()]


@pytest.mark.parametrize("kind", ["adam", "sgd", "adagrad_loop"])
def test_a_foreach_optimizer_step_is_fused_without_snapshots(kind):
    # Each result of a foreach op reads only its own parameter's tensors, so writing the first parameter is no
    # hazard for the others' new values: the step takes no snapshot (it took 40 for 10 parameters, each a copy of
    # a whole tensor through a Python custom op, 1.7-2.4x eager's time). Parameters and state (exp_avg,
    # exp_avg_sq, step; SGD's momentum buffers) stay within the fused tolerance of the torch executor's over
    # several steps, and near eager's: under dynamo Adam computes its bias corrections from the step tensors in
    # float32 tensor arithmetic (eager: Python floats from `.item()`), 2e-4 apart relative after two steps with
    # either executor, and with torch.compile.
    def make():
        torch.manual_seed(0)
        ps = [torch.randn(8, 5, requires_grad=True) for _ in range(3)] + [torch.randn(7, requires_grad=True)]
        for p in ps:
            p.grad = torch.randn_like(p)
        if kind == "adam":
            return ps, torch.optim.Adam(ps, lr=0.1, foreach=True)
        if kind == "adagrad_loop":  # (foreach=False: `p.addcdiv_(g, std, value=-clr)` with a 0-d tensor clr)
            return ps, torch.optim.Adagrad(ps, lr=0.1, foreach=False)
        return ps, torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, foreach=True)

    (pe, oe), (pt, ot), (pf, of) = make(), make(), make()
    jt, jf = dealias.jit(ot.step), dealias.jit(of.step, executor="inductor")
    for step in range(4):
        oe.step()
        jt()
        jf()
        msg = lambda m, s=step: f"step {s}: {m}"  # noqa: E731
        for e, t, f in zip(pe + adam_state(oe), pt + adam_state(ot), pf + adam_state(of)):
            torch.testing.assert_close(f, t, rtol=1e-5, atol=1e-6, msg=msg)
            torch.testing.assert_close(t, e, rtol=1e-3, atol=1e-5, msg=msg)
        for group in (pt, pf, pe):  # (new gradients: the program reads them, not the values it was compiled with)
            torch.manual_seed(step)
            for p in group:
                p.grad.copy_(torch.randn_like(p))
    assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]
    assert SNAPSHOT not in targets(fused_graph(jf))
    assert not python_ops(fused_graph(jf))


def python_ops(gm) -> list:
    """The ops of a fused graph inductor calls through Python and the dispatcher: dealias's own, but the snapshot
    (lowered to a copy in inductor's code: test_a_snapshot_is_a_copy_in_inductors_code_not_a_python_call)."""
    return [t for t in targets(gm) if getattr(t, "namespace", None) == "dealias" and t is not SNAPSHOT]


def adam_like_update(p, m, v, g, step):
    # A 0-d tensor as the Scalar of an in-place op (an optimizer's bias corrections): traced as dealias::addcdiv_
    # and friends (compat/tensor_scalars.py), which inductor called as Python extern kernels.
    bc = 1 - 0.9**step
    m.addcmul_(g, g, value=bc)
    v.add_(g, alpha=bc * 2)
    p.addcdiv_(m, v.abs() + 1, value=-0.1 / bc)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_tensor_as_the_scalar_of_an_in_place_op_is_fused_arithmetic(dtype):
    args = [torch.randn(64, dtype=dtype) for _ in range(4)] + [torch.tensor(3.0)]
    jf = check(adam_like_update, *args, executor="inductor")
    assert jf.last.tier == "fused"
    if dtype is torch.bfloat16:  # (eager's kernel kept: inductor's fused bfloat16 operands are not rounded)
        assert len(python_ops(fused_graph(jf))) == 3
    else:
        assert not python_ops(fused_graph(jf)), python_ops(fused_graph(jf))


def cumsum_of_ones(x):
    return x.new_ones((3, 4, 2)).cumsum(1)


def test_results_have_eagers_strides():
    # inductor returned this constant as an expanded tensor, strides (0, 1, 0) (fuzz seed 950052)
    check(cumsum_of_ones, torch.randn(3, 4, 2), executor="inductor")


def tiers_of_slice_write_calls(jf, calls: int) -> list:
    """Call the tiered `jf` of slice_write `calls` times, each compared with eager; the tiers after each call."""
    tiers = []
    for _ in range(calls):
        buf, row = torch.randn(256, 64), torch.randn(64)
        expected = buf.clone()
        slice_write(expected, row)
        jf(buf, row)
        torch.testing.assert_close(buf, expected)
        tiers.append(dealias.cache_info(jf).tiers)
    return tiers


def fake_times(monkeypatch, **seconds: float) -> list[str]:
    """executor="tiered" measures each tier on the calls (frontend/tiers.py): make `tiers.measure` say each call on
    tier t took seconds[t], and each tier need one timed call (after its untimed first one); the tiers measured."""
    from dealias.frontend import tiers

    ran: list[str] = []

    def measure(tier, run, leaves):
        ran.append(tier)
        return run(leaves), seconds[tier]

    monkeypatch.setattr(tiers, "measure", measure)
    monkeypatch.setattr(tiers, "clock", lambda: 0.0)  # (a call with autograd history: no time until the next)
    monkeypatch.setattr(tiers, "SAMPLES", 1)
    monkeypatch.setattr(tiers, "BACKGROUND", False)  # (compiled in the promoting call: the calls are counted)
    return ran


def test_tiered_executor_fuses_a_program_once_it_has_run_often(monkeypatch):
    from dealias.frontend import tiers

    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 3)
    ran = fake_times(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    jf = dealias.jit(slice_write, executor="tiered")
    # calls 1-2: the exact tiers' first calls; 3: fused (compiled on its PROMOTE_AFTER-th call); 4-6: one timed
    # call each, and the fastest kept
    assert tiers_of_slice_write_calls(jf, 7) == [("torch",)] * 5 + [("fused",)] * 2
    assert ran == ["torch", "graph", "fused", "torch", "graph", "fused"]  # (then nothing is timed)
    info = dealias.cache_info(jf)
    assert (info.misses, info.hits) == (1, 6)
    assert info.timings == ({"torch": 2e-5, "graph": 3e-5, "fused": 1e-5},)
    assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]


def test_tiered_executor_fuses_a_program_whose_calls_take_long_sooner(monkeypatch):
    from dealias.frontend import tiers

    monkeypatch.setattr(tiers, "PROMOTE_AFTER_SECONDS", 1e-9)  # any call on the torch executor takes longer
    ran = fake_times(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    jf = dealias.jit(slice_write, executor="tiered")
    assert tiers_of_slice_write_calls(jf, 6)[-1] == ("fused",)
    assert ran[:3] == ["torch", "graph", "fused"]  # compiled on the second call (PROMOTE_AFTER is 16)


def test_tiered_executor_keeps_what_cannot_fuse_on_the_torch_executor(monkeypatch):
    from dealias.frontend import tiers

    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 2)
    fake_times(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    jf = dealias.jit(kv_write, executor="tiered")
    for p in range(6):
        args = torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
        jf(*args, torch.tensor([p]))
    assert dealias.cache_info(jf).tiers == ("fused",)
    jg = dealias.jit(double_then_sin, executor="tiered")
    for _ in range(6):
        x = torch.randn(3, requires_grad=True) * 1
        jg(x).sum().backward()
    assert dealias.cache_info(jg).tiers == ("torch (not fusable)",)


def exp_then_sin(x):
    x.copy_(x.exp().sin())


def test_verify_runs_with_the_fused_executor():
    # verify=True compares a fused program with eager at the fused tolerance (1e-4; 1e-5 for the torch executor).
    jf = dealias.jit(exp_then_sin, executor="inductor", verify=True)
    for _ in range(2):
        jf(torch.linspace(-2, 2, 64))
    assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]


def gelu_then_scale(x, out):
    out.copy_(torch.nn.functional.gelu(x) * 2)


def gelu_then_scale_small(x, out):  # a code object of its own: dynamo would make gelu_then_scale's sizes symbolic
    out.copy_(torch.nn.functional.gelu(x) * 2)


def test_ops_inductor_runs_slower_stay_atens_kernels_inside_fused_graphs():
    # gelu is on the measured keep-ATen list: on a large tensor ATen's kernel runs it (bit-equal to eager, which
    # inductor's own code is not), and the scale and the store around it are still fused; on a small one
    # inductor's code runs (a kernel of its own would cost more there).
    n = KEEP_ATEN_MIN_NUMEL
    jf = check(gelu_then_scale, torch.randn(n) * 3, torch.zeros(n), executor="inductor")
    assert jf.last.tier == "fused"
    assert torch.ops.dealias.aten_gelu.default in targets(fused_graph(jf))
    small = dealias.jit(gelu_then_scale_small, executor="inductor")
    small(torch.randn(n // 2), torch.zeros(n // 2))
    assert small.last.tier == "fused"
    assert torch.ops.dealias.aten_gelu.default not in targets(fused_graph(small))


def decode_attention(kc, vc, q, k, v, pos: int, mask):
    kc[:, :, pos] = k
    vc[:, :, pos] = v
    return torch.nn.functional.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)


@pytest.mark.parametrize("keys", [64, 2048])
def test_short_attention_runs_by_matmuls_and_long_attention_by_the_flash_kernel(keys):
    mask = torch.zeros(1, 1, 1, keys, dtype=torch.bool)
    mask[..., :40] = True
    args = (torch.randn(1, 2, keys, 8), torch.randn(1, 2, keys, 8), torch.randn(1, 2, 1, 8))
    # A code object per size: dynamo would make the second size symbolic (automatic dynamic), which is not fused.
    fn = types.FunctionType(decode_attention.__code__.replace(co_name=f"decode_attention_{keys}"), globals())
    jf = check(fn, *args, torch.randn(1, 2, 8), torch.randn(1, 2, 8), 39, mask, executor="inductor")
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert (flash in targets(fused_graph(jf))) == (keys > 1024)
    assert [r.mode for r in dealias.explain(jf)] == ["in place", "in place"]


def decode_attention_rotary(kc, vc, q, cos, sin, k, v, pos: int, mask):
    kc[:, :, pos] = k
    vc[:, :, pos] = v
    q = q * cos + q.flip(-1) * sin  # (a rotary embedding's shape of computation: pointwise over q)
    return torch.nn.functional.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)


def test_short_attention_over_computed_queries_keeps_the_flash_kernel():
    # By matmuls, inductor would compute q's expression inside the product with each key (HF Llama's decode step)
    keys = 64
    mask = torch.zeros(1, 1, 1, keys, dtype=torch.bool)
    mask[..., :40] = True
    args = (torch.randn(1, 2, keys, 8), torch.randn(1, 2, keys, 8), torch.randn(1, 2, 1, 8))
    rotary = (torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8))
    jf = check(
        decode_attention_rotary,
        *args,
        *rotary,
        torch.randn(1, 2, 8),
        torch.randn(1, 2, 8),
        39,
        mask,
        executor="inductor",
    )
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in targets(fused_graph(jf))


def test_a_tiered_program_runs_on_the_torch_executor_where_the_fused_ones_guard_fails(monkeypatch):
    # Inductor's decisions about a program's symbols may add guards to it: the fused program then holds for fewer
    # calls than the cache entry (made with the torch executor's guard) lets in. Those calls run the exact tier.
    from dealias.frontend import tiers

    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 2)
    fake_times(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    compile_program = tiers.compile_program
    rejected = []

    def narrowed(gm, leaves, names, executor, symbolic=None):
        program = compile_program(gm, leaves, names, executor, symbolic)
        if executor == "inductor":
            guard = program.shape_guard
            pos = lambda call: next(x for x in call if isinstance(x, int))
            holds = lambda call: guard(call) and pos(call) <= 6
            program.shape_guard = lambda call: holds(call) or rejected.append(pos(call))
            program.shape_guard.text = f"{guard.text} and pos <= 6"
        return program

    monkeypatch.setattr(tiers, "compile_program", narrowed)
    jf = dealias.jit(decode_prefix, executor="tiered")
    caches, eager_caches = [torch.zeros(1, 2, 16, 8) for _ in range(2)], [torch.zeros(1, 2, 16, 8) for _ in range(2)]
    for pos in range(9):
        q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 8), torch.randn(1, 2, 8)
        torch.testing.assert_close(jf(*caches, q, k, v, pos), decode_prefix(*eager_caches, q, k, v, pos))
        torch.testing.assert_close(caches, eager_caches)
    # pos 0 specialized: one call, never promoted; pos 1-8 over a symbol: fused compiled at pos 2, chosen at 6
    assert dealias.cache_info(jf).tiers == ("torch", "fused")
    assert rejected == [7, 8]


def real_part_add_(c, x):
    c.real.add_(x)
    return c


def view_as_real_column_add_(c, x):
    torch.view_as_real(c)[:, 0].add_(x)
    return c


def imag_zeroed_then_abs(c, x):
    c.imag.zero_()
    return c.abs() + x


@pytest.mark.parametrize("fn", [real_part_add_, view_as_real_column_add_, imag_zeroed_then_abs])
def test_writes_through_real_views_of_complex_tensors_stay_on_the_torch_executor(fn):
    # Inductor generates no code for complex ops and falls back to ATen's: a write through `view_as_real(c)`
    # then never reached the caller's tensor (silently: `c` came back unchanged, `c.abs()` read the old values).
    c = torch.tensor([1 + 2j, 3 + 4j, -5 + 1j], dtype=torch.complex64)
    jf = check(fn, c, torch.tensor([10.0, 20.0, 30.0]), executor="inductor")
    assert jf.last.tier == "torch"
    assert "complex" in dealias.last_traces(jf)[-1].text


def test_a_graph_kept_on_the_torch_executor_is_named_in_one_warning_with_its_reason():
    # executor="inductor" ran such graphs on the torch executor silently (seen only in cache_info().tiers): one
    # NotFusedWarning names the function and says why, once for the graph however many layouts it compiles.
    jf = dealias.jit(real_part_add_, executor="inductor")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 3, 5, 5):  # (two layouts: two compiles of the graph, one warning)
            c = torch.complex(torch.randn(n), torch.randn(n))
            x = torch.randn(n)
            diff = compare_call(real_part_add_, jf, (c, x))
            assert diff is None, diff
    told = [str(w.message) for w in caught if issubclass(w.category, dealias.NotFusedWarning)]
    assert len(told) == 1, told
    assert "real_part_add_ runs on the torch executor, not fused: complex tensors" in told[0]
    assert "test_inductor.py" in told[0]  # (the graph's source line)
    assert not [w for w in caught if issubclass(w.category, dealias.FallbackWarning)]
    info = dealias.cache_info(jf)
    assert info.tiers == ("torch", "torch")
    assert all(r.startswith("not fused: complex tensors") for r in info.tier_reasons), info.tier_reasons


def test_a_fused_graph_gives_no_not_fused_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.NotFusedWarning)
        jf = check(flip_in_place, torch.randn(4), executor="inductor")
    assert jf.last.tier == "fused"


def add_to_first_row(x):
    x[0].add_(1)
    return x.sum()


def test_a_write_of_an_inference_tensor_outside_inference_mode_raises_eagers_error():
    # Inductor's kernels write through a view of an inference tensor without eager's check; the torch executor's
    # ops raise it, so such inputs are not fused.
    jf = dealias.jit(add_to_first_row, executor="inductor")
    for f in (add_to_first_row, jf, jf):
        with torch.inference_mode():
            x = torch.ones(2, 3)
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
            f(x)


def sgd_through_data(params, lr):
    for p in params:
        p.data.add_(p.grad, alpha=-lr)


def test_a_step_through_data_fuses():
    # The graph reads each parameter through a clone that requires grad, so autograd "records" it, but no result
    # requires grad: nothing recorded is observable, and fused_autograd refuses writes of inputs that require
    # grad. It ran on the torch executor; it fuses, the parameters' counters left as eager's (x.data).
    jf = dealias.jit(sgd_through_data, executor="inductor")
    for _ in range(2):
        params = [torch.nn.Parameter(torch.randn(64)) for _ in range(3)]
        for p in params:
            p.grad = torch.randn(64)
        expected = [p.detach() + p.grad * -0.1 for p in params]
        versions = [p._version for p in params]
        jf(params, 0.1)
        for p, e in zip(params, expected):
            torch.testing.assert_close(p.detach(), e)
        assert [p._version for p in params] == versions
    assert dealias.cache_info(jf).tiers == ("fused",)


def relu_then_hidden_write(x0, x1):
    x1.relu_()
    x0.detach().mul_(0.5)
    return x1


def relu_then_no_grad_write(x0, x1):
    x1.relu_()
    with torch.no_grad():
        x0.add_(x0)
    return x1


@pytest.mark.parametrize("fn", [relu_then_hidden_write, relu_then_no_grad_write])
def test_an_op_recorded_on_a_callers_tensor_is_not_run_unrecorded(fn):
    # No result requires grad but x1's own relu_ is recorded on x1 itself: the fused executor (no autograd) would
    # drop relu's mask from x1's gradient (found by fuzzing, seed 2220015).
    def make_args():
        return (torch.randn(4, requires_grad=True) * 1, torch.tensor([-1.0, 2.0, -3.0, 4.0], requires_grad=True) * 1)

    jf = dealias.jit(fn, executor="inductor")
    grads_like_eager(fn, jf, make_args)
    out = jf(*make_args())
    assert type(out.grad_fn).__name__ == "ReluBackward0"


def scaled_update(x, g, lr):
    x.add_(g, alpha=-lr)
    return x * lr


def foreach_decay_step(ps, gs, lr, wd):
    torch._foreach_mul_(ps, 1 - lr * wd)
    torch._foreach_add_(ps, torch._foreach_mul(gs, -lr))


def clamped_to_lr(x, lr):
    x.clamp_(max=lr)  # (clamp's bound: no tensor form for tensorify_python_scalars: the float stays a float)
    return x + 1


@pytest.mark.parametrize(
    "fn, make, fused",
    [
        (scaled_update, lambda: (torch.randn(8), torch.randn(8)), True),
        (foreach_decay_step, lambda: ([torch.randn(5) for _ in range(3)], [torch.randn(5) for _ in range(3)]), True),
        (clamped_to_lr, lambda: (torch.randn(8),), False),
    ],
)
def test_a_float_that_changes_every_call_is_fused_once_for_all_its_values(fn, make, fused):
    # A learning rate that changes (a schedule) becomes a float input after its second value (frontend/floats.py).
    # Inductor compiles no code for a float symbol: such graphs ran on the torch executor. Taken as a 0-d float64
    # tensor input with its arithmetic as tensor arithmetic, one fused program serves every value; where that
    # cannot be done, the torch executor runs the graph, over the float still (no compile per value).
    jf = dealias.jit(fn, executor="inductor")
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for lr in (0.1, 0.2, 0.3, 0.05):
            extra = (0.01,) if fn is foreach_decay_step else ()
            diff = compare_call(fn, jf, (*make(), lr, *extra))
            assert diff is None, f"lr={lr}: {diff}"
    info = dealias.cache_info(jf)
    assert info.misses == 2 and info.dynamic == ("lr",), info  # (the first value specialized, then one for all)
    told = [str(w.message) for w in caught if issubclass(w.category, dealias.NotFusedWarning)]
    if fused:
        assert info.tiers == ("fused", "fused") and not told, (info, told)
    else:
        assert info.tiers == ("fused", "torch"), info
        assert len(told) == 1 and "a float input inductor cannot take" in told[0], told


def add_position_embedding(x, wpe, out):
    pos = torch.arange(x.shape[0])  # (GPT-2's position ids: computed from nothing of the call's)
    out.copy_(x + torch.nn.functional.embedding(pos, wpe))


def test_an_index_computed_from_nothing_of_the_calls_is_computed_and_checked_once():
    # The prologue computed such an index with aten calls from Python on every call (GPT-2's forward: 7% of its
    # time), and checked it: its values and its check's outcome are the same on every call.
    jf = check(add_position_embedding, torch.randn(6, 4), torch.randn(8, 4), torch.zeros(6, 4), executor="inductor")
    assert jf.last.tier == "fused"
    args = (torch.randn(6, 4), torch.randn(8, 4), torch.zeros(6, 4))
    with torch.profiler.profile() as prof:
        for _ in range(3):
            jf(*args)
    assert not [e.name for e in prof.events() if e.name == "aten::arange"]
    # Out of range (a table of 5 positions for 6 rows): eager's error on every call, before the write.
    short = dealias.jit(add_position_embedding, executor="inductor")
    for _ in range(3):
        out = torch.zeros(6, 4)
        with pytest.raises(IndexError, match="index out of range"):
            short(torch.randn(6, 4), torch.randn(5, 4), out)
        assert not out.any()


def embed_tokens_and_positions(ids, wte, wpe, out):
    pos = torch.arange(ids.shape[-1])  # (GPT-2's forward: token ids viewed, positions from nothing of the call's)
    emb = torch.nn.functional.embedding
    out.copy_(emb(ids.view(-1, ids.shape[-1]), wte)[0] + emb(pos, wpe))


def test_an_index_from_nothing_is_computed_once_beside_one_of_the_calls():
    # GPT-2's prologue has both: its position ids (the same values on every call) and a view of the call's token ids
    # (checked on every call). The position ids were computed again on every call with the ids' view.
    make = lambda: (torch.tensor([[1, 0, 2, 1]]), torch.randn(3, 4), torch.randn(6, 4), torch.zeros(4, 4))  # noqa: E731
    jf = check(embed_tokens_and_positions, *make(), executor="inductor")
    assert jf.last.tier == "fused"
    args = make()
    with torch.profiler.profile() as prof:
        for _ in range(3):
            jf(*args)
    assert not [e.name for e in prof.events() if e.name == "aten::arange"]
    for _ in range(2):  # the call's ids out of range: eager's error on every call, before the write
        ids, wte, wpe, out = make()
        ids[0, 2] = 3
        with pytest.raises(IndexError, match="index out of range"):
            jf(ids, wte, wpe, out)
        assert not out.any()
        a = make()
        b = tuple(t.clone() for t in a)
        jf(*a)
        embed_tokens_and_positions(*b)
        torch.testing.assert_close(a[3], b[3], rtol=0, atol=0)
