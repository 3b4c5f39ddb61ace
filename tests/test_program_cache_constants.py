"""The program cache with tensor constants (issue 38: GPT-2's warm first call traced again, 0.56 CPU s of it, as its
graph makes empty tensors from Python values, `torch.tensor([])`, which make_fx lifts as constants). A constant made
by the graph's code is kept by value (dynamo's graph's code, in the key, determines it), read back with its bits
and layout; any other real tensor is still never kept; results and writes stay eager's."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_program_cache import cache  # noqa: F401 - the program cache on, in a fresh directory

import dealias
from dealias.passes import kept_graphs, program_cache

SRC = Path(__file__).resolve().parent.parent / "src"


def with_constants(x, buf):
    shift = torch.tensor([1.5, -2.0, 0.25, 3.0])  # (a constant of the trace, made from Python values)
    empty = torch.tensor([])  # (GPT-2's kind: no element)
    x.add_(shift)
    buf[1:3] = x[:2] * shift
    return torch.cat([x.reshape(-1), empty]) * 2, shift.sum()


def other_constants(x, buf):
    shift = torch.tensor([1.5, -2.0, 0.25, 4.0])  # (another value: another graph code, another key)
    empty = torch.tensor([])
    x.add_(shift)
    buf[1:3] = x[:2] * shift
    return torch.cat([x.reshape(-1), empty]) * 2, shift.sum()


def run_like_eager(fn, executor="torch"):
    torch._dynamo.reset()
    torch.manual_seed(0)
    x, buf = torch.randn(3, 4), torch.zeros(4, 4)
    want_x, want_buf, got_x, got_buf = x.clone(), buf.clone(), x.clone(), buf.clone()
    want = fn(want_x, want_buf)
    jf = dealias.jit(fn, executor=executor)
    got = jf(got_x, got_buf)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert torch.equal(got_x, want_x) and torch.equal(got_buf, want_buf)
    return jf


def test_a_program_with_tensor_constants_is_loaded(cache):  # noqa: F811 - the imported fixture
    run_like_eager(with_constants)
    assert program_cache.counts == {"read": 0, "written": 1} and len(cache) == 1
    run_like_eager(with_constants)  # (a second compile: loaded, nothing traced, eager's results)
    assert program_cache.counts == {"read": 1, "written": 1} and len(cache) == 1


def test_other_constant_values_are_another_entry(cache):  # noqa: F811 - the imported fixture
    run_like_eager(with_constants)
    run_like_eager(other_constants)  # (its values are in its code: never the first one's entry)
    assert program_cache.counts == {"read": 0, "written": 2} and len(cache) == 2


def test_constants_read_back_with_their_bits_and_layout():
    values = torch.tensor([[1.5, -0.0], [float("nan"), -3.0]]).t()  # (a transposed layout, -0.0 and a NaN)
    gm = torch.fx.symbolic_trace(lambda x: x)
    gm.c = values
    node = gm.graph.get_attr("c")
    gm.graph.output((gm.graph.find_nodes(op="placeholder")[0], node))
    gm.graph.erase_node(next(n for n in gm.graph.nodes if n.op == "output"))
    gm.recompile()
    data = kept_graphs.dumps({"key": "k", "gm": gm})
    got = kept_graphs.loads(data, "k")["gm"].c
    assert (got.shape, got.stride(), got.dtype) == (values.shape, values.stride(), values.dtype)
    assert torch.equal(got.view(torch.int32), values.view(torch.int32))  # (bit for bit: -0.0, the NaN's payload)


def test_a_real_tensor_that_is_no_constant_is_never_kept():
    # (a caller's tensor must never come back a copy of itself: only graph attributes and the named constants)
    assert kept_graphs.dumps({"key": "k", "t": torch.ones(3)}) is None
    pickler = kept_graphs._Pickler(io.BytesIO())
    with pytest.raises(kept_graphs.Uncacheable):
        pickler.persistent_id(torch.ones(3))


def test_a_large_constant_is_not_kept():
    gm = torch.fx.symbolic_trace(lambda x: x)
    gm.c = torch.zeros(kept_graphs._CONSTANT_BYTES // 4 + 1)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(out):
        node = gm.graph.get_attr("c")
    out.args = ((out.args[0], node),)
    gm.recompile()
    assert kept_graphs.dumps({"key": "k", "gm": gm}) is None


_FUSED_CHILD = textwrap.dedent(
    """
    import json, sys, torch, dealias
    sys.path.insert(0, sys.argv[1])
    from test_program_cache_constants import with_constants
    from dealias.passes import program_cache
    from dealias.runtime import fused

    retraced = []
    retrace = fused._retrace
    fused._retrace = lambda *a: retraced.append(1) or retrace(*a)
    torch.manual_seed(0)
    x, buf = torch.randn(3, 4), torch.zeros(4, 4)
    want_x, want_buf = x.clone(), buf.clone()
    want = with_constants(want_x, want_buf)
    got = dealias.jit(with_constants, executor="inductor")(x, buf)
    same = [torch.allclose(a, b) for a, b in ((got[0], want[0]), (got[1], want[1]), (x, want_x), (buf, want_buf))]
    print(json.dumps({"counts": program_cache.counts, "retraced": len(retraced), "same": all(same)}))
    """
)


@pytest.mark.inductor
def test_a_second_process_loads_a_fused_retrace_with_constants(tmp_path):
    env = dict(os.environ, DEALIAS_CACHE_DIR=str(tmp_path / "dealias"), DEALIAS_PROGRAM_CACHE="1")
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    runs = []
    for _ in range(2):
        cmd = [sys.executable, "-c", _FUSED_CHILD, str(Path(__file__).resolve().parent)]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert runs[0] == {"counts": {"read": 0, "written": 2}, "retraced": 1, "same": True}
    assert runs[1] == {"counts": {"read": 2, "written": 0}, "retraced": 0, "same": True}


def test_a_constant_beyond_its_bytes_is_refused():
    # (review17: a damaged or crafted entry describing a constant larger than the bytes kept; `set_` would grow the
    # storage and the constant would read memory never written)
    buf = io.BytesIO()
    buf.write(kept_graphs.MAGIC)

    class Crafted(kept_graphs._Pickler):
        def persistent_id(self, obj):
            if obj == "constant":
                return ("real", 0, (0, b"\x00" * 4, torch.float32, (2**20,), (1,), 0))
            return None

    Crafted(buf).dump({"key": "k", "c": "constant"})
    assert kept_graphs.loads(buf.getvalue(), "k") is None
