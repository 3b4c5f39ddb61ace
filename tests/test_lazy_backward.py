"""The fused tier's backward is timed (and so compiled) only once the user's backward is seen (frontend/choosing.py,
issue 38: the first call of a forward never backpropagated compiled inductor's backward too, 33 C++ kernels for
resnet18's training forward where torch.compile's first call compiles 23).

The faked-time tests use test_defaultgap2's fake tiers: the "fused" program is the torch executor's, so every
result is compared with eager bit for bit. The last test runs inductor for real and counts its compiles."""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref

import pytest
import torch
from test_defaultgap2 import BACKWARDS_ON_COPIES, fake_forward_and_backward, model_and_reference
from test_defaultgap3 import reasons, same_grads, training_steps, user_runs

import dealias
from dealias.frontend import backward_seen, by_backward, copies, copies_record, tiers

# (the choice rules' calls counted call by call: conftest.calls_one_by_one)
pytestmark = pytest.mark.usefixtures("calls_one_by_one")

ON_COPIES = tiers.SAMPLES + 1  # (each tier's warm-up and timed runs)
# (after a training step's first backward: the fused warm-up and the runs that drop clear losers, the user's calls
# measuring the close tiers; where gradients accumulate before it, ON_COPIES)
AFTER_BACKWARD = by_backward.FILTER_SAMPLES + 1
# seconds per run, forward and backward each: the fused tier the fastest on both, clearly
FUSED_WINS = {"torch": 1.0e-5, "fused": 0.5e-5, "graph": 3e-5}


def test_a_training_step_whose_fused_tier_wins_clearly_runs_it_from_the_second_call(monkeypatch):
    # forward and backward: fused 1.0, torch 2.0, graph 6.0 (x 1e-5 s): the fused tier, once its backward is timed
    ran, _ = fake_forward_and_backward(monkeypatch, FUSED_WINS, FUSED_WINS)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    x = torch.randn(4, 8)
    out, expected = jf(x), ref(x)
    assert torch.equal(out, expected)
    assert "fused" not in BACKWARDS_ON_COPIES  # (the first call: the fused forward alone)
    assert user_runs(ran) == ["torch"], ran  # (the exact tier fastest on forward and backward)
    assert dealias.cache_info(jf).tiers == ("torch",)
    out.sum().backward()  # (at its end, every tier's forward and backward timed on copies: no later call waits)
    expected.sum().backward()
    assert same_grads(model, ref)
    assert BACKWARDS_ON_COPIES.count("fused") == AFTER_BACKWARD, BACKWARDS_ON_COPIES
    assert dealias.cache_info(jf).tiers == ("fused",)
    training_steps(jf, model, ref, 5)
    assert BACKWARDS_ON_COPIES.count("fused") == AFTER_BACKWARD, BACKWARDS_ON_COPIES  # (once)
    assert user_runs(ran) == ["torch"], ran  # (then settled: no call timed)
    info = dealias.cache_info(jf)
    assert info.tiers == ("fused",), info
    assert "chosen by forward and backward" in reasons(jf)
    assert info.timings[0]["fused"] < info.timings[0]["torch"], info


def test_a_training_step_whose_fused_backward_cannot_be_timed_runs_an_exact_tier(monkeypatch):
    # the runs on copies at the end of the first backward refused (the tensors over the copies' limit): the exact
    # tiers by the first call's forward and backward, never the fused backward on the user's calls for its measure
    ran, _ = fake_forward_and_backward(monkeypatch, FUSED_WINS, FUSED_WINS)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    x = torch.randn(4, 8)
    out, expected = jf(x), ref(x)
    monkeypatch.setattr(copies, "COPY_BYTES", 0)
    out.sum().backward()
    expected.sum().backward()
    assert same_grads(model, ref)
    training_steps(jf, model, ref, 5)
    assert "fused" not in BACKWARDS_ON_COPIES and "fused" not in user_runs(ran), (BACKWARDS_ON_COPIES, ran)
    assert dealias.cache_info(jf).tiers == ("torch",)
    assert "fused not chosen: its backward not timed" in reasons(jf), reasons(jf)


