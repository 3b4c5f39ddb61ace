"""Tiers (frontend/tiers.py): executor="exact" runs each program on the faster of the torch executor and dynamo's
graph run as it is, measured on its calls; executor="tiered" (the default) adds the fused executor, compiled in the
background. Every call is compared with eager, before, during and after the choice. Timing is faked
(`tiers.measure`): which tier wins is decided by the test, never by the machine; so is when a background compile
ends."""

from __future__ import annotations

import copy
import time

import pytest
import torch
from harness import compare_call, grads_like_eager, same

import dealias
from dealias.compat.inductor import compile_beside_calls
from dealias.frontend import tiers

# (the choice rules' calls counted call by call: conftest.calls_one_by_one)
pytestmark = pytest.mark.usefixtures("calls_one_by_one")

CALLS = 16  # enough for either exact tier to be chosen (one warm-up and tiers.SAMPLES timed calls each)


def faked(monkeypatch, now: list[float] | None = None, **seconds: float) -> list[str]:
    """Make `tiers.measure` say each call on tier t took seconds[t]; returns the tiers measured, in order. The fused
    compile runs in the promoting call (the background compile has tests of its own, below). The clock that times a
    call with autograd history until the next call reads `now[0]` (stands still unless the test moves it)."""
    ran: list[str] = []
    monkeypatch.setattr(tiers, "BACKGROUND", False)
    now = [0.0] if now is None else now
    monkeypatch.setattr(tiers, "clock", lambda: now[0])

    def measure(tier, run, leaves):
        ran.append(tier)
        return run(leaves), seconds[tier]

    monkeypatch.setattr(tiers, "measure", measure)
    return ran


def slice_write(buf, row):
    buf[123] = row
    buf[124].add_(row)
    return buf[3:5], buf.sum()  # a view of the input, and a value


def write_through_view(x, y):
    v = x.t()
    v[0].mul_(y)
    return v, x + 1  # returns a view of the caller's tensor


def calls_like_eager(fn, jf, make_args, calls: int = CALLS) -> None:
    for call in range(calls):
        diff = compare_call(fn, jf, make_args())  # values, mutated inputs, aliasing of outputs
        assert diff is None, f"call {call + 1}: {diff}"


@pytest.mark.parametrize("winner", ["graph", "torch"])
@pytest.mark.parametrize(
    "fn, make_args",
    [
        (slice_write, lambda: (torch.randn(256, 8), torch.randn(8))),
        (write_through_view, lambda: (torch.randn(4, 3), torch.randn(4))),
    ],
)
def test_exact_keeps_the_faster_exact_tier_and_stays_exact(monkeypatch, winner, fn, make_args):
    loser = "torch" if winner == "graph" else "graph"
    ran = faked(monkeypatch, **{winner: 2e-5, loser: 5e-5})
    jf = dealias.jit(fn, executor="auto")  # "exact"'s former name
    assert jf.options.executor == "exact"
    calls_like_eager(fn, jf, make_args)
    info = dealias.cache_info(jf)
    assert (info.misses, info.hits, info.tiers) == (1, CALLS - 1, (winner,)), info
    assert info.timings == ({winner: 2e-5, loser: 5e-5},)
    assert info.tier_reasons == (
        f"fastest measured: {winner} 20.0 us vs {loser} 50.0 us (each one's fastest timed calls)",
    )
    # one untimed first call per tier, then timed ones, taking turns: the loser (2.5x) dropped after its second
    # timed call, which chooses the winner (the only candidate left); nothing timed after the choice
    assert ran.count(winner) == 3 and ran.count(loser) == 3, ran
    assert ran[:4] in (["torch", "graph"] * 2, ["graph", "torch"] * 2)
    explained = dealias.explain(jf)
    assert (explained.tier, explained.tier_reason) == (winner, info.tier_reasons[0])
    assert [r.target for r in explained] == ["buf" if fn is slice_write else "x"]


def test_close_tiers_are_both_measured_to_the_end(monkeypatch):
    ran = faked(monkeypatch, graph=2e-5, torch=2.6e-5)  # (within CLEAR_LOSS: no early drop)
    jf = dealias.jit(slice_write, executor="exact")
    calls_like_eager(slice_write, jf, lambda: (torch.randn(256, 8), torch.randn(8)))
    assert ran.count("graph") == ran.count("torch") == tiers.SAMPLES + 1, ran
    assert dealias.cache_info(jf).tiers == ("graph",)


