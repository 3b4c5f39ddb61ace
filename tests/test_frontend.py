"""The dynamo front end as users meet it: bound methods, Python state that changes between calls, graph
breaks, inputs passed twice and tied weights, memory and recompile limits, no fake tensor ever left in a user
object nor a user op run on a real tensor while tracing, and `torch.compile(backend="dealias")` (threads:
test_threads.py).

Every test runs the program eagerly and jitted on identical copies and compares values, mutated inputs and
outside state, on the first (compiling) call and on cached calls, and checks how many times it compiled."""

from __future__ import annotations

import collections
import copy
import dataclasses
import gc
import warnings
import weakref

import pytest
import torch
from harness import check_real_parameters, fallback_messages, no_fakes_in, no_fallback, same, same_state
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import dealias
import dealias.api
import dealias.frontend.backend
from dealias.runtime.verify import compare_call

# 1. A bound method, with state on its object ----------------------------------------------------------------


class Obj:
    def __init__(self) -> None:
        self.c = torch.zeros(3)

    def step(self, x):
        self.c.add_(1)
        return self.c * x


def test_bound_method_mutates_its_object_once_per_call():
    eager, jitted = Obj(), Obj()
    jf = dealias.jit(jitted.step)
    for call in range(1, 5):
        x = torch.arange(3.0) + call
        with no_fallback():
            got = jf(x.clone())
        expected = eager.step(x.clone())
        same(got, expected)
        same(jitted.c, eager.c)
        assert jitted.c.eq(call).all(), f"call {call}: c = {jitted.c}"
    info = dealias.cache_info(jf)
    assert info.misses == 1 and info.hits == 3, info


# 2. Python state changed between calls is read on the next call --------------------------------------------

SCALE = 2.0


def scaled(x):
    return x * SCALE


def test_global_float_changed_between_calls():
    global SCALE
    jf = dealias.jit(scaled)
    try:
        for scale in (2.0, 2.0, 3.5, 3.5, 2.0):
            SCALE = scale
            x = torch.randn(4)
            with no_fallback():
                same(jf(x), scaled(x))
            assert jf(x).sub(x * scale).abs().max() == 0
    finally:
        SCALE = 2.0
    assert dealias.cache_info(jf).misses == 2  # 2.0 and 3.5; then 2.0 again from the cache


@dataclasses.dataclass
class Cfg:
    scale: float


def with_cfg(x, cfg):
    return x * cfg.scale


def test_attribute_of_a_new_argument_object_each_call():
    jf = dealias.jit(with_cfg)
    x = torch.randn(5)
    scales = [2.0, 2.0, 3.0, 4.0, 2.0]
    reused_address = False
    cfg = Cfg(scales[0])
    for i, scale in enumerate(scales):
        if i:
            old = id(cfg)
            del cfg
            cfg = Cfg(scale)  # often allocated where the freed one was
            reused_address |= id(cfg) == old
        with no_fallback():
            got = jf(x, cfg)
        same(got, with_cfg(x, cfg))
        same(got, x * scale)
    info = dealias.cache_info(jf)
    assert info.misses == 2, info  # 2.0 specialized, then cfg.scale a float input (3.0, 4.0, 2.0 again)
    # Not required for correctness, only that the address case was exercised (CPython reuses the freed block).
    print("dataclass reallocated at the same address:", reused_address)


def _pair(module: torch.nn.Module):
    """The module for eager, and an identical copy to jit."""
    return module, copy.deepcopy(module)


def test_dropout_p_changed_between_calls():
    eager, jitted = _pair(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.0)).train())
    jf = dealias.jit(jitted)
    x = torch.randn(3, 4)
    for p in (0.0, 1.0, 1.0, 0.0):
        eager[1].p = jitted[1].p = p
        with no_fallback():
            got = jf(x)
        expected = eager(x)
        same(got, expected)
        if p == 1.0:
            assert got.eq(0).all()
        else:
            same(got, eager[0](x))
    assert dealias.cache_info(jf).misses == 2


