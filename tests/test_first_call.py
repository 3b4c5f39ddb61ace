"""The fused executor's first call in a second process (a restart with the same cache directories): inductor's code
comes from its FX graph cache, and no probe of the host's vector ISAs runs again (compat/vec_isa.py: the base probe's
verdict and each extension probe's outcome are kept on disk)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from dealias.compat import vec_isa

x86_linux = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"), reason="inductor probes x86 Linux only"
)

# A child process: the program compiled by the fused executor and called once, against eager on a copy; prints the
# FX graph cache's counters and how many vector-ISA probes spawned a child of their own.
CHILD = textwrap.dedent(
    """
    import json
    import torch
    import torch._inductor.cpu_vec_isa as isa
    from torch._dynamo.utils import counters
    import dealias

    probes = []
    load = isa.VecISA._probe_load
    isa.VecISA._probe_load = lambda self, path: probes.append(str(self)) or load(self, path)

    def f(buf, row):
        buf[1].add_(row)
        buf.mul_(0.5)
        return (buf[1] + row).sin()

    torch.manual_seed(0)
    buf, row = torch.randn(4, 64), torch.randn(64)
    ref = buf.clone()
    expected = f(ref, row)
    got = dealias.jit(f, executor="inductor")(buf, row)
    same = torch.allclose(got, expected, rtol=1e-5, atol=1e-6) and torch.allclose(buf, ref, rtol=1e-5, atol=1e-6)
    fx = {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
    print(json.dumps({"same": bool(same), "fx": fx, "probes": probes}))
    """
)


def _first_call(tmp_path: Path) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), OMP_NUM_THREADS="1")
    env["DEALIAS_CACHE_DIR"] = str(tmp_path / "dealias")
    env.pop("TORCHINDUCTOR_VEC_ISA_OK", None)
    src = Path(__file__).resolve().parent.parent / "src"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1])


@x86_linux
@pytest.mark.inductor
@pytest.mark.slow
def test_a_restart_loads_inductors_code_and_probes_no_vector_isa(tmp_path):
    cold = _first_call(tmp_path)
    assert cold["same"]
    assert cold["fx"].get("fxgraph_cache_miss", 0) >= 1 and not cold["fx"].get("fxgraph_cache_bypass")
    warm = _first_call(tmp_path)
    assert warm["same"]
    assert warm["fx"].get("fxgraph_cache_hit", 0) >= 1
    assert not warm["fx"].get("fxgraph_cache_miss") and not warm["fx"].get("fxgraph_cache_bypass")
    assert warm["probes"] == []  # (the cold process probed: `cold["probes"]`, one per ISA and extension)


@pytest.fixture
def checks(monkeypatch, tmp_path):
    """inductor's `VecISA.check_build` replaced by one that records its calls and answers `answer[0]`."""
    import torch._inductor.cpu_vec_isa as isa

    calls, answer = [], [True]

    def check_build(self, code):
        calls.append((str(self), code))
        return answer[0]

    monkeypatch.setattr(isa.VecISA, "check_build", check_build)
    yield isa, calls, answer, tmp_path / "vec_isa-test"


def test_extension_probes_are_recorded_then_answered_from_disk(checks):
    isa, calls, answer, verdict = checks
    avx512 = next(v for v in isa.supported_vec_isa_list if type(v).__name__ == "VecAVX512")
    with vec_isa._recorded_checks(isa, verdict):
        assert avx512.check_build("bf16 code") is True
    assert len(calls) == 1
    answer[0] = False  # (what a real probe would say now is not asked: the record answers)
    with vec_isa._recorded_checks(isa, verdict):  # (another process)
        assert avx512.check_build("bf16 code") is True
        assert avx512.check_build("vnni code") is False  # (not recorded: probed, and recorded)
    assert calls == [(str(avx512), "bf16 code"), (str(avx512), "vnni code")]
    with vec_isa._recorded_checks(isa, verdict):
        assert avx512.check_build("vnni code") is False
        base = avx512._arch_flags
        avx512._arch_flags = base + " -mavx512bf16"  # (a probe of other flags, as the bf16 one: its own entry)
        try:
            assert avx512.check_build("vnni code") is False
        finally:
            avx512._arch_flags = base
    assert len(calls) == 3
    assert isa.VecISA.check_build.__name__ == "check_build" and not hasattr(isa.VecISA.check_build, "__wrapped__")


def test_other_threads_probe_as_inductor_does(checks):
    isa, calls, _, verdict = checks
    avx2 = next(v for v in isa.supported_vec_isa_list if type(v).__name__ == "VecAVX2")
    with vec_isa._recorded_checks(isa, verdict):
        avx2.check_build("code")
        other = threading.Thread(target=avx2.check_build, args=("code",))
        other.start()
        other.join()
    assert len(calls) == 2  # (the other thread's probe is not answered from the record)


# --- the hazard search (runtime/hazards.py): found by bisection, the same hazards in the same order as a scan ---
def _scanned_hazards(gm):
    """The hazards as the scan of the graph per write found them (before the bisection): the reference."""
    from dealias.runtime import hazards as hz

    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    reads = hz.reads_of(gm)
    writes, root = hz.memory_of(gm)
    found = []
    for w, m in writes:
        for n in gm.graph.nodes:
            if order[n] >= order[w]:
                break
            if n.op != "call_function" or hz._alias(n) or n.target in hz.SNAPSHOTS or m not in reads[n]:
                continue
            if any(order[u] > order[w] for u in n.users):
                found.append((n, w, False))
        written = hz._arg(w, hz.facts(w.target).mutated[0])
        for a in w.all_input_nodes:
            if a is written or m not in reads[a]:
                continue
            if w.target is not hz.aten.copy_.default or not hz._aligned(a, written.meta["val"], m, reads, root):
                found.append((a, w, True))
    for n in gm.graph.nodes:
        if n.op == "call_function" and hz.is_scatter(n.target) and n.args and n.args[0] in root:
            m = root[n.args[0]]
            found += [(a, n, True) for a in n.all_input_nodes if a is not n.args[0] and m in reads[a]]
    return found


def _row_program(seed: int, statements: int):
    """Rows of two buffers read, combined and written back in a random order (values kept across writes)."""
    import random

    rng = random.Random(seed)
    lines = ["def program(a, b):", "    vals = [a[0] * 1.0]"]
    for _ in range(statements):
        buf, row, other = rng.choice("ab"), rng.randrange(4), rng.randrange(4)
        kind = rng.randrange(3)
        if kind == 0:
            lines.append(f"    vals.append({buf}[{row}] + {buf}[{other}])")
        elif kind == 1:
            lines.append(f"    {buf}[{row}].copy_(vals[{rng.randrange(8)} % len(vals)] * 0.5)")
        else:
            lines.append(f"    {buf}.mul_(1.5)")
    lines.append("    return sum(vals)")
    scope: dict = {}
    exec("\n".join(lines), scope)  # noqa: S102 - the test's own generated source
    return scope["program"]


@pytest.mark.parametrize("seed", range(6))
def test_hazards_are_the_scans_in_its_order_and_snapshots_keep_eagers_values(seed):
    import copy

    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from dealias.runtime import hazards as hz

    program = _row_program(seed, 40)
    torch.manual_seed(seed)
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    gm = make_fx(program, tracing_mode="fake")(a.clone(), b.clone())
    names = lambda found: [(v.name, w.name, at) for v, w, at in found]  # noqa: E731
    assert names(hz.hazards(gm)) == names(_scanned_hazards(gm))
    reference = copy.deepcopy(gm)
    scanned = hz.hazards
    hz.hazards = lambda g: iter(_scanned_hazards(g))
    try:
        expected_count = hz.insert_snapshots(reference)
    finally:
        hz.hazards = scanned
    count = hz.insert_snapshots(gm)
    assert count == expected_count and count > 0
    assert gm.graph.python_code("self").src == reference.graph.python_code("self").src
    assert next(hz.hazards(gm), None) is None
    gm.recompile()
    ea, eb = a.clone(), b.clone()
    expected = program(ea, eb)
    ga, gb = a.clone(), b.clone()
    got = gm(ga, gb)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close((ga, gb), (ea, eb), rtol=0, atol=0)
