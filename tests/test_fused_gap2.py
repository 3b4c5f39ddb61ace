"""The fused executor against torch.compile where it was just above it (issue 38): BatchNorm2d in training, Adam and
AdamW with foreach. Inductor's code for dealias's graphs was torch.compile's, kernel for kernel (one kernel each, no
buffer of its own for a write-back, the running statistics and the optimizer state written inside that kernel);
what differed was the Python of the fused call around it: a generator over the written inputs (40 of them in a
10-parameter Adam step) and a comprehension over the arguments of a BatchNorm call, run on every call. Each is now
an index picker built once, in C."""

from __future__ import annotations

import copy
import sys
import types
from unittest import mock

import pytest
import torch

import dealias


def _own_code(fn):
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


def inductor_code(fn, *args):
    """`fn(*args)` and the code inductor generated meanwhile."""
    from torch._inductor.graph import GraphLowering

    codes = []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        return fn(*args), "\n".join(codes)


def python_frames(fn, *args, module):
    """The Python frames of dealias's `module` (a path ending) entered while `fn(*args)` runs (a generator's each
    resumption counts)."""
    entered = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith(module):
            entered.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return entered


def kernel_call(code):
    """The body of the `call` inductor generated (its allocations, kernel and extern calls)."""
    return code[code.index("def call(") :].split("\nrunner = ", 1)[0]


def besides_kernels(call):
    """The lines of `call` other than its kernels' (whose names tell the ops they fused: `..._copy__0`)."""
    return "\n".join(line for line in call.splitlines() if "cpp_fused_" not in line)


def step(opt):
    opt.step()


def _optimizer(kind):
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(8, 5)) for _ in range(3)] + [torch.nn.Parameter(torch.randn(7))]
    for p in ps:
        p.grad = torch.randn_like(p)
    cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    return ps, cls(ps, lr=0.1, foreach=True, weight_decay=0.01 if kind == "adamw" else 0)


def _state(ps, opt):
    return ps + [t for s in opt.state.values() for t in s.values()]


@pytest.mark.inductor
@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_a_foreach_adam_step_is_one_kernel_and_moves_counters_without_python_loops(kind):
    (pe, oe), (pf, of) = _optimizer(kind), _optimizer(kind)
    jf = dealias.jit(_own_code(step), executor="inductor")
    oe.step()
    _, code = inductor_code(jf, of)
    assert dealias.cache_info(jf).tiers == ("fused",)
    call = kernel_call(code)
    # As torch.compile's: one kernel writes parameters, exp_avg, exp_avg_sq and the step counters in place; no
    # buffer, no copy, no extern call.
    assert call.count("cpp_fused_") == 1, call
    rest = besides_kernels(call)
    assert "empty_strided" not in rest and "copy" not in rest and "extern_kernels" not in rest, call
    for calls in range(1, 4):
        versions = [t._version for t in _state(pf, of)]
        eager_versions = [t._version for t in _state(pe, oe)]
        oe.step()
        # The fused call's own Python: the call alone (generated per program, fused.py `runner`), no frame per
        # written input (a generator over the 16 written inputs entered 17 frames), none of fused.py's own.
        assert python_frames(jf, of, module=("<dealias fused call>", "runtime/fused.py")) == ["run"]
        for e, f in zip(_state(pe, oe), _state(pf, of)):
            # (under dynamo the bias corrections are float32 tensor arithmetic, eager's Python floats: 2e-4 apart
            # relative after two steps, with torch.compile too)
            torch.testing.assert_close(f, e, rtol=1e-3, atol=1e-5, msg=lambda m, c=calls: f"call {c}: {m}")
        # Every tensor eager's step wrote has a moved counter, and only those.
        moved = [t._version != v for t, v in zip(_state(pf, of), versions)]
        eager_moved = [t._version != v for t, v in zip(_state(pe, oe), eager_versions)]
        assert moved == eager_moved
        for group in (pe, pf):  # (new gradients: read on every call, not the compiling call's)
            torch.manual_seed(calls)
            for p in group:
                p.grad.copy_(torch.randn_like(p))


def bn_train(bn, x):
    return bn(x)


@pytest.mark.inductor
def test_batch_norm_training_is_one_kernel_and_its_call_reads_no_versions_in_python():
    torch.manual_seed(0)
    bn, x = torch.nn.BatchNorm2d(4), torch.randn(2, 4, 3, 3, requires_grad=True)
    ref_bn, ref_x = copy.deepcopy(bn), x.detach().clone().requires_grad_()
    jf = dealias.jit(_own_code(bn_train), executor="inductor")
    out, code = inductor_code(jf, bn, x)
    expected = bn_train(ref_bn, ref_x)
    assert dealias.cache_info(jf).tiers == ("fused",)
    # As torch.compile's forward: one kernel computes the statistics, the output and writes the running statistics
    # and num_batches_tracked in place (no write-back of its own, no copy); the output is the one large buffer.
    forward = kernel_call(code)
    assert forward.count("cpp_fused_") == 1 and "copy" not in besides_kernels(forward), forward
    assert forward.count("empty_strided_cpu((2, 4, 3, 3)") == 1, forward
    for calls in range(2, 5):
        x2, ref_x2 = (torch.randn(2, 4, 3, 3) for _ in range(2))
        ref_x2.copy_(x2)
        x2.requires_grad_(), ref_x2.requires_grad_()
        versions = [t._version for t in (bn.running_mean, bn.running_var, bn.num_batches_tracked)]
        # The fused autograd call's Python: nothing of double_backward.py (the version counters a double backward
        # checks are read in C; a comprehension over the arguments was a frame of its own on every call).
        got = []
        frames = python_frames(lambda x2=x2, got=got: got.append(jf(bn, x2)), module="runtime/double_backward.py")
        out, expected = got[0], bn_train(ref_bn, ref_x2)
        assert frames == []
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(bn, name), getattr(ref_bn, name), rtol=1e-5, atol=1e-6, msg=name)
        assert ref_bn.num_batches_tracked.item() == bn.num_batches_tracked.item() == calls
        # eager's batch norm kernel leaves the running statistics' counters; num_batches_tracked's add_ moves it
        assert [bn.running_mean._version, bn.running_var._version] == versions[:2]
        assert bn.num_batches_tracked._version > versions[2]
        grad = torch.randn_like(out)
        out.backward(grad)
        expected.backward(grad)
        torch.testing.assert_close(x2.grad, ref_x2.grad, rtol=1e-4, atol=1e-5)
        for p, q in zip(bn.parameters(), ref_bn.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    # A backward with create_graph=True recomputes from the call's inputs, checking their counters (read in C now)
    x3 = torch.randn(2, 4, 3, 3, requires_grad=True)
    ref_x3 = x3.detach().clone().requires_grad_()
    (g,) = torch.autograd.grad((jf(bn, x3) ** 2).sum(), x3, create_graph=True)
    (ref_g,) = torch.autograd.grad((bn_train(ref_bn, ref_x3) ** 2).sum(), ref_x3, create_graph=True)
    torch.testing.assert_close(g, ref_g, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.autograd.grad(g.sum(), x3)[0], torch.autograd.grad(ref_g.sum(), ref_x3)[0])
    y = jf(bn, x3)
    with torch.no_grad():
        bn.bias.add_(1)  # (an input nothing saved, written in place since the call: the recompute refuses)
    with pytest.raises(RuntimeError, match="modified in place since the call"):
        torch.autograd.grad(y.sum(), x3, create_graph=True)