def test_batchnorm_momentum_changed_between_calls():
    eager, jitted = _pair(torch.nn.BatchNorm1d(4).train())
    jf = dealias.jit(jitted)
    for i, momentum in enumerate((0.1, 0.1, 0.5, 0.9, 0.1)):
        eager.momentum = jitted.momentum = momentum
        x = torch.randn(8, 4) + i
        with no_fallback():
            got = jf(x.clone())
        same(got, eager(x.clone()))
        same_state(eager, jitted)
    info = dealias.cache_info(jf)
    assert info.misses == 3, info  # 0.1, 0.5, 0.9


class Predictor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.drop = torch.nn.Dropout(1.0)  # train: all zeros, eval: identity; deterministic either way

    def forward(self, x):
        h = self.bn(self.lin(x))
        return h, self.drop(h)

    def predict(self, x):
        h, dropped = self.forward(x)
        return h.softmax(-1), dropped


def test_eval_after_jitting_a_method_that_calls_forward():
    eager, jitted = _pair(Predictor().train())
    jf = dealias.jit(jitted.predict)
    for i in range(6):
        if i == 2:
            eager.eval()
            jitted.eval()
        if i == 4:
            eager.train()
            jitted.train()
        x = torch.randn(6, 4) + i
        with no_fallback():
            got = jf(x.clone())
        same(got, eager.predict(x.clone()))
        same_state(eager, jitted)
        assert got[1].eq(0).all() == jitted.training
    assert dealias.cache_info(jf).misses == 2  # train, eval; train again from the cache


def test_forward_hook_registered_after_the_first_call():
    eager, jitted = _pair(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()))
    jf = dealias.jit(jitted)
    x = torch.randn(2, 3)
    with no_fallback():
        same(jf(x), eager(x))
    for m in (eager, jitted):
        m[0].register_forward_hook(lambda mod, inp, out: out * 10 - 1)
    with no_fallback():
        got = jf(x)
        same(got, eager(x))
        same(jf(x), eager(x))
    lin = jitted[0]
    same(got, torch.relu(torch.nn.functional.linear(x, lin.weight, lin.bias) * 10 - 1))  # the hook ran


def make_ones(x):
    return torch.ones(3) + x


def test_default_dtype_changed_between_calls():
    jf = dealias.jit(make_ones)
    x = torch.arange(3, dtype=torch.float16)
    old = torch.get_default_dtype()
    try:
        with no_fallback():
            for dtype in (torch.float32, torch.float64, torch.float64, torch.float32):
                torch.set_default_dtype(dtype)
                got = jf(x)
                same(got, make_ones(x))
                assert got.dtype == dtype
    finally:
        torch.set_default_dtype(old)
    assert dealias.cache_info(jf).misses == 2


# 4. Graph breaks ---------------------------------------------------------------------------------------------


def branchy(x):
    x.mul_(2)
    if x.sum() > 0:  # the graph break
        x.add_(1)
    else:
        x.sub_(1)
    return x * 3


BRANCH_LINE = branchy.__code__.co_firstlineno + 2


def test_data_dependent_branch_breaks_the_graph():
    jf = dealias.jit(branchy)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for sign in (1, -1, 1, -1, 1):
            x = torch.arange(1.0, 5.0) * sign
            xe, xj = x.clone(), x.clone()
            got = jf(xj)
            same(got, branchy(xe))
            same(xj, xe)
    assert len(jf.stats.graphs) >= 2, jf.stats.graphs
    at_branch = [m for m in fallback_messages(record) if f":{BRANCH_LINE} " in m]
    assert len(at_branch) == 1, fallback_messages(record)
    assert "if x.sum() > 0" in at_branch[0]
    with pytest.raises(dealias.DataDependentError):
        dealias.jit(branchy, strict=True)(torch.ones(3))


def printing(x):
    x.add_(1)
    print("sum is", float(x.sum()))
    return x * 2


def test_print_in_the_middle(capsys):
    jf = dealias.jit(printing)
    for i in range(3):
        x = torch.full((3,), float(i))
        xe, xj = x.clone(), x.clone()
        expected = printing(xe)
        eager_out = capsys.readouterr().out
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            got = jf(xj)
        assert capsys.readouterr().out == eager_out  # printed on every call, with this call's value
        same(got, expected)
        same(xj, xe)


