"""Review of the stale-saved compile (passes/stale.py): facts of the call eager's message names that the
compile-time eager run on copies must reproduce, or the graph must run eagerly. Against eager on every call."""

from __future__ import annotations

import warnings

import pytest
import torch

import dealias


def _error(fn, args, leaves):
    out = fn(*args)
    try:
        torch.autograd.grad(out.sum(), leaves, allow_unused=True)
    except RuntimeError as e:
        return type(e), str(e)
    raise AssertionError("eager's backward raises here")


def sin_then_written_unrecorded(x):
    s = x.sin()  # saves x itself...
    with torch.no_grad():
        x.add_(1)  # ...written without history: x's node at backward is the caller's
    return s


def mul_by_weight_then_written(x, w):
    y = x * w  # saves w
    w.add_(1)
    return y


def test_a_leafs_versions_are_eagers():
    # The copy of a leaf started a version ahead (the copy_ into it counted): "version 2; expected 1" where
    # eager says "version 1; expected 0".
    jf = dealias.jit(sin_then_written_unrecorded, executor="torch")
    for call in range(2):
        got = []
        for f in (sin_then_written_unrecorded, jf):
            torch.manual_seed(call)
            x = torch.randn(4, requires_grad=True)
            got.append(_error(f, (x,), [x]))
        assert got[1] == got[0], (call, got)