def test_gradients_accumulated_over_forwards_time_the_fused_backward_at_the_end_of_the_backward(monkeypatch):
    ran, _ = fake_forward_and_backward(monkeypatch, FUSED_WINS, FUSED_WINS)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    for step in range(2):
        losses, expected = [], []
        for _ in range(3):
            x = torch.randn(4, 8)
            out, e = jf(x), ref(x)
            assert torch.equal(out, e)
            losses.append(out.sum())
            expected.append(e.sum())
        if step == 0:  # (three forwards, no backward yet: nothing timed after the first call)
            assert "fused" not in BACKWARDS_ON_COPIES and user_runs(ran) == ["torch"] * 3, ran
        sum(losses).backward()
        sum(expected).backward()
        assert same_grads(model, ref), step
        if step == 0:  # (the runs on copies at the end of that backward: the second step's forwards settled)
            assert BACKWARDS_ON_COPIES.count("fused") == ON_COPIES, BACKWARDS_ON_COPIES
            assert dealias.cache_info(jf).tiers == ("fused",)
    assert BACKWARDS_ON_COPIES.count("fused") == ON_COPIES, BACKWARDS_ON_COPIES
    assert user_runs(ran) == ["torch"] * 3, ran  # (then settled: no call timed)
    assert dealias.cache_info(jf).tiers == ("fused",)


def test_a_record_of_the_first_call_keeps_no_fused_backward(tmp_path, monkeypatch):
    # copies_record: the lazy tiers are in the key, and a record of a call recording autograd has no `whole` for them
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(copies_record, "ENABLED", True)
    whole, forwards = {"torch": [2e-5], "graph": [3e-5]}, {"torch": [1e-5], "graph": [2e-5], "fused": [0.5e-5]}
    copies_record.save("k" * 32, whole, forwards)
    tiers_ = ["torch", "graph", "fused"]
    assert copies_record.load("k" * 32, tiers_, frozenset({"fused"})) == (whole, forwards)
    assert copies_record.load("k" * 32, tiers_) is None  # (read as a record timing every backward: not this one)
    copies_record.save("n" * 32, {"torch": [2e-5], "graph": [3e-5], "fused": [1e-5]}, None)
    assert copies_record.load("n" * 32, tiers_, frozenset({"fused"})) is not None  # (no autograd: every tier whole)


def steps(jf, model, ref, ran, now, backward, calls: int) -> None:
    """`calls` training steps compared with eager's bit for bit; the faked clock moves by the user's backward of
    the tier that ran each call."""
    for call in range(calls):
        x = torch.randn(4, 8)
        out, expected = jf(x), ref(x)
        assert torch.equal(out, expected), call
        out.sum().backward()
        expected.sum().backward()
        assert same_grads(model, ref), call
        now[0] += backward[ran[-1]] if not ran[-1].startswith("copies:") else 0.0


def test_a_fused_tier_slower_on_the_forward_alone_stays_for_its_backward(monkeypatch):
    # forward and backward: fused 2.3, torch 4.0 (x 1e-5 s), its forward alone 1.3x torch's: not dropped on that
    forward = {"torch": 1.0e-5, "graph": 3e-5, "fused": 1.3e-5}
    backward = {"torch": 3.0e-5, "graph": 3e-5, "fused": 1.0e-5}
    ran, now = fake_forward_and_backward(monkeypatch, forward, backward)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    steps(jf, model, ref, ran, now, backward, 6)
    assert dealias.cache_info(jf).tiers == ("fused",), reasons(jf)
    assert user_runs(ran) == ["torch"], ran


def test_a_fused_tier_whose_forward_alone_loses_a_training_step_is_dropped_in_the_first_call(monkeypatch):
    # its forward alone 1.5x torch's forward and backward: it cannot win a training step, nor a forward
    forward = {"torch": 1.0e-5, "graph": 3e-5, "fused": 3e-5}
    backward = {"torch": 1.0e-5, "graph": 3e-5, "fused": 1.0e-5}
    ran, now = fake_forward_and_backward(monkeypatch, forward, backward)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    steps(jf, model, ref, ran, now, backward, 3)
    assert "fused" not in BACKWARDS_ON_COPIES and ran.count("copies:fused") == ON_COPIES, ran
    assert dealias.cache_info(jf).tiers == ("torch",), reasons(jf)


def test_where_no_hook_can_be_set_the_fused_tiers_first_user_call_is_its_warm_up(monkeypatch):
    # the user's calls time the tiers (no hook on the outputs): the fused tier's first call there compiles its
    # backward (faked: 2 s on the clock), untimed, as any tier's first call; then it wins (half torch's time)
    forward = {"torch": 0.1, "graph": 0.3, "fused": 0.05}
    backward = {"torch": 0.1, "graph": 0.3, "fused": 0.05}
    ran, now = fake_forward_and_backward(monkeypatch, forward, backward)
    monkeypatch.setattr(backward_seen, "watch", lambda *args: (None, "no output with a grad_fn"))
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    compile_seconds = {"fused": 2.0}
    for _ in range(12):
        steps(jf, model, ref, ran, now, backward, 1)
        if ran[-1] == "fused":
            now[0] += compile_seconds.pop("fused", 0.0)  # (the fused backward's first run compiles it)
    assert dealias.cache_info(jf).tiers == ("fused",), reasons(jf)


