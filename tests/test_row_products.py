"""Products of a few rows by a weight (a decode step's linear layers) handed to inductor as a reduction where that
is faster on this host than ATen's mm (runtime/row_products.py): which products qualify, the verdict measured once
and kept on disk, and the results against eager's (the caller's cache written too)."""

from __future__ import annotations

import types
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import dealias
from dealias.runtime import keep_aten, row_products

aten = torch.ops.aten
K = 512  # a 512 x 512 weight: above row_products' size floor (MIN_NUMEL)


def linear_step(x, w, b, cache, pos: int):
    h = F.linear(x, w, b)
    cache[pos] = h[0]
    return F.silu(h) @ w.t()


def plain_product(x, w):
    return (x @ w).relu()


def fresh(fn):
    """`fn` under a code object of its own: each test compiles anew (dynamo caches per code object)."""
    fresh.count += 1
    return types.FunctionType(fn.__code__.replace(co_name=f"{fn.__name__}_{fresh.count}"), globals())


fresh.count = 0


def fused_targets(fn, *args):
    """The ops of the graph handed to inductor for `fn(*args)`, after checking its results and writes against
    eager's on clones."""
    jf = dealias.jit(fresh(fn), executor="inductor")
    expected_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    expected = fn(*expected_args)
    got = jf(*args)
    assert jf.last.tier == "fused"
    torch.testing.assert_close(got, expected)
    for a, b in zip(args, expected_args):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b)
    return [n.target for n in jf.last.run_graph.graph.graph.nodes if n.op == "call_function"]


def step_args(rows=1, side=K):
    w = torch.randn(side, side) / side**0.5
    return torch.randn(rows, side), w, torch.randn(side), torch.zeros(8, side), 3


def products(targets):
    return [t for t in targets if t in (aten.mm.default, aten.addmm.default)]


def test_one_row_products_become_reductions_and_match_eager():
    targets = fused_targets(linear_step, *step_args())
    assert products(targets) == []
    assert targets.count(aten.sum.dim_IntList) == 2  # (the linear layer with its bias, and `@ w.t()`)


def mlp_step(x, w1, w2):
    return F.gelu(F.layer_norm(x, (K,)) @ w1.t()) @ w2.t()


def reduction_loops(code: str) -> list[str]:
    """The innermost loops of inductor's C++ `code` that accumulate a reduction, each from its `for(` line to its
    accumulating line."""
    loops, start = [], 0
    lines = code.splitlines()
    for i, line in enumerate(lines):
        if "for(" in line:
            start = i
        elif "tmp_acc0 = tmp_acc0 +" in line or "tmp_acc0_vec = tmp_acc0_vec +" in line:
            loops.append("\n".join(lines[start : i + 1]))
    return loops


def test_the_rows_are_computed_once_not_once_per_column():
    # Inductor inlines a pointwise row where the reduction reads it: a norm's row, a GELU's, was computed again for
    # each column of the weight (an MLP block of width 256: 8x slower than ATen's products). `dealias::row` makes
    # it a buffer of its own that the reductions load.
    from torch._inductor.graph import GraphLowering

    x, w1, w2 = torch.randn(1, K), torch.randn(K, K) / K**0.5, torch.randn(K, K) / K**0.5
    codes = []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        targets = fused_targets(mlp_step, x, w1, w2)
    assert products(targets) == [] and targets.count(row_products.ROW) == 2
    loops = reduction_loops("\n".join(codes))
    assert len(loops) >= 2  # (the two products; the norm's statistics too)
    assert not any("erf" in loop or "rsqrt" in loop or "sqrt" in loop for loop in loops)


def test_without_the_rows_lowering_the_rows_are_left_inlined():
    # `dealias::row` without its lowering would be a custom op called through Python per product: the products are
    # still reductions, their rows inlined as before.
    from dealias.compat.registry import forced_off

    x, w1, w2 = torch.randn(1, K), torch.randn(K, K) / K**0.5, torch.randn(K, K) / K**0.5
    with forced_off("inductor_snapshot_lowering"):
        targets = fused_targets(mlp_step, x, w1, w2)
    assert products(targets) == [] and row_products.ROW not in targets


@pytest.mark.parametrize(
    "case",
    [
        "weight not transposed",  # the reduction would run over w's strided dimension: 2-3x slower than ATen's
        "16 rows",  # above MAX_ROWS: the reduction reads the weight once per row
        "small weight",  # 64 x 64: under MIN_NUMEL
        "pinned to aten",
    ],
)
def test_products_that_stay_atens(case, monkeypatch):
    if case == "weight not transposed":
        args = (torch.randn(1, K), torch.randn(K, K) / K**0.5)
        assert products(fused_targets(plain_product, *args)) == [aten.mm.default]
        return
    if case == "pinned to aten":
        monkeypatch.setenv("DEALIAS_ROW_PRODUCTS", "aten")
    args = step_args(rows=16) if case == "16 rows" else step_args(side=64) if case == "small weight" else step_args()
    assert products(fused_targets(linear_step, *args)) == [aten.addmm.default, aten.mm.default]


@pytest.fixture
def measuring(monkeypatch, verdict_store):
    monkeypatch.setenv("DEALIAS_ROW_PRODUCTS", "measure")
    return verdict_store


