"""Which calls of a program are timed on which tier while executor "tiered"/"exact" chooses (frontend/tiers.py): each
timed call of a slower tier is a call the user waits for (issue 38: no call after the first above eager x 1.10).
The choice is by each tier's fastest timed call (a loaded machine only adds time); close tiers are measured longer;
the exact tier chosen before the fused compile keeps its timed calls, so a clearly faster fused program is not
measured against as many calls of it again. Timing is faked (`tiers.measure`); the "fused" program here is the
torch executor's compiled program labelled fused (no inductor compile), so that every call is compared with eager's
bit for bit."""

from __future__ import annotations

import pytest
import torch
from harness import compare_call

import dealias
from dealias.frontend import tiers
from dealias.runtime.program import Tier

# (the choice rules' calls counted call by call: conftest.calls_one_by_one)
pytestmark = pytest.mark.usefixtures("calls_one_by_one")


def slice_write(buf, row):
    buf[123] = row
    buf[124].add_(row)
    return buf[3:5], buf.sum()


def make_args():
    return torch.randn(256, 8), torch.randn(8)


def fake(monkeypatch, **seconds) -> list[str]:
    """`tiers.measure` says the k-th timed call of tier t took seconds[t][k] (the last value once they run out, a
    number for every call); the "fused" compile is the torch executor's program. Returns the tiers run, in order."""
    ran: list[str] = []
    monkeypatch.setattr(tiers, "BACKGROUND", False)
    monkeypatch.setattr(tiers, "clock", lambda: 0.0)

    def measure(tier, run, leaves):
        ran.append(tier)
        values = seconds[tier] if isinstance(seconds[tier], list) else [seconds[tier]]
        return run(leaves), values[min(ran.count(tier) - 1, len(values) - 1)]

    real = tiers.compile_program

    def compile_program(gm, leaves, names, executor, symbolic):
        program = real(gm, leaves, names, "torch", symbolic)
        program.tier = Tier.FUSED
        return program

    monkeypatch.setattr(tiers, "measure", measure)
    monkeypatch.setattr(tiers, "compile_program", compile_program)
    return ran


def calls_like_eager(jf, calls: int) -> None:
    for call in range(calls):
        diff = compare_call(slice_write, jf, make_args())  # values, mutated inputs, aliasing of outputs, bit for bit
        assert diff is None, f"call {call + 1}: {diff}"


def test_a_clearly_faster_fused_program_is_not_measured_against_the_exact_tier_again(monkeypatch):
    ran = fake(monkeypatch, graph=3e-5, torch=2e-5, fused=1e-5)
    jf = dealias.jit(slice_write)  # the default: "tiered"
    calls_like_eager(jf, tiers.PROMOTE_AFTER - 1)
    assert dealias.cache_info(jf).tiers == ("torch",) and "fused" not in ran
    before = len(ran)
    calls_like_eager(jf, 12)
    # the promoting call and the fused program's untimed first call, 2 timed calls, against the torch executor's
    # timed calls from before the compile: a clear win, then nothing is timed. (Not another SAMPLES calls of the
    # torch executor, each as slow as before.)
    assert ran[before:] == ["fused"] * 3, ran[before:]
    info = dealias.cache_info(jf)
    assert info.tiers == ("fused",) and info.misses == 1
    assert info.timings == ({"torch": 2e-5, "graph": 3e-5, "fused": 1e-5},)


def test_a_fused_program_close_to_the_exact_tier_is_measured_against_fresh_calls_too(monkeypatch):
    ran = fake(monkeypatch, graph=3e-5, torch=2e-5, fused=1.95e-5)  # (within CLOSE)
    jf = dealias.jit(slice_write)
    calls_like_eager(jf, tiers.PROMOTE_AFTER - 1)
    before = len(ran)
    calls_like_eager(jf, 40)
    after = ran[before:]
    # close: both measured on to CLOSE_ROUNDS x SAMPLES timed calls, the torch executor's SAMPLES from before the
    # compile counted
    timed = tiers.CLOSE_ROUNDS * tiers.SAMPLES
    assert after.count("fused") == timed + 1 and after.count("torch") == timed - tiers.SAMPLES, after
    assert dealias.cache_info(jf).tiers == ("fused",)


def test_close_exact_tiers_are_measured_longer(monkeypatch):
    ran = fake(monkeypatch, graph=2e-5, torch=2.05e-5)
    jf = dealias.jit(slice_write, executor="exact")
    calls_like_eager(jf, 40)
    assert ran.count("graph") == ran.count("torch") == tiers.CLOSE_ROUNDS * tiers.SAMPLES + 1, ran
    assert dealias.cache_info(jf).tiers == ("graph",)