def test_after_the_choice_the_graphs_lean_call_runs_the_winner_directly(monkeypatch):
    faked(monkeypatch, graph=1e-5, torch=2e-5)
    jf = dealias.jit(slice_write, executor="exact")
    calls_like_eager(slice_write, jf, lambda: (torch.randn(256, 8), torch.randn(8)))
    program = jf.stats.graphs[0]
    tiered = program.lean[1]
    assert tiered.settled and program.lean[2] is tiered.runs["graph"]


def test_inputs_sharing_memory_stay_on_the_torch_executor(monkeypatch):
    ran = faked(monkeypatch, graph=1e-6, torch=1e-3)  # the graph would win: it must not be tried

    def fn(x, y):
        x.add_(1)
        return y * 2

    def make_args():
        base = torch.randn(10)
        return base, base[2:]

    jf = dealias.jit(fn, executor="exact")
    calls_like_eager(fn, jf, make_args)
    info = dealias.cache_info(jf)
    assert info.tiers == ("torch",) and info.timings == ({},)
    assert info.tier_reasons == ("the only exact tier; graph not tried: inputs share memory",)
    assert ran == []  # nothing measured, nothing to choose


def test_a_metadata_change_is_not_run_as_the_graph(monkeypatch):
    faked(monkeypatch, graph=1e-6, torch=1e-3)

    def fn(x):
        y = x * 2
        y.t_()
        return y

    jf = dealias.jit(fn, executor="exact")
    calls_like_eager(fn, jf, lambda: (torch.randn(3, 4),))
    assert dealias.cache_info(jf).tiers == ("torch",)
    assert "graph not tried" in dealias.cache_info(jf).tier_reasons[0]


@pytest.mark.parametrize("winner", ["graph", "torch"])
def test_gradients_are_eagers_on_either_tier(monkeypatch, winner):
    faked(monkeypatch, **{winner: 1e-5, ("torch" if winner == "graph" else "graph"): 2e-5})

    def fn(x, w):
        y = x * w
        y[0].mul_(2)
        return y.sum(0), y

    def make_args():
        return torch.randn(3, 4, requires_grad=True) * 1, torch.randn(4, requires_grad=True)

    jf = dealias.jit(fn, executor="exact")
    assert grads_like_eager(fn, jf, make_args, calls=CALLS) == []
    assert dealias.cache_info(jf).tiers == (winner,)


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("slow_backward", ["graph", "torch"])
def test_a_calls_backward_counts_in_its_tiers_time(monkeypatch, slow_backward, grad):
    """A call whose outputs carry autograd history is timed until the program's next call, its backward included:
    the tier with the faster forward loses when its backward costs more. Without history, the forward decides."""
    other = "torch" if slow_backward == "graph" else "graph"
    now = [0.0]
    ran = faked(monkeypatch, now, **{slow_backward: 1e-5, other: 2e-5})

    def fn(x, w):
        y = x * w
        y[0].mul_(2)
        return y.sum(0), y

    jf = dealias.jit(fn, executor="exact")
    torch.manual_seed(0)
    for _ in range(CALLS):
        x, w = torch.randn(3, 4, requires_grad=True) * 1, torch.randn(4, requires_grad=True)
        with torch.set_grad_enabled(grad):
            got, expected = jf(x, w), fn(x.detach().clone().requires_grad_(grad), w)
        same(got[1], expected[1])
        now[0] += 1e-3 if ran[-1] == slow_backward else 0.0  # (the backward below, on the tier that ran)
        if grad:
            got[0].sum().backward()
    assert dealias.cache_info(jf).tiers == ((other,) if grad else (slow_backward,))
    reason = f"{other} 20.0 us vs {slow_backward} 1010.0 us" if grad else f"{slow_backward} 10.0 us vs {other} 20.0 us"
    assert dealias.cache_info(jf).tier_reasons[0].startswith("fastest measured: " + reason)


