"""Every torch.optim optimizer's step compiled as users compile it (issue 38, item 2): exactness against eager over
several steps, recompiles over many steps (with an LR scheduler changing lr between them), and the per-call time
of dealias's default, its fused executor and torch.compile(backend="inductor"), each as a ratio to eager's.

A model-like parameter set: 14 parameters of mixed sizes (an embedding, linear weights and biases, a LayerNorm, a
conv weight), 2.7 MB of float32; gradients set before each step, outside the compiled step.

Variants (each compiles `step(opt)`, i.e. `opt.step()`, on a code object of its own):
  default   dealias.jit(step), no options (executor="tiered"; the fused program built in the first call unless
            DEALIAS_FUSE_FIRST=0: run this script without it, as users do)
  backend   torch.compile(step, backend="dealias") (checked, not timed: the same backend as `default`)
  fused     dealias.jit(step, executor="inductor")
  tc        torch.compile(step, backend="inductor")
and the references: eager, and dynamo's graph as it is (torch.compile(backend="eager")): under dynamo torch.optim
runs code of its own (`torch.compiler.is_compiling()` branches), so an exact tier is exact when it equals the
bits of either.

Exactness: each variant runs STEPS steps from the same state with the same gradients (new ones each step) and its
scheduler stepping after each; after each step every parameter, gradient, optimizer state tensor (values and
dtype), step counter and param_group number is compared with eager's after the same step: "exact" (bit for bit
with eager at every step), "exact-dyn" (bit for bit with dynamo's graph), "tol" (within the fused tolerance,
the largest relative difference shown), "WRONG@k" (beyond it at step k, or an error). An exact tier's "tol" is a
finding: the tiers each variant ran are shown.
Recompiles: dynamo's graphs compiled over the STEPS steps plus the warm-up (WARM steps at least; the default
until its tiers settle), beyond the first step's.
Per call: rounds in a shuffled order, each variant's steps (and scheduler steps) for ~ROUND_SECONDS, CPU time
(`time.process_time`); the ratio to eager's in the same round, median over rounds.

    python bench/optim_sweep.py                       # everything (torch 2.13, a loaded 2-core machine: ~40 min)
    python bench/optim_sweep.py --only adam_fe adam_fe_sched --rounds 5 --json /tmp/sweep.json
    python bench/optim_sweep.py --table /tmp/sweep.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import traceback
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import dealias

STEPS = 6  # steps compared with eager's, one by one
WARM = 24  # steps after those before timing (the default: until its tiers settle, at most SETTLE_MAX)
SETTLE_MAX = 160
SETTLE_STABLE = 24
ROUND_SECONDS = 0.1
FUSED_TOLERANCE = dict(rtol=1e-3, atol=1e-4)
EXACT_TIERS = {"torch", "graph"}
SHAPES = [
    (1000, 64),  # embedding
    (256, 64), (256,),
    (256, 256), (256,),
    (1024, 256), (1024,),
    (256, 1024), (256,),
    (256,), (256,),  # LayerNorm
    (10, 256), (10,),
    (32, 3, 3, 3),  # conv
]  # fmt: skip


@dataclass
class Config:
    name: str
    make: Callable[[list[nn.Parameter]], torch.optim.Optimizer]
    sched: Callable[[torch.optim.Optimizer], Any] | None = None
    tags: list[str] = field(default_factory=list)


def _configs() -> list[Config]:
    optim = torch.optim
    base: list[tuple[str, Callable[..., torch.optim.Optimizer]]] = [
        ("adam", lambda p, **k: optim.Adam(p, lr=1e-3, weight_decay=1e-2, **k)),
        ("adam_amsgrad", lambda p, **k: optim.Adam(p, lr=1e-3, amsgrad=True, **k)),
        ("adam_maximize", lambda p, **k: optim.Adam(p, lr=1e-3, maximize=True, **k)),
        ("adamw", lambda p, **k: optim.AdamW(p, lr=1e-3, **k)),
        ("adamw_amsgrad", lambda p, **k: optim.AdamW(p, lr=1e-3, amsgrad=True, **k)),
        ("sgd", lambda p, **k: optim.SGD(p, lr=1e-2, **k)),
        ("sgd_momentum", lambda p, **k: optim.SGD(p, lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=1e-4, **k)),
        ("sgd_nesterov", lambda p, **k: optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True, **k)),
        ("rmsprop", lambda p, **k: optim.RMSprop(p, lr=1e-3, **k)),
        (
            "rmsprop_centered",
            lambda p, **k: optim.RMSprop(p, lr=1e-3, centered=True, momentum=0.9, weight_decay=1e-4, **k),
        ),
        ("adagrad", lambda p, **k: optim.Adagrad(p, lr=1e-2, lr_decay=1e-3, weight_decay=1e-4, **k)),
        ("adadelta", lambda p, **k: optim.Adadelta(p, lr=1.0, weight_decay=1e-4, **k)),
        ("adadelta_nowd", lambda p, **k: optim.Adadelta(p, lr=1.0, **k)),
        ("adamax", lambda p, **k: optim.Adamax(p, lr=2e-3, weight_decay=1e-4, **k)),
        ("nadam", lambda p, **k: optim.NAdam(p, lr=2e-3, weight_decay=1e-4, **k)),
        (
            "nadam_decoupled",
            lambda p, **k: optim.NAdam(p, lr=2e-3, weight_decay=1e-2, decoupled_weight_decay=True, **k),
        ),
        ("radam", lambda p, **k: optim.RAdam(p, lr=1e-3, weight_decay=1e-4, **k)),
        (
            "radam_decoupled",
            lambda p, **k: optim.RAdam(p, lr=1e-3, weight_decay=1e-2, decoupled_weight_decay=True, **k),
        ),
        ("asgd", lambda p, **k: optim.ASGD(p, lr=1e-2, t0=3, weight_decay=1e-4, **k)),
        ("rprop", lambda p, **k: optim.Rprop(p, lr=1e-2, **k)),
    ]
    out: list[Config] = []
    for name, mk in base:
        for fe in (True, False):
            out.append(Config(f"{name}_{'fe' if fe else 'loop'}", lambda p, mk=mk, fe=fe: mk(p, foreach=fe)))
    for name in ("adam", "adamw", "sgd_momentum", "adagrad"):
        mk = dict(base)[name]
        out.append(Config(f"{name}_fused", lambda p, mk=mk: mk(p, fused=True)))
    exp = lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.99)  # noqa: E731
    for name in ("adam", "adamw", "sgd_nesterov", "rmsprop", "adagrad"):
        mk = dict(base)[name]
        for fe in (True, False):
            out.append(Config(f"{name}_{'fe' if fe else 'loop'}_sched", lambda p, mk=mk, fe=fe: mk(p, foreach=fe), exp))
    out.append(Config("adam_fused_sched", lambda p: optim.Adam(p, lr=1e-3, fused=True), exp))
    # lr a tensor (torch.compile's advice for schedulers), and OneCycleLR (betas changing each step too)
    out.append(Config("adam_fe_tensorlr_sched", lambda p: optim.Adam(p, lr=torch.tensor(1e-3), foreach=True), exp))
    cyc = lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=1e-2, total_steps=10_000)  # noqa: E731
    out.append(Config("adam_fe_onecycle", lambda p: optim.Adam(p, lr=1e-3, foreach=True), cyc))
    return out


CONFIGS = _configs()


def step(opt):
    opt.step()


def own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` on a code object of its own: dynamo keeps its cache entries on the code object."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def dynamo_graphs() -> int:
    """Dynamo's graphs compiled so far in this process (its compiles and recompiles, any backend)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def compiled(variant: str) -> Callable[..., Any]:
    fn = own_code(step)
    if variant == "eager":
        return fn
    if variant == "default":
        return dealias.jit(fn)
    if variant == "fused":
        return dealias.jit(fn, executor="inductor")
    return torch.compile(fn, backend={"backend": "dealias", "tc": "inductor", "dyn": "eager"}[variant])


