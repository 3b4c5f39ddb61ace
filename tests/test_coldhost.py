"""A cold first call (issue 38): the host's variance verdict (runtime/inductor_fixes.py) is asked only for a graph
whose variance it decides. Its measurement compiles two C++ kernels and ran in every cold process's first fused
compile, AdamW's and GPT-2's too, whose variances (none; LayerNorm rows of 768) it never changed. Verdict files are
written whole by every writer, threads of one process included, and keep what other processes saved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from dealias.runtime import inductor_fixes, keep_aten


def _graph(fn, *args):
    """The aten graph of `fn` (no decomposition), as the fused executor is handed one."""
    with torch.no_grad():
        return make_fx(fn, tracing_mode="fake")(*args)


def _bn(training, dtype=torch.float32):
    x = torch.randn(16, 64, 32, 32, dtype=dtype)
    rm, rv, w, b = torch.zeros(64), torch.ones(64), torch.ones(64, dtype=dtype), torch.zeros(64, dtype=dtype)
    return _graph(lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=training), x, rm, rv, w, b)


def _layer_norm(width):
    return _graph(lambda x: F.layer_norm(x, (width,)) * 2, torch.randn(4, width))


def _adamw_like():
    ps = [torch.randn(300, 300) for _ in range(3)]
    gs = [torch.randn(300, 300) for _ in range(3)]

    def step(ps, gs):
        torch._foreach_mul_(ps, 0.99)
        torch._foreach_add_(ps, gs, alpha=-1e-3)
        return torch.linalg.vector_norm(torch.stack([p.norm() for p in ps]))  # (a clipping's norms: no variance)

    return _graph(step, ps, gs)


_UNDECIDED = {
    "bn_eval": lambda: _bn(False),
    "bn_train_bfloat16": lambda: _bn(True, torch.bfloat16),
    "layer_norm_768": lambda: _layer_norm(768),
    "adamw_like": _adamw_like,
    "var_of_all": lambda: _graph(lambda x: torch.var_mean(x), torch.randn(64, 4096)),
    "var_float64": lambda: _graph(lambda x: torch.var(x, 1), torch.randn(8, 4096, dtype=torch.float64)),
}
_DECIDED = {
    "bn_train": lambda: _bn(True),
    "layer_norm_2048": lambda: _layer_norm(2048),
    "var_mean_rows": lambda: _graph(lambda x: torch.var_mean(x, 1), torch.randn(8, 4096)),
    "group_norm": lambda: _graph(lambda x: F.group_norm(x, 2), torch.randn(2, 8, 32, 32)),
}


@pytest.mark.parametrize("name", sorted(_UNDECIDED))
def test_a_graph_whose_variance_the_verdict_does_not_decide_asks_for_none(name, monkeypatch):
    gm = _UNDECIDED[name]()
    asked = []
    monkeypatch.setattr(inductor_fixes, "_float64_passes_here", lambda: asked.append(1) or True)
    assert not inductor_fixes.variance_decided(gm)
    assert inductor_fixes.decompositions(gm).float64_passes is False and not asked
    # ...and either verdict traces it to the same code: not asking changes nothing.
    codes = {_traced(gm, inductor_fixes._table(passes)) for passes in (True, False)}
    assert len(codes) == 1


@pytest.mark.parametrize("name", sorted(_DECIDED))
def test_a_graph_whose_variance_it_decides_gets_the_same_verdict(name, monkeypatch):
    gm = _DECIDED[name]()
    assert inductor_fixes.variance_decided(gm)
    for verdict in (True, False):
        monkeypatch.setattr(inductor_fixes, "_float64_passes_here", lambda verdict=verdict: verdict)
        assert inductor_fixes.decompositions(gm).float64_passes is verdict
        assert inductor_fixes.decompositions().float64_passes is verdict  # (no graph: asked, as before)
    # (the verdict does decide it: the two tables trace it differently)
    assert len({_traced(gm, inductor_fixes._table(passes)) for passes in (True, False)}) == 2


def test_another_librarys_op_counts_as_deciding():
    lib = torch.library.Library("coldhost_test", "FRAGMENT")
    lib.define("spread(Tensor x) -> Tensor")
    lib.impl("spread", lambda x: torch.var(x, 1, keepdim=True) * x, "CompositeExplicitAutograd")
    lib.impl("spread", lambda x: torch.empty_like(x), "Meta")
    gm = _graph(lambda x: torch.ops.coldhost_test.spread(x), torch.randn(8, 4096))
    assert inductor_fixes.variance_decided(gm)


def _traced(gm, table):
    example = [ph.meta["val"] for ph in gm.graph.find_nodes(op="placeholder")]
    with torch.no_grad():
        real = [torch.zeros(v.shape, dtype=v.dtype) for v in example]
        return make_fx(lambda *a: torch.fx.Interpreter(gm).run(*a), decomposition_table=table)(*real).code


def test_verdict_file_written_by_threads_is_never_read_half_written(tmp_path):
    path = tmp_path / "verdicts.json"
    texts = [json.dumps({f"key{i}": [float(j) for j in range(20000 + 5000 * i)]}) for i in range(4)]
    stop, seen, bad = threading.Event(), set(), []

    def write(text):
        for _ in range(30):
            keep_aten.write_whole(path, text)

    def read():
        while not stop.is_set():
            try:
                text = path.read_text()
            except OSError:
                continue
            if text not in texts:
                bad.append(len(text))
            seen.add(text)

    readers = [threading.Thread(target=read) for _ in range(2)]
    writers = [threading.Thread(target=write, args=(t,)) for t in texts]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not bad, f"read half-written: {bad[:5]}"
    assert path.read_text() in texts
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # (no temporary file left)


def test_saving_a_verdict_keeps_those_another_process_saved(verdict_store):
    assert keep_aten.measured("one", lambda: (1.0, 2.0)) == (1.0, 2.0)
    # Another process saves its verdict after this one read the file...
    keep_aten.write_whole(keep_aten._path(), json.dumps({"one": [1.0, 2.0], "other": [3.0, 4.0]}))
    keep_aten.measured("three", lambda: (5.0, 6.0))
    assert set(json.loads(keep_aten._path().read_text())) == {"one", "other", "three"}


_COLD = """
import json, os, torch, dealias
torch.manual_seed(0)
ln = torch.nn.LayerNorm(768)
buf = torch.zeros(4, 768)
def step(x, ps, gs):
    y = ln(x).relu()
    buf.add_(y)  # (a write-back to the caller's tensor)
    torch._foreach_mul_(ps, 0.9)
    torch._foreach_add_(ps, gs, alpha=-0.1)
    return y.sum(1)
