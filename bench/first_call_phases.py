"""Where a first call's time goes, per phase, cold and warm (issue 38: the warm first call against torch.compile's).

For each workload of bench/real.py and each variant (dealias's default, torch.compile(backend="inductor")), rounds
of: a cold process (fresh TORCHINDUCTOR_CACHE_DIR and DEALIAS_CACHE_DIR), then a warm one (a second process with the
same directories). Each reports, from construction to the first call's return (as bench/real.py times it):
- wall seconds, this process's CPU seconds and its waited-for children's (inductor's C++ compiles and torch 2.13's
  vector-ISA probe children; a cold wall of a loaded machine is mostly theirs; CPU seconds are the steadier figure
  under load);
- inductor's FX graph cache and AOTAutograd's cache counters (a warm dealias process should show one hit per fused
  graph and no miss or bypass; torch.compile's an autograd_cache_hit);
- dealias's own phases, CPU seconds summed over the call's compiles: capture, alias analysis, functionalize,
  optimize (or the program cache's load of them, passes/program_cache.py, and its save in a cold process),
  write-back lowering, the torch executor, the fused executor (its retrace by make_fx shown apart; the rest is
  inductor's compile or cache lookup and load, and whatever inductor imports there), the runs on copies;
- the second call's wall and CPU seconds (its children's included): what a first call left to it. A training step's
  fused backward is timed on copies, and compiled, at the end of the first call's backward (frontend/choosing.py),
  where torch.compile's first backward compiles its own; the second call does it only where that backward's state
  was not the call's.

    python bench/first_call_phases.py --only adamw_foreach gpt2 --rounds 3
    python bench/first_call_phases.py --only gpt2 --variants default --json out.json
    python bench/first_call_phases.py --variants default default-norecord torch.compile  # (the record's worth)
    python bench/first_call_phases.py --variants default default-allvariance torch.compile  # (the variance verdict's)
    python bench/first_call_phases.py --variants default default-noheader torch.compile  # (header_prefetch's worth)
    python bench/first_call_phases.py --variants default default-noprogram torch.compile  # (the program cache's)
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PHASES = ("capture", "analyze", "functionalize", "optimize", "lower", "torch_executor", "fused_executor")


def _instrument() -> dict[str, float]:
    """CPU seconds per dealias phase, by wrapping the pipeline's functions (nothing else changes)."""
    from dealias.frontend import copies
    from dealias.passes import pipeline
    from dealias.runtime import fused

    spent: dict[str, float] = collections.defaultdict(float)

    def timed(f: Any, label: str) -> Any:
        @functools.wraps(f)
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return f(*args, **kwargs)
            finally:
                spent[label] += time.process_time() - start

        return run

    for name in PHASES:
        setattr(pipeline, name, timed(getattr(pipeline, name), name))
    copies.run_on_copies = timed(copies.run_on_copies, "copies")
    # The program cache's load (a warm process: instead of capture..optimize) and its save (a cold one)
    pipeline.program_cache.load = timed(pipeline.program_cache.load, "program_cache_load")
    pipeline.program_cache.save = timed(pipeline.program_cache.save, "program_cache_save")
    # The per-host measurements (keep_aten.measured's callers), by key: wall seconds (their C++ compiles are children),
    # without the wait for the vector-ISA probe a cold process's first measurement does in its first inductor compile
    # (`vec_isa (wall)`, shown apart: torch.compile's first compile probes too)
    from dealias.compat import vec_isa
    from dealias.runtime import conv_layout, keep_aten, row_products

    measured = keep_aten.measured

    def measured_timed(key: str, measure: Any) -> Any:
        def run() -> Any:
            start, probe = time.perf_counter(), spent["vec_isa (wall)"]
            try:
                return measure()
            finally:
                waited = spent["vec_isa (wall)"] - probe
                spent["measure:" + key.split("|")[0]] += time.perf_counter() - start - waited

        return measured(key, run)

    keep_aten.measured = row_products.measured = conv_layout.measured = measured_timed
    all_pass = vec_isa._all_pass

    def all_pass_timed() -> bool:
        start = time.perf_counter()
        try:
            return all_pass()
        finally:
            spent["vec_isa (wall)"] += time.perf_counter() - start

    vec_isa._all_pass = all_pass_timed
    make_fx = fused.make_fx
    fused.make_fx = lambda *a, **k: timed(make_fx(*a, **k), "retrace")
    return spent


