"""compat/inductor.py and runtime/inductor_fixes.py: a view of a computed value handed to ATen's matmul is passed
with the strides a contiguous layout gives its dims of size 1, not inductor's 0 (with which ATen's mm copies the
matrix first); a variance is computed in two passes, not by Welford's algorithm; for dealias's compiles only."""

from __future__ import annotations

import copy
import types
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import dealias
from dealias.runtime import inductor_fixes


def decode_linears(x, g, w1, w2, w3):
    # The head of a Llama layer at one token: RMS norm, then three projections of the same normed row.
    h = g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    return F.linear(h, w1), F.linear(h, w2), F.linear(h, w3)


def ops_of_a_call(fn, args):
    with torch.profiler.profile() as prof:
        fn(*args)
    return [e.name for e in prof.events()]


def test_a_decode_steps_linears_call_atens_mm_without_copying_their_row(monkeypatch):
    # (Left to ATen's mm, as one-row products are where inductor's reduction is not faster: row_products.py.)
    monkeypatch.setenv("DEALIAS_ROW_PRODUCTS", "aten")
    args = (torch.randn(1, 1, 256), torch.randn(256), *(torch.randn(256, 256) for _ in range(3)))
    jf = dealias.jit(decode_linears, executor="inductor")
    torch.testing.assert_close(jf(*args), decode_linears(*args))
    assert jf.last.tier == "fused"
    ops = ops_of_a_call(jf, args)
    assert ops.count("aten::mm") == 3
    # Before the fix each mm copied its (1, 256) row, strided (0, 1), into a contiguous one.
    assert "aten::clone" not in ops and "aten::copy_" not in ops
    torch.testing.assert_close(jf(*args), decode_linears(*args))


def test_other_compiles_in_the_process_see_inductor_unchanged():
    args = (torch.randn(1, 1, 256), torch.randn(256), *(torch.randn(256, 256) for _ in range(3)))
    dealias.jit(decode_linears, executor="inductor")(*args)  # (the correction is installed by now)
    tc = torch.compile(_own_code(decode_linears), backend="inductor")
    torch.testing.assert_close(tc(*args), decode_linears(*args))
    # inductor's own strides (0, 1) for torch.compile's graph: ATen's mm copies the row of at least one matmul
    # (should torch fix pytorch issue 174869, this fails: the correction is then to be removed).
    assert "aten::clone" in ops_of_a_call(tc, args)


def _own_code(fn, suffix="tc"):
    return types.FunctionType(fn.__code__.replace(co_name=f"{fn.__name__}_{suffix}"), fn.__globals__, fn.__name__)


def bn_step(bn, x):
    return bn(x).relu()


def inductor_code(fn, *args):
    """`fn(*args)` and the code inductor generated meanwhile."""
    from torch._inductor.graph import GraphLowering

    codes = []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        return fn(*args), "\n".join(codes)


