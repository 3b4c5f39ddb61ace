"""Inductor's FX graph cache for dealias's fused compiles (compat/graph_cache.py): a second process compiling the
same program loads inductor's code from the cache directory and gives eager's results (over a symbol too, with
the compile's guards); an entry is dealias's own (the corrections in force are in its key); a graph over symbols
no SymInt input binds is not cached."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.inductor

# Two programs, each run by eager (on clones) and by the fused executor: one writing into the caller's tensors
# (fused.py's compile_fx_inner), one autograd records (fused_autograd.py's AOTAutograd), with a backward. Prints,
# per program, whether everything matched eager's and the FX graph cache's counters for its compile.
_SCRIPT = textwrap.dedent(
    """
    import json
    import torch
    from torch._dynamo.utils import counters
    import dealias

    torch.manual_seed(0)

    def writes(buf, row):
        buf[3] = row
        buf.mul_(2).add_(row)
        return buf[:4].sum(0) + 1

    def forward(lin, x):
        return (lin(x).relu_() * 2).sum(1)

    def at_position(cache, k, pos: int):
        cache[:, pos] = k
        return cache[:, : pos + 1].sum(1)

    def same(a, b):
        return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-6, atol=1e-6))

    out = {}
    buf, row = torch.randn(8, 16), torch.randn(16)
    eager_buf, eager_row = buf.clone(), row.clone()
    counters.clear()
    jf = dealias.jit(writes, executor="inductor")
    got, expected = jf(buf, row), writes(eager_buf, eager_row)
    ok = same(got, expected) and same(buf, eager_buf) and same(row, eager_row) and jf.last.tier == "fused"
    out["writes"] = {"ok": ok, **{k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph")}}

    lin, x = torch.nn.Linear(16, 8), torch.randn(4, 16, requires_grad=True)
    eager_lin, eager_x = torch.nn.Linear(16, 8), x.detach().clone().requires_grad_()
    eager_lin.load_state_dict(lin.state_dict())
    counters.clear()
    jf = dealias.jit(forward, executor="inductor")
    got, expected = jf(lin, x), forward(eager_lin, eager_x)
    got.sum().backward()
    expected.sum().backward()
    ok = same(got, expected) and same(x.grad, eager_x.grad) and jf.last.tier == "fused"
    ok = ok and all(same(a.grad, b.grad) for a, b in zip(lin.parameters(), eager_lin.parameters()))
    out["autograd"] = {"ok": ok, **{k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph")}}

    # Over a symbol (the position, dynamic from its second value on): a cache hit's guards go into the program's
    # shape guard as the compile's did.
    counters.clear()
    jf = dealias.jit(at_position, executor="inductor")
    ok = True
    for pos in (2, 5, 7):
        cache, k = torch.randn(2, 9), torch.randn(2)
        eager_cache = cache.clone()
        ok = ok and same(jf(cache, k, pos), at_position(eager_cache, k, pos)) and same(cache, eager_cache)
    guard = jf.last.shape_guard
    ok = ok and jf.last.tier == "fused" and guard is not None
    counts = {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph")}
    out["symbolic"] = {"ok": ok, "guard": guard.text, **counts}
    print(json.dumps(out))
    """
)


def _process(cache_dir, **env) -> dict:
    """The script in a new process whose inductor cache is `cache_dir`."""
    environ = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), **env}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=900, env=environ, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_fused_code_from_the_cache_and_gives_eagers_results(tmp_path):
    cold = _process(tmp_path)
    for program in ("writes", "autograd", "symbolic"):
        assert cold[program]["ok"], program
        assert cold[program].get("fxgraph_cache_miss", 0) >= 1, (program, cold[program])  # (stored, not bypassed)
        assert cold[program].get("fxgraph_cache_bypass", 0) == 0, (program, cold[program])
    warm = _process(tmp_path)
    for program in ("writes", "autograd", "symbolic"):
        assert warm[program]["ok"], program
        assert warm[program].get("fxgraph_cache_hit", 0) >= 1, (program, warm[program])
        assert warm[program].get("fxgraph_cache_miss", 0) == 0, (program, warm[program])
    assert warm["symbolic"]["guard"] == cold["symbolic"]["guard"]
    # A correction out of force changes what inductor generates for dealias's graphs, and is not in the graph's
    # code: the cached entries are not taken then.
    other = _process(tmp_path, DEALIAS_COMPAT_OFF="inductor_view_strides")
    for program in ("writes", "autograd"):
        assert other[program]["ok"], program
        assert other[program].get("fxgraph_cache_hit", 0) == 0, (program, other[program])


def test_a_graph_over_symbols_only_sizes_bind_is_not_cached():
    """Inductor's entry keeps guards over SymInt inputs only: a symbol bound by an input's size alone would go
    unchecked at a lookup, so such a graph is compiled without the cache (graph_cache yields no tracing context)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from dealias.compat.graph_cache import _symbols_are_inputs, graph_cache

    mode = FakeTensorMode(shape_env=ShapeEnv())
    x = mode.from_tensor(torch.randn(5, 3))  # (dynamic sizes: s0, s1)
    assert not _symbols_are_inputs([x])
    assert _symbols_are_inputs([x, x.shape[0], x.shape[1]])
    with graph_cache([x]) as handed:
        assert handed == [x]
        assert torch._guards.TracingContext.try_get() is None
    with graph_cache([x, x.shape[0], x.shape[1]]) as handed:
        assert torch._guards.TracingContext.try_get().fake_mode is mode
    # A static example is handed over as fake tensors of its layout (its values would otherwise be hashed).
    t = torch.randn(4, 6)[:, 1:]
    with graph_cache([t, 3]) as handed:
        fake, three = handed
        assert isinstance(fake, torch._subclasses.FakeTensor) and three == 3
        assert (fake.shape, fake.stride(), fake.storage_offset()) == (t.shape, t.stride(), t.storage_offset())
        assert torch._guards.TracingContext.try_get().fake_mode is fake.fake_mode
