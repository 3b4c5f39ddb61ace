"""bench/real.py, the real workloads' benchmark, kept from rotting: one small workload end to end on the torch
executor (its exactness check against eager included), and the check itself catching a wrong result."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import real  # noqa: E402 - bench/ is not a package
from real_workloads import WORKLOADS, Workload  # noqa: E402


def test_one_workload_end_to_end(tmp_path):
    threads = torch.get_num_threads()
    out = tmp_path / "rows.json"
    try:
        argv = ["--only", "ema_foreach", "--rounds", "1", "--no-first-call", "--variants", "torch", "--json", str(out)]
        assert real.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    (row,) = json.loads(out.read_text())
    assert row["workload"] == "ema_foreach"
    assert row["check"] == {"torch": "exact"}  # bit for bit eager's, checked before timing
    assert row["tiers"] == {"torch": ["torch"]}
    assert row["warm"]["torch"]["calls"] >= real.MIN_WARM_CALLS
    assert row["eager_ms"] > 0 and row["ratio"]["torch"] > 0


def test_alone_times_each_variant_in_a_process_of_its_own(tmp_path):
    threads = torch.get_num_threads()
    out = tmp_path / "rows.json"
    try:
        argv = ["--alone", "--only", "ema_foreach", "--rounds", "1", "--no-first-call", "--variants", "torch"]
        assert real.main([*argv, "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    (row,) = json.loads(out.read_text())
    assert row["alone"] and row["check"] == {"torch": "alone"} and row["tiers"] == {"torch": ["torch"]}
    assert row["eager_ms"] > 0 and row["ratio"]["torch"] > 0


def _small(name: str, make) -> Workload:
    """A workload of real_workloads.py on small tensors: the check's cost is the tensors' copies and comparisons."""
    w = next(w for w in WORKLOADS if w.name == name)
    return Workload(w.name, w.title, w.fn, make)


def test_check_compares_mutations_with_eager():
    w = _small("ema_foreach", lambda: ([torch.randn(16, 16), torch.randn(16)], [torch.randn(16, 16), torch.randn(16)]))
    args = real.make_args(w)
    assert real.check(w.fn, w, args, exact=True) == "exact"

    def off_by_a_bit(ema, params):  # the EMA with another weight: a mutation eager does not make
        torch._foreach_lerp_(ema, params, 0.0010001)

    def off(ema, params):
        torch._foreach_lerp_(ema, params, 0.01)

    assert real.check(off_by_a_bit, w, args, exact=True).startswith("NOT BIT-EXACT: eager's state value")
    assert real.check(off_by_a_bit, w, args, exact=False) == "within tolerance"
    assert real.check(off, w, args, exact=False).startswith("WRONG: state value")


def _adam():
    params = [torch.nn.Parameter(torch.randn(8, 8)) for _ in range(2)]
    for p in params:
        p.grad = torch.randn_like(p)
    return (torch.optim.Adam(params, lr=1e-3, foreach=True),)


def test_check_compares_optimizer_state_and_grads():
    w = _small("adam_foreach", _adam)
    (opt,) = real.make_args(w)
    opt.step()  # state to copy: exp_avg, exp_avg_sq, step
    assert real.check(w.fn, w, (opt,), exact=True) == "exact"

    def also_scales_a_grad(o):
        o.step()
        o.param_groups[0]["params"][1].grad.mul_(2)

    assert real.check(also_scales_a_grad, w, (opt,), exact=True).startswith("WRONG: state value")


def test_user_programs_worst_call_over_repeats_is_their_median():
    # (bench/user_programs.py --repeats: one cold call's time swings 2x between compiled functions; the median of
    # several is the row's worst call 2..48, every one of them kept)
    import user_programs

    worsts = [{"call": 2, "ratio": r} for r in (6.35, 2.24, 3.9, 4)]
    assert user_programs._median_worst(worsts) == {"call": 2, "ratio": 3.9, "ratios": [6.35, 2.24, 3.9, 4]}  # (lower)
    assert user_programs._median_worst(worsts[:1]) == worsts[0]  # (one function: its worst call, as before)


def test_first_calls_refuse_a_warm_process_of_another_dealias_source(monkeypatch, tmp_path):
    # (mobilenet_train_bwd's default took 15.6 s warm, its warm first call 2.3-2.8 s: a file of the editable install
    # was saved between its cold and warm processes, whose caches are keyed on dealias's source hash)
    import subprocess

    sources: list[str] = []

    def child(cmd, **kwargs):  # (a first-call child's output, without its compile)
        line = json.dumps({"seconds": 30.0 if "--then-settle" in cmd else 2.0, "cpu": 1.0, "source": sources.pop(0)})
        return subprocess.CompletedProcess(cmd, 0, stdout=f"{line}\n", stderr="")

    monkeypatch.setattr(real.subprocess, "run", child)
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))  # (no keep-ATen verdicts to copy)
    w = next(w for w in WORKLOADS if w.name == "ema_foreach")
    sources += ["dealias-a", "dealias-a"]
    want = {"cold": 30.0, "cold cpu": 1.0, "warm": 2.0, "warm cpu": 1.0}
    assert real.first_calls(w, ["default"]) == {"default": want}
    sources += ["dealias-a", "dealias-b"]  # (a source file saved between the two processes)
    want = {"cold": 30.0, "cold cpu": 1.0, "warm": real.SOURCE_CHANGED}
    assert real.first_calls(w, ["default"]) == {"default": want}
    assert not sources