def test_module_state_and_optimizer_steps_are_eagers_on_the_graph_tier(monkeypatch):
    faked(monkeypatch, graph=1e-5, torch=2e-5)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(inplace=True))
    eager_model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    jmodel, jstep = dealias.jit(model, executor="exact"), dealias.jit(opt.step, executor="exact")
    versions = [[t._version for t in m.state_dict().values()] for m in (model, eager_model)]
    for _ in range(CALLS):
        x = torch.randn(16, 8)
        jmodel(x).square().sum().backward()
        eager_model(x).square().sum().backward()
        jstep()
        eager_opt.step()
        for a, b, a0, b0 in zip(model.state_dict().values(), eager_model.state_dict().values(), *versions):
            same(a, b)
            assert a._version - a0 == b._version - b0  # (deepcopy's tensors start at 0, the model's after init)
        for a, b in zip(model.parameters(), eager_model.parameters()):
            same(a.grad, b.grad)
        opt.zero_grad()
        eager_opt.zero_grad()
    assert "graph" in dealias.cache_info(jstep).tiers
    # BatchNorm's running statistics, written where eager's counters stay, run as dynamo's graph too (eager's ops)
    assert dealias.cache_info(jmodel).tiers == ("graph",)


def test_a_program_whose_fused_compile_fails_stays_exact(monkeypatch):
    faked(monkeypatch, graph=1e-5, torch=2e-5, fused=1e-6)
    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 3)

    def failing(*args, **kwargs):
        raise RuntimeError("inductor failed")

    monkeypatch.setattr(tiers, "compile_program", failing)
    jf = dealias.jit(slice_write, executor="tiered")
    calls_like_eager(slice_write, jf, lambda: (torch.randn(256, 8), torch.randn(8)))  # bit for bit (rtol=0)
    info = dealias.cache_info(jf)
    assert info.tiers == ("graph (fused compile failed)",) and info.misses == 1
    assert "fused" not in info.timings[0]


def test_tiered_waits_for_promote_after_before_compiling_the_fused_program(monkeypatch):
    faked(monkeypatch, graph=1e-5, torch=2e-5)
    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 20)
    compiles = []
    monkeypatch.setattr(tiers, "compile_program", lambda *a, **k: compiles.append(1) or 1 / 0)
    jf = dealias.jit(slice_write, executor="tiered")
    calls_like_eager(slice_write, jf, lambda: (torch.randn(256, 8), torch.randn(8)), calls=19)
    assert compiles == [] and dealias.cache_info(jf).tiers == ("graph",)
    calls_like_eager(slice_write, jf, lambda: (torch.randn(256, 8), torch.randn(8)), calls=1)
    assert compiles == [1] and dealias.cache_info(jf).tiers == ("graph (fused compile failed)",)


def fused_results_close(fn, jf, make_args, calls: int) -> None:
    from harness import clone_args

    for _ in range(calls):
        args = make_args()
        eager_args = clone_args(args)
        got, expected = jf(*args), fn(*eager_args)
        # (a fused sum of 2,048 floats adds in another order: up to ~1e-5 apart on values of a few units, which the
        # default float32 tolerance missed for some of the unseeded inputs)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(args, eager_args, rtol=1e-5, atol=1e-4)
        assert got[0]._base is args[0] or got[0]._base is args[0]._base  # a view of the caller's buffer


@pytest.mark.inductor
@pytest.mark.parametrize("fused_wins", [True, False])
def test_tiered_keeps_the_fused_program_only_when_it_is_faster(monkeypatch, fused_wins):
    ran = faked(monkeypatch, graph=3e-5, torch=2e-5, fused=1e-5 if fused_wins else 4e-5)
    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 14)
    jf = dealias.jit(slice_write, executor="tiered")
    make_args = lambda: (torch.randn(256, 8), torch.randn(8))
    fused_results_close(slice_write, jf, make_args, 13)
    assert dealias.cache_info(jf).tiers == ("torch",) and "fused" not in ran  # (exact tiers chosen by call 12)
    fused_results_close(slice_write, jf, make_args, 16)
    info = dealias.cache_info(jf)
    assert info.misses == 1
    assert info.tiers == ("fused" if fused_wins else "torch",)
    assert set(info.timings[0]) == {"torch", "graph", "fused"}
    assert info.tier_reasons[0].startswith("fastest measured: " + ("fused 10.0 us" if fused_wins else "torch 20.0 us"))
    assert (jf.last.shown.tier == "fused") == fused_wins  # last_traces / explain show the program that runs
    n = len(ran)
    fused_results_close(slice_write, jf, make_args, 3)
    assert len(ran) == n  # settled: nothing timed any more


