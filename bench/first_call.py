"""First call (compile included) of dealias's fused executor against torch.compile(backend="inductor"), cold and warm.

Each first call runs in a process of its own, so nothing compiled in this one helps it:
- cold: fresh caches (a new TORCHINDUCTOR_CACHE_DIR and DEALIAS_CACHE_DIR): inductor generates and compiles every
  kernel, dealias measures what it measures per host;
- warm: a second process given the same cache directories as the cold one (a restart of the same program):
  inductor's FX graph cache and dealias's on-disk verdicts may serve it.
The two compilers are interleaved (cold dealias, cold torch.compile, warm dealias, warm torch.compile, per workload
and round), each with cache directories of its own, and reported as the median over rounds. The machine is shared:
read the ratios, not the seconds.

    python bench/first_call.py                        # every workload, 1 round
    python bench/first_call.py --only mha --rounds 3
    python bench/first_call.py --modes fused fused_uncached tc
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _mha_args() -> tuple[Any, ...]:
    import torch

    return (torch.nn.MultiheadAttention(256, 4, batch_first=True).eval(), torch.randn(4, 32, 256))


def mha(m: Any, x: Any) -> Any:
    return m(x, x, x)


def workloads() -> dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]]:
    """name -> (function, its arguments' maker): bench/run.py's, and nn.MultiheadAttention's forward."""
    sys.path.insert(0, str(HERE))
    import run

    found = {w.name: (w.fn, w.make) for w in run.WORKLOADS}
    names = ("adam_foreach", "sgd_foreach", "mlp", "kv_decode")
    return {**{n: found[n] for n in names}, "mha": (mha, _mha_args)}


# dealias's executor per mode; "tc" is torch.compile(backend="inductor"); "fused_uncached" is the fused executor
# with its compiles kept out of inductor's FX graph cache (as before compat/graph_cache.py)
EXECUTOR = {"fused": "inductor", "fused_uncached": "inductor", "tiered": "tiered"}
MODES = (*EXECUTOR, "tc")


def worker(name: str, mode: str) -> None:
    """In this (fresh) process: the first call of workload `name` compiled by `mode`; prints a JSON line."""
    import torch
    from torch._dynamo.utils import counters

    import dealias

    torch.set_num_threads(1)
    torch.manual_seed(0)
    fn, make = workloads()[name]
    args = make()
    # (from the construction on: torch.compile(backend="inductor") imports inductor there, dealias.jit at the first
    # call that needs it)
    start = time.perf_counter()
    f = torch.compile(fn, backend="inductor") if mode == "tc" else dealias.jit(fn, executor=EXECUTOR[mode])
    f(*args)
    seconds = time.perf_counter() - start
    cache = {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
    cache.update({k: v for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache")})
    print(json.dumps({"seconds": seconds, "cache": cache}), flush=True)


def first_call(name: str, mode: str, cache_dir: Path) -> dict[str, Any]:
    """The first call of `name` under `mode` in a new process whose caches are in `cache_dir`."""
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    env["DEALIAS_CACHE_DIR"] = str(cache_dir / "dealias")
    if mode == "fused_uncached":
        env["DEALIAS_COMPAT_OFF"] = ",".join(filter(None, (env.get("DEALIAS_COMPAT_OFF"), "inductor_graph_cache")))
    src = HERE.parent / "src"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, mode]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{name} {mode} failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="workload names")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--modes", nargs="*", default=["fused", "tc"], choices=MODES)
    ap.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "MODE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(*a.worker)
        return 0
    names = [n for n in workloads() if not a.only or n in a.only]
    print(f"first call, seconds (median of {a.rounds} round(s)); cache: FX graph cache hits/misses/bypasses")
    for name in names:
        times: dict[tuple[str, str], list[float]] = {}
        caches: dict[tuple[str, str], Any] = {}
        for _ in range(a.rounds):
            with tempfile.TemporaryDirectory(prefix="first_call_") as tmp:
                dirs = {m: Path(tmp) / m for m in a.modes}
                for state in ("cold", "warm"):  # (the warm process reuses the cold one's directories)
                    for m in a.modes:
                        r = first_call(name, m, dirs[m])
                        times.setdefault((m, state), []).append(r["seconds"])
                        caches[(m, state)] = r["cache"]
        cells = []
        for state in ("cold", "warm"):
            med = {m: statistics.median(times[(m, state)]) for m in a.modes}
            text = " | ".join(f"{m} {med[m]:6.2f} s ({_cache_text(caches[(m, state)])})" for m in a.modes)
            if "fused" in med and "tc" in med:
                text += f" | fused/tc {med['fused'] / med['tc']:.2f}"
            cells.append(f"{state}: {text}")
        print(f"{name:>13}  " + "\n               ".join(cells), flush=True)
    return 0


def _cache_text(cache: dict[str, int]) -> str:
    fx = [cache.get(f"fxgraph_cache_{k}", 0) for k in ("hit", "miss", "bypass")]
    return "fx " + "/".join(map(str, fx))


if __name__ == "__main__":
    sys.exit(main())
