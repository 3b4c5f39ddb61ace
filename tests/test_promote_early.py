"""executor="tiered" with FUSE_FIRST (frontend/tiers.py): a program's fused program is compiled in its first call, as
torch.compile compiles, and the exact tiers are timed there on copies of the call's tensors, so that no later call
waits for a compile and a fused program clearly faster takes every later call (issue 38: no call after the first
above eager x 1.10; a foreach optimizer's step runs 1.2x eager on the exact tiers). Timing is faked (`tiers.measure`);
the "fused" program is the torch executor's labelled fused (no inductor compile: every call compared with eager's
bit for bit), but for the one test marked `inductor`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from harness import compare_call

import dealias
from dealias.frontend import by_backward, copies, tiers
from dealias.passes import pipeline
from dealias.runtime.program import Tier

# (the choice rules' calls counted call by call: conftest.calls_one_by_one)
pytestmark = pytest.mark.usefixtures("calls_one_by_one")

FRONT = "inductor from the first's front"  # (capture and passes up to optimize not run again)


def slice_write(buf, row):
    buf[123] = row
    buf[124].add_(row)
    return buf[3:5], buf.sum()


def noisy_write(buf, row):  # (a random draw: the runs on copies must leave the random state as it was)
    buf[7].add_(torch.rand(8))
    buf[123] = row
    return buf.sum()


# the first call's runs on copies: each tier's warm-up, then SAMPLES rounds of each
COPIES = [(t, False) for _ in range(tiers.SAMPLES + 1) for t in ("torch", "graph", "fused")]


def make_args():
    return torch.randn(256, 8), torch.randn(8)


def fake(monkeypatch, fail: bool = False, **seconds) -> tuple[list[tuple[str, bool]], list[str]]:
    """FUSE_FIRST on; `tiers.measure` says each timed call of tier t took seconds[t]; the "fused" compile is the torch
    executor's program (or raises, `fail`). Returns the runs (tier, whether on the caller's own buffer) and the
    executors compiled, both in order."""
    ran: list[tuple[str, bool]] = []
    compiled: list[str] = []
    mine: list[torch.Tensor] = []  # the caller's buffer of the current call
    monkeypatch.setattr(tiers, "FUSE_FIRST", True, raising=False)
    monkeypatch.setattr(tiers, "clock", lambda: 0.0)

    def measure(tier, run, leaves):
        if getattr(run, "backward", False):  # (a run on copies' backward, timed apart: its forward's time is all)
            return run(leaves), 0.0
        ran.append((tier, any(x is mine[-1] for x in leaves)))
        return run(leaves), seconds[tier]

    real = tiers.compile_program

    def compile_program(gm, leaves, names, executor, symbolic, front=None):
        compiled.append(str(executor) + (" from the first's front" if front is not None else ""))
        if fail:
            raise RuntimeError("inductor could not compile it")
        program = real(gm, leaves, names, "torch", symbolic, front=front)
        program.tier = Tier.FUSED
        return program

    monkeypatch.setattr(tiers, "measure", measure)
    monkeypatch.setattr(tiers, "compile_program", compile_program)
    fake.mine = mine
    return ran, compiled


def call(fn, jf, n: int = 1) -> None:
    for k in range(n):
        args = make_args()
        fake.mine.append(args[0])  # (compare_call runs the compiled function on a copy: recognized by its storage)
        diff = compare_call(fn, lambda *a: (fake.mine.append(a[0]), jf(*a))[1], args)
        assert diff is None, f"call {k + 1}: {diff}"


def test_the_first_call_compiles_the_fused_program_and_times_the_exact_tiers_on_copies(monkeypatch):
    ran, compiled = fake(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    jf = dealias.jit(slice_write)  # the default: "tiered"
    call(slice_write, jf)
    # the fused program compiled in this call; each tier's first run (warm-up), then SAMPLES rounds of timed runs
    # on copies, the fused program's among them: the choice made there, in dynamo's backend call (GraphProgram.
    # compile_first), and the user's call runs the winner, untimed, as every later call
    assert compiled == [FRONT]
    assert ran == COPIES, ran
    info = dealias.cache_info(jf)
    assert info.tiers == ("fused",) and "on copies in the first call" in info.tier_reasons[0], info
    call(slice_write, jf, 5)  # settled: nothing timed after
    assert ran == COPIES, ran
    info = dealias.cache_info(jf)
    assert info.tiers == ("fused",) and (info.misses, info.hits) == (1, 5) and compiled == [FRONT]
    assert info.timings == ({"torch": 2e-5, "graph": 3e-5, "fused": 1e-5},)


def test_a_fused_program_close_to_the_exact_tier_is_measured_against_its_calls_too(monkeypatch):
    ran, _ = fake(monkeypatch, torch=2e-5, graph=3e-5, fused=1.95e-5)  # (within CLOSE of the torch executor)
    jf = dealias.jit(slice_write)
    call(slice_write, jf, 40)
    on_calls = [t for t, mine in ran if mine]
    timed = tiers.CLOSE_ROUNDS * tiers.SAMPLES
    # close on copies (within COPIES_CLOSE): measured afresh on the user's calls, the copies' runs not counted
    assert on_calls.count("fused") == on_calls.count("torch") == timed, on_calls
    assert "graph" not in on_calls and dealias.cache_info(jf).tiers == ("fused",)


def test_the_runs_on_copies_leave_the_random_state_as_eager_has_it(monkeypatch):
    ran, compiled = fake(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    jf = dealias.jit(noisy_write)
    call(noisy_write, jf, 4)  # (compare_call: the same random state for eager and dealias; bit for bit)
    assert [t for t, mine in ran if not mine] == [t for t, _ in COPIES]
    assert compiled == [FRONT]


def test_a_failed_fused_compile_chooses_the_exact_tier_in_the_first_call(monkeypatch):
    ran, compiled = fake(monkeypatch, fail=True, torch=2e-5, graph=3e-5)
    jf = dealias.jit(slice_write)
    call(slice_write, jf)
    # (settled on copies, before the call: the call runs the torch executor untimed, no run on the caller's buffer)
    assert compiled == [FRONT] and ran and not any(mine for _, mine in ran)
    info = dealias.cache_info(jf)
    assert info.tiers == ("torch (fused compile failed)",), info.tiers
    n = len(ran)
    call(slice_write, jf, 3)
    assert len(ran) == n  # settled in the first call: nothing timed on the user's calls


def test_a_call_recording_autograd_times_the_tiers_with_their_backward_on_copies(monkeypatch):
    ran, compiled = fake(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)

    def scaled_write(buf, w):
        buf.mul_(2)
        return buf * w  # (w requires grad: the results carry history, timed with their backward)

    jf = dealias.jit(scaled_write)
    w = torch.randn(8, requires_grad=True)
    expected = torch.randn(4, 8)
    got = expected.clone()
    fake.mine.append(got)
    jf(got, w).sum().backward()
    grad, w.grad = w.grad.clone(), None
    scaled_write(expected, w).sum().backward()
    assert torch.equal(got, expected) and torch.equal(grad, w.grad)
    assert compiled == [FRONT]  # (in the first call all the same)
    # every tier timed on copies with its backward (copies.run_on_copies), but the fused one's forward alone: its
    # backward is timed at the end of the user's first backward (frontend/choosing.py), and the first call runs the
    # exact tier fastest on forward and backward; dynamo's graph dropped there (slower on both measures)
    # (after the backward: the fused warm-up, then runs that drop clear losers, the torch executor warm already)
    again = [("fused", False)] + [(t, False) for _ in range(by_backward.FILTER_SAMPLES) for t in ("torch", "fused")]
    assert ran == [*COPIES, ("torch", True), *again], ran
    for _ in range(3):
        fake.mine.append(expected)
        jf(expected, w)
    assert ran == [*COPIES, ("torch", True), *again], ran  # (settled: no call timed)
    reasons = dealias.cache_info(jf).tier_reasons[0]
    assert "on copies in the first backward" in reasons, reasons
    assert "measured on the calls" not in reasons, reasons


def test_a_call_switching_grad_off_inside_is_timed_on_copies(monkeypatch):
    # (a transformers forward under `with torch.no_grad()` in the function: called with grad on, weights that
    # require grad, results without history)
    ran, compiled = fake(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    w = torch.randn(8, requires_grad=True)

    def scaled_write(buf, row):
        with torch.no_grad():
            buf[123] = row * w
            return buf.sum()

    jf = dealias.jit(scaled_write)
    call(scaled_write, jf, 4)
    assert ran == COPIES, ran  # (chosen on copies before the first call: no call of the user's timed)
    assert compiled == [FRONT] and dealias.cache_info(jf).tiers == ("fused",)


def test_tensors_over_copy_bytes_are_not_copied(monkeypatch):
    ran, compiled = fake(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    monkeypatch.setattr(copies, "COPY_BYTES", 1024)
    jf = dealias.jit(slice_write)
    call(slice_write, jf)
    assert compiled == [FRONT] and ran == [("torch", True)], ran  # (the torch executor's first call, as before)
    assert "more than 0 MB" in dealias.cache_info(jf).tier_reasons[0]
    call(slice_write, jf, 12)
    assert dealias.cache_info(jf).tiers == ("fused",)


def test_dealias_fuse_first_0_leaves_the_fused_compile_for_later():
    # the test suite's setting (conftest.py), read once at import; without it, on
    assert os.environ["DEALIAS_FUSE_FIRST"] == "0" and tiers.FUSE_FIRST is False
    env = {k: v for k, v in os.environ.items() if k != "DEALIAS_FUSE_FIRST"}
    code = "from dealias.frontend import tiers; print(tiers.FUSE_FIRST)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True", out.stderr[-500:]


@pytest.mark.inductor
def test_a_foreach_step_is_fused_in_its_first_call(monkeypatch):
    monkeypatch.setattr(tiers, "FUSE_FIRST", True, raising=False)
    monkeypatch.setattr(tiers, "BACKGROUND", True)  # (2.14: still compiled in the first call, not in a thread)

    def step(params, grads, bufs):
        torch._foreach_mul_(bufs, 0.9)
        torch._foreach_add_(bufs, grads)
        torch._foreach_add_(params, bufs, alpha=-0.1)

    def make():
        torch.manual_seed(0)
        return (
            [torch.randn(64) for _ in range(3)],
            [torch.randn(64) for _ in range(3)],
            [torch.zeros(64) for _ in range(3)],
        )

    captures = []
    real_capture = pipeline.capture
    monkeypatch.setattr(pipeline, "capture", lambda *a, **k: captures.append(1) or real_capture(*a, **k))
    jf = dealias.jit(step)
    mine, eager = make(), make()
    for k in range(40):  # (until settled: a close choice is measured longer)
        jf(*mine)
        step(*eager)
        if k == 0:  # compiled in the first call (not left to a thread), every tier timed on copies
            assert jf.last.fused is not None and jf.last.pending is None
            assert len(captures) == 1  # (the fused compile took the torch executor's capture and passes)
            reason = dealias.cache_info(jf).tier_reasons[0]
            # (chosen there, or tiers close to the best measured on on the user's calls)
            assert "on copies in the first call" in reason or "measuring (" in reason, reason
        for a, b in zip(mine, eager):
            for x, y in zip(a, b):
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    info = dealias.cache_info(jf)
    assert info.misses == 1 and set(info.timings[0]) == {"torch", "graph", "fused"}, info