def test_calls_the_machines_load_slowed_do_not_decide(monkeypatch):
    # dynamo's graph costs 1e-5 a call, but all of its timed calls except one ran beside another process (3e-5);
    # the torch executor's all ran at its 2.2e-5. The median (3e-5) would keep the torch executor; the mean of
    # the fastest 2 (2e-5) keeps the graph.
    ran = fake(monkeypatch, graph=[3e-5, 1e-5, 3e-5, 3e-5, 3e-5], torch=2.2e-5)
    jf = dealias.jit(slice_write, executor="exact")
    calls_like_eager(jf, 16)
    info = dealias.cache_info(jf)
    assert info.tiers == ("graph",), info
    assert info.timings == ({"graph": 2e-5, "torch": 2.2e-5},)
    assert info.tier_reasons[0] == "fastest measured: graph 20.0 us vs torch 22.0 us (each one's fastest timed calls)"
    n = len(ran)
    calls_like_eager(jf, 3)
    assert len(ran) == n  # settled: nothing timed


@pytest.mark.parametrize("loser", ["graph", "torch"])
def test_a_clear_loser_ends_the_measurement(monkeypatch, loser):
    winner = "torch" if loser == "graph" else "graph"
    ran = fake(monkeypatch, **{winner: 2e-5, loser: 5e-5})
    jf = dealias.jit(slice_write, executor="exact")
    calls_like_eager(jf, 10)
    # each one's untimed first call and 2 timed calls: the loser's best (5e-5) beyond CLEAR_LOSS x the winner's
    # slowest, and the winner, the only candidate left, chosen without more timed calls of either
    assert sorted(ran) == sorted([winner, loser] * 3), ran
    assert dealias.cache_info(jf).tiers == (winner,)


def test_exact_tiers_still_measured_at_the_promotion_are_chosen_between_then(monkeypatch):
    # close exact tiers, measured on past PROMOTE_AFTER: the promoting call chooses between them by their calls so
    # far, and the fused program is measured against that one's calls (not against both afresh)
    ran = fake(monkeypatch, graph=2e-5, torch=2.05e-5, fused=1e-5)
    jf = dealias.jit(slice_write)
    calls_like_eager(jf, tiers.PROMOTE_AFTER - 1)
    assert dealias.cache_info(jf).tier_reasons[0].startswith("measuring (torch, graph")
    before = len(ran)
    calls_like_eager(jf, 12)
    assert ran[before:] == ["fused"] * 3, ran[before:]
    info = dealias.cache_info(jf)
    assert info.tiers == ("fused",)
    assert info.timings == ({"graph": 2e-5, "torch": 2.05e-5, "fused": 1e-5},)


def test_on_one_thread_a_call_is_timed_by_its_threads_cpu_time(monkeypatch):
    # Time the calling thread did not run (another process of a loaded machine ran, here: a sleep) is not the tier's
    # where torch runs on one thread; with more threads the wall time is (their work is the call's too).
    import time

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        _, seconds = tiers.measure("torch", lambda leaves: time.sleep(0.2), [])
        assert seconds < 0.1
        torch.set_num_threads(2)
        _, seconds = tiers.measure("torch", lambda leaves: time.sleep(0.2), [])
        assert seconds >= 0.2
        torch.set_num_threads(1)
        jf = dealias.jit(slice_write, executor="exact")  # measured on the thread's clock: every call still eager's
        calls_like_eager(jf, 16)
        assert dealias.cache_info(jf).tiers[0] in ("torch", "graph")
    finally:
        torch.set_num_threads(threads)


def test_the_graph_tier_runs_dynamos_graph_by_its_generated_code(monkeypatch):
    # Dynamo's graph modules generate their code at their first call, and their lazy forward calls the module: taken
    # as it was, the graph tier's first call generated it (10 ms for HF Llama's decode step) and every call went
    # through nn.Module.__call__. Generated when the tier is set up, the tier calls the code itself.
    ran = fake(monkeypatch, graph=1e-5, torch=2e-5)
    jf = dealias.jit(slice_write, executor="exact")
    calls_like_eager(jf, 1)
    module_calls = []
    jf.stats.graphs[0].gm.register_forward_pre_hook(lambda *a: module_calls.append(1))
    calls_like_eager(jf, 8)
    assert ran.count("graph") >= 3 and dealias.cache_info(jf).tiers == ("graph",)
    assert module_calls == []
