"""Per-step time of DDP training (examples/train_ddp.py's BatchNorm model) with 2 gloo processes on 127.0.0.1, in
one run: eager; torch.compile(backend="dealias"); torch.compile with inductor; torch.compile(backend="aot_eager").

    python bench/ddp.py [--steps N] [--width W]

Every mode gets its own DDP(make_model(width=W, norm="batchnorm")) from the same seed, in the same process group,
and all modes train in interleaved rounds (round i: one step of each mode on the same batch i, the order rotated
by one every round), so a drift of the machine's speed hits every mode alike. A step is `zero_grad`, forward,
MSE loss, backward (DDP's all-reduce of the gradients), SGD with momentum and `loss.item()`; its time on a round
is the slower rank's. The first step of each mode includes dynamo's tracing and the backend's compile and is
reported apart; the next `--warmup` steps are dropped; the median and min are over the `--steps` steps after them.

Inductor compiles with a fresh, empty cache directory (TORCHINDUCTOR_CACHE_DIR in a temporary directory), so
its first step is a cold compile on every run, not a cache hit of an earlier run.

Size: the model is Linear(8, W) -> BatchNorm1d(W) -> in-place scale and ReLU -> Linear(W, 4). At W = 256 and a
batch of 64, an eager step of one process alone takes about 0.4 ms, nearly all of it Python and dispatch
overhead of the ~20 ops, autograd and the optimizer; the benchmark would time little else. The defaults,
W = 1024 and a batch of 256, make that step about 2.6 ms on one thread, most of it compute (matmuls, BatchNorm
and the elementwise ops on 256 x 1024), so a backend's overhead and its kernels both show, and the parameters (15 k,
60 KB) stay in one gradient bucket: DDPOptimizer leaves dynamo's graph whole. Both ranks run with one thread
each and share the machine's cores (2 here); the gloo all-reduce goes over loopback. On 2 cores DDP itself (the
all-reduce, gloo's threads, the ranks waiting for each other) adds some 3-5 ms to every step, whatever the mode,
so the ratios to eager understate a backend's own difference: the compute and overhead it changes are the rest.

Losses are checked against eager's on both ranks at every step: dealias runs eager's own aten kernels and must
agree exactly; other backends may reorder floating point, and their max abs difference is reported.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
WORLD = 2
MODES = ("eager", "dealias", "inductor", "aot_eager")


def _example() -> Any:
    if str(ROOT / "examples") not in sys.path:
        sys.path.insert(0, str(ROOT / "examples"))
    import train_ddp

    return train_ddp


def _batch(rank: int, step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic batch of `batch` rows, different for every rank and step (the example's is 6 rows)."""
    g = torch.Generator().manual_seed(1000 * rank + step + 1)
    return torch.randn(batch, 8, generator=g), torch.randn(batch, 4, generator=g)


class _Run:
    """One mode's DDP model, optimizer, losses and step times on this rank."""

    def __init__(self, mode: str, width: int) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ex = _example()
        self.mode = mode
        self.ddp = DDP(ex.make_model(width=width, norm="batchnorm"))
        if mode == "eager":
            self.model: Any = self.ddp
        else:
            self.model = torch.compile(self.ddp, backend=None if mode == "inductor" else mode)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=0.1, momentum=0.9)
        self.losses: list[float] = []
        self.times: list[float] = []

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        start = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        value = loss.item()
        self.times.append(time.perf_counter() - start)
        self.losses.append(value)