def test_the_verdict_is_measured_once_per_dtype_and_row_count_and_kept(measuring, monkeypatch):
    asked = []

    def measure(dtype, rows):  # one row: the reduction 2x faster than ATen's; two rows: 10 % slower
        asked.append((dtype, rows))
        return (2.0, 1.0) if rows == 1 else (1.0, 1.1)

    monkeypatch.setattr(row_products, "measure", measure)
    assert products(fused_targets(linear_step, *step_args())) == []
    assert products(fused_targets(linear_step, *step_args(rows=2))) == [aten.addmm.default, aten.mm.default]
    assert asked == [(torch.float32, 1), (torch.float32, 2)]
    (saved,) = measuring.glob("keep_aten-*.json")  # (kept with the keep-ATen verdicts)
    assert "row products in a block|torch.float32|rows=1" in saved.read_text()

    monkeypatch.setattr(keep_aten, "_memory", {})  # a later process: read from disk, not measured again
    monkeypatch.setattr(row_products, "measure", lambda *a: pytest.fail("measured again"))
    assert products(fused_targets(linear_step, *step_args())) == []


@pytest.mark.parametrize("aten_s", [1.05, 1.0])
def test_a_reduction_faster_by_any_margin_in_the_measured_block_is_taken(measuring, monkeypatch, aten_s):
    # The block understates a program's gain (row_products.measure): no margin is asked of the reduction. A tie (a
    # measurement that failed counts as one) leaves ATen's products.
    monkeypatch.setattr(row_products, "measure", lambda dtype, rows: (aten_s, 1.0))
    expected = [] if aten_s > 1.0 else [aten.addmm.default, aten.mm.default]
    assert products(fused_targets(linear_step, *step_args())) == expected


def test_measure_times_inductors_code_both_ways_in_a_block(monkeypatch):
    # Inside a fused graph the choice is between ATen's product called from inductor's code, the norm and the
    # activation in kernels of their own, and one kernel computing them with the reduction: both are timed so.
    compiled = []

    def inductor_code(fn, xs):
        gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(*xs)
        compiled.append({n.target for n in gm.graph.nodes if n.op == "call_function"})
        return lambda args: fn(*args)

    monkeypatch.setattr(row_products, "inductor_code", inductor_code)
    aten_s, inductor_s = row_products.measure(torch.float32, 1)
    assert 0 < aten_s < 0.1 and 0 < inductor_s < 0.1
    with_aten, with_reductions = compiled
    assert aten.addmm.default in with_aten and aten.addmm.default not in with_reductions
    assert row_products.ROW in with_reductions
    for ops in compiled:  # (the norm and the GELU around the products)
        assert aten.native_layer_norm.default in ops and aten.gelu.default in ops


def test_measure_times_both_kernels():
    aten_s, inductor_s = row_products.measure(torch.float32, 1)
    assert 0 < aten_s < 0.1 and 0 < inductor_s < 0.1


def addmm_step(x, w, b):
    return torch.addmm(b, x, w.t())


@pytest.mark.parametrize(
    "bias",
    [
        torch.randn(3, K),  # rows that are not the product's
        torch.randn(K, 1),
        torch.randn(2, 1, K),  # more dims than the product
        torch.ones(K, dtype=torch.float64),  # another dtype
        torch.tensor(1),
    ],
    ids=["3 rows", "column", "3-d", "float64", "int 0-d"],
)
def test_a_bias_atens_addmm_rejects_gets_eagers_error(bias):
    # Fake tensors check neither the bias's shape nor its dtype: the product stays ATen's, whose kernel raises.
    x, w = torch.randn(1, K), torch.randn(K, K)
    with pytest.raises(RuntimeError) as expected:
        addmm_step(x, w, bias)
    with pytest.raises(RuntimeError) as got:
        dealias.jit(fresh(addmm_step), executor="inductor")(x, w, bias)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_products_round_once_as_atens(dtype):
    # Summed and biased in float32, rounded once: as close to eager's as to the exact value (a rounding of the
    # sum before the bias made 130-169 of 512 elements worse than eager's).
    x, w, b = torch.randn(1, K, dtype=dtype), (torch.randn(K, K) / K**0.5).to(dtype), torch.randn(K, dtype=dtype)
    jf = dealias.jit(fresh(addmm_step), executor="inductor")
    got, expected = jf(x, w, b), addmm_step(x, w, b)
    assert jf.last.tier == "fused"
    assert products([n.target for n in jf.last.run_graph.graph.graph.nodes if n.op == "call_function"]) == []
    exact = addmm_step(x.double(), w.double(), b.double())
    assert (got.double() - exact).abs().max() <= (expected.double() - exact).abs().max() * 1.01
    torch.testing.assert_close(got, expected)


def test_measuring_leaves_the_callers_random_numbers_alone(measuring):
    x, w = torch.randn(1, K), torch.randn(K, K)
    torch.manual_seed(0)
    dealias.jit(fresh(plain_product_t), executor="inductor")(x, w)  # (measures: no verdict on disk yet)
    got = torch.rand(3)
    torch.manual_seed(0)
    plain_product_t(x, w)
    assert torch.equal(got, torch.rand(3))


def plain_product_t(x, w):
    return x @ w.t()


def test_an_unknown_setting_is_named(monkeypatch):
    monkeypatch.setenv("DEALIAS_ROW_PRODUCTS", "inductr")
    with pytest.warns(dealias.FallbackWarning, match="DEALIAS_ROW_PRODUCTS='inductr'"):
        dealias.jit(fresh(plain_product_t), executor="inductor")(torch.randn(1, K), torch.randn(K, K))
