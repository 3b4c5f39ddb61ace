"""The fused executor (executor="inductor"): what it fuses and what it leaves to the torch executor (autograd,
complex tensors, inference tensors, changing floats), optimizer steps, ATen kernels kept inside fused graphs, and
its NotFusedWarning. Few and small: each compile costs seconds on CPU. (Snapshots: test_inductor_snapshots.py;
index checks: test_inductor_indices.py; the tiered executor: test_inductor_tiers.py.)"""

from __future__ import annotations

import types
import warnings

import pytest
import torch
from fused_harness import double_then_sin, flip_in_place, fused_graph, targets
from harness import check, compare_call, grads_like_eager

import dealias
from dealias.runtime.hazards import SNAPSHOT
from dealias.runtime.keep_aten import MIN_NUMEL as KEEP_ATEN_MIN_NUMEL
from dealias.tools.demo import kv_cache_write, seed_program


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


def test_what_cannot_be_fused_runs_on_the_torch_executor():
    jf = dealias.jit(double_then_sin, executor="inductor")
    x = torch.randn(3, requires_grad=True) * 1
    jf(x).sum().backward()
    assert "not fused, write_back_now runs in Python" in str(dealias.last_traces(jf)[3])


def test_unknown_executor_is_refused():
    with pytest.raises(ValueError, match="executor"):
        dealias.jit(seed_program, executor="xla")


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
    (lowered to a copy in inductor's code: test_inductor_snapshots.py)."""
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