def test_batch_norm_statistics_in_two_passes_not_welfords():
    # 4,096 elements per channel: over inductor's own threshold (1,024), under TWO_STEP_MAX_BYTES.
    bn, x = torch.nn.BatchNorm2d(8), torch.randn(4, 8, 32, 32)
    ref_bn, ref_x = copy.deepcopy(bn), x.clone().requires_grad_()
    x.requires_grad_()
    out, code = inductor_code(dealias.jit(_own_code(bn_step, "dealias"), executor="inductor"), bn, x)
    assert "kernel" in code and "welford" not in code.lower()
    expected = bn_step(ref_bn, ref_x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(bn.running_mean, ref_bn.running_mean)
    torch.testing.assert_close(bn.running_var, ref_bn.running_var)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    # (sums of 4,096 products each, in another order than eager's: a few float32 roundings apart)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(bn.weight.grad, ref_bn.weight.grad, rtol=1e-4, atol=1e-4)
    # torch.compile in the same process: inductor's own choice, Welford's algorithm
    _, code = inductor_code(torch.compile(_own_code(bn_step), backend="inductor"), copy.deepcopy(ref_bn), x.detach())
    assert "welford" in code.lower()


def test_two_passes_keep_the_digits_of_a_channel_far_from_zero():
    # Inductor's own two-pass variance sums the values themselves: a channel at 1234.567 +- 1e-3 lost its mean's
    # low digits, and the normalized output was off by 1.5 (eager's by 0.006). Shifted by one of its elements,
    # the sums are of small differences.
    torch.manual_seed(0)
    bn, x = torch.nn.BatchNorm2d(8), torch.randn(16, 8, 32, 32)
    x[:, 0] = 1234.567 + 1e-3 * torch.randn(16, 32, 32)
    truth = copy.deepcopy(bn).double()(x.double())
    expected = copy.deepcopy(bn)(x)
    jf = dealias.jit(_own_code(bn_step, "far"), executor="inductor")
    out = jf(bn, x)
    assert jf.last.tier == "fused"
    eager_error = (expected.relu().double() - truth.relu()).abs().max()
    assert (out.double() - truth.relu()).abs().max() <= 2 * eager_error


def test_two_passes_in_float64_keep_an_outliers_neighbours():
    # An outlier among values near 1: shifted by the group's first element (an earlier version) the mean came out
    # 52 for 11; float32 sums of squares lose the small terms next to a large one.
    x = 1 + 1e-3 * torch.randn(2, 100_000)
    x[:, 0] = 1e6
    y = torch.randn(16, 8, 32, 32)
    y[0, :, 0, 0] = 1e4
    jf = dealias.jit(_own_code(variances_of_rows_and_channels, "outlier"), executor="inductor")
    got = jf(x, y)
    assert jf.last.tier == "fused"
    truth = variances_of_rows_and_channels(x.double(), y.double())
    for g, e, t in zip(got, variances_of_rows_and_channels(x, y), truth):
        assert ((g.double() - t).abs() / t.abs()).max() <= 2 * ((e.double() - t).abs() / t.abs()).max() + 1e-7


def variances_of_rows_and_channels(x, y):
    return (*torch.var_mean(x, 1), *torch.var_mean(y, (0, 2, 3), correction=0))


def test_values_near_float32s_largest_give_eagers_infinite_variance():
    # (x minus a shift by its first element overflowed in an earlier version: an infinite mean, a nan variance)
    x = torch.tensor([[2e38, -2e38, 1.0] * 400, [3e38, -3e38, 0.0] * 400])
    jf = dealias.jit(_own_code(var_mean_of_rows, "huge"), executor="inductor")
    var, mean = jf(x)
    assert jf.last.tier == "fused"
    assert torch.equal(var, var_mean_of_rows(x)[0]) and var.isinf().all()
    # (eager's mean of these depends on its summation order: 2.4e21 for 1/3; float64 sums give 1/3 and 0)
    assert mean.isfinite().all() and (mean.abs() < 1e22).all()


def var_mean_of_rows(x):
    return torch.var_mean(x, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_variances_of_every_shape_match_eager(dtype):
    # (bfloat16 and reductions of 1,024 elements or fewer: inductor's own lowering)
    x = (torch.randn(8, 1100, 200) * 3 + 50).to(dtype)
    jf = dealias.jit(_own_code(variances, str(dtype).split(".")[1]), executor="inductor")
    got = jf(x)
    assert jf.last.tier == "fused"
    torch.testing.assert_close(got, variances(x), rtol=1e-2 if dtype is torch.bfloat16 else 1e-5, atol=1e-3)


def variances(x):
    v, m = torch.var_mean(x, (0, 2), correction=0)
    return v, m, torch.var(x, 1, keepdim=True), torch.std(x, -1), torch.var_mean(x, 1, correction=2)


def test_a_variance_over_a_large_input_keeps_welfords():
    x = torch.randn((inductor_fixes.TWO_STEP_MAX_BYTES // 4) // 2048 + 8, 2048)
    out, code = inductor_code(dealias.jit(_own_code(var_mean_of_columns, "large"), executor="inductor"), x)
    assert "welford" in code.lower()
    torch.testing.assert_close(out, var_mean_of_columns(x))


def var_mean_of_columns(x):
    return torch.var_mean(x, 0)


def test_bfloat16_and_short_rows_keep_inductors_own_variance():
    # Float64 passes measured slower there than inductor's code: bfloat16 batch norm 2.5x (the conversions),
    # layer norm over rows of 768 1.4-1.9x (inductor's float32 two passes).
    bn, x = torch.nn.BatchNorm2d(8).to(torch.bfloat16), torch.randn(4, 8, 32, 32, dtype=torch.bfloat16)
    _, code = inductor_code(dealias.jit(_own_code(bn_step, "bf16"), executor="inductor"), bn, x)
    assert "welford" in code.lower() and "double" not in code
    ln, y = torch.nn.LayerNorm(768), torch.randn(64, 768)
    _, code = inductor_code(dealias.jit(_own_code(bn_step, "ln"), executor="inductor"), ln, y)
    assert "kernel" in code and "double" not in code


# --- which variance runs: measured once per host (float64 passes against inductor's Welford) ---------------------
@pytest.fixture
def measuring(monkeypatch, verdict_store):
    monkeypatch.setenv("DEALIAS_VARIANCE", "measure")
    return verdict_store


def bn_code_and_check(name, monkeypatch=None):
    """The code inductor generates for a BatchNorm2d training step (over its threshold), checked against eager."""
    bn, x = torch.nn.BatchNorm2d(8), torch.randn(4, 8, 32, 32)
    ref_bn = copy.deepcopy(bn)
    out, code = inductor_code(dealias.jit(_own_code(bn_step, name), executor="inductor"), bn, x)
    torch.testing.assert_close(out, bn_step(ref_bn, x))
    torch.testing.assert_close(bn.running_mean, ref_bn.running_mean)
    torch.testing.assert_close(bn.running_var, ref_bn.running_var)
    assert torch.equal(bn.num_batches_tracked, ref_bn.num_batches_tracked)
    return code


def test_where_float64_passes_measure_slower_inductors_welford_runs(measuring, monkeypatch):
    asked = []

    def measure():  # the float64 passes 2x slower than Welford's here
        asked.append(torch.get_num_threads())
        return 2.0, 1.0

    monkeypatch.setattr(inductor_fixes, "measure", measure)
    code = bn_code_and_check("slow_passes")
    assert "welford" in code.lower() and "double" not in code
    assert len(asked) == 1
    (saved,) = measuring.glob("keep_aten-*.json")  # (kept with the keep-ATen verdicts)
    assert "variance in float64 passes" in saved.read_text()

    from dealias.runtime import keep_aten

    monkeypatch.setattr(keep_aten, "_memory", {})  # a later process: read from disk, not measured again
    monkeypatch.setattr(inductor_fixes, "measure", lambda: pytest.fail("measured again"))
    assert "welford" in bn_code_and_check("slow_passes_again").lower()


def test_where_float64_passes_measure_faster_they_run(measuring, monkeypatch):
    monkeypatch.setattr(inductor_fixes, "measure", lambda: (1.0, 2.0))
    code = bn_code_and_check("fast_passes")
    assert "welford" not in code.lower() and "double" in code


def test_the_setting_pins_the_variance_and_keys_inductors_cache(monkeypatch):
    import pickle

    monkeypatch.setattr(inductor_fixes, "measure", lambda: pytest.fail("measured though pinned"))
    monkeypatch.setenv("DEALIAS_VARIANCE", "inductor")
    welford = inductor_fixes.decompositions()
    assert "welford" in bn_code_and_check("pinned_inductor").lower()
    monkeypatch.setenv("DEALIAS_VARIANCE", "float64")
    passes = inductor_fixes.decompositions()
    # inductor hashes the pickled table into its cache keys: the two must differ (one cached program must not
    # serve the other setting), and each must load back as the table it was
    assert pickle.dumps(welford) != pickle.dumps(passes)
    assert pickle.loads(pickle.dumps(welford)).keys() == welford.keys()
    assert torch.ops.aten.var_mean.correction in pickle.loads(pickle.dumps(passes))
    monkeypatch.setenv("DEALIAS_VARIANCE", "fast")
    with pytest.raises(ValueError, match="DEALIAS_VARIANCE='fast'"):
        inductor_fixes.decompositions()


def test_measure_times_both_lowerings():
    passes_s, welford_s = inductor_fixes.measure()
    assert 0 < passes_s < 0.1 and 0 < welford_s < 0.1