def with_item(x, y):
    x.add_(1)
    s = x.sum().item()
    y.mul_(s)
    return y + s


def test_item_in_the_middle():
    jf = dealias.jit(with_item)
    for _ in range(3):
        x, y = torch.randn(3), torch.randn(2)
        args_e, args_j = (x.clone(), y.clone()), (x.clone(), y.clone())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            got = jf(*args_j)
        same(got, with_item(*args_e))
        same(args_j, args_e)


def counting_up(x, n):
    for i in range(n):
        x.add_(1)
        yield x * i


def consumes_generator(x):
    return [t + 1 for t in counting_up(x, 3)]


@pytest.mark.parametrize("fn", [counting_up, consumes_generator], ids=["generator", "calls_generator"])
def test_generators_yield_real_tensors(fn):
    jf = dealias.jit(fn)
    for _ in range(2):
        x = torch.randn(4)
        xe, xj = x.clone(), x.clone()
        args = (3,) if fn is counting_up else ()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            got = list(jf(xj, *args))
        expected = list(fn(xe, *args))
        assert not any(isinstance(t, FakeTensor) for t in got)
        same(got, expected)
        same(xj, xe)


def seeded_random(x):
    torch.manual_seed(0)
    return torch.rand(3) + x


def test_manual_seed_then_random_inside():
    jf = dealias.jit(seeded_random)
    for i in range(3):
        x = torch.full((3,), float(i))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            got = jf(x)
        expected = seeded_random(x)
        same(got, expected)
        after_jit = torch.rand(2)  # the generator is left where eager leaves it
        seeded_random(x)
        same(after_jit, torch.rand(2))


def stale_view_after_a_break(x):
    with torch.no_grad():
        v = x.narrow(0, 1, 1)
    x.mul_(2)  # with grad on: eager forbids reading v's grad_fn from here on (new_ones does not read it)
    torch._dynamo.graph_break()
    return v.new_ones((2,)) + 1


def raises_before_a_later_error(x):
    x.add_(1)
    torch._dynamo.graph_break()
    c = torch.linalg.cholesky(x)  # eager raises here, on the values: x is not positive-definite
    return c[:, :, 0]  # dynamo's tracing of the code after the break raises here first (IndexError)


def test_code_after_a_break_runs_eagerly_when_its_tracing_raises():
    # Dynamo traces the code after a graph break when it is first reached. When that tracing raises (dynamo's
    # own rule stricter than eager: a stale no_grad view as an input; or a later line's error, before an earlier
    # line's eager error), none of that code has run yet: it runs eagerly, and eager's result or error follows.
    for fn, make in (
        (stale_view_after_a_break, lambda: (torch.randn(3, requires_grad=True) * 1,)),
        (raises_before_a_later_error, lambda: (-torch.eye(3),)),
    ):
        jf = dealias.jit(fn)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for _ in range(2):
                assert compare_call(fn, jf, make()) is None
        told = [m for m in fallback_messages(record) if "dynamo could not trace it" in m]
        assert told and "the code after a graph break" in told[0], fallback_messages(record)
    with pytest.raises(torch.linalg.LinAlgError):
        dealias.jit(raises_before_a_later_error)(-torch.eye(3))


# 5. One tensor passed twice, tied weights --------------------------------------------------------------------


def twice(a, b):
    a.add_(1)
    return a * b


def test_same_tensor_passed_twice():
    jf = dealias.jit(twice)
    for _ in range(4):
        x = torch.randn(5)
        xe, xj = x.clone(), x.clone()
        with no_fallback():
            got = jf(xj, xj)
        same(got, twice(xe, xe))
        same(xj, xe)
    info = dealias.cache_info(jf)
    assert info.misses == 1 and info.hits == 3, info


class TiedLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.out = torch.nn.Linear(6, 11, bias=False)
        self.out.weight = self.emb.weight
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, ids):
        self.steps.add_(1)
        return self.out(torch.tanh(self.emb(ids)))