def test_a_fused_guard_rejecting_the_first_calls_tensors_leaves_the_choice_to_the_next_call(monkeypatch):
    # at the end of the first backward, the fused program's guard rejects the first call's tensors (a guard of the
    # fused program narrower than the entry's): the next call it accepts times the tiers on copies, as it would
    ran, now = fake_forward_and_backward(monkeypatch, FUSED_WINS, FUSED_WINS)
    made = []
    real_init = tiers.Tiered.__init__

    def init(self, *args, **kwargs):
        made.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(tiers.Tiered, "__init__", init)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    x = torch.randn(4, 8)
    out, expected = jf(x), ref(x)
    (entry,) = made
    asked = []
    entry.narrower = lambda leaves: asked.append(1) or len(asked) > 2  # (rejects the first two asks)
    out.sum().backward()
    expected.sum().backward()
    assert same_grads(model, ref)
    assert "fused" not in BACKWARDS_ON_COPIES and dealias.cache_info(jf).tiers == ("torch",)
    assert "choosing between" in reasons(jf), reasons(jf)
    steps(jf, model, ref, ran, now, FUSED_WINS, 1)  # (rejected again: the next)
    assert "fused" not in BACKWARDS_ON_COPIES, BACKWARDS_ON_COPIES
    steps(jf, model, ref, ran, now, FUSED_WINS, 4)
    assert "fused" in BACKWARDS_ON_COPIES and dealias.cache_info(jf).tiers == ("fused",), reasons(jf)


def test_an_interrupt_while_the_fused_backward_is_timed_settles_on_an_exact_tier(monkeypatch):
    # Ctrl-C in the fused backward's compile, seconds long, at the end of the user's first backward: raised there,
    # the gradients all in (the engine's callbacks run once the graph is done), and the exact tiers chosen
    ran, now = fake_forward_and_backward(monkeypatch, FUSED_WINS, FUSED_WINS)
    backward = FUSED_WINS
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    real = copies.run_on_copies

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    x = torch.randn(4, 8)
    out, expected = jf(x), ref(x)
    monkeypatch.setattr(copies, "run_on_copies", interrupted)
    with pytest.raises(KeyboardInterrupt):
        out.sum().backward()
    expected.sum().backward()
    assert same_grads(model, ref)
    monkeypatch.setattr(copies, "run_on_copies", real)
    steps(jf, model, ref, ran, now, backward, 3)
    info = dealias.cache_info(jf)
    assert info.tiers == ("torch",) and "timing each tier" not in reasons(jf), reasons(jf)


@pytest.mark.parametrize("where", ["deterministic", "autocast", "mode", "thread"])
def test_a_first_backward_in_another_state_leaves_the_timing_to_the_next_call(monkeypatch, where):
    # the programs run on copies at the end of the user's first backward only where the thread's state is the first
    # call's (what dynamo's frames were compiled under) and no mode of the user's would see the runs; else the next
    # call times them, as it did before. A backward in another thread: there, the state being the same.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        ops: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    ran, now = fake_forward_and_backward(monkeypatch, FUSED_WINS, FUSED_WINS)
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    x = torch.randn(4, 8)
    out, expected = jf(x), ref(x)
    if where == "thread":
        thread = threading.Thread(target=lambda: out.sum().backward())
        thread.start()
        thread.join()
    else:
        state = {
            "deterministic": lambda: deterministic(),
            "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
            "mode": lambda: Seen(),
        }[where]
        with state():
            out.sum().backward()
        # (the user's mode saw the backward's ops, none of a run on copies: no clone of the copies made)
        assert all("clone" not in str(op) for op in Seen.ops), Seen.ops
        with state():  # (eager's backward in the same state: the gradients the same)
            expected.sum().backward()
    if where == "thread":
        expected.sum().backward()
    assert same_grads(model, ref)
    if where == "thread":
        assert BACKWARDS_ON_COPIES.count("fused") == AFTER_BACKWARD and dealias.cache_info(jf).tiers == ("fused",)
        return
    assert "fused" not in BACKWARDS_ON_COPIES and dealias.cache_info(jf).tiers == ("torch",), reasons(jf)
    steps(jf, model, ref, ran, now, FUSED_WINS, 3)
    assert BACKWARDS_ON_COPIES.count("fused") == AFTER_BACKWARD and dealias.cache_info(jf).tiers == ("fused",)
    assert user_runs(ran) == ["torch", "fused"], ran  # (the second call timed them: then settled)


