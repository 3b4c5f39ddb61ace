"""The first call's program compiled in dynamo's backend call (backend.GraphProgram.compile_first; for executor
"tiered" with FUSE_FIRST, Tiered.prepare: the fused compile and the tiers timed on copies too), as torch.compile
compiles, before dynamo builds and evaluates the frame's guards: the second call then finds dynamo's path warm (issue
38: call 2 of microsecond programs). Every call's results and inputs are eager's, the first call's included; the
user's modes see the call's ops, not the compile's (dynamo sets them aside while it compiles); a failing compile
raises or falls back at the call as before; fake or symbolic example inputs leave the compile to the call.

"In the backend call" is told by `torch.compiler.is_compiling()`, which dynamo sets while it compiles a frame.
Timing is faked where tiers are measured (tiers.measure); the "fused" program is the torch executor's labelled
fused, but in the one test marked `inductor`."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from harness import compare_call, fallback_messages, same
from test_copytiers import fused_is_torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import dealias
from dealias.errors import InvariantError, UnsupportedError
from dealias.frontend import backend, tiers


def slice_write(buf, row, scale: float = 2.0):
    buf[3] = row
    buf[4].mul_(scale)
    return buf[1:3], buf.sum()


def make_args():
    return torch.randn(8, 4), torch.randn(4)


def compiles(monkeypatch) -> list[tuple[str, bool, int, int]]:
    """Each compile of dealias's pipeline: (executor, in dynamo's backend call, torch function modes, dispatch modes
    on the stack when it began)."""
    seen: list[tuple[str, bool, int, int]] = []
    real_backend, real_tiers = backend.compile_program, tiers.compile_program

    def recorded(real):
        def compile_program(gm, leaves, names, executor, *rest, **kw):
            modes = torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()
            seen.append((str(executor), torch.compiler.is_compiling(), *modes))
            return real(gm, leaves, names, executor, *rest, **kw)

        return compile_program

    monkeypatch.setattr(backend, "compile_program", recorded(real_backend))
    monkeypatch.setattr(tiers, "compile_program", recorded(real_tiers))
    return seen


def fake_fused(monkeypatch) -> list[tuple[str, bool]]:
    """FUSE_FIRST on, the fused program the torch executor's labelled fused and the fastest on every run; returns
    the timed runs: (tier, whether in dynamo's backend call)."""
    ran: list[tuple[str, bool]] = []
    seconds = {"torch": 2e-5, "graph": 3e-5, "fused": 1e-5}
    monkeypatch.setattr(tiers, "FUSE_FIRST", True, raising=False)
    monkeypatch.setattr(tiers, "clock", lambda: 0.0)

    def measure(tier, run, leaves):
        if getattr(run, "backward", False):
            return run(leaves), 0.0
        ran.append((tier, torch.compiler.is_compiling()))
        return run(leaves), seconds[tier]

    monkeypatch.setattr(tiers, "measure", measure)
    fused_is_torch(monkeypatch)
    return ran


def calls_like_eager(fn, jf, n: int, make=make_args) -> None:
    for k in range(n):
        diff = compare_call(fn, jf, make())
        assert diff is None, f"call {k + 1}: {diff}"


@pytest.mark.parametrize("executor", ["torch", "exact", "tiered"])
def test_the_first_calls_program_is_compiled_in_dynamos_backend_call(monkeypatch, executor):
    seen = compiles(monkeypatch)
    jf = dealias.jit(slice_write, executor=executor)
    calls_like_eager(slice_write, jf, 4)
    assert seen == [("torch", True, 0, 0)], seen
    info = dealias.cache_info(jf)
    assert (info.misses, info.hits) == (1, 3), info


def test_torch_compiles_backend_dealias_compiles_there_too(monkeypatch):
    seen = compiles(monkeypatch)
    cf = torch.compile(slice_write, backend="dealias", options={"executor": "torch"})
    calls_like_eager(slice_write, cf, 3)
    assert seen == [("torch", True, 0, 0)], seen


def test_the_first_calls_tiers_are_compiled_and_timed_on_copies_in_the_backend_call(monkeypatch):
    ran = fake_fused(monkeypatch)
    jf = dealias.jit(slice_write)
    calls_like_eager(slice_write, jf, 4)
    # each tier's warm-up and SAMPLES rounds on copies, all before the call; the call and those after it run the
    # fused program, chosen there, untimed
    assert ran == [(t, True) for _ in range(tiers.SAMPLES + 1) for t in ("torch", "graph", "fused")], ran
    info = dealias.cache_info(jf)
    assert info.tiers == ("fused",) and "on copies in the first call" in info.tier_reasons[0], info


def test_a_training_step_times_its_forward_and_backward_on_copies_in_the_backend_call(monkeypatch):
    # the first call's runs on copies (forward and backward, the fused tier's forward alone) before the call; the
    # hooks on the call's outputs and the fused backward timed at the end of the user's first backward, outside it
    ran = fake_fused(monkeypatch)
    torch.manual_seed(0)
    model, ref = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    ref.load_state_dict(model.state_dict())
    jf = dealias.jit(model)
    for call in range(4):
        x = torch.randn(3, 8)
        out, expected = jf(x), ref(x)
        assert torch.equal(out, expected), call
        out.square().sum().backward()
        expected.square().sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.equal(p.grad, q.grad), call
        if call == 0:
            first = list(ran)
    assert first and all(in_backend for _, in_backend in first[: 3 * (tiers.SAMPLES + 1)]), first
    assert any(not in_backend for _, in_backend in ran), ran  # (the fused backward: timed after the first backward)
    assert "first backward" in dealias.cache_info(jf).tier_reasons[0], dealias.cache_info(jf)


class Ops(TorchDispatchMode):
    """Records the aten ops it sees: those on real tensors, and how many on fake or meta ones."""

    infra = True

    @classmethod
    def is_infra_mode(cls) -> bool:
        return cls.infra

    def __init__(self) -> None:
        super().__init__()
        self.real: list[str] = []
        self.fake = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(isinstance(t, FakeTensor) or t.device.type == "meta" for t in tensors):
            self.fake += 1
        else:
            self.real.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("executor", ["torch", "tiered"])
def test_a_users_dispatch_mode_sees_the_calls_ops_and_none_of_the_compile(monkeypatch, executor):
    # an infra mode (dynamo compiles under it): dynamo sets it aside while it compiles, dealias's compile in its
    # backend call included, and it is on the stack for the call, which runs the program as every later call does
    if executor == "tiered":
        fake_fused(monkeypatch)
    jf = dealias.jit(slice_write, executor=executor)
    seen = []
    for _ in range(3):
        args = make_args()
        expected_args = [a.clone() for a in args]
        mode = Ops()
        with mode:
            got = jf(*args)
        same(got, slice_write(*expected_args))
        same(list(args), expected_args)
        seen.append(mode)
    assert seen[0].fake == 0, seen[0].fake  # (before: the capture's ops on fake tensors, 20 or more)
    assert seen[0].real == seen[1].real == seen[2].real and seen[0].real, (seen[0].real, seen[1].real)


def test_under_a_users_dispatch_mode_dynamo_runs_the_frame_eagerly(monkeypatch):
    # not an infra mode: dynamo (2.13, 2.14) does not compile the frame at all, with any backend; the mode sees
    # eager's ops (a later call without it compiles on 2.14; 2.13 leaves the frame to eager from then on)
    monkeypatch.setattr(Ops, "infra", False)
    seen = compiles(monkeypatch)
    jf = dealias.jit(slice_write, executor="torch")
    args = make_args()
    expected_args = [a.clone() for a in args]
    mode = Ops()
    with mode:
        got = jf(*args)
    eager = Ops()
    with eager:
        expected = slice_write(*expected_args)
    same(got, expected)
    same(list(args), expected_args)
    assert seen == [] and mode.real == eager.real and mode.fake == 0
    calls_like_eager(slice_write, jf, 2)
    assert seen in ([], [("torch", True, 0, 0)]), seen


class Passing(TorchFunctionMode):
    """A torch function mode that changes nothing."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_a_users_function_mode_is_not_on_the_stack_while_dealias_compiles(monkeypatch):
    seen = compiles(monkeypatch)
    jf = dealias.jit(slice_write, executor="torch")
    for _ in range(3):
        args = make_args()
        expected_args = [a.clone() for a in args]
        with Passing():
            got = jf(*args)
            expected = slice_write(*expected_args)
        same(got, expected)
        same(list(args), expected_args)
    assert seen == [("torch", True, 0, 0)], seen  # (before: compiled at the call, the user's mode on the stack)


class AddsOne(TorchFunctionMode):
    """A torch function mode that changes results: every `torch.add` or `Tensor.add` gives one more."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out + 1 if func is torch.add or func is torch.Tensor.add else out


def adds(x, y):
    return torch.add(x, y) * 2


@pytest.mark.parametrize("executor", ["torch", "exact", "tiered", "inductor"])
def test_a_users_function_mode_runs_once_per_op_as_in_eager(executor):
    # dynamo traces the user's torch function mode into its graph: the program runs with the mode set aside (else the
    # torch executor's Tensor methods and dynamo's graph ran it again: (x + y + 2) * 2 where eager's is (x + y + 1)
    # * 2; backend="eager" alike), and the mode is back on the stack after the call, under another one, in its place
    jf = dealias.jit(adds, executor=executor)
    for call in range(4):
        x, y = torch.zeros(3), torch.zeros(3)
        with AddsOne() as outer, AddsOne() as inner:
            before = torch.add(x, 0)
            got = jf(x, y)
            expected = adds(x, y)
            assert torch.equal(torch.add(x, 0), before), call  # (the modes act as before the call)
            assert torch._C._len_torch_function_stack() == 2
            assert torch._C._get_function_stack_at(0) is outer and torch._C._get_function_stack_at(1) is inner
        if executor == "inductor":
            torch.testing.assert_close(got, expected)
        else:
            same(got, expected)
    assert torch._C._len_torch_function_stack() == 0


def test_a_graph_dealias_refuses_warns_or_raises_at_the_call_as_before(monkeypatch):
    real = backend.compile_program

    def refusing(gm, leaves, *rest, **kw):
        raise UnsupportedError("refused by the test")

    monkeypatch.setattr(backend, "compile_program", refusing)
    jf = dealias.jit(slice_write, executor="torch")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        calls_like_eager(slice_write, jf, 3)
    assert len(fallback_messages(record)) == 1 and "refused by the test" in fallback_messages(record)[0], record
    strict = dealias.jit(slice_write, executor="torch", strict=True)
    with pytest.raises(UnsupportedError, match="refused by the test"):  # (itself: not dynamo's BackendCompilerFailed)
        strict(*make_args())
    monkeypatch.setattr(backend, "compile_program", real)


def test_an_invariant_error_is_raised_by_the_call_itself(monkeypatch):
    # a bug in dealias (checks on): raised as InvariantError by the user's call, as when compiled there, not wrapped
    # in dynamo's BackendCompilerFailed, never turned into a fallback
    def broken(*args, **kwargs):
        raise InvariantError("broken by the test")

    monkeypatch.setattr(backend, "compile_program", broken)
    jf = dealias.jit(slice_write, executor="torch")
    for _ in range(2):
        with pytest.raises(InvariantError, match="broken by the test"):
            jf(*make_args())


def test_fake_example_inputs_leave_the_compile_to_the_call(monkeypatch):
    # a backend handing dealias fakes (as DDP's graph splitter does): nothing compiled in the backend call, the call
    # compiles with its real tensors, and no fake tensor reaches the results or the caller's tensors
    seen = compiles(monkeypatch)
    dealias_backend = backend.Backend(backend.Options(executor="torch"))

    def with_fakes(gm, example_inputs):
        mode = FakeTensorMode()
        return dealias_backend(gm, [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs])

    with_fakes.is_dealias_backend = True
    cf = torch.compile(slice_write, backend=with_fakes)
    for _ in range(3):
        args = make_args()
        expected_args = [a.clone() for a in args]
        got = cf(*args)
        same(got, slice_write(*expected_args))
        same(list(args), expected_args)
        assert not any(isinstance(t, FakeTensor) for t in pytree.tree_leaves((got, args)))
    assert seen == [("torch", False, 0, 0)], seen


def test_symbolic_sizes_and_positions_compile_at_the_call(monkeypatch):
    # automatic dynamic: the second graph's example inputs hold symbols (a changed int) or it has symbolic sizes;
    # its program is compiled at the call, as before, each call's results eager's
    seen = compiles(monkeypatch)

    def write_at(buf, row, pos: int):
        buf[pos] = row
        return buf[: pos + 1].sum(0)

    jf = dealias.jit(write_at, executor="torch")
    for pos in (1, 2, 3, 5):
        diff = compare_call(write_at, jf, (torch.randn(8, 4), torch.randn(4), pos))
        assert diff is None, (pos, diff)
    for n in (8, 9, 10):
        diff = compare_call(write_at, jf, (torch.randn(n, 4), torch.randn(4), 2))
        assert diff is None, (n, diff)
    assert seen[0] == ("torch", True, 0, 0) and len(seen) > 1, seen
    assert all(not in_backend for _, in_backend, _, _ in seen[1:]), seen


def test_first_calls_in_two_threads(monkeypatch):
    jf = dealias.jit(slice_write, executor="torch")
    inputs = [make_args() for _ in range(2)]
    expected = [slice_write(*[a.clone() for a in args]) for args in inputs]
    results: list = [None, None]
    barrier = threading.Barrier(2)

    def run(i):
        barrier.wait()
        results[i] = jf(*inputs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, exp in zip(results, expected):
        same(got, exp)
    assert dealias.cache_info(jf).misses == 1, dealias.cache_info(jf)


@pytest.mark.inductor
@pytest.mark.parametrize("executor", ["tiered", "inductor"])
def test_a_ring_buffer_compiled_in_the_backend_call_with_inductor(monkeypatch, executor):
    # the real fused compile in dynamo's backend call: a replay buffer's add and sample, results within the fused
    # tolerance of eager's (buffer and pointer exactly), the fused tier chosen there for "tiered"
    monkeypatch.setattr(tiers, "FUSE_FIRST", True, raising=False)
    seen = compiles(monkeypatch)

    def ring(buf, ptr, x, idx):
        pos = (ptr + torch.arange(x.shape[0])) % buf.shape[0]
        buf.index_copy_(0, pos, x)
        ptr.add_(x.shape[0]).remainder_(buf.shape[0])
        return buf[idx].sum(1)

    g = torch.Generator().manual_seed(0)
    buf, ptr = torch.zeros(16, 3), torch.zeros((), dtype=torch.long)
    ebuf, eptr = buf.clone(), ptr.clone()
    jf = dealias.jit(ring, executor=executor)
    for _ in range(4):  # (25 rows into 16: the position wraps)
        x, idx = torch.randn(5, 3, generator=g), torch.randint(0, 16, (7,), generator=g)
        got, expected = jf(buf, ptr, x, idx), ring(ebuf, eptr, x, idx)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
        assert torch.equal(buf, ebuf) and torch.equal(ptr, eptr)
    assert seen and all(in_backend for _, in_backend, _, _ in seen), seen
    if executor == "tiered":
        assert dealias.cache_info(jf).tiers == ("fused",), dealias.cache_info(jf).tier_reasons
