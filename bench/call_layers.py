"""Per-call layers of a fused program against torch.compile's, on tiny versions of real workloads (kernels nearly free,
so what is timed is the Python and the frames around them; issue 38 item 4).

Each layer is called directly with the inputs dynamo hands the graph, and timed in blocks of 20 calls, the blocks of
all layers interleaved in a shuffled order (a loaded machine moves them all), reported as the 10th percentile and the
median of the blocks' per-call time:

    jit          dealias.jit(f, executor="inductor")(*args): the JitFunction, dynamo's frame, the graph's call
    jf.compiled  the torch.compile function inside it (no JitFunction bookkeeping)
    graphprog    the backend's GraphProgram called with dynamo's graph inputs (lean lookup + generated call)
    lean_check   the lean lookup alone (frontend/guards.lean_check)
    lean_run     the generated call (runtime/generated_call.py)
    run          the fused runner (runtime/fused.runner)
    inner        fused_autograd's call, for a graph autograd records
    aot          AOTAutograd's compiled function (autograd), or `kernel`: inductor's callable
    tc, tc_inner torch.compile(f) and the callable inductor compiled for it

    python bench/call_layers.py                 # mha bn ema
    python bench/call_layers.py adam --rounds 200
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import types
import warnings
from typing import Any

import torch
from torch import nn
from torch._inductor.compile_fx import compile_fx

import dealias
from dealias.frontend import backend as frontend


def attention(mha, x):
    return mha(x, x, x)


def ema(avg, params):
    torch._foreach_lerp_(avg, params, 0.001)


def batch_norm(bn, x):
    return bn(x)


def step(opt):
    opt.step()


def make(name: str) -> tuple[Any, tuple[Any, ...]]:
    torch.manual_seed(0)
    if name == "mha":
        return attention, (nn.MultiheadAttention(16, 2, batch_first=True), torch.randn(1, 4, 16))
    if name == "ema":
        params = [torch.randn(s) for s in [(8, 8), (8,), (8, 8), (8,), (2, 8), (2,)]]
        return ema, ([p + 0.1 for p in params], params)
    if name == "bn":
        return batch_norm, (nn.BatchNorm2d(4), torch.randn(2, 4, 4, 4))
    if name == "adam":
        params = [nn.Parameter(torch.randn(8, 8)) for _ in range(10)]
        for p in params:
            p.grad = torch.randn_like(p)
        return step, (torch.optim.Adam(params, lr=1e-3, foreach=True),)
    raise SystemExit(f"unknown workload {name}")


def _fresh(f: Any) -> Any:
    """`f` on a code object of its own: dynamo keeps cache entries per code object."""
    return types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__)


def _cell(f: Any, name: str) -> Any:
    return f.__closure__[f.__code__.co_freevars.index(name)].cell_contents


def layers(name: str) -> dict[str, Any]:
    fn, _ = make(name)
    jf = dealias.jit(_fresh(fn), executor="inductor")
    caught: dict[str, Any] = {}

    def inductor(gm: Any, example: Any) -> Any:
        inner = compile_fx(gm, example)

        def call(*args: Any) -> Any:
            caught["args"] = args
            return inner(*args)

        caught["inner"] = inner
        return call

    optimizer = name == "adam"  # (torch's own step frames: one compiled function per process)
    tc = _fresh(fn) if optimizer else torch.compile(_fresh(fn), backend=inductor)
    ours, theirs, eager = make(name)[1], make(name)[1], make(name)[1]
    for _ in range(40):
        jf(*ours)
        tc(*theirs)
        fn(*eager)
    graph = jf.stats.graphs[-1]
    seen: dict[str, Any] = {}
    call = frontend.GraphProgram.__call__

    def spy(self: Any, *args: Any) -> Any:
        seen["args"] = args
        return call(self, *args)

    frontend.GraphProgram.__call__ = spy
    try:
        jf(*ours)
    finally:
        frontend.GraphProgram.__call__ = call
    args, held = seen["args"], tuple(graph.attributes)
    check, _, lean = graph.lean
    run = jf.last.run_graph
    out = {
        "eager": lambda: fn(*eager),
        "jit": lambda: jf(*ours),
        "jf.compiled": lambda: jf.compiled(*ours),
        "graphprog": lambda: graph(*args),
        "lean_check": lambda: check(args),
        "lean_run": lambda: lean(list(args)),
        "run": lambda: run(*args, *held),
    }
    if not optimizer:
        out["tc"] = lambda: tc(*theirs)
        out["tc_inner"] = lambda: caught["inner"](*caught["args"])
    inner = _cell(run, "compiled")
    if callable(inner) and "compiled" in getattr(getattr(inner, "__code__", None), "co_freevars", ()):
        aot = _cell(inner, "compiled")
        out["inner"] = lambda: inner(args)
        out["aot"] = lambda: aot(*args)
    else:
        kernel = _cell(run, "state")["call"]
        out["kernel"] = lambda: kernel([*args, *held])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", default=["mha", "bn", "ema"])
    parser.add_argument("--rounds", type=int, default=100)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    for name in opts.names:
        timed = layers(name)
        grad = name != "adam"  # (the layers of an optimizer step run in its no_grad)
        samples: dict[str, list[float]] = {k: [] for k in timed}
        keys = list(timed)
        with torch.set_grad_enabled(grad):
            for _ in range(opts.rounds):
                random.shuffle(keys)
                for k in keys:
                    f = timed[k]
                    start = time.perf_counter_ns()
                    for _ in range(20):
                        f()
                    samples[k].append((time.perf_counter_ns() - start) / 20 / 1000)
        print(name)
        for k, v in samples.items():
            v.sort()
            print(f"  {k:12s} q10 {v[len(v) // 10]:8.1f} us   median {statistics.median(v):8.1f} us")


if __name__ == "__main__":
    main()
