"""compat/: dealias's settings and corrections to dynamo are in force only for dealias's frames, each is checked
against this torch's internals when installed, and each construct stays exact when its correction is out of force
(as on a torch whose internals moved): the frame runs eagerly, the graph breaks, or (resume_fallback) dynamo's
own error propagates, never a wrong result and never an import error."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import pytest
import torch

import dealias
from dealias import compat
from dealias.compat import registry
from dealias.compat.examples import EXAMPLES, probe
from dealias.frontend.backend import dealias_backend

# What other backends capture, run in a fresh process with and without dealias imported first. The hand-written Adam
# loop of issue 39 (a 0-d tensor step, `value=-lr / bc1`): dynamo's decompositions keep it one graph; with them off
# (as importing dealias once did for every backend) dynamo calls `.item()` and the break inside the loop skips it.
# Random state calls, a generator argument and `random_` break the graph under any other backend (dealias's
# compat/dynamo_rng.py traces them for dealias's frames only).
_OTHER_BACKENDS = textwrap.dedent(
    """
    import json, sys
    if sys.argv[1] == "with":
        import dealias  # noqa: F401
    import torch
    from torch._dynamo.utils import counters

    def adam(params, grads, ms, vs, step, lr=1e-3):
        step += 1
        bc1 = 1 - 0.9 ** step
        bc2 = 1 - 0.999 ** step
        for p, g, m, v in zip(params, grads, ms, vs):
            m.lerp_(g, 0.1)
            v.mul_(0.999).addcmul_(g, g, value=0.001)
            denom = (v / bc2).sqrt().add_(1e-8)
            p.addcdiv_(m, denom, value=-lr / bc1)

    def scaled(x, scale):
        return x * scale + 1

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x).relu()

    def rng(x, g):
        torch.manual_seed(2)
        s = torch.get_rng_state()
        a = torch.randn(3, generator=g)
        torch.set_rng_state(s)
        return x.random_(0, 5) + a

    def graphs(fn, *args):
        before = counters["stats"]["unique_graphs"]
        fn(*args)
        return counters["stats"]["unique_graphs"] - before

    out = {}
    for backend in sys.argv[2].split(","):
        torch._dynamo.reset()
        ps = [torch.randn(4) for _ in range(2)]
        state = [[torch.randn(4) for _ in range(2)] for _ in range(3)]
        step = torch.tensor(0.0)
        fn = torch.compile(adam, backend=backend)
        out[backend + " adam"] = graphs(fn, ps, *state, step)
        fs = torch.compile(scaled, backend=backend)
        out[backend + " floats"] = [graphs(fs, torch.ones(2), s) for s in (0.5, 0.25, 0.125)]
        m = M()
        fm = torch.compile(m, backend=backend)
        first = graphs(fm, torch.ones(2, 3))
        m.lin.register_forward_hook(lambda mod, i, o: o * 2)
        out[backend + " hook"] = [first, graphs(fm, torch.ones(2, 3))]
        breaks = sum(counters["graph_break"].values())
        fr = torch.compile(rng, backend=backend)
        made = graphs(fr, torch.zeros(3), torch.Generator())
        out[backend + " rng"] = [made, sum(counters["graph_break"].values()) - breaks]
    config = torch._dynamo.config
    out["config"] = [config.enable_dynamo_decompositions, config.skip_nnmodule_hook_guards, config.specialize_float]
    print(json.dumps(out))
    """
)


def _run(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600, env=env or os.environ
    )


@pytest.mark.slow
def test_importing_dealias_changes_nothing_other_backends_capture():
    captured = {}
    for imported in ("without", "with"):
        run = _run(_OTHER_BACKENDS, imported, "eager,aot_eager")
        assert run.returncode == 0, run.stderr[-2000:]
        captured[imported] = json.loads(run.stdout.strip().splitlines()[-1])
    assert captured["with"] == captured["without"]
    assert captured["with"]["eager adam"] == 1  # (the loop compiles: dynamo's own decompositions were in force)


@pytest.mark.inductor
def test_importing_dealias_changes_nothing_inductor_captures():
    captured = [
        json.loads(_run(_OTHER_BACKENDS, i, "inductor").stdout.strip().splitlines()[-1]) for i in ("without", "with")
    ]
    assert captured[0] == captured[1]


def test_a_dealias_compile_leaves_dynamo_settings_as_they_were():
    config = torch._dynamo.config
    before = (config.enable_dynamo_decompositions, config.skip_nnmodule_hook_guards, config.specialize_float)

    def f(p, m, d):
        p.addcdiv_(m, d, value=0.5)
        return p * 2.0

    args = [torch.randn(3), torch.randn(3), torch.rand(3) + 1]
    expected = f(*(a.clone() for a in args))
    got = dealias.jit(f)(*args)
    assert torch.equal(got, expected) and torch.equal(args[0] * 2.0, got)  # eager's addcdiv_ kernel: eager's bits
    assert (config.enable_dynamo_decompositions, config.skip_nnmodule_hook_guards, config.specialize_float) == before


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_each_correction_in_force_matches_eager(name):
    assert compat.active(name), compat.report()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert probe(name, "dealias") is None


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_each_correction_out_of_force_stays_exact(name):
    # As where its internals are missing: the wrappers pass through, and the fall-backs apply.
    with compat.forced_off(name), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        difference = probe(name, "dealias")
    if name == "resume_fallback":  # without it, dynamo's own error propagates (an error, not a wrong result)
        assert difference is not None and "'raises'" in difference.split("compiled gives")[1]
    elif name == "kept_index_reads":  # without it, the unused read is dropped, as with every backend (README)
        assert difference is not None and "'raises'" in difference.split("compiled gives")[0]
    elif name == "checkpoint_arguments":  # without it, backward raises, as with every backend (README)
        assert difference is not None and "'backward raises'" in difference.split("compiled gives")[1]
    elif name == "signed_zero_guards":  # without it, 0.0's program serves -0.0, as with every backend (README)
        assert difference is not None and "-inf" in difference.split("compiled gives")[0]
    elif name == "leaf_guards":  # without it, the leaf's program serves the non-leaf, as with every backend
        assert difference is not None and "call 2" in difference
    else:
        assert difference is None


def test_without_the_settings_every_frame_runs_eagerly_and_says_so():
    def f(x):
        x.add_(1)
        return x * 2

    jf = dealias.jit(f)
    with compat.forced_off("dynamo_settings"):
        with pytest.warns(dealias.FallbackWarning, match="settings are not in force"):
            x = torch.zeros(3)
            assert torch.equal(jf(x), torch.full((3,), 2.0)) and torch.equal(x, torch.ones(3))


def test_a_missing_internal_leaves_its_correction_out_of_force():
    @registry.correction("test_missing", corrects="nothing", without="nothing changes")
    def install():
        registry.require(torch._dynamo, "no_such_internal_anywhere")

    @registry.correction("test_signature", corrects="nothing", without="nothing changes")
    def install_signature():
        registry.require(torch.Tensor, "add_", "self", "not_its_argument")

    try:
        registry.install_all()  # (never raises)
        assert not compat.active("test_missing") and "no_such_internal_anywhere is not there" in compat.report()
        assert not compat.active("test_signature")
        assert "NOT in force" in compat.report()
    finally:
        del registry._CORRECTIONS["test_missing"], registry._CORRECTIONS["test_signature"]


@pytest.mark.slow
def test_import_with_every_correction_off_is_exact():
    script = textwrap.dedent(
        """
        import warnings, torch, dealias
        from dealias import compat
        assert not any(compat.active(c.name) for c in compat.corrections())
        def f(x):
            x.add_(1)
            return x * 2
        with warnings.catch_warnings(record=True) as told:
            warnings.simplefilter("always")
            x = torch.zeros(3)
            out = dealias.jit(f)(x)
        assert torch.equal(out, torch.full((3,), 2.0)) and torch.equal(x, torch.ones(3))
        assert any(issubclass(w.category, dealias.FallbackWarning) for w in told)
        print(compat.report().splitlines()[0])
        """
    )
    run = _run(script, env={**os.environ, "DEALIAS_COMPAT_OFF": "all"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "0 of" in run.stdout


def test_doctor_lists_the_corrections():
    from dealias.tools.cli import main

    assert main(["doctor"]) == 0
    text = compat.report()
    for c in compat.corrections():
        assert c.name in text


@pytest.mark.inductor
def test_without_its_autograd_correction_a_graph_autograd_records_runs_unfused():
    # Where AOTAutograd's donated buffers cannot be turned off for dealias's compiles, a second
    # backward(retain_graph=True) would raise where eager's runs: such graphs stay on the torch executor.
    def step(x, w):
        return (x * w).sin().sum()

    jf = dealias.jit(step, executor="inductor")
    x, w = torch.randn(4), torch.randn(4, requires_grad=True)
    with compat.forced_off("aot_no_donated_buffers"):
        loss = jf(x, w)
    assert jf.last.tier == "torch"
    loss.backward(retain_graph=True)
    loss.backward()
    torch.testing.assert_close(w.grad, 2 * x * (x * w).cos())


def two_linears_of_a_row(x, g, w1, w2):
    h = g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))  # a (1, 1, 256) row inductor computes
    return torch.nn.functional.linear(h, w1), torch.nn.functional.linear(h, w2)


@pytest.mark.inductor
def test_without_the_view_strides_correction_atens_mm_copies_the_row_and_the_results_stay(monkeypatch):
    # Out of force, inductor's (0, 1) strides reach ATen's mm, which copies the row first: slower, the same values.
    monkeypatch.setenv("DEALIAS_ROW_PRODUCTS", "aten")  # (the products left to ATen's mm: row_products.py)
    args = (torch.randn(1, 1, 256), torch.randn(256), torch.randn(256, 256), torch.randn(256, 256))
    jf = dealias.jit(two_linears_of_a_row, executor="inductor")
    with compat.forced_off("inductor_view_strides"):
        torch.testing.assert_close(jf(*args), two_linears_of_a_row(*args))
    assert jf.last.tier == "fused"
    with torch.profiler.profile() as prof:
        got = jf(*args)
    torch.testing.assert_close(got, two_linears_of_a_row(*args))
    ops = [e.name for e in prof.events()]
    assert ops.count("aten::mm") == 2 and ("aten::clone" in ops or "aten::copy_" in ops), ops


_SNAPSHOT_OFF = textwrap.dedent(
    """
    import json, torch, dealias
    from dealias.compat import active
    from dealias.runtime.hazards import SNAPSHOTS
    from dealias.runtime.verify import compare_call

    def swap_rows(buf):
        t = buf[0].clone()  # read before buf[0] is written: a snapshot in the fused graph
        buf[0] = buf[1]
        buf[1] = t

    jf = dealias.jit(swap_rows, executor="inductor")
    diffs = [compare_call(swap_rows, jf, (torch.randn(4, 3),)) for _ in range(3)]
    snapshots = [n for n in jf.last.run_graph.graph.graph.nodes if n.target in SNAPSHOTS]  # (handed to inductor)
    print(json.dumps([diffs, jf.last.tier, len(snapshots), active("inductor_snapshot_lowering")]))
    """
)


@pytest.mark.inductor
def test_without_the_snapshot_lowering_the_rows_still_swap_as_eagers():
    # The lowering is registered with inductor once installed: out of force means never installed (a fresh process
    # with DEALIAS_COMPAT_OFF). Inductor then runs the custom op as it runs any other (slower), the values eager's.
    run = _run(_SNAPSHOT_OFF, env={**os.environ, "DEALIAS_COMPAT_OFF": "inductor_snapshot_lowering"})
    assert run.returncode == 0, run.stderr[-2000:]
    diffs, tier, snapshots, active = json.loads(run.stdout.strip().splitlines()[-1])
    assert diffs == [None, None, None] and tier == "fused" and snapshots > 0 and not active


def hand_written_adam(params, grads, ms, vs, step, lr=1e-3):
    step += 1
    bc1 = 1 - 0.9**step
    bc2 = 1 - 0.999**step
    for p, g, m, v in zip(params, grads, ms, vs):
        m.lerp_(g, 0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        denom = (v / bc2).sqrt().add_(1e-8)
        p.addcdiv_(m, denom, value=-lr / bc1)  # a 0-d tensor value
        p.add_(g, alpha=step * 1e-4)  # a 0-d tensor alpha


def _adam_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.rand(5, generator=g) for _ in range(3)] for _ in range(4)] + [torch.tensor(0.0)]


def test_a_hand_written_adam_with_tensor_scalars_is_one_graph_with_eagers_bits():
    # Issue 39: with dynamo's decompositions off the 0-d `value` broke the graph inside the loop, and dynamo ran the
    # whole step eagerly, with no warning; with them on (other backends) it runs prims.fma, other bits than eager's.
    jf = dealias.jit(hand_written_adam)
    expected, got = _adam_state(), _adam_state()
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        for _ in range(3):
            hand_written_adam(*expected)
            jf(*got)
            for want, have in zip(pytree_leaves(expected), pytree_leaves(got)):
                assert torch.equal(want, have)
    info = dealias.cache_info(jf)
    assert (info.misses, info.hits, len(jf.stats.graphs)) == (1, 2, 1)
    assert "dealias.addcdiv_" in dealias.last_traces(jf)[-1].text


def test_tensor_scalars_of_a_tensor_requiring_grad_are_left_to_dynamo():
    # (These ops have no derivative formula: under grad mode with an operand requiring grad, dynamo's own path.)
    def f(x, w, t):
        y = x * 1
        y.add_(w, alpha=t)
        return y

    jf = dealias.jit(f)
    args = [torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True), torch.tensor(0.5)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = jf(*args)
    expected = f(*args)
    assert torch.equal(out, expected)
    out.sum().backward()
    assert torch.equal(args[1].grad, torch.full((3,), 0.5))


def pytree_leaves(tree):
    return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def loop_with_a_break(xs):
    for x in xs:
        x.add_(1)
        if x.sum().item() > 1e9:  # a graph break inside the loop: dynamo gives up on the whole frame
            x.zero_()


def test_a_frame_dynamo_gives_up_on_runs_eagerly_with_one_warning():
    jf = dealias.jit(loop_with_a_break)
    xs, expected = [torch.zeros(2) for _ in range(3)], [torch.zeros(2) for _ in range(3)]
    with pytest.warns(dealias.FallbackWarning, match=r"loop_with_a_break \(.*test_compat.py:\d+\) runs eagerly"):
        jf(xs)
    loop_with_a_break(expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)  # (once: dynamo remembers the frame)
        jf(xs)
    loop_with_a_break(expected)
    assert all(torch.equal(a, b) for a, b in zip(xs, expected))


def test_a_users_file_in_a_folder_named_torch_is_still_the_users(tmp_path):
    # torch's own frames are left quiet by the package's directory, not by a `/torch/` in the path.
    folder = tmp_path / "torch"
    folder.mkdir()
    path = folder / "user_loop.py"
    path.write_text(
        textwrap.dedent("""
        def loop(xs):
            for x in xs:
                x.add_(1)
                if x.sum().item() > 1e9:
                    x.zero_()
    """)
    )
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    jf = dealias.jit(namespace["loop"])
    with pytest.warns(dealias.FallbackWarning, match=r"loop \(.*user_loop.py:\d+\) runs eagerly"):
        jf([torch.zeros(2)])


def test_torch_optims_own_graph_breaks_are_listed_not_warned():
    # torch.optim calls torch._dynamo.graph_break() around its step on purpose: not the user's problem.
    def make():
        params = [torch.nn.Parameter(torch.linspace(-1, 1, 6).view(2, 3) * (i + 1)) for i in range(2)]
        for i, p in enumerate(params):
            p.grad = torch.full_like(p, 0.1 * (i + 1))
        return params, torch.optim.Adam(params, lr=0.05)

    (eager_params, eager_opt), (params, opt) = make(), make()
    jf = dealias.jit(opt.step)
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)  # (GraphBreakWarning is one)
        for _ in range(3):
            eager_opt.step()
            jf()
    for a, b in zip(eager_params, params):
        torch.testing.assert_close(a, b)  # (torch.optim under dynamo rounds its step differently: README)
    breaks = dealias.graph_breaks(jf)
    assert breaks and all("asked for by torch's own code" in b for b in breaks), breaks


# Found by review.


def test_a_wrapper_of_dealias_dynamo_cannot_see_through_runs_the_frame_eagerly():
    # The frame is traced without dealias's settings (a forward hook registered after the first call was ignored).
    from torch._dynamo.testing import CompileCounterWithBackend

    m = torch.nn.Linear(2, 2)
    for backend in (CompileCounterWithBackend("dealias"), lambda gm, ex: dealias_backend(gm, ex, options={})):
        f = torch.compile(lambda x: m(x), backend=backend)
        x = torch.ones(1, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            first = f(x)
            handle = m.register_forward_hook(lambda mod, i, o: o * 100)
            second = f(x)
            handle.remove()
        assert torch.equal(first, m(x)) and torch.equal(second, m(x) * 100)


def test_a_tensor_scalar_eager_refuses_is_refused():
    def step(p, g):
        with torch.no_grad():
            p.add_(g, alpha=p[0])  # a view made under no_grad of a leaf requiring grad: eager's TypeError

    p, g = torch.ones(3, requires_grad=True), torch.ones(3)
    with pytest.raises(TypeError, match="must be Number, not Tensor"):
        step(p, g)
    with warnings.catch_warnings(), pytest.raises(TypeError, match="must be Number, not Tensor"):
        warnings.simplefilter("ignore")
        dealias.jit(step)(p, g)
    assert torch.equal(p.detach(), torch.ones(3))


def test_a_tensor_scalar_sharing_the_written_memory_keeps_eagers_version_counter():
    def step(p, g):
        a = p[0]
        p.mul_(2)
        p.add_(g, alpha=a)
        return p

    p, q, g = torch.ones(3), torch.ones(3), torch.full((3,), 0.5)
    step(p, g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dealias.jit(step)(q, g)
    assert torch.equal(p, q) and p._version == q._version == 2


def test_without_autograd_facts_a_branch_on_a_stale_view_runs_eagerly():
    def branch(x, w):
        t = x * 1
        v = t[:2]  # made before t carries grad; read only by Python below
        t.mul_(w)
        return t.sum() * (2 if v.requires_grad else 3)

    args = [torch.ones(3), torch.ones(3, requires_grad=True)]
    with compat.forced_off("autograd_facts"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = dealias.jit(branch)(*args)
    assert torch.equal(got, branch(*args))


def at_own_offset(x):
    v = x[1]
    return v.as_strided((2,), (1,), v.storage_offset()) * 1  # the offset depends on x's placement in its storage


def test_storage_offset_with_static_shapes_is_a_guarded_constant():
    # Dynamo breaks the graph at storage_offset() with static shapes; for dealias's compiles it is this call's
    # offset, with the inputs' offsets guarded: another placement compiles again, the same one hits.
    jf = dealias.jit(at_own_offset)
    base = torch.arange(16.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        for offset in (0, 1, 2, 1, 0):
            x = base[offset : offset + 12].view(3, 4)
            assert torch.equal(jf(x), at_own_offset(x))
    info = dealias.cache_info(jf)
    assert (info.misses, info.hits) == (3, 2) and "storage_offset" in info.last_miss_reason
    with compat.forced_off("storage_offset"):
        torch._dynamo.reset()
        jf = dealias.jit(at_own_offset)
        with pytest.warns(dealias.FallbackWarning, match="storage_offset"):
            jf(base[1:13].view(3, 4))


def _lerp_ema(ema, params):
    torch._foreach_lerp_(ema, params, 0.25)


def test_foreach_lerp_stays_eagers_op_in_dealias_graphs_only():
    """Dynamo 2.13 rewrites `_foreach_lerp_` into a sub, a full_like per tensor and an addcmul_ for every backend
    (5.7x eager run as they are); in dealias's frames the graph holds eager's op (dynamo_lerp.py), as 2.14 does
    with decompositions off. Other backends capture what they captured before."""
    from harness import functional_ops

    def make():
        torch.manual_seed(0)
        return [torch.randn(5, 3) for _ in range(3)], [torch.randn(5, 3) for _ in range(3)]

    jf = dealias.jit(_lerp_ema, executor="torch")
    for _ in range(2):  # first and cached call: eager's bits, every tensor of the average written
        (ema, params), (expected, _) = make(), make()
        _lerp_ema(expected, params)
        jf(ema, params)
        assert all(torch.equal(a, b) for a, b in zip(ema, expected))
    assert dealias.cache_info(jf).misses == 1
    ops = functional_ops(jf)
    assert "aten._foreach_lerp.Scalar" in ops and not any("addcmul" in op or "full_like" in op for op in ops), ops

    def captured(forced_off: bool) -> list[str]:
        graphs: list[Any] = []

        def record(gm, example):
            graphs.append(gm)
            return gm.forward

        torch._dynamo.reset()
        with compat.forced_off("foreach_lerp_kept") if forced_off else contextlib.nullcontext():
            torch.compile(_lerp_ema, backend=record)(*make())
        return [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]

    assert captured(False) == captured(True)
