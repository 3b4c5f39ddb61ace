"""A float that changes every call (issue 39): torch.optim.Adam with a LambdaLR scheduler (lr lives in
param_groups, a new float every step). Per-step time of `opt.step()` as a ratio to eager, for dealias.jit (torch
executor) and torch.compile(backend="eager") (dynamo's graphs run by eager's kernels; with dynamo's default
settings, whose prims.fma decompositions of addcdiv_/addcmul_ run slowly eagerly, and with them off as dealias
traces), interleaved step by step, median over the steps after the warm-up; and the compiles each made.

    python bench/floats.py [--steps 60] [--warmup 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch._dynamo.testing import CompileCounterWithBackend

import dealias


def make(seed: int = 0):
    torch.manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(64, 64)) for _ in range(4)] + [
        torch.nn.Parameter(torch.randn(64)) for _ in range(4)
    ]
    opt = torch.optim.Adam(params, lr=1e-3, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.99**e)
    return params, opt, sched


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)  # (a loaded machine's cores: threads of small ops only add noise)
    counter = CompileCounterWithBackend("eager")
    variants = {}
    no_fma = torch._dynamo.config.patch(enable_dynamo_decompositions=False)
    for name in ("eager", "dealias", "compile_eager", "compile_eager_nofma"):
        params, opt, sched = make()
        if name == "eager":
            step = opt.step
        elif name == "dealias":
            step = dealias.jit(opt.step)
        elif name == "compile_eager":
            step = torch.compile(opt.step, backend=counter)
        else:
            step = no_fma(torch.compile(opt.step, backend="eager"))
        variants[name] = (params, opt, sched, step)
    g = torch.Generator().manual_seed(1)
    times: dict[str, list[float]] = {name: [] for name in variants}
    total = dict.fromkeys(variants, 0.0)  # every step's time, compiles included
    for i in range(args.warmup + args.steps):
        grads = [torch.randn(p.shape, generator=g) for p in variants["eager"][0]]
        for name, (params, _, sched, step) in variants.items():
            for p, gr in zip(params, grads):
                p.grad = gr.clone()
            start = time.perf_counter()
            step()
            elapsed = time.perf_counter() - start
            total[name] += elapsed
            sched.step()
            if i >= args.warmup:
                times[name].append(elapsed)
    eager = statistics.median(times["eager"])
    info = dealias.cache_info(variants["dealias"][3])
    print(f"Adam + LambdaLR, {args.steps} steps after {args.warmup} (median per step, interleaved)")
    for name, ts in times.items():
        med = statistics.median(ts)
        whole = f"all steps, compiles included: {total[name]:.2f} s"
        print(f"  {name:20s} {med * 1e3:8.3f} ms  {med / eager:6.2f}x eager  ({whole})")
    print(f"  dealias compiles: {info.misses} (entries {info.entries}, eager entries {info.eager_entries})")
    print(f"  torch.compile(backend='eager') graphs: {counter.frame_count}")
    same = all(torch.equal(a, b) for a, b in zip(variants["dealias"][0], variants["compile_eager_nofma"][0]))
    print(f"  dealias's params equal those of torch.compile(backend='eager') without prims.fma: {same}")


if __name__ == "__main__":
    main()