def _worker(rank: int, port: int, out_dir: str, a: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    from dealias import FallbackWarning

    torch.set_num_threads(1)  # two ranks share the machine's cores
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(out_dir, f"inductor{rank}")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=120),
    )
    result: dict[str, Any] = {}
    try:
        runs = [_Run(mode, a.width) for mode in a.modes]
        graphs = {mode: 0 for mode in a.modes}
        notes: dict[str, list[str]] = {mode: [] for mode in a.modes}
        for i in range(1 + a.warmup + a.steps):
            x, y = _batch(rank, i, a.batch)
            for run in runs[i % len(runs) :] + runs[: i % len(runs)]:  # each mode in each position in turn
                if i > a.warmup:  # timed steps: nothing around them
                    run.step(x, y)
                    continue
                before = counters["stats"]["unique_graphs"]
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", FallbackWarning)
                    run.step(x, y)
                graphs[run.mode] += counters["stats"]["unique_graphs"] - before
                notes[run.mode] += [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
        for run in runs:
            result[run.mode] = {"losses": run.losses, "times": run.times}
            result[run.mode]["graphs"] = graphs[run.mode]
            result[run.mode]["fallbacks"] = notes[run.mode]
    finally:
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(a: argparse.Namespace) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _worker, args=(_free_port(), out_dir, a), nprocs=WORLD, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + a.timeout
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() > deadline:
                    raise SystemExit(f"the ranks did not finish within {a.timeout:.0f} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]


def _agreement(mode: str, per_rank: list[dict[str, Any]]) -> str:
    got = [loss for r in per_rank for loss in r[mode]["losses"]]
    expected = [loss for r in per_rank for loss in r["eager"]["losses"]]
    if got == expected:
        return "exact"
    diff = max(abs(g - e) for g, e in zip(got, expected, strict=True))
    return f"**NO**: max abs diff {diff:.3g}" if mode in ("eager", "dealias") else f"max abs diff {diff:.3g}"


def _table(per_rank: list[dict[str, Any]], a: argparse.Namespace) -> list[str]:
    rows, base = [], {}
    for mode in a.modes:
        # a step's time is the slower rank's: DDP's all-reduce makes the ranks wait for each other
        times = [max(ts) for ts in zip(*(r[mode]["times"] for r in per_rank), strict=True)]
        timed = times[1 + a.warmup :]
        med, low = statistics.median(timed) * 1e3, min(timed) * 1e3
        base.setdefault("med", med)
        base.setdefault("min", low)
        graphs = "-" if mode == "eager" else str(per_rank[0][mode]["graphs"])
        rows.append(
            f"| {mode} | {times[0]:.2f} | {med:.3f} | {low:.3f} | {med / base['med']:.2f} | {low / base['min']:.2f} "
            f"| {graphs} | {_agreement(mode, per_rank)} |"
        )
    header = [
        "| mode | first step (s) | median (ms) | min (ms) | median / eager | min / eager | graphs "
        "| same losses as eager |",
        "|---|---|---|---|---|---|---|---|",
    ]
    return header + rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps of each mode")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after the first (compile) step")
    parser.add_argument("--width", type=int, default=1024, help="hidden features of the model")
    parser.add_argument("--batch", type=int, default=256, help="rows of each rank's batch")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="eager always runs first")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole spawn")
    a = parser.parse_args(argv)
    a.modes = ["eager"] + [m for m in a.modes if m != "eager"]
    start = time.perf_counter()
    per_rank = _spawn(a)
    total = time.perf_counter() - start
    params = 8 * a.width + a.width + 2 * a.width + 4 * a.width + 4
    print(
        f"DDP, gloo, {WORLD} processes on 127.0.0.1 sharing {os.cpu_count()} CPU cores (1 thread each); "
        f"Linear(8, {a.width}) -> BatchNorm1d -> Linear({a.width}, 4), {params} parameters, batch {a.batch} "
        f"per rank; torch {torch.__version__}"
    )
    print(
        f"first step: dynamo + backend compile (inductor with an empty cache); then {a.warmup} warm-up steps; "
        f"median and min over {a.steps} steps, interleaved rounds, slower rank's time\n"
    )
    for line in _table(per_rank, a):
        print(line)
    for mode in a.modes:
        for r, res in enumerate(per_rank):
            for message in dict.fromkeys(res[mode]["fallbacks"]):
                print(f"\n{mode}, rank {r}: FallbackWarning: {message}")
    print(f"\ntotal run time {total:.1f} s (spawning {WORLD} processes and importing torch included)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