def params() -> list[nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [nn.Parameter(torch.randn(s, generator=g) * 0.1) for s in SHAPES]


def set_grads(opt: torch.optim.Optimizer, k: int) -> None:
    g = torch.Generator().manual_seed(1000 + k)
    for p in (p for grp in opt.param_groups for p in grp["params"]):
        grad = torch.randn(p.shape, generator=g)
        if p.grad is None:
            p.grad = grad
        else:
            p.grad.copy_(grad)


def snapshot(opt: torch.optim.Optimizer) -> list[Any]:
    """Everything a step reads or writes, in a fixed order (tensors cloned)."""
    out: list[Any] = []
    for grp in opt.param_groups:
        out += [(k, grp[k]) for k in sorted(grp) if k != "params" and isinstance(grp[k], (int, float, bool, tuple))]
        for p in grp["params"]:
            out += [p.detach().clone(), p.grad.clone() if p.grad is not None else None]
            st = opt.state.get(p, {})
            out += [(k, v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in sorted(st.items())]
    return out


def _tensors(x: Any) -> list[Any]:
    return [x[1] if isinstance(x, tuple) else x]


def compare(a: list[Any], b: list[Any]) -> tuple[str, float]:
    """("exact" | "tol" | "WRONG: ...", the largest relative difference) of state `a` against reference `b`."""
    if len(a) != len(b):
        return f"WRONG: {len(a)} state values against {len(b)}", float("inf")
    worst, exact = 0.0, True
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, tuple) and isinstance(y, tuple) and x[0] != y[0]:
            return f"WRONG: state key {x[0]!r} against {y[0]!r}", float("inf")
        x, y = (x[1], y[1]) if isinstance(x, tuple) and isinstance(y, tuple) else (x, y)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape:
                return f"WRONG: value {i}: {x.dtype}{list(x.shape)} against {y.dtype}{list(y.shape)}", float("inf")
            if torch.equal(x, y) or (
                x.is_floating_point()
                and torch.equal(x.isnan(), y.isnan())
                and torch.equal(torch.nan_to_num(x), torch.nan_to_num(y))
            ):
                continue
            exact = False
            scale = max(1.0, y.abs().max().item()) if y.numel() and y.is_floating_point() else 1.0
            try:
                torch.testing.assert_close(
                    x, y, rtol=FUSED_TOLERANCE["rtol"], atol=FUSED_TOLERANCE["atol"] * scale, equal_nan=True
                )
            except AssertionError as e:
                line = [s.strip() for s in str(e).splitlines() if s.strip()][-1]
                return f"WRONG: value {i}: {line}", float("inf")
            worst = max(worst, ((x.double() - y.double()).abs().max() / max(y.abs().max().item(), 1e-30)).item())
        elif type(x) is not type(y) or x != y:
            if isinstance(x, float) and isinstance(y, float) and abs(x - y) <= 1e-12 * max(abs(y), 1.0):
                exact = False
                continue
            return f"WRONG: value {i}: {x!r} against {y!r}", float("inf")
    return ("exact" if exact else "tol"), worst


def tiers_of(variant: str, f: Any) -> tuple[str, ...]:
    return dealias.cache_info(f).tiers if variant in ("default", "fused") else ()


def trajectory(cfg: Config, variant: str, steps: int) -> dict[str, Any]:
    """`steps` steps of a fresh optimizer under `variant`: the state after each, the graphs compiled, the tiers."""
    opt = cfg.make(params())
    sched = cfg.sched(opt) if cfg.sched else None
    f = compiled(variant)
    before = dynamo_graphs()
    states, tiers, err = [], [], ""
    first = 0.0
    for k in range(steps):
        set_grads(opt, k)
        t0 = time.perf_counter()
        try:
            f(opt)
        except Exception as e:  # noqa: BLE001 - reported
            err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            break
        if k == 0:
            first = time.perf_counter() - t0
        if sched:
            sched.step()
        states.append(snapshot(opt))
        tiers.append(tiers_of(variant, f))
    n = dynamo_graphs() - before
    return {"opt": opt, "sched": sched, "f": f, "states": states, "tiers": tiers, "err": err, "graphs": n,
            "first_s": first, "graphs_base": before}  # fmt: skip


def warm(variant: str, t: dict[str, Any]) -> int:
    """Steps until warm (WARM; the default until its tiers settle): the graphs compiled over all steps so far."""
    f, opt, sched = t["f"], t["opt"], t["sched"]
    seen, stable, n = None, 0, 0
    while True:
        f(opt)
        if sched:
            sched.step()
        n += 1
        if variant != "default":
            if n >= WARM:
                break
            continue
        info = dealias.cache_info(f)
        now = (info.tiers, info.tier_reasons)
        stable = stable + 1 if now == seen else 0
        seen = now
        if (n >= WARM and stable >= SETTLE_STABLE) or n >= SETTLE_MAX:
            break
    return dynamo_graphs() - t["graphs_base"]


def per_step(states: list[list[Any]], ref: list[list[Any]], dyn: list[list[Any]] | None) -> list[str]:
    """Per step: "=" bit for bit with eager, "d" with dynamo's graph, "~" within tolerance, "X" beyond it."""
    out = []
    for k, (s, r) in enumerate(zip(states, ref)):
        v = compare(s, r)[0]
        if v != "exact" and not v.startswith("WRONG") and dyn is not None and k < len(dyn):
            v = "d" if compare(s, dyn[k])[0] == "exact" else v
        out.append({"exact": "=", "tol": "~", "d": "d"}.get(v, "X"))
    return out


def verdict(states: list[list[Any]], ref: list[list[Any]], dyn: list[list[Any]] | None, err: str) -> str:
    if err:
        return f"WRONG@{len(states)}: {err}"
    if len(states) != len(ref):
        return f"WRONG: {len(states)} steps against {len(ref)}"
    kinds, worst = set(), 0.0
    for k, (s, r) in enumerate(zip(states, ref)):
        v, w = compare(s, r)
        if v.startswith("WRONG"):
            return f"WRONG@{k}: {v[7:]}"
        if v != "exact" and dyn is not None and k < len(dyn) and compare(s, dyn[k])[0] == "exact":
            v = "exact-dyn"
        kinds.add(v)
        worst = max(worst, w)
    if kinds == {"exact"}:
        return "exact"
    if "tol" not in kinds:
        return "exact-dyn"
    return f"tol {worst:.1e}"


def per_call(impls: dict[str, tuple[Any, Any, Any]], rounds: int) -> dict[str, float]:
    def run(v: str, iters: int) -> float:
        f, opt, sched = impls[v]
        t0 = time.process_time()
        for _ in range(iters):
            f(opt)
            if sched:
                sched.step()
        return time.process_time() - t0

    names = list(impls)
    w0 = time.perf_counter()
    run("eager", 3)
    one = max((time.perf_counter() - w0) / 3, 1e-5)
    iters = max(3, int(ROUND_SECONDS / one))
    times: dict[str, list[float]] = {v: [] for v in names}
    order = random.Random(0)
    for _ in range(rounds):
        for v in order.sample(names, len(names)):
            times[v].append(run(v, iters) / iters)
    out = {
        v: statistics.median(t / e for t, e in zip(times[v], times["eager"]) if e > 0) for v in names if v != "eager"
    }
    out["eager_us"] = statistics.median(times["eager"]) * 1e6
    return out


def sweep(cfg: Config, rounds: int, variants: list[str]) -> dict[str, Any]:
    torch._dynamo.reset()  # (automatic dynamic remembers values per code location across configs)
    row: dict[str, Any] = {"config": cfg.name, "check": {}, "recompiles": {}, "tiers": {}, "first_s": {}, "ratio": {}}
    try:
        ref = trajectory(cfg, "eager", STEPS)
    except Exception as e:  # noqa: BLE001 - eager itself refuses (e.g. capturable on CPU)
        row["skip"] = f"eager: {type(e).__name__}: {e}"
        return row
    if ref["err"]:
        row["skip"] = f"eager: {ref['err']}"
        return row
    dyn = trajectory(cfg, "dyn", STEPS)
    timed: dict[str, tuple[Any, Any, Any]] = {"eager": (ref["f"], ref["opt"], ref["sched"])}
    for v in variants:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t = trajectory(cfg, v, STEPS)
            row["check"][v] = verdict(t["states"], ref["states"], dyn["states"] if not dyn["err"] else None, t["err"])
            row["first_s"][v] = t["first_s"]
            row.setdefault("steps", {})[v] = "".join(per_step(t["states"], ref["states"], dyn["states"]))
            row.setdefault("step_tiers", {})[v] = [",".join(x) for x in t["tiers"]]
            g_first = t["graphs"]
            if not t["err"]:
                try:
                    total = warm(v, t)
                    row["recompiles"][v] = f"{g_first}/{total}"
                except Exception as e:  # noqa: BLE001
                    row["check"][v] += f"; warm-up: {type(e).__name__}: {e}"
            row["tiers"][v] = sorted(set(tiers_of(v, t["f"])))
        msgs = sorted({str(w.message).splitlines()[0][:160] for w in caught if "dealias" in str(w.message).lower()
                       or "eager" in str(w.message).lower()})  # fmt: skip
        if msgs:
            row.setdefault("warnings", {})[v] = msgs
        if not row["check"][v].startswith("WRONG") and v != "backend":
            timed[v] = (t["f"], t["opt"], t["sched"])
    warm("eager", ref)
    if rounds:
        row["ratio"] = per_call(timed, rounds)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = ["config", "eager us", "default", "fused", "tc", "check default / backend / fused / tc",
            "graphs (first 6 steps / all) default / backend / fused / tc", "tiers default"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("skip"):
            lines.append(f"| {r['config']} | skipped: {r['skip'][:80]} |" + " |" * (len(head) - 2))
            continue
        rt = r["ratio"]
        cells = [r["config"], f"{rt.get('eager_us', 0):.0f}"]
        cells += [f"{rt[v]:.2f}" if v in rt else "" for v in ("default", "fused", "tc")]
        cells.append(" / ".join(r["check"].get(v, "") for v in ("default", "backend", "fused", "tc")))
        cells.append(" / ".join(r["recompiles"].get(v, "") for v in ("default", "backend", "fused", "tc")))
        cells.append(",".join(r["tiers"].get("default", [])))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="config names: " + ", ".join(c.name for c in CONFIGS))
    ap.add_argument("--match", help="configs whose name contains this")
    ap.add_argument("--variants", nargs="*", default=["default", "backend", "fused", "tc"])
    ap.add_argument("--rounds", type=int, default=7, help="timing rounds (0: no timing)")
    ap.add_argument("--json", help="write the rows here (as it goes)")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the table of earlier runs' --json files")
    a = ap.parse_args(argv)
    if a.table:
        rows = [r for name in a.table for r in json.loads(Path(name).read_text())]
        print(table(rows))
        return 0
    torch.set_num_threads(1)
    rows = []
    for cfg in CONFIGS:
        if (a.only and cfg.name not in a.only) or (a.match and a.match not in cfg.name):
            continue
        start = time.perf_counter()
        try:
            row = sweep(cfg, a.rounds, a.variants)
        except Exception:  # noqa: BLE001 - one config's failure reported, the others still run
            row = {"config": cfg.name, "skip": "sweep failed: " + traceback.format_exc().splitlines()[-1]}
        rows.append(row)
        print(json.dumps(row), f"({time.perf_counter() - start:.0f} s)", flush=True)
        if a.json:
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            Path(a.json).write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 1 if any(c.startswith("WRONG") for r in rows for c in r.get("check", {}).values()) else 0


if __name__ == "__main__":
    sys.exit(main())