def child(name: str, variant: str) -> None:
    import torch

    sys.path.insert(0, str(HERE))
    import real
    from real_workloads import WORKLOADS

    spent = _instrument() if variant != "torch.compile" else {}
    if variant == "default-allvariance":  # (as before issue 38's fix: the host's variance verdict asked at every
        from dealias.runtime import inductor_fixes  # fused compile, measured by a cold one whatever its graph)

        inductor_fixes.variance_decided, variant = (lambda gm: True), "default"
    if variant == "default-noheader":  # (the default without naming inductor's precompiled header ahead)
        from dealias.compat import header_prefetch

        header_prefetch.ENABLED, variant = False, "default"
    if variant == "default-noprogram":  # (the default without the program cache: every process traces again)
        from dealias.passes import program_cache

        program_cache.ENABLED, variant = False, "default"
    if variant == "default-norecord":  # (the default without the copies' record: every first call times its tiers)
        from dealias.frontend import copies_record

        copies_record.ENABLED, variant = False, "default"
    torch.set_num_threads(1)
    w = next(w for w in WORKLOADS if w.name == name)
    args = real.make_args(w)
    import resource

    children = lambda: resource.getrusage(resource.RUSAGE_CHILDREN)  # noqa: E731
    start, cpu, before = time.perf_counter(), time.process_time(), children()
    f = real.compiled(variant, w.fn)
    real.call(f, args, w.backward)
    wall, cpu, after = time.perf_counter() - start, time.process_time() - cpu, children()
    phases = dict(spent)  # (the first call's, its backward's included: the second call's runs add to `spent`)
    # (child processes waited for: inductor's C++ compiles and vector-ISA probes; a pool's workers are not counted)
    cpu_children = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    from torch._dynamo.utils import counters

    caches = {f"inductor.{k}": v for k, v in counters["inductor"].items() if k.startswith("fxgraph")}
    caches.update({f"aot.{k}": v for k, v in counters["aot_autograd"].items() if "cache" in k})
    # The second call too: what a first call leaves to it is a first call's cost.
    start, second_cpu, before = time.perf_counter(), time.process_time(), children()
    real.call(f, args, w.backward)
    second, second_cpu, after = time.perf_counter() - start, time.process_time() - second_cpu, children()
    second_cpu += after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    record = {"wall": wall, "cpu": cpu, "cpu_children": cpu_children, "second_wall": second, "second_cpu": second_cpu}
    record["source"] = real.dealias_source()  # (what keyed the caches: a warm process of another is no warm one)
    print(json.dumps({**record, "caches": caches, "phases": phases}))


def one(name: str, variant: str, root: Path) -> dict[str, Any]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"), DEALIAS_CACHE_DIR=str(root / "dealias"))
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, variant]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode or not lines:
        return {"failed": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", default=["adamw_foreach", "gpt2"])
    ap.add_argument("--variants", nargs="+", default=["default", "torch.compile"])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", help="write every process's record here")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(*a.child)
        return 0
    import torch

    records: list[dict[str, Any]] = []
    for r in range(a.rounds):
        for name in a.only:
            for v in a.variants:  # (interleaved: cold and warm of each variant, variant after variant)
                root = Path(tempfile.mkdtemp(prefix="dealias-phases-"))
                try:
                    (root / "dealias").mkdir()
                    for kind in ("cold", "warm"):
                        rec = {"round": r, "workload": name, "variant": v, "kind": kind, **one(name, v, root)}
                        cold = records[-1] if kind == "warm" else {"failed": ""}
                        if "failed" not in cold and "failed" not in rec and rec.get("source") != cold.get("source"):
                            # (its tree edited meanwhile: the warm process found none of the cold one's caches)
                            rec["failed"] = "dealias's source changed between the cold and the warm process"
                        records.append(rec)
                        print(json.dumps(rec), flush=True)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
    print(f"\ntorch {torch.__version__}, load average {os.getloadavg()[0]:.1f}; medians over {a.rounds} round(s)")
    for name in a.only:
        for v in a.variants:
            for kind in ("cold", "warm"):
                recs = [x for x in records if (x["workload"], x["variant"], x["kind"]) == (name, v, kind)]
                recs = [x for x in recs if "failed" not in x]
                if not recs:
                    print(f"{name:14} {v:14} {kind}: failed")
                    continue
                med = lambda key, recs=recs: statistics.median(x[key] for x in recs)  # noqa: E731
                labels = sorted({k for x in recs for k in x["phases"]})
                phases = " ".join(f"{k} {statistics.median(x['phases'].get(k, 0.0) for x in recs):.2f}" for k in labels)
                children = statistics.median(x.get("cpu_children", 0.0) for x in recs)
                second = f"second call wall {med('second_wall'):.2f} cpu {med('second_cpu'):.2f}"
                print(
                    f"{name:14} {v:14} {kind}: wall {med('wall'):.2f} cpu {med('cpu'):.2f} children {children:.2f} "
                    f"({second}) | ",
                    end="",
                )
                print(recs[-1]["caches"])
                if phases:
                    print(f"{'':30} cpu per phase: {phases}")
    if a.json:
        Path(a.json).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