def test_tied_weights_module():
    eager, jitted = _pair(TiedLM())
    assert jitted.out.weight is jitted.emb.weight
    jf = dealias.jit(jitted)
    for i in range(4):
        ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(i))
        with no_fallback():
            got = jf(ids)
        expected = eager(ids)
        same(got, expected)
        got.sum().backward()
        expected.sum().backward()
        same(jitted.emb.weight.grad, eager.emb.weight.grad)
        same_state(eager, jitted)
    assert jitted.out.weight is jitted.emb.weight
    info = dealias.cache_info(jf)
    assert info.misses == 1 and info.hits == 3, info


# 6. Memory and limits ----------------------------------------------------------------------------------------


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def tiny(x):
    x.add_(1)
    return x * 2 + 1


def test_many_cached_calls_do_not_grow_memory():
    jf = dealias.jit(tiny)
    x = torch.zeros(8)
    with no_fallback():
        for _ in range(1000):
            jf(x)
        gc.collect()
        before = _rss_kb()
        for _ in range(20_000):
            out = jf(x)
        gc.collect()
        after = _rss_kb()
    print(f"RSS growth over 20,000 cached calls: {after - before} kB")
    assert after - before < 20 * 1024
    same(x, torch.full((8,), 21_000.0))
    same(out, torch.full((8,), 42_001.0))
    info = dealias.cache_info(jf)
    assert info.misses == 1 and info.hits == 20_999, info


def int_arg(x, n):
    x.add_(n)
    return x * n


def test_int_changing_every_call_compiles_at_most_twice():
    # Dynamo makes the int symbolic after its second value (automatic dynamic); one program serves the rest.
    jf = dealias.jit(int_arg)
    with no_fallback():
        for n in range(30):
            x = torch.randn(3)
            xe, xj = x.clone(), x.clone()
            same(jf(xj, n), int_arg(xe, n))
            same(xj, xe)
    assert dealias.cache_info(jf).misses <= 2, dealias.cache_info(jf)


def test_float_changing_every_call_compiles_twice():
    jf = dealias.jit(int_arg)  # the first value specialized, then the float an input of the program (issue 39)
    with no_fallback():
        for n in range(30):
            x = torch.randn(3)
            xe, xj = x.clone(), x.clone()
            got = jf(xj, n + 0.5)
            same(got, int_arg(xe, n + 0.5))
            same(xj, xe)
    info = dealias.cache_info(jf)
    assert info.misses == 2 and info.eager_entries == 0, info


def test_input_tensor_is_freed_after_the_call():
    jf = dealias.jit(tiny)
    for call in range(3):
        x = torch.randn(1000)
        ref = weakref.ref(x)
        with no_fallback():
            out = jf(x)
        del x
        gc.collect()
        assert ref() is None, f"call {call + 1}: the input is still alive"
        assert out.shape == (1000,)


# 7. Capture leaves no fake tensor in user objects and runs no user op on a real tensor -----------------------