@pytest.mark.inductor
def test_tiered_over_a_changing_position_compiles_a_bounded_number_of_programs(monkeypatch):
    faked(monkeypatch, graph=3e-5, torch=2e-5, fused=1e-5)
    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 4)

    def write_at(cache, k, pos: int):
        cache[:, pos] = k
        return cache[:, : pos + 1].sum(1)

    jf = dealias.jit(write_at, executor="tiered")
    cache, eager_cache = torch.zeros(2, 32), torch.zeros(2, 32)
    for pos in range(24):
        k = torch.randn(2)
        torch.testing.assert_close(jf(cache, k, pos), write_at(eager_cache, k, pos))
        torch.testing.assert_close(cache, eager_cache)
    info = dealias.cache_info(jf)
    assert info.misses <= 2 and info.tiers[-1] == "fused", info


def test_an_error_on_the_graph_tier_is_eagers(monkeypatch):
    faked(monkeypatch, graph=1e-5, torch=2e-5)

    def two_writes(x, i, s):
        x.add_(1)
        x.index_copy_(0, i, s)

    jf = dealias.jit(two_writes, executor="exact")
    calls_like_eager(two_writes, jf, lambda: (torch.zeros(4), torch.tensor([1]), torch.ones(1)))
    assert dealias.cache_info(jf).tiers == ("graph",)
    x, eager_x = torch.zeros(4), torch.zeros(4)
    with pytest.raises(IndexError) as eager:
        two_writes(eager_x, torch.tensor([7]), torch.ones(1))
    with pytest.raises(IndexError) as compiled:
        jf(x, torch.tensor([7]), torch.ones(1))
    assert str(compiled.value) == str(eager.value)
    same(x, eager_x)  # eager's first write happened, as eager's did


@pytest.mark.inductor
def test_gradients_before_and_after_the_fused_program_is_chosen(monkeypatch):
    faked(monkeypatch, graph=3e-5, torch=2e-5, fused=1e-5)
    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 3)
    monkeypatch.setattr(tiers, "SAMPLES", 1)

    def fn(x, w):
        y = x * w
        y.mul_(2)
        return y.sum(0).sin()

    def make_args():
        return torch.randn(3, 4, requires_grad=True) * 1, torch.randn(4, requires_grad=True)

    from harness import clone_args

    jf = dealias.jit(fn, executor="tiered")
    tiers_seen = []
    for _ in range(8):
        args = make_args()
        eager_args = clone_args(args)
        got, expected = jf(*args), fn(*eager_args)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)  # (fused: the fuzzer's tolerance)
        got.square().sum().backward()
        expected.square().sum().backward()
        torch.testing.assert_close(args[1].grad, eager_args[1].grad, rtol=1e-4, atol=1e-4)
        tiers_seen.append(dealias.cache_info(jf).tiers[0])
    assert tiers_seen[-1] == "fused" and tiers_seen[0] == "torch", tiers_seen


def blocked_compile(monkeypatch, fail: bool = False):
    """Inductor's compile waits for the test's `release` (and raises if `fail`); `threads` records where it ran."""
    import threading

    import torch._inductor.compile_fx as compile_fx

    release, threads = threading.Event(), []
    real = compile_fx.compile_fx_inner

    def compile_fx_inner(*args, **kwargs):
        threads.append(threading.current_thread().name)
        assert release.wait(120), "the test never released the compile"
        if fail:
            raise RuntimeError("inductor failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx_inner", compile_fx_inner)
    return release, threads


needs_background = pytest.mark.skipif(
    not compile_beside_calls(),
    reason="FX's tracing flag is the process's on this torch: the fused compile runs in the promoting call",
)


def _entry(jf):
    """The (one) cache entry of jf's graph: a Tiered."""
    [[(_, _, entry, _)]] = jf.stats.graphs[0].cache.values()
    return entry