@pytest.mark.parametrize("backward", [True, False])
def test_the_first_calls_tensors_are_not_kept_past_the_choice_or_the_users_graph(monkeypatch, backward):
    # the hooks hold the first call's tensors for the end of the first backward: freed once the choice is made
    # there, or with the user's graph where no backward comes
    ran, now = fake_forward_and_backward(monkeypatch, FUSED_WINS, FUSED_WINS)
    model, ref = model_and_reference()
    jf = dealias.jit(lambda x: model(x * 1))  # (x not saved by the graph: held only by the hooks)
    x = torch.randn(4, 8)
    kept = weakref.ref(x)
    out = jf(x)
    del x
    gc.collect()
    assert kept() is not None  # (the hooks hold it, for the end of the backward)
    if backward:
        out.sum().backward()
        assert dealias.cache_info(jf).tiers == ("fused",)
        gc.collect()
        assert kept() is None  # (the choice removed the hooks: out and its graph still the user's)
    del out
    gc.collect()
    assert kept() is None


@contextlib.contextmanager
def deterministic():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def test_a_later_process_reads_both_records_of_a_training_step(monkeypatch, tmp_path):
    # the first call's record (the fused backward untimed) and the second call's: both read by a second process,
    # which then times nothing; its warm-up runs the fastest tiers once, the fused backward among them
    ran, now = fake_forward_and_backward(monkeypatch, FUSED_WINS, FUSED_WINS)
    backward = FUSED_WINS
    monkeypatch.setattr(tiers, "_MEASURE", tiers.measure)  # (the faked times taken as real: kept and read)
    monkeypatch.setattr(tiers, "_CLOCK", tiers.clock)
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(copies_record, "ENABLED", True)
    monkeypatch.setattr(copies_record, "counts", {"read": 0, "written": 0})
    for process in range(2):
        torch._dynamo.reset()
        ran.clear()
        model, ref = model_and_reference()
        jf = dealias.jit(model)
        steps(jf, model, ref, ran, now, backward, 3)
        assert dealias.cache_info(jf).tiers == ("fused",), reasons(jf)
        assert copies_record.counts == ({"read": 0, "written": 2} if process == 0 else {"read": 2, "written": 2})
    assert ran.count("copies:fused") == 2, ran  # (its warm-ups alone: one a record)


@pytest.mark.inductor
def test_a_forward_never_backpropagated_compiles_no_fused_backward(monkeypatch, tmp_path):
    # for real: a training-mode forward called for its outputs' values compiles the fused forward only; a training
    # step compiles the fused backward at the end of its first backward (as torch.compile's first backward), and
    # both match eager
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path / "dealias"))
    monkeypatch.setattr(tiers, "FUSE_FIRST", True)
    monkeypatch.setattr(tiers, "clock", lambda: 0.0)

    def measure(tier, run, leaves):  # (real runs; times faked so that the fused tier stays, the fastest on both)
        return run(leaves), 0.5e-5 if tier == "fused" else 1e-5

    monkeypatch.setattr(tiers, "measure", measure)

    def compiles() -> int:
        return sum(v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache_"))

    torch._dynamo.reset()
    counters.clear()
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    for _ in range(4):
        x = torch.randn(4, 8)
        out, expected = jf(x), ref(x)
        torch.testing.assert_close(out, expected)
        assert out.requires_grad and out.grad_fn is not None
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert compiles() == 1, dict(counters["inductor"])  # (the fused forward; no backward compiled)

    torch._dynamo.reset()
    counters.clear()
    model, ref = model_and_reference()
    jf = dealias.jit(model)
    for call in range(4):
        x = torch.randn(4, 8)
        out, expected = jf(x), ref(x)
        torch.testing.assert_close(out, expected)
        if call == 0:
            assert compiles() == 1, dict(counters["inductor"])
        out.sum().backward()
        expected.sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        if call == 0:  # (the fused backward, at the end of the first backward)
            assert compiles() == 2, dict(counters["inductor"])
            assert dealias.cache_info(jf).tiers == ("fused",)
    assert compiles() == 2, dict(counters["inductor"])