class Stateful(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("total", torch.zeros(4))
        self.inner = torch.nn.BatchNorm1d(4)
        self.cache = {"last": torch.zeros(4)}  # a tensor in a plain attribute, written in place

    def forward(self, x):
        self.calls.add_(1)
        h = self.inner(self.lin(x))
        self.total.add_(h.sum(0))
        self.cache["last"].copy_(h[0])
        return h.relu()


def test_no_fake_tensor_left_in_module_state():
    eager, jitted = _pair(Stateful().train())
    jf = dealias.jit(jitted)
    for call in range(1, 4):
        x = torch.randn(5, 4)
        with no_fallback():
            got = jf(x)
        same(got, eager(x))
        same_state(eager, jitted)
        same(jitted.cache["last"], eager.cache["last"])
        assert int(jitted.calls) == call  # each call's in-place writes happen exactly once
        assert int(jitted.inner.num_batches_tracked) == call
        assert no_fakes_in(jitted) == []
        check_real_parameters(jitted)


class RealOps(TorchDispatchMode):
    """Records every aten op with a real (neither fake nor meta) tensor argument. An infra mode does not stop
    dynamo compiling; dynamo sets it aside while it compiles (dealias's compile in its backend call too, where
    `_count_real_ops` enters it again), and it is on the stack at the call: ops dealias's compile runs over fake
    tensors pass through it too (on meta tensors, or fakes) and are counted apart."""

    @classmethod
    def is_infra_mode(cls) -> bool:
        return True

    def __init__(self) -> None:
        super().__init__()
        self.real: collections.Counter = collections.Counter()
        self.traced = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(not isinstance(t, FakeTensor) and t.device.type != "meta" for t in tensors):
            self.real[str(func)] += 1
        elif tensors:
            self.traced += 1
        return func(*args, **kwargs)


def counted(x, counter, buf):
    counter.add_(1)
    buf[1:3].mul_(2)
    y = x.t()
    y.add_(counter)
    return x.sin() + buf.sum()


_MISS = dealias.frontend.backend.GraphProgram._miss


def _count_real_ops(fn, args, monkeypatch):
    """`fn(*args)` under a RealOps mode, entered around dealias's compile too where that runs in dynamo's backend
    call (GraphProgram.compile_first), where dynamo sets the user's modes aside."""
    mode = RealOps()

    def miss(self, *a):
        if torch._C._len_torch_dispatch_stack():  # (at the call: the mode is on the stack)
            return _MISS(self, *a)
        with mode:
            return _MISS(self, *a)

    monkeypatch.setattr(dealias.frontend.backend.GraphProgram, "_miss", miss)
    with mode:
        out = fn(*args)
    return mode, out


def _fresh():
    return torch.randn(2, 3), torch.zeros((), dtype=torch.long), torch.ones(4)


def test_first_call_runs_no_extra_op_on_real_tensors(monkeypatch):
    jf = dealias.jit(counted, executor="torch")  # (executor="auto" may run dynamo's graph from the second call)
    runs = []
    for _ in range(3):
        args = _fresh()
        eager_args = tuple(a.clone() for a in args)
        versions = [a._version for a in args]
        with no_fallback():
            mode, got = _count_real_ops(jf, args, monkeypatch)
        same(got, counted(*eager_args))
        same(args, eager_args)
        assert int(args[1]) == 1  # the counter incremented exactly once
        runs.append((mode, [a._version - v for a, v in zip(args, versions)]))
    first, cached = runs[0], runs[1]
    assert first[0].traced > 0, "the mode was not on the stack while tracing: this test checks nothing"
    assert cached[0].traced == 0, dealias.cache_info(jf)
    # The compiling call ran on the caller's tensors exactly the ops a cached call runs: tracing touched none.
    assert first[0].real == cached[0].real, (first[0].real, cached[0].real)
    assert first[1] == cached[1] and all(d > 0 for d in first[1]), (first[1], cached[1])
    assert dealias.cache_info(jf).misses == 1


def test_real_op_counter_catches_an_op_run_while_compiling(monkeypatch):
    """The check above can fail: a compile that also runs the graph on the real inputs is caught."""
    # wherever the backend finds the pipeline (imported at module level, or from dealias.api when called)
    owner = dealias.frontend.backend if hasattr(dealias.frontend.backend, "compile_program") else dealias.api
    real_compile = owner.compile_program

    def leaky(fn, args, *rest, **kw):
        fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])  # ops on real tensors, on copies
        return real_compile(fn, args, *rest, **kw)

    monkeypatch.setattr(owner, "compile_program", leaky)
    jf = dealias.jit(counted, executor="torch")  # (as above: the tiers would run other ops from the second call)
    first, _ = _count_real_ops(jf, _fresh(), monkeypatch)
    cached, _ = _count_real_ops(jf, _fresh(), monkeypatch)
    assert first.real != cached.real


# 8. torch.compile(backend="dealias") -------------------------------------------------------------------------


def writes(x, y):
    x[0].add_(y)
    y.mul_(2)
    return x.sum(0) * y


@pytest.mark.parametrize("options", [{"verify": True}, {"executor": "torch"}, {}], ids=["verify", "torch", "default"])
def test_torch_compile_backend_entry_point(options):
    torch._dynamo.reset()
    cf = torch.compile(writes, backend="dealias", options=options)
    for _ in range(3):
        x, y = torch.randn(3, 4), torch.randn(4)
        ej, ee = (x.clone(), y.clone()), (x.clone(), y.clone())
        with no_fallback():
            got = cf(*ej)
        same(got, writes(*ee))
        same(ej, ee)
