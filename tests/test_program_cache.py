"""The program cache (passes/program_cache.py, issue 38: the warm first call): a compile's capture and passes up to
optimize kept on disk, and a later compile of the same dynamo graph with the same leaves' metadata (another process's
included) loads them instead of tracing again. Results, writes and aliasing stay eager's; other leaves, another
graph or other settings never load an entry; a damaged entry is ignored; a directory that cannot be written keeps
nothing and fails nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import dealias
from dealias.passes import kept_graphs, pipeline, program_cache

SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """The program cache on, in a fresh directory; counts from zero; the number of captures run, in `traced`."""
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path / "dealias"))
    monkeypatch.setattr(program_cache, "ENABLED", True)
    monkeypatch.setattr(program_cache, "counts", {"read": 0, "written": 0})
    traced = []
    capture = pipeline.capture

    def counted(*args, **kwargs):
        traced.append(1)
        return capture(*args, **kwargs)

    monkeypatch.setattr(pipeline, "capture", counted)
    return traced


def step(a, b, x):
    """Writes through two overlapping views of one tensor (an alias group) and into x; returns a view of x."""
    a.add_(1)
    b.mul_(x[0, 0])
    x.mul_(2)
    return (a * 2).sum(), x.view(-1)[1:]


def other_step(a, b, x):
    a.sub_(1)
    b.mul_(x[0, 0])
    x.mul_(3)
    return (a * 2).sum(), x.view(-1)[1:]


def inputs(dtype=torch.float32, offset=False, requires_grad=False):
    torch.manual_seed(0)
    base = torch.randn(10, dtype=dtype)
    x = torch.randn(3, 4, dtype=dtype)
    if offset:
        x = torch.randn(4, 4, dtype=dtype)[1:]
    if requires_grad:
        x = x.detach().requires_grad_()
    return base, x


def _like(x):
    """A copy of `x` in memory of its own laid out as x's (a slice's storage offset kept), requiring grad as x."""
    if x.requires_grad:
        return x.detach().clone().requires_grad_()
    memory = torch.zeros(x.untyped_storage().nbytes() // x.element_size(), dtype=x.dtype)
    return memory.as_strided(x.shape, x.stride(), x.storage_offset()).copy_(x)


def run_like_eager(fn, dtype=torch.float32, offset=False, requires_grad=False, grad=True, **options):
    """A fresh compile's first call of `fn` on two overlapping views and x, compared with eager's: results, the
    memory written, and the returned view's aliasing (its base, its offset in x's memory)."""
    torch._dynamo.reset()
    base, x = inputs(dtype, offset, requires_grad)
    want_base, want_x = base.clone(), _like(x)
    got_base, got_x = base.clone(), _like(x)
    ctx = torch.no_grad() if requires_grad or not grad else torch.enable_grad()
    with ctx:
        want = fn(want_base[:6], want_base[4:], want_x)
        jf = dealias.jit(fn, executor=options.pop("executor", "torch"), **options)
        got = jf(got_base[:6], got_base[4:], got_x)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
    assert torch.equal(got_base, want_base) and torch.equal(got_x, want_x)
    root = lambda t: t if t._base is None else t._base  # noqa: E731
    assert want[1]._base is root(want_x) and got[1]._base is root(got_x)
    assert got[1].data_ptr() == got_x.data_ptr() + got_x.element_size()
    return jf


def test_a_second_compile_loads_the_first_ones_front(cache):
    run_like_eager(step)
    assert program_cache.counts == {"read": 0, "written": 1} and len(cache) == 1
    jf = run_like_eager(step)  # (dynamo's caches reset: the same graph and leaves compiled again)
    assert program_cache.counts == {"read": 1, "written": 1} and len(cache) == 1
    traces = {t.name: t for t in dealias.last_traces(jf)}
    assert [name for name, _ in traces["captured"].passes] == ["loaded from the program cache"]
    assert "aten.add_.Tensor" in traces["captured"].text and "x.mul_(2)" in traces["captured"].text
    assert "region_write" in traces["functional"].text or "copy" in traces["functional"].text
    run_like_eager(step, executor="exact")  # (the front is every executor's: capture and passes up to optimize)
    assert program_cache.counts == {"read": 2, "written": 1} and len(cache) == 1


def test_other_leaves_another_graph_or_settings_miss(cache, monkeypatch):
    run_like_eager(step)
    run_like_eager(step, dtype=torch.float64)  # (a dtype)
    run_like_eager(step, offset=True)  # (x's storage offset and size)
    run_like_eager(step, requires_grad=True)  # (requires_grad)
    run_like_eager(other_step)  # (another graph of the same leaves)
    monkeypatch.setenv("DEALIAS_SOME_SETTING", "1")  # (dealias's settings)
    run_like_eager(step)
    monkeypatch.delenv("DEALIAS_SOME_SETTING")
    run_like_eager(step, grad=False)  # (grad mode)
    assert program_cache.counts == {"read": 0, "written": 7} and len(cache) == 7
    # ...and storage sharing: the views of one tensor apart (no alias group), same sizes and strides
    torch._dynamo.reset()
    base, x = inputs()
    a, b = base[:6].clone(), base[4:].clone()
    want_a, want_b, want_x = a.clone(), b.clone(), x.clone()
    want = step(want_a, want_b, want_x)
    got = dealias.jit(step, executor="torch")(a, b, x)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert torch.equal(a, want_a) and torch.equal(b, want_b) and torch.equal(x, want_x)
    assert program_cache.counts["read"] == 0 and len(cache) == 8


def test_a_damaged_or_mismatched_entry_is_ignored(cache, tmp_path):
    run_like_eager(step)
    (entry,) = (tmp_path / "dealias" / "programs").iterdir()
    data = entry.read_bytes()
    damaged = [
        data[: len(data) // 2],  # (cut short)
        b"not an entry",
        kept_graphs.MAGIC + b"\x80\x05garbage",
        data.replace(entry.stem.encode(), b"0" * len(entry.stem)),  # (another key inside)
    ]
    for content in damaged:
        entry.write_bytes(content)
        run_like_eager(step)
        assert program_cache.counts["read"] == 0
    # (an entry of another program under this one's name: its key inside differs)
    run_like_eager(other_step)
    other = next(p for p in (tmp_path / "dealias" / "programs").iterdir() if p != entry)
    entry.write_bytes(other.read_bytes())
    run_like_eager(step)
    assert program_cache.counts["read"] == 0
    assert len(cache) == 1 + len(damaged) + 2


def test_a_cache_dir_that_cannot_be_written_keeps_nothing(cache, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(blocker / "dealias"))  # (a directory under a file)
    run_like_eager(step)
    run_like_eager(step)
    assert program_cache.counts == {"read": 0, "written": 0} and len(cache) == 2


_CHILD = textwrap.dedent(
    """
    import json, sys, torch, dealias
    from dealias.passes import pipeline, program_cache
    sys.path.insert(0, sys.argv[1])
    import test_program_cache as t

    traced = []
    capture = pipeline.capture
    pipeline.capture = lambda *a, **k: traced.append(1) or capture(*a, **k)
    t.run_like_eager(t.step)
    t.run_like_eager(t.step, requires_grad=True)
    print(json.dumps({"counts": program_cache.counts, "traced": len(traced)}))
    """
)


def test_a_second_process_loads_the_first_ones_programs(tmp_path):
    env = dict(os.environ, DEALIAS_CACHE_DIR=str(tmp_path / "dealias"), DEALIAS_PROGRAM_CACHE="1")
    env.update(PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    runs = []
    for _ in range(2):
        cmd = [sys.executable, "-c", _CHILD, str(Path(__file__).resolve().parent)]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert runs[0] == {"counts": {"read": 0, "written": 2}, "traced": 2}
    assert runs[1] == {"counts": {"read": 2, "written": 0}, "traced": 0}  # (nothing traced: results still eager's)


_FUSED_CHILD = textwrap.dedent(
    """
    import json, torch, dealias
    from dealias.passes import program_cache
    from dealias.runtime import fused
    from torch._dynamo.utils import counters

    retraced = []
    retrace = fused._retrace
    fused._retrace = lambda *a: retraced.append(1) or retrace(*a)

    def step(w, g, buf, pos):
        w.sub_(0.1 * g)
        buf[pos] = w.sum(0)
        return (w * 2).relu(), buf[pos]

    torch.manual_seed(0)
    w, g, buf = torch.randn(8, 16), torch.randn(8, 16), torch.zeros(4, 16)
    want_w, want_buf = w.clone(), buf.clone()
    want = step(want_w, g, want_buf, 2)
    got = dealias.jit(step, executor="inductor")(w, g, buf, 2)
    same = [torch.allclose(a, b) for a, b in ((got[0], want[0]), (got[1], want[1]), (w, want_w), (buf, want_buf))]
    same.append(got[1].data_ptr() == buf[2].data_ptr())
    hits = counters["inductor"]["fxgraph_cache_hit"]
    print(json.dumps({"counts": program_cache.counts, "retraced": len(retraced), "same": all(same), "fx_hits": hits}))
    """
)


@pytest.mark.inductor
def test_a_second_process_loads_the_fused_retrace(tmp_path):
    env = dict(os.environ, DEALIAS_CACHE_DIR=str(tmp_path / "dealias"), DEALIAS_PROGRAM_CACHE="1")
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    runs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", _FUSED_CHILD], env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    # (the front and the retrace written, then both read; inductor's own cache still hit with the loaded retrace)
    assert runs[0] == {"counts": {"read": 0, "written": 2}, "retraced": 1, "same": True, "fx_hits": 0}
    assert runs[1] == {"counts": {"read": 2, "written": 0}, "retraced": 0, "same": True, "fx_hits": 1}