@needs_background
@pytest.mark.inductor
def test_the_default_compiles_the_fused_program_in_the_background(monkeypatch):
    ran = faked(monkeypatch, graph=3e-5, torch=2e-5, fused=1e-5)
    monkeypatch.setattr(tiers, "BACKGROUND", True)
    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 3)
    release, threads = blocked_compile(monkeypatch)
    jf = dealias.jit(slice_write)  # the default
    assert jf.options.executor == "tiered"
    make_args = lambda: (torch.randn(256, 8), torch.randn(8))  # noqa: E731
    # Calls 1-3 on the exact tiers; the third starts the compile, which waits: calls go on, bit for bit eager's.
    calls_like_eager(slice_write, jf, make_args, calls=12)
    deadline = time.monotonic() + 120  # (a loaded machine may not have run the thread up to inductor's compile yet)
    while not threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threads == ["dealias fused compile"], dealias.cache_info(jf)
    info = dealias.cache_info(jf)
    assert info.tiers == ("torch",) and "fused" not in ran
    assert info.tier_reasons[0].startswith("the fused program compiling in the background")
    release.set()
    assert dealias.wait_compiles(jf, timeout=120)
    # adopted; the three measured afresh (samples taken while inductor compiled are dropped; the exact tiers' choice
    # waits for the fused program once it is promoted), the fastest chosen
    fused_results_close(slice_write, jf, make_args, 3 * tiers.SAMPLES + 1)
    info = dealias.cache_info(jf)
    assert info.tiers == ("fused",) and info.misses == 1
    assert info.tier_reasons[0].startswith("fastest measured: fused 10.0 us")
    assert jf.last.shown.tier == "fused"


@needs_background
def test_a_fused_compile_failing_in_the_background_leaves_the_exact_tiers(monkeypatch):
    faked(monkeypatch, graph=3e-5, torch=2e-5, fused=1e-5)
    monkeypatch.setattr(tiers, "BACKGROUND", True)
    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 2)
    release, threads = blocked_compile(monkeypatch, fail=True)
    jf = dealias.jit(slice_write)
    make_args = lambda: (torch.randn(256, 8), torch.randn(8))  # noqa: E731
    calls_like_eager(slice_write, jf, make_args, calls=4)
    release.set()
    assert _entry(jf).wait(120) and threads == ["dealias fused compile"]
    calls_like_eager(slice_write, jf, make_args, calls=12)  # bit for bit: the exact tiers only
    info = dealias.cache_info(jf)
    assert info.tiers == ("torch (not fusable)",) and "fused" not in info.timings[0], info
    assert info.tier_reasons[0].startswith("fastest measured: torch 20.0 us vs graph 30.0 us")


def test_a_program_over_symbols_compiles_its_fused_program_in_the_promoting_call(monkeypatch):
    # Inductor's decisions add guards to the program's ShapeEnv, which its shape guard is made from when it is built.
    faked(monkeypatch, graph=3e-5, torch=2e-5, fused=1e-5)
    monkeypatch.setattr(tiers, "BACKGROUND", True)
    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 2)
    release, threads = blocked_compile(monkeypatch, fail=True)
    release.set()  # (fails at once, wherever it runs)
    jf = dealias.jit(slice_write, dynamic=True)
    calls_like_eager(slice_write, jf, lambda: (torch.randn(256, 8), torch.randn(8)), calls=3)
    assert threads == ["MainThread"] and _entry(jf).pending is None


def test_where_fx_tracing_is_the_processs_the_fused_compile_runs_in_the_promoting_call(monkeypatch):
    # (torch 2.13: a compile in another thread would make calls of every compiled function raise meanwhile)
    faked(monkeypatch, graph=3e-5, torch=2e-5, fused=1e-5)
    monkeypatch.setattr(tiers, "BACKGROUND", True)
    monkeypatch.setattr(tiers, "compile_beside_calls", lambda: False)
    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 2)
    release, threads = blocked_compile(monkeypatch, fail=True)
    release.set()
    jf = dealias.jit(slice_write)
    calls_like_eager(slice_write, jf, lambda: (torch.randn(256, 8), torch.randn(8)), calls=3)
    assert threads == ["MainThread"] and _entry(jf).pending is None
    assert dealias.cache_info(jf).tiers[0].endswith("(not fusable)")