x = torch.randn(4, 768)
ps = [torch.randn(64, 64) for _ in range(2)]
gs = [torch.randn(64, 64) for _ in range(2)]
eager_buf, eager_ps = buf.clone(), [p.clone() for p in ps]
with torch.no_grad():
    buf0, ps0 = buf.clone(), [p.clone() for p in ps]
    expected = step(x, ps, gs)
    eager_buf, eager_ps = buf.clone(), [p.clone() for p in ps]
    buf.copy_(buf0)
    for p, p0 in zip(ps, ps0):
        p.copy_(p0)
    f = dealias.jit(step, executor="inductor")  # (the fused program, compiled cold at the first call)
    got = f(x, ps, gs)
ok = torch.allclose(got, expected, rtol=1e-5, atol=1e-5) and torch.allclose(buf, eager_buf, rtol=1e-5, atol=1e-5)
ok = ok and all(torch.allclose(p, e, rtol=1e-5, atol=1e-5) for p, e in zip(ps, eager_ps))
print(json.dumps({"ok": bool(ok)}))
"""


@pytest.mark.inductor
def test_a_cold_first_call_gives_eagers_results_and_measures_no_variance(tmp_path):
    env = dict(os.environ, DEALIAS_CACHE_DIR=str(tmp_path / "dealias"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"))
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"), env.get("PYTHONPATH", "")])
    for pinned in ("DEALIAS_VARIANCE", "DEALIAS_KEEP_ATEN", "DEALIAS_ROW_PRODUCTS", "DEALIAS_CONV_LAYOUT"):
        env.pop(pinned, None)  # (measured, as on a user's host)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(_COLD)], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["ok"], result
    assert list((tmp_path / "ind").rglob("*.so")), "no C++ compiled: the fused program did not run"
    verdicts = {}
    for f in (tmp_path / "dealias").glob("keep_aten-*.json"):
        verdicts.update(json.loads(f.read_text()))
    assert not [k for k in verdicts if k.startswith("variance")], verdicts


# Inductor's probe counted, with the thread each ran in, in a process of its own (tests/test_vec_isa_measured.py's).
_COUNT = """
import threading, torch, torch._inductor.cpu_vec_isa as isa
original, probes = isa.VecISA.check_build, []
def counted(self, code):
    probes.append((str(self), threading.current_thread().name))
    return original(self, code)
isa.VecISA.check_build = counted
"""

_FIRST_CALL = """
import dealias
assert threading.active_count() == 1  # (importing dealias starts nothing)
f = dealias.jit(lambda x: (x.sin() * 2).relu(), executor="inductor")
x = torch.randn(1000)
assert torch.allclose(f(x), (x.sin() * 2).relu())
print(json.dumps(probes))
"""

_INDUCTOR_ALONE = """
isa.valid_vec_isa_list()
print(json.dumps(probes))
"""


def _probes(code, tmp_path):
    env = dict(os.environ, DEALIAS_CACHE_DIR=str(tmp_path / "dealias"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"))
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"), env.get("PYTHONPATH", "")])
    env.pop("TORCHINDUCTOR_VEC_ISA_OK", None)
    code = "import json\n" + textwrap.dedent(_COUNT) + textwrap.dedent(code)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.inductor
def test_a_cold_first_calls_isa_probe_runs_beside_the_trace_once(tmp_path):
    probes = _probes(_FIRST_CALL, tmp_path / "dealias_run")
    alone = _probes(_INDUCTOR_ALONE, tmp_path / "inductor_run")
    if not alone:
        pytest.skip("inductor probes no vector ISA on this host")
    # The same probes as inductor's own, each once, in the probe's thread (started at the first call, before dynamo
    # traced), not the compile's.
    assert sorted(isa for isa, _ in probes) == sorted(isa for isa, _ in alone)
    assert {thread for _, thread in probes} == {"dealias-vec-isa-probe"}
