"""Train a small model with in-place ops and BatchNorm under DistributedDataParallel (gloo, CPU), compiled by dealias.

    torchrun --standalone --nproc_per_node 2 examples/train_ddp.py [--mode eager|dealias|aot_eager] [--steps 3]

Each rank prints its loss at every step. The model mutates its BatchNorm buffers in forward, runs an in-place
ReLU and scales an intermediate in place: the kind of program dealias functionalizes and writes back exactly.
DDP's graph splitter (DDPOptimizer) cuts dynamo's graph at the gradient-bucket boundaries, so with several
buckets (`--width 70000 --bucket-cap-mb 1`: buckets under 1 MiB fail in dynamo) dealias compiles several graphs,
each on its first real call.

`--norm center` swaps BatchNorm1d for a module that also updates buffers in place in forward but whose
buffers autograd does not save for backward.

`tests/test_distributed.py` imports this file and calls `train_ddp` in spawned processes.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

MODES = ("eager", "dealias", "jit", "aot_eager")  # jit: dealias.jit(model) instead of torch.compile


class RunningCenter(nn.Module):
    """Centers a batch by its mean and tracks the running mean in buffers updated in place in forward, like
    BatchNorm's running stats, except that autograd saves none of the buffers for backward."""

    def __init__(self, features: int, momentum: float = 0.1) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        mean = h.mean(0)
        if self.training:
            self.running_mean.mul_(1 - self.momentum).add_(mean.detach(), alpha=self.momentum)
            self.num_batches_tracked.add_(1)
        return h - mean


class Net(nn.Module):
    """Linear -> BatchNorm1d (or RunningCenter) -> in-place scale -> in-place ReLU -> Linear."""

    def __init__(self, width: int = 16, norm: str = "batchnorm") -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, width)
        # running_mean, running_var, num_batches_tracked: mutated by forward
        self.bn = nn.BatchNorm1d(width) if norm == "batchnorm" else RunningCenter(width)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.fc1(x))
        h.mul_(0.5)  # an in-place op on an intermediate
        h = self.act(h)
        return self.fc2(h)


def make_model(seed: int = 0, **kwargs: Any) -> Net:
    """The same initial weights on every rank and in every mode."""
    torch.manual_seed(seed)
    return Net(**kwargs)


def make_batch(rank: int, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic batch, different for every rank, step and micro-batch."""
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro + 1)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def compiled(module: nn.Module, mode: Any) -> Any:
    """`module` as it runs in `mode`: eager, or torch.compile'd with that backend (a name or a backend object)."""
    if callable(mode):
        return torch.compile(module, backend=mode)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if mode == "jit":
        import dealias

        return dealias.jit(module)
    return module if mode == "eager" else torch.compile(module, backend=mode)


def snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Parameters, buffers and optimizer state as plain CPU tensors (local shards of DTensors)."""

    def plain(t: torch.Tensor) -> torch.Tensor:
        return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()

    names = {p: n for n, p in model.named_parameters()}
    return {
        "params": {n: plain(p) for n, p in model.named_parameters()},
        "grads": {n: plain(p.grad) for n, p in model.named_parameters() if p.grad is not None},
        "buffers": {n: plain(b) for n, b in model.named_buffers()},
        "opt": {names[p]: {k: plain(v) for k, v in s.items()} for p, s in opt.state.items()},
    }


def train_ddp(
    mode: Any,
    steps: int = 3,
    *,
    lr: float = 0.1,
    accumulate_step: int | None = None,
    broadcast_buffers: bool = True,
    bucket_cap_mb: float | None = None,
    verbose: bool = False,
    **model_kwargs: Any,
) -> dict[str, Any]:
    """`steps` SGD-with-momentum steps of DDP(Net) on this rank; at `accumulate_step`, two micro-batches with
    gradients accumulated locally under `no_sync()` for the first. Returns the losses, per-step times and the
    final state (see `snapshot`). `model_kwargs` go to `Net`. The process group must be initialized.

    DDPOptimizer (dynamo's graph splitter for DDP) assumes a first bucket of 1 MiB, so `bucket_cap_mb` below 1
    fails in dynamo whatever the backend; to split the graph, take a model of more than 1 MiB of parameters."""
    rank = dist.get_rank()
    torch._dynamo.reset()
    # forward_sync_buffers is torch 2.13's name for broadcast_buffers (deprecated): rank 0's buffers are
    # broadcast to every rank before each forward.
    kwargs: dict[str, Any] = {"forward_sync_buffers": broadcast_buffers}
    if bucket_cap_mb is not None:
        kwargs["bucket_cap_mb"] = bucket_cap_mb
    ddp = DDP(make_model(**model_kwargs), **kwargs)
    model = compiled(ddp, mode)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    losses, times = [], []
    for step in range(steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if step == accumulate_step:
            x, y = make_batch(rank, step, micro=1)
            with ddp.no_sync():  # local gradients only: no all-reduce
                first = nn.functional.mse_loss(model(x), y)
                first.backward()
            losses.append(first.item())
        x, y = make_batch(rank, step)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # all-reduces the accumulated gradients
        opt.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
        if verbose:
            print(f"[{mode}] rank {rank} step {step}: loss {loss.item():.6f} ({times[-1] * 1e3:.1f} ms)", flush=True)
    return {"losses": losses, "times": times, **snapshot(ddp.module, opt)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=MODES, default="dealias")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--accumulate-step", type=int, default=None, help="a step with no_sync() accumulation")
    parser.add_argument("--bucket-cap-mb", type=float, default=None, help="bucket size (at least 1)")
    parser.add_argument("--width", type=int, default=16, help="hidden features (> 2**15 for several buckets)")
    parser.add_argument("--norm", choices=("batchnorm", "center"), default="batchnorm")
    args = parser.parse_args()
    dist.init_process_group("gloo", init_method="env://")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    try:
        train_ddp(
            args.mode,
            args.steps,
            lr=args.lr,
            accumulate_step=args.accumulate_step,
            bucket_cap_mb=args.bucket_cap_mb,
            verbose=True,
            width=args.width,
            norm=args.norm,
        )
    finally:
        # Every rank done before any tears gloo down: a rank leaving while the other still talks to it aborts.
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" not in os.environ:
        raise SystemExit("launch with: torchrun --nproc_per_node 2 examples/train_ddp.py")
    main()
