"""The tiered executor (executor="tiered", frontend/tiers.py) with fused programs: promotion after enough calls
or long calls, what cannot fuse stays on the torch executor, and calls the fused program's guard rejects run on
the exact tier. The tiers' timings are faked. Few and small: each compile costs seconds on CPU."""

from __future__ import annotations

import pytest
import torch
from fused_harness import double_then_sin, kv_write, slice_write
from harness import decode_prefix

import dealias

# (the choice rules' calls counted call by call: conftest.calls_one_by_one)
pytestmark = pytest.mark.usefixtures("calls_one_by_one")


def tiers_of_slice_write_calls(jf, calls: int) -> list:
    """Call the tiered `jf` of slice_write `calls` times, each compared with eager; the tiers after each call."""
    tiers = []
    for _ in range(calls):
        buf, row = torch.randn(256, 64), torch.randn(64)
        expected = buf.clone()
        slice_write(expected, row)
        jf(buf, row)
        torch.testing.assert_close(buf, expected)
        tiers.append(dealias.cache_info(jf).tiers)
    return tiers


def fake_times(monkeypatch, **seconds: float) -> list[str]:
    """executor="tiered" measures each tier on the calls (frontend/tiers.py): make `tiers.measure` say each call on
    tier t took seconds[t], and each tier need one timed call (after its untimed first one); the tiers measured."""
    from dealias.frontend import tiers

    ran: list[str] = []

    def measure(tier, run, leaves):
        ran.append(tier)
        return run(leaves), seconds[tier]

    monkeypatch.setattr(tiers, "measure", measure)
    monkeypatch.setattr(tiers, "clock", lambda: 0.0)  # (a call with autograd history: no time until the next)
    monkeypatch.setattr(tiers, "SAMPLES", 1)
    monkeypatch.setattr(tiers, "BACKGROUND", False)  # (compiled in the promoting call: the calls are counted)
    return ran


def test_tiered_executor_fuses_a_program_once_it_has_run_often(monkeypatch):
    from dealias.frontend import tiers

    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 3)
    ran = fake_times(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    jf = dealias.jit(slice_write, executor="tiered")
    # calls 1-2: the exact tiers' first calls; 3: fused (compiled on its PROMOTE_AFTER-th call); 4-6: one timed
    # call each, and the fastest kept
    assert tiers_of_slice_write_calls(jf, 7) == [("torch",)] * 5 + [("fused",)] * 2
    assert ran == ["torch", "graph", "fused", "torch", "graph", "fused"]  # (then nothing is timed)
    info = dealias.cache_info(jf)
    assert (info.misses, info.hits) == (1, 6)
    assert info.timings == ({"torch": 2e-5, "graph": 3e-5, "fused": 1e-5},)
    assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]


def test_tiered_executor_fuses_a_program_whose_calls_take_long_sooner(monkeypatch):
    from dealias.frontend import tiers

    monkeypatch.setattr(tiers, "PROMOTE_AFTER_SECONDS", 1e-9)  # any call on the torch executor takes longer
    ran = fake_times(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    jf = dealias.jit(slice_write, executor="tiered")
    assert tiers_of_slice_write_calls(jf, 6)[-1] == ("fused",)
    assert ran[:3] == ["torch", "graph", "fused"]  # compiled on the second call (PROMOTE_AFTER is 16)


def test_tiered_executor_keeps_what_cannot_fuse_on_the_torch_executor(monkeypatch):
    from dealias.frontend import tiers

    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 2)
    fake_times(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    jf = dealias.jit(kv_write, executor="tiered")
    for p in range(6):
        args = torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
        jf(*args, torch.tensor([p]))
    assert dealias.cache_info(jf).tiers == ("fused",)
    jg = dealias.jit(double_then_sin, executor="tiered")
    for _ in range(6):
        x = torch.randn(3, requires_grad=True) * 1
        jg(x).sum().backward()
    assert dealias.cache_info(jg).tiers == ("torch (not fusable)",)


def test_a_tiered_program_runs_on_the_torch_executor_where_the_fused_ones_guard_fails(monkeypatch):
    # Inductor's decisions about a program's symbols may add guards to it: the fused program then holds for fewer
    # calls than the cache entry (made with the torch executor's guard) lets in. Those calls run the exact tier.
    from dealias.frontend import tiers

    monkeypatch.setattr(tiers, "PROMOTE_AFTER", 2)
    fake_times(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    compile_program = tiers.compile_program
    rejected = []

    def narrowed(gm, leaves, names, executor, symbolic=None):
        program = compile_program(gm, leaves, names, executor, symbolic)
        if executor == "inductor":
            guard = program.shape_guard
            pos = lambda call: next(x for x in call if isinstance(x, int))
            holds = lambda call: guard(call) and pos(call) <= 6
            program.shape_guard = lambda call: holds(call) or rejected.append(pos(call))
            program.shape_guard.text = f"{guard.text} and pos <= 6"
        return program

    monkeypatch.setattr(tiers, "compile_program", narrowed)
    jf = dealias.jit(decode_prefix, executor="tiered")
    caches, eager_caches = [torch.zeros(1, 2, 16, 8) for _ in range(2)], [torch.zeros(1, 2, 16, 8) for _ in range(2)]
    for pos in range(9):
        q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 8), torch.randn(1, 2, 8)
        torch.testing.assert_close(jf(*caches, q, k, v, pos), decode_prefix(*eager_caches, q, k, v, pos))
        torch.testing.assert_close(caches, eager_caches)
    # pos 0 specialized: one call, never promoted; pos 1-8 over a symbol: fused compiled at pos 2, chosen at 6
    assert dealias.cache_info(jf).tiers == ("torch", "fused")
    assert rejected == [7, 8]