def test_a_saved_input_not_requiring_grad_versions_are_eagers():
    jf = dealias.jit(mul_by_weight_then_written, executor="torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        for call in range(2):
            got = []
            for f in (mul_by_weight_then_written, jf):
                torch.manual_seed(call)
                x, w = torch.randn(4, requires_grad=True), torch.randn(4)
                got.append(_error(f, (x, w), [x]))
            assert got[1] == got[0], (call, got)


def test_the_callers_node_named_in_the_message_is_this_calls():
    # x is Mul's output on one call, Add's on the next (same guards): eager's message names each call's node.
    jf = dealias.jit(sin_then_written_unrecorded, executor="torch")
    for call, make in enumerate((lambda t: t * 1, lambda t: t + 0, lambda t: t * 1)):
        got = []
        for f in (sin_then_written_unrecorded, jf):
            torch.manual_seed(call)
            leaf = torch.randn(4, requires_grad=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", dealias.FallbackWarning)
                got.append(_error(f, (make(leaf),), [leaf]))
        assert got[1] == got[0], (call, got)


def sin_of_one_view_then_write_another(a, b):
    s = a.sin()  # saves a...
    b.add_(1)  # ...whose memory b overlaps: one counter for both
    return s


def relu_of_one_view_then_write_another(a, b):
    a.relu_()  # saves its result, a
    b.mul_(2)
    return a * 1


@pytest.mark.parametrize("fn", [sin_of_one_view_then_write_another, relu_of_one_view_then_write_another])
def test_overlapping_views_versions_follow_the_callers_counter(fn):
    # Inputs overlapping views of one tensor (an alias group): eager counts versions from that tensor's counter at
    # the call; the compiled message was the compiling call's on every later call ("version 1" for eager's 3).
    jf = dealias.jit(fn, executor="torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        for bumps in (0, 2, 5, 1):
            got = []
            for f in (fn, jf):
                torch.manual_seed(bumps)
                leaf = torch.randn(6, requires_grad=True)
                base = leaf * 1
                with torch.no_grad():
                    for _ in range(bumps):
                        base.add_(0)  # moves the counter only
                got.append(_error(f, (base[:4], base[2:]), [leaf]))
            assert got[1] == got[0], (bumps, got)
    assert dealias.cache_info(jf).misses == 1


def test_a_split_element_input_runs_eagerly():
    # The caller's x is an element of unbind (a view eager restricts): eager's backward raises "Output 0 of View is a
    # view and its base ... returns multiple views", where a copy made as_strided said "modified by an inplace".
    jf = dealias.jit(sin_then_written_unrecorded, executor="torch")
    for call, make in enumerate((lambda b: b[0], lambda b: b.unbind(0)[0].view(3), lambda b: b.unbind(0)[1])):
        got = []
        for f in (sin_then_written_unrecorded, jf):
            torch.manual_seed(call)
            leaf = torch.randn(2, 3, requires_grad=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", dealias.FallbackWarning)
                got.append(_error(f, (make(leaf * 1),), [leaf]))
        assert got[1] == got[0], (call, got)


def test_the_copy_limit_is_for_all_inputs_together(monkeypatch):
    # The eager run copies every input: a limit per input let many (a model's parameters) double the memory of a
    # call at the compile. Scaled down: two inputs of 600 bytes under a limit of 1000.
    import dealias.passes.stale as stale

    monkeypatch.setattr(stale, "_COPY_LIMIT", 1000)
    jf = dealias.jit(mul_by_weight_then_written, executor="torch")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dealias.FallbackWarning)
        got = []
        for f in (mul_by_weight_then_written, jf):
            torch.manual_seed(0)
            x, w = torch.randn(150, requires_grad=True), torch.randn(150)
            got.append(_error(f, (x, w), [x]))
    assert got[1] == got[0]
    assert [w.category for w in caught] == [dealias.EagerRaisesFallbackWarning], caught


def exp_then_add_(x):
    y = x.exp()
    y.add_(1)
    return y


@pytest.mark.parametrize("at_compile", [False, True])
def test_the_hint_follows_anomaly_detection_at_backward(at_compile):
    # Eager's hint is "enable anomaly detection ..." or "the backtrace further above ...", after the mode when its
    # backward runs; the compiled message was the compiling call's on every backward.
    jf = dealias.jit(exp_then_add_, executor="torch")
    with torch.autograd.set_detect_anomaly(at_compile, check_nan=False), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (anomaly detection's traceback warnings)
        jf(torch.randn(3, requires_grad=True))
    for anomaly in (False, True, False):
        got = []
        for f in (exp_then_add_, jf):
            x = torch.randn(3, requires_grad=True)
            with torch.autograd.set_detect_anomaly(anomaly, check_nan=False), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                got.append(_error(f, (x,), [x]))
        assert got[1] == got[0], (anomaly, got)
    assert dealias.cache_info(jf).misses == 1


def mul_itself_(x):
    x.mul_(x)  # saves x as its other factor, and writes it
    return x * 2


def exp_twice(x):
    return x.exp() * 2


def test_an_own_write_under_saved_tensors_hooks_is_eagers():
    # Under saved_tensors_hooks eager checks no version: its backward reads the written x (4, 12, 24), the
    # functional graph read the x before the write (4, 8, 12). The probe asking whether mul_'s own write
    # invalidates what it saved ran under the user's hooks, so it saw no error either: the graph compiled.
    jf = dealias.jit(mul_itself_, executor="torch")
    got = []
    for f in (mul_itself_, jf):
        leaf = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t), warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            got.append(torch.autograd.grad(f(leaf * 1).sum(), leaf)[0])
    assert torch.equal(got[1], got[0]), got


@pytest.mark.parametrize("fn", [exp_then_add_, mul_itself_, exp_twice])
def test_pack_hooks_are_called_as_often_as_eagers(fn):
    # A pack hook is the user's Python (counting, offloading): the compile's trace, probes and eager run on copies
    # called it too (4 calls for eager's 1).
    counts = []
    for f in (fn, dealias.jit(fn, executor="torch")):
        packed = []

        def pack(t, packed=packed):
            packed.append(type(t))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            for _ in range(2):
                f(torch.randn(3, requires_grad=True) * 1)
        counts.append(packed)
    assert counts[1] == counts[0]


@torch.library.custom_op("dealias_review::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x):
    return torch.empty_like(x)


_twice.register_autograd(lambda ctx, grad: grad * 3)  # (not twice's own derivative: eager's formula is the user's)


def twice_then_exp(x):
    return _twice(x).exp()


def test_a_user_op_with_autograd_keeps_its_gradient():
    # (found checking the eager run's side effects) A torch.library op's autograd kernel runs above make_fx: the
    # trace recorded its inner call under no_grad, and the compiled result did not require grad.
    got = []
    for f in (twice_then_exp, dealias.jit(twice_then_exp, executor="torch")):
        x = torch.randn(3, requires_grad=True)
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            out = f(x)
        got.append((out.requires_grad, torch.autograd.grad(out.sum(), x)[0] if out.requires_grad else None, x))
    (rg0, g0, x0), (rg1, g1, x1) = got
    assert rg1 == rg0 and torch.equal(g1, (x1 * 2).exp() * 3) and torch.equal(g0, (x0 * 2).exp() * 3)
