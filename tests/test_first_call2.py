"""The first call's own work: the torch executor's binding probes (runtime/executor.py) are asked once per op and
argument kinds, not once per node; a cached answer is the probe's answer for every kind of argument."""

from __future__ import annotations

import pytest
import torch
from harness import check
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from dealias.runtime import bindings, executor

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def own_cache(monkeypatch, tmp_path):
    """Answers in memory and on disk as a new host has them: none (the disk file in `tmp_path`)."""
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    bindings.clear()
    yield tmp_path
    bindings.clear()


def _calls(mode: FakeTensorMode) -> list[tuple]:
    """(op, args, kwargs) on fake tensors: methods, functions, none, scalars of each type, lists, in-place ops,
    foreach lists, non-contiguous and requiring-grad tensors."""
    with mode:
        x = torch.randn(4, 5)
        y = torch.randn(4, 5)
        xt = torch.randn(5, 4).t()
        xi = torch.ones(4, 5, dtype=torch.int64)
        cond = torch.zeros(4, 5, dtype=torch.bool)
        g = torch.randn(4, 5, requires_grad=True)
        xs = [torch.randn(3), torch.randn(2, 2)]
        z = torch.randn(4, 5, dtype=torch.complex64)
        zc = z.conj()  # (the conjugate bit: eager's dispatch materializes it first)
    return [
        (aten.add.Tensor, (x, y), {}),
        (aten.add.Tensor, (x, y), {"alpha": 2}),
        (aten.add.Tensor, (x, y), {"alpha": 2.5}),
        (aten.add.Tensor, (xt, y), {}),
        (aten.add.Tensor, (xi, xi), {}),
        (aten.add.Tensor, (g, y), {}),
        (aten.add_.Tensor, (x, y), {}),
        (aten.add_.Tensor, (xt, y), {}),
        (aten.mul.Scalar, (x, 2), {}),
        (aten.mul.Scalar, (x, 2.0), {}),
        (aten.mul.Scalar, (x, True), {}),
        (aten.where.self, (cond, x, y), {}),
        (aten.sum.dim_IntList, (x, [0]), {}),
        (aten.sum.dim_IntList, (x, [0, 1], True), {}),
        (aten.sum.dim_IntList, (x, [1]), {"dtype": torch.float64}),
        (aten.transpose.int, (x, 0, 1), {}),
        (aten.view.default, (x, [20]), {}),
        (aten.view.dtype, (x, torch.int32), {}),
        (aten.select.int, (x, 0, 1), {}),
        (aten.clamp.default, (x, 0, None), {}),
        (aten.clamp.default, (x, 0.5, 1.5), {}),
        (aten.clamp.default, (x, None, 1), {}),
        (aten.lerp_.Scalar, (x, y, 0.5), {}),
        (aten.addcmul.default, (x, y, y), {"value": 0.5}),
        (aten._foreach_mul.Scalar, (xs, 0.9), {}),
        (aten._foreach_mul_.Scalar, (xs, 0.9), {}),
        (aten._foreach_add.List, (xs, xs), {"alpha": 0.1}),
        (aten.expand.default, (x[0], [4, 5]), {}),
        (aten.slice.Tensor, (x, 1, 0, 3), {}),
        (aten.to.dtype, (x, torch.float64), {}),
        (aten.mul.Tensor, (z, z), {}),
        (aten.mul.Tensor, (zc, z), {}),
        (aten.sum.default, (z,), {}),
        (aten.sum.default, (zc,), {}),
    ]


def test_cached_binding_is_the_probed_one():
    """Each call asked twice (the second from the cache) under both grad modes: the probe's answer each time, and the
    calls whose kinds differ got answers of their own (a method for some, a function for others, None for some)."""
    bindings.clear()
    mode = FakeTensorMode()
    answers = set()
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            for op, args, kwargs in _calls(mode):
                want = executor.probe_binding(op, args, kwargs)
                assert executor.binding_for_call(op, args, kwargs) == want, (op, args, kwargs)
                assert executor.binding_for_call(op, args, kwargs) == want, (op, args, kwargs)
                answers.add(want if want is None else want[0])
    assert answers == {None, "method", "function"}


