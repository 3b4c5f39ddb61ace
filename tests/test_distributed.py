"""Distributed training under `torch.compile(..., backend="dealias")`: DDP and FSDP2 (`fully_shard`) with gloo on
CPU, two processes on 127.0.0.1, against the same training in eager.

One spawn runs every scenario (starting processes and importing torch costs seconds); each rank saves its
results with `torch.save` to a temporary directory, and each test compares one scenario's results with
eager's. A scenario that raises records its traceback instead of killing the rank, so the other scenarios
still run.

The comparisons are exact (`torch.equal`): dealias runs eager's own aten kernels, gloo's all-reduce of two
ranks on CPU sums the same two values whatever the order buckets become ready in (a + b == b + a in floating
point), and DDP divides by the world size the same way in both runs; FSDP2's reduce-scatter likewise.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
WORLD = 2
TIMEOUT = 120.0  # seconds for the whole spawn; the scenarios take about a minute on 2 CPU cores

# name -> (kind, mode, keyword arguments of the training function)
SCENARIOS: dict[str, tuple[str, str, dict[str, Any]]] = {}
for _mode in ("eager", "dealias"):
    # RunningCenter: buffers written in place in forward, none saved for backward. Step 1 accumulates two
    # micro-batches, the first under no_sync(); rank 0's buffers are broadcast before every forward.
    SCENARIOS[f"ddp_center_{_mode}"] = ("ddp", _mode, {"norm": "center", "accumulate_step": 1})
    SCENARIOS[f"ddp_center_local_buffers_{_mode}"] = ("ddp", _mode, {"norm": "center", "broadcast_buffers": False})
    # Parameters of more than 1 MiB, buckets of 1 MiB: DDPOptimizer splits dynamo's graph in several, each
    # compiled by dealias on its first real call (the backend gets fake example inputs).
    SCENARIOS[f"ddp_split_{_mode}"] = ("ddp", _mode, {"norm": "center", "width": 70000, "bucket_cap_mb": 1, "lr": 0.01})
    SCENARIOS[f"fsdp_center_{_mode}"] = ("fsdp", _mode, {"norm": "center"})
    # BatchNorm1d last: a scenario that fails on both ranks leaves the process group usable for the next one.
    SCENARIOS[f"ddp_batchnorm_{_mode}"] = ("ddp", _mode, {"norm": "batchnorm", "accumulate_step": 1})
    SCENARIOS[f"fsdp_batchnorm_{_mode}"] = ("fsdp", _mode, {"norm": "batchnorm"})
# dealias.jit(ddp_model): the same front end and backend as torch.compile(backend="dealias").
SCENARIOS["ddp_batchnorm_jit"] = ("ddp", "jit", {"norm": "batchnorm", "accumulate_step": 1})


def _examples() -> Any:
    if str(ROOT / "examples") not in sys.path:
        sys.path.insert(0, str(ROOT / "examples"))
    import train_ddp

    return train_ddp


def train_fsdp(mode: Any, steps: int = 3, *, lr: float = 0.1, **model_kwargs: Any) -> dict[str, Any]:
    """`steps` SGD-with-momentum steps of the example's model with FSDP2: each Linear and the root sharded."""
    from torch.distributed.fsdp import fully_shard

    ex = _examples()
    rank = torch.distributed.get_rank()
    torch._dynamo.reset()
    model = ex.make_model(**model_kwargs)
    fully_shard(model.fc1)
    fully_shard(model.fc2)
    fully_shard(model)
    run = ex.compiled(model, mode)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses, times = [], []
    for step in range(steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        x, y = ex.make_batch(rank, step)
        loss = torch.nn.functional.mse_loss(run(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return {"losses": losses, "times": times, **ex.snapshot(model, opt)}


def _run_scenario(kind: str, mode: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    from dealias import FallbackWarning
    from dealias.frontend.backend import Backend, Options, Stats

    counters.clear()
    stats = Stats()
    # The dealias backend as torch.compile(backend="dealias") makes it, with statistics we can read.
    split = mode == "dealias" and "bucket_cap_mb" in kwargs
    backend: Any = Backend(Options(), stats) if split else mode
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FallbackWarning)
        try:
            if kind == "ddp":
                result = _examples().train_ddp(backend, **kwargs)
            else:
                result = train_fsdp(backend, **kwargs)
        except Exception:  # noqa: BLE001 - reported by the test of this scenario
            result = {"error": traceback.format_exc()}
    result["fallbacks"] = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    result["graphs"] = len(stats.graphs)  # graphs the dealias backend got from DDPOptimizer's split
    result["dynamo_graphs"] = counters["stats"]["unique_graphs"]  # graphs dynamo compiled with the backend
    return result


def _worker(rank: int, port: int, out_dir: str, names: list[str]) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=30),  # a rank left waiting in a collective errors out, not hangs
    )
    results = {}
    try:
        for name in names:
            kind, mode, kwargs = SCENARIOS[name]
            results[name] = _run_scenario(kind, mode, kwargs)
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict[str, Any]]]:
    """scenario name -> the results of rank 0 and rank 1."""
    import torch.multiprocessing as mp

    names = list(SCENARIOS)
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _worker, args=(_free_port(), out_dir, names), nprocs=WORLD, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + TIMEOUT
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() > deadline:
                    pytest.fail(f"distributed workers did not finish within {TIMEOUT:.0f} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
        per_rank = [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]
    return {name: [per_rank[r][name] for r in range(WORLD)] for name in names}


def _assert_same(got: dict[str, Any], expected: dict[str, Any], where: str) -> None:
    assert "error" not in expected, f"{where}: eager raised:\n{expected['error']}"
    assert "error" not in got, f"{where}: dealias raised:\n{got['error']}"
    assert got["losses"] == expected["losses"], f"{where}: losses {got['losses']} != eager {expected['losses']}"
    for part in ("params", "grads", "buffers", "opt"):
        assert got[part].keys() == expected[part].keys(), f"{where}: {part} names differ"
        for name in expected[part]:
            a, b = got[part][name], expected[part][name]
            pairs = [(f"{name}.{k}", a[k], b[k]) for k in b] if isinstance(b, dict) else [(name, a, b)]
            for label, x, y in pairs:
                assert torch.equal(x, y), f"{where}: {part} {label} differs from eager by {(x - y).abs().max()}"


def _compare(results: dict[str, list[dict[str, Any]]], scenario: str, mode: str = "dealias") -> list[dict[str, Any]]:
    eager, dealias_ = results[f"{scenario}_eager"], results[f"{scenario}_{mode}"]
    for rank in range(WORLD):
        _assert_same(dealias_[rank], eager[rank], f"{scenario}, rank {rank}")
        assert dealias_[rank]["dynamo_graphs"] >= 1, f"{scenario}: dynamo compiled nothing with dealias"
    return dealias_


def _replicas_agree(runs: list[dict[str, Any]]) -> None:
    """DDP keeps every rank's parameters and optimizer state identical."""
    for part in ("params", "opt"):
        for name, x in runs[0][part].items():
            y = runs[1][part][name]
            same = all(torch.equal(x[k], y[k]) for k in x) if isinstance(x, dict) else torch.equal(x, y)
            assert same, f"{part} {name} differs between ranks"


def test_ddp_no_sync_and_broadcast_buffers(results):
    runs = _compare(results, "ddp_center")
    assert all(run["fallbacks"] == [] for run in runs), runs[0]["fallbacks"]
    assert len(runs[0]["losses"]) == 4  # 3 steps, one of them with two micro-batches
    _replicas_agree(runs)
    # broadcast buffers: each forward starts from rank 0's running mean, then adds the rank's own batch
    assert not torch.equal(runs[0]["buffers"]["bn.running_mean"], runs[1]["buffers"]["bn.running_mean"])


def test_ddp_local_buffers(results):
    runs = _compare(results, "ddp_center_local_buffers")
    assert all(run["fallbacks"] == [] for run in runs), runs[0]["fallbacks"]
    _replicas_agree(runs)


def test_ddp_graph_split_in_buckets(results):
    runs = _compare(results, "ddp_split")
    assert all(run["fallbacks"] == [] for run in runs), runs[0]["fallbacks"]
    assert all(run["graphs"] > 1 for run in runs), [run["graphs"] for run in runs]
    _replicas_agree(runs)


def test_fsdp2(results):
    runs = _compare(results, "fsdp_center")
    # Dynamo breaks the graph at FSDP2's hooks (torch._dynamo.config.skip_fsdp_hooks), so the sharded Linears
    # run eagerly and dealias gets the graph between them: RunningCenter's buffer updates, mul_ and relu_.
    # Whatever dealias cannot compile there must run eagerly with a FallbackWarning, with the exact values
    # checked above; today it all compiles.
    assert all(run["fallbacks"] == [] for run in runs), runs[0]["fallbacks"]


def test_ddp_batchnorm(results):
    _replicas_agree(_compare(results, "ddp_batchnorm"))


def test_ddp_batchnorm_with_dealias_jit(results):
    _replicas_agree(_compare(results, "ddp_batchnorm", mode="jit"))


def test_fsdp2_batchnorm(results):
    _compare(results, "fsdp_batchnorm")


def test_example_under_torchrun():
    """examples/train_ddp.py as its docstring launches it, with env:// initialization from torchrun."""
    import subprocess

    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    # --standalone: torchrun's own rendezvous on a free local port (a port picked here could be taken before
    # torchrun binds it).
    command += ["--standalone", "--nproc_per_node", str(WORLD)]
    command += [str(ROOT / "examples" / "train_ddp.py"), "--mode", "dealias", "--norm", "center", "--steps", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    if done.returncode != 0 and "SIGABRT" in done.stderr and done.stdout.count("step 1: loss") == WORLD:
        # Seen once in ~10 full-suite runs before the example's final barrier: a rank aborting in gloo's
        # teardown after both had trained. One more launch; a second failure fails the test.
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    # The ranks write to one pipe: their lines can interleave, so count the reports, not the lines.
    reports = re.findall(r"\[dealias\] rank (\d) step (\d): loss [\d.]+", done.stdout)
    assert sorted(reports) == sorted((str(r), str(s)) for r in range(WORLD) for s in range(2)), done.stdout
