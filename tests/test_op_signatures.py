"""Op facts read off an op run on meta or fake tensors (which results of an op require grad; which arguments each
result of a decomposition reads) are kept per signature of the op's arguments: a net's batch norms of one size
are run once. These check that a signature differing in anything that changes the answer is run again."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
from harness import AddsItsInput, grads_like_eager

import dealias
from dealias.ir import emitter
from dealias.runtime import double_backward

aten = torch.ops.aten


def _batch_norm_graph(count: int, channels: int = 4) -> fx.GraphModule:
    """`count` training batch norms of the same layout, each on arguments of its own, every result returned."""
    graph = fx.Graph()
    results = []
    for k in range(count):
        x, w, b, rm, rv = (graph.placeholder(f"{name}{k}") for name in ("x", "w", "b", "rm", "rv"))
        for ph, shape in zip((x, w, b, rm, rv), ((2, channels, 3, 3), *([(channels,)] * 4))):
            ph.meta["val"] = torch.empty(shape, device="meta")
        bn = graph.call_function(aten._native_batch_norm_legit_functional.default, (x, w, b, rm, rv, True, 0.1, 1e-5))
        for i in range(5):
            results.append(graph.call_function(operator.getitem, (bn, i)))
    graph.output(tuple(results))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_one_trace_per_signature_of_the_batch_norms(monkeypatch):
    double_backward._traced_dependence.clear()
    traced = []
    trace = double_backward._dependence_by_position
    monkeypatch.setattr(double_backward, "_dependence_by_position", lambda *a: traced.append(a[0]) or trace(*a))
    gm = _batch_norm_graph(3)
    written = frozenset(range(15))  # (every argument written: each result's reads are asked)
    reads = double_backward.written_inputs_read(gm, written)
    assert len(traced) == 1
    # The output reads the input, weight, bias (and the running statistics only through nothing: training mode
    # normalizes by the batch's statistics); the updated running statistics read them.
    for k in range(3):
        out, _, _, new_rm, new_rv = reads[5 * k : 5 * k + 5]
        assert out == {5 * k, 5 * k + 1, 5 * k + 2}
        assert 5 * k + 3 in new_rm and 5 * k + 4 in new_rv
    double_backward._traced_dependence.clear()
    assert double_backward.written_inputs_read(gm, written) == reads  # (kept and traced anew: the same facts)
    wider = _batch_norm_graph(1, channels=8)
    traced.clear()
    double_backward.written_inputs_read(wider, frozenset(range(5)))
    assert len(traced) == 1  # (another layout: traced again)


def test_the_dependence_trace_makes_one_fake_mode(monkeypatch):
    """The decomposition is traced in one fake mode: traced on meta tensors as real ones, make_fx made a fake mode per
    value it recorded, each taking the Python stack (deep inside dynamo's backend call: resnet18's training graph's
    traces took 0.12 CPU s of its warm first call, half of it there)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    made = []
    init = FakeTensorMode.__init__
    monkeypatch.setattr(FakeTensorMode, "__init__", lambda self, *a, **k: made.append(1) or init(self, *a, **k))
    double_backward._traced_dependence.clear()
    reads = double_backward.written_inputs_read(_batch_norm_graph(1), frozenset(range(5)))
    assert len(made) == 1
    out, _, _, new_rm, new_rv = reads
    assert out == {0, 1, 2} and 3 in new_rm and 4 in new_rv  # (the same facts)
    double_backward._traced_dependence.clear()


def _requires_grads(gm: fx.GraphModule, marked: set[str]) -> list[bool]:
    results = gm.graph.output_node().args[0]
    return [emitter.differentiable(r, lambda a: a.name in marked) for r in results]


def test_which_results_require_grad_follows_the_arguments_that_do():
    emitter._probed.clear()
    gm = _batch_norm_graph(1)
    # The input requiring grad: the output does; the saved statistics and updated running statistics do not.
    assert _requires_grads(gm, {"x0"}) == [True, False, False, False, False]
    # The same layouts with nothing requiring grad: a different signature, run again (kept, it would answer True).
    assert _requires_grads(gm, set()) == [False] * 5
    assert _requires_grads(gm, {"w0"}) == [True, False, False, False, False]
    emitter._probed.clear()
    assert _requires_grads(gm, {"w0"}) == [True, False, False, False, False]


def test_which_results_require_grad_is_asked_once_for_any_sizes(monkeypatch):
    # Sizes are no part of the signature (no op's differentiability depends on them): batch norms of two sizes,
    # three of each, run the op once, not once per node or per size.
    emitter._probed.clear()
    probed = []
    probe = emitter._probe
    monkeypatch.setattr(emitter, "_probe", lambda *a: probed.append(a[0]) or probe(*a))
    for channels in (4, 8):
        assert (
            _requires_grads(_batch_norm_graph(3, channels), {"x0", "x1", "x2"})
            == [True, False, False, False, False] * 3
        )
    assert probed == [aten._native_batch_norm_legit_functional.default]
    emitter._probed.clear()


def three_blocks(x, *tensors):
    """Three conv + training batch norm blocks of one size, their running statistics updated in place."""
    weights, running = tensors[:6], tensors[6:]
    for k in range(3):
        x = torch.nn.functional.conv2d(x, weights[2 * k], padding=1)
        x = torch.nn.functional.batch_norm(x, *running[2 * k : 2 * k + 2], weight=weights[2 * k + 1], training=True)
    return x.relu_().sum()


@pytest.mark.parametrize("executor", ["torch", pytest.param("inductor", marks=pytest.mark.inductor)])
def test_batch_norms_of_one_size_train_as_eager(executor):
    def make():
        torch.manual_seed(0)
        weights = [t.requires_grad_() for k in range(3) for t in (torch.randn(4, 4, 3, 3) / 6, torch.rand(4) + 0.5)]
        running = [t for k in range(3) for t in (torch.zeros(4), torch.ones(4))]
        return (torch.randn(2, 4, 6, 6, requires_grad=True), *weights, *running)

    jf = dealias.jit(three_blocks, executor=executor)
    assert grads_like_eager(three_blocks, jf, make) == []


def bessel_of_a_window(w, v, n):
    return w[:n].sin() + torch.special.bessel_j0(v[:n])  # (no derivative in autograd: no grad, no edge to v)


def test_which_results_require_grad_is_asked_without_a_guard_on_the_programs_sizes():
    # The probe runs at the symbols' values in the compiling call, on tensors of its own: the program's symbols
    # get no guard from it (one compile for every n), and the fused graph has no edge to v, as eager's graph (the
    # custom Function behind v would give the leaf a gradient: test_fused_autograd.py).
    jf = dealias.jit(bessel_of_a_window, dynamic=True, executor="inductor")
    for n in range(2, 7):
        grads, outs = [], []
        for fn in (bessel_of_a_window, jf):
            w, leaf = torch.ones(8, requires_grad=True), torch.linspace(0, 1, 8, requires_grad=True)
            outs.append(fn(w, AddsItsInput.apply(leaf), n))
            grads.append(torch.autograd.grad(outs[-1].sum(), (w, leaf), allow_unused=True))
        torch.testing.assert_close(outs[1], outs[0])
        assert grads[0][1] is None and grads[1][1] is None, (n, grads)
        torch.testing.assert_close(grads[1][0], grads[0][0])
    info = dealias.cache_info(jf)
    assert info.misses == 1 and "n" in info.dynamic, info
