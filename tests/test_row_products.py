"""Products of a few rows by a weight (a decode step's linear layers) handed to inductor as a reduction where that
is faster on this host than ATen's mm (runtime/row_products.py): which products qualify, the verdict measured once
and kept on disk, and the results against eager's (the caller's cache written too)."""

from __future__ import annotations

import types

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
    if case == "16 rows":
        args = (*args[:3], torch.zeros(8, K), 3)
    assert products(fused_targets(linear_step, *args)) == [aten.addmm.default, aten.mm.default]


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    monkeypatch.setenv("DEALIAS_ROW_PRODUCTS", "measure")
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(keep_aten, "_memory", {})
    return tmp_path


def test_the_verdict_is_measured_once_per_dtype_and_row_count_and_kept(measuring, monkeypatch):
    asked = []

    def measure(dtype, rows):  # one row: the reduction 2x faster than ATen's; two rows: a tie
        asked.append((dtype, rows))
        return (2.0, 1.0) if rows == 1 else (1.0, 1.0)

    monkeypatch.setattr(row_products, "measure", measure)
    assert products(fused_targets(linear_step, *step_args())) == []
    assert products(fused_targets(linear_step, *step_args(rows=2))) == [aten.addmm.default, aten.mm.default]
    assert asked == [(torch.float32, 1), (torch.float32, 2)]
    (saved,) = measuring.glob("keep_aten-*.json")  # (kept with the keep-ATen verdicts)
    assert "mm by reduction|torch.float32|rows=1" in saved.read_text()

    monkeypatch.setattr(keep_aten, "_memory", {})  # a later process: read from disk, not measured again
    monkeypatch.setattr(row_products, "measure", lambda *a: pytest.fail("measured again"))
    assert products(fused_targets(linear_step, *step_args())) == []


def test_measure_times_both_kernels():
    aten_s, inductor_s = row_products.measure(torch.float32, 1)
    assert 0 < aten_s < 0.1 and 0 < inductor_s < 0.1
