"""The fused SGD(momentum, nesterov, foreach) step against torch.compile's (issue 38: the one row where the fused
executor was above it, 0.53 against 0.50 of eager's time). Inductor's code for both is one kernel, the same loops, the
same 30 pointers written in place; what differed was dealias's Python around it on every call: the lean lookup's
storage check (a pybind call per tensor), the switch of grad mode off around a call that comes with it off (torch.optim
steps under no_grad), the written inputs picked into a tuple of their own when every input is written."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

import dealias
from dealias.compat.internals import storage_object
from dealias.frontend.guards import lean_check


def _own_code(fn):
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


def step(opt):
    opt.step()


def _sgd():
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(8, 5)) for _ in range(3)] + [torch.nn.Parameter(torch.randn(7))]
    for p in ps:
        p.grad = torch.randn_like(p)
    return ps, torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, foreach=True)


def _state(ps, opt):
    """Everything the step writes: parameters, gradients (nesterov adds the momentum to them), momentum buffers."""
    return ps + [p.grad for p in ps] + [opt.state[p]["momentum_buffer"] for p in ps if p in opt.state]


def _new_grads(ps, seed):
    torch.manual_seed(seed)
    for p in ps:
        p.grad.copy_(torch.randn_like(p))


def _grads_share_a_storage(ps, opt):
    # (two gradients, views of one tensor with their values: dynamo's guards pass them, sizes and strides unchanged)
    both = torch.stack([ps[0].grad, ps[1].grad])
    ps[0].grad, ps[1].grad = both[0], both[1]


def _share_first_buffer(ps, opt):
    a, b = (opt.state[p]["momentum_buffer"] for p in ps[:2])
    b.set_(a.untyped_storage(), a.storage_offset(), a.shape, a.stride())


def _first_buffer_in_a_gradient(ps, opt):
    # (the buffer, a held tensor dynamo guards by identity only, now in the memory of the last parameter's gradient)
    buf, grad = opt.state[ps[-1]]["momentum_buffer"], ps[-1].grad
    buf.set_(grad.untyped_storage(), grad.storage_offset(), grad.shape, grad.stride())


def _first_param_no_longer_a_leaf(ps, opt):
    # (a held parameter, guarded by identity only, now a non-leaf that still requires grad: its lean check reads
    # `is_leaf` alone)
    ps[0].requires_grad_(False)
    ps[0].mul_(torch.ones((), requires_grad=True))
    assert ps[0].requires_grad and not ps[0].is_leaf


def _transposed_grad(ps, opt):
    # (the same values, column-major: dynamo guards an optimizer's gradients as not None only, and read in the
    # compiled layout they gave parameters wrong by 10, without an error)
    ps[0].grad = ps[0].grad.t().contiguous().t()


@pytest.mark.inductor
@pytest.mark.parametrize(
    "change",
    [
        None,
        _grads_share_a_storage,
        _share_first_buffer,
        _first_buffer_in_a_gradient,
        _first_param_no_longer_a_leaf,
        _transposed_grad,
    ],
)
def test_foreach_nesterov_sgd_step_is_eagers_and_its_lean_lookup_sees_shared_storages(change):
    """Parameters, gradients and momentum buffers within ulps of eager's and counters moved as eager's, step after
    step; a change of storage sharing dynamo does not guard (gradients that are views of one tensor, a held buffer
    moved into another buffer's or a gradient's memory) leaves the first layout's lean lookup for a program of its
    own."""
    (pe, oe), (pf, of) = _sgd(), _sgd()
    jf = dealias.jit(_own_code(step), executor="inductor")
    for call in range(5):
        if call == 2 and change is not None:
            change(pe, oe)
            change(pf, of)
        versions = [t._version for t in _state(pf, of)]
        eager_versions = [t._version for t in _state(pe, oe)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            oe.step()
        with warnings.catch_warnings():
            # (a buffer sharing another tensor's memory, both requiring grad or not: that layout runs eagerly)
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            warnings.simplefilter("ignore", UserWarning)  # (a non-leaf's .grad read, by eager's step too)
            jf(of)
        for e, f in zip(_state(pe, oe), _state(pf, of)):
            torch.testing.assert_close(f, e, rtol=1e-6, atol=1e-6, msg=lambda m, c=call: f"call {c}: {m}")
        if call > 0:  # (the first step makes the buffers: no counters before it)
            moved = [t._version != v for t, v in zip(_state(pf, of), versions)]
            eager_moved = [t._version != v for t, v in zip(_state(pe, oe), eager_versions)]
            assert moved == eager_moved, call
        _new_grads(pe, call)
        _new_grads(pf, call)
    assert set(dealias.cache_info(jf).tiers) == {"fused"}
    steady = [g for g in jf.stats.graphs if g.attributes][-1]  # (the graph of the steps after the buffers' first)
    assert steady.lean is not None and steady.entries == (1 if change is None else 2), change  # (a change: compiled)


@pytest.mark.inductor
def test_foreach_nesterov_sgd_call_has_only_the_steps_its_calls_need():
    (pe, oe), (pf, of) = _sgd(), _sgd()
    jf = dealias.jit(_own_code(step), executor="inductor")
    for call in range(3):
        oe.step()
        jf(of)
        _new_grads(pe, call)
        _new_grads(pf, call)
    graph = next(g for g in jf.stats.graphs if g.lean is not None and g.attributes and g.lean[1] is jf.last)
    holds, program, _ = graph.lean
    # Storages counted by their Python objects, not their ids (a pybind call a tensor), parameters, gradients and
    # buffers alike (12 tensors: all plain), each group in one `map` (tests/test_lean_storages.py).
    assert storage_object is not None
    assert "len({*map(storage, args), *map(storage, held)}) == 12" in holds.source, holds.source
    assert "sid" not in holds.source, holds.source
    # The gradients, which dynamo guards as not None only, get a tensor check of their own (the first 4 inputs).
    assert graph.unguarded == frozenset(range(4)) and "passed_check(a0, a1, a2, a3)" in holds.source, holds.source
    run = program.run_graph
    # Every input is written: the version counters moved on the call's own tuple; grad mode switched off only for a
    # call that comes with it on (the step runs under no_grad).
    assert "increment_versions(args)" in run.source and "pick_written" not in run.source, run.source
    assert "if is_grad_enabled():" in run.source, run.source
    switched, real = [], run.__globals__["set_grad_enabled"]
    run.__globals__["set_grad_enabled"] = lambda mode: switched.append(mode) or real(mode)
    try:
        jf(of)  # (torch.optim runs the step's graph under no_grad: no switch)
    finally:
        run.__globals__["set_grad_enabled"] = real
    oe.step()
    assert switched == []
    for e, f in zip(_state(pe, oe), _state(pf, of)):
        torch.testing.assert_close(f, e, rtol=1e-6, atol=1e-6)


def test_storage_objects_are_one_per_storage():
    """compat's `storage_object`: the same object for tensors of one storage (views, another offset), another for
    another storage; the lean check counts storages with it only where every tensor is a plain one (a subclass's
    untyped_storage may be its __torch_function__'s answer)."""
    assert storage_object is not None  # (the torch this project pins keeps one per storage)
    t = torch.randn(6)
    assert storage_object(t) is storage_object(t[2:]) is storage_object(t.view(2, 3))
    assert storage_object(t) is not storage_object(t.clone())

    class Sub(torch.Tensor):
        pass

    plain = [torch.randn(3), torch.randn(3)]
    assert "map(storage, args)" in lean_check(plain, frozenset(), None).source
    sub = [torch.randn(3).as_subclass(Sub), torch.randn(3)]
    source = lean_check(sub, frozenset(), None).source
    assert "map(sid, args)" in source and "storage" not in source, source
    # either way the check refuses a layout whose tensors now share a storage
    for leaves in (plain, sub):
        holds = lean_check(leaves, frozenset(), None)
        b = torch.randn(6)
        first = b[:3].as_subclass(Sub) if leaves is sub else b[:3]
        assert holds((leaves[0], leaves[1])) and not holds((first, b[3:]))


def test_lean_check_of_a_held_parameter_reads_its_leafness_alone():
    """A held parameter (an optimizer's, the same object at every call, its requires_grad in held_check) is checked
    by `is_leaf` alone: it cannot become a view, only a non-leaf, which the check refuses."""
    g, p = torch.randn(3), torch.nn.Parameter(torch.randn(3))
    holds = lean_check([g, p], frozenset(), None, held=1)
    assert "a1.is_leaf" in holds.source and "a1._base" not in holds.source, holds.source
    assert holds((g,))
    with torch.no_grad():
        p.data = torch.randn(4)[1:]  # (another memory, at an offset in a view's: p stays no view and a leaf)
    assert p._base is None and p.is_leaf and holds((g,))
    p.data = g  # (now in g's memory)
    assert p._base is None and p.is_leaf and not holds((g,))
    p.data = torch.randn(3)
    p.requires_grad_(False)
    p.mul_(torch.ones((), requires_grad=True))
    assert p.requires_grad and not p.is_leaf and not holds((g,))