def test_probe_once_per_kind(monkeypatch):
    """Nodes of one op on arguments of one kind probe once; another scalar type, dtype, layout or grad mode probes
    again."""
    bindings.clear()
    probed = []
    probe = executor.probe_binding
    monkeypatch.setattr(executor, "probe_binding", lambda *a: probed.append(a[0]) or probe(*a))
    mode = FakeTensorMode()
    with mode:
        x, y = torch.randn(4, 5), torch.randn(4, 5)
        x2, y2 = torch.randn(4, 5), torch.randn(4, 5)
    for a, b in ((x, y), (x2, y2), (y, x)):
        executor.binding_for_call(aten.mul.Tensor, (a, b), {})
    assert len(probed) == 1
    executor.binding_for_call(aten.mul.Tensor, (x, y.t()), {})  # another layout
    executor.binding_for_call(aten.mul.Tensor, (x, y.double()), {})  # another dtype
    executor.binding_for_call(aten.add.Tensor, (x, y), {"alpha": 2})
    executor.binding_for_call(aten.add.Tensor, (x, y), {"alpha": 2.0})  # another scalar type
    with torch.no_grad():
        executor.binding_for_call(aten.mul.Tensor, (x, y), {})
    assert len(probed) == 6


def test_symbolic_arguments_are_probed_each_time(monkeypatch):
    """A symbolic size is its ShapeEnv's: such calls are never answered from the cache."""
    bindings.clear()
    probed = []
    probe = executor.probe_binding
    monkeypatch.setattr(executor, "probe_binding", lambda *a: probed.append(a[0]) or probe(*a))
    mode = FakeTensorMode(shape_env=ShapeEnv())
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 2)
    sym = mode.from_tensor(torch.randn(6, 5), symbolic_context=dynamic)
    static = mode.from_tensor(torch.randn(6, 5), static_shapes=True)
    assert isinstance(sym.shape[0], torch.SymInt)
    for _ in range(2):
        executor.binding_for_call(aten.mul.Tensor, (sym, sym), {})  # symbolic sizes
        executor.binding_for_call(aten.view.default, (static, [sym.shape[0] * 5]), {})  # a symbolic argument
    assert len(probed) == 4
    assert not bindings._memory


def test_programs_of_repeated_ops_match_eager():
    """A program whose nodes share op and kinds (each answered from the cache after the first) runs as eager does:
    outputs, written inputs."""

    def f(ps, gs, scale):
        out = []
        for p, g in zip(ps, gs):
            p.mul_(0.9).add_(g, alpha=-0.1)
            out.append(p.t().mul(scale).sum(0))
        return out

    def args():
        torch.manual_seed(0)
        return [torch.randn(3, 4) for _ in range(4)], [torch.randn(3, 4) for _ in range(4)], 2.0

    for executor_name in ("torch", "exact"):
        check(f, *args(), executor=executor_name)


def test_answers_from_disk_are_the_probed_ones(monkeypatch, own_cache):
    """A later process (memory cleared) answers from the disk file without probing, each answer the probe's: the
    function itself, the method's name, None."""
    mode = FakeTensorMode()
    calls = _calls(mode)
    want = [executor.probe_binding(op, a, k) for op, a, k in calls]
    for op, a, k in calls:
        executor.binding_for_call(op, a, k)
    bindings.flush()
    assert list(own_cache.glob("bindings-*.json"))
    bindings.clear()
    probed = []
    monkeypatch.setattr(executor, "probe_binding", lambda *a: probed.append(a[0]))
    got = [executor.binding_for_call(op, a, k) for op, a, k in calls]
    assert got == want and not probed
    with torch.no_grad():  # not on disk: probed
        executor.binding_for_call(*calls[0])
    assert probed == [calls[0][0]]


def test_a_program_compiled_from_disk_answers_matches_eager(own_cache):
    """The same program compiled again in a "later process" (memory cleared, the file kept) runs as eager does."""

    def f(x, y):
        x.add_(y).mul_(2)
        return torch.where(x > 0, x, y).sum(0), x.t().clamp(min=0.5)

    check(f, torch.randn(3, 4), torch.randn(3, 4), executor="torch")
    assert list(own_cache.glob("bindings-*.json"))
    bindings.clear()
    check(f, torch.randn(3, 4), torch.randn(3, 4), executor="torch")
