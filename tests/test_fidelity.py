"""Eager's observable details on the torch executor, each compared with eager on cloned inputs: aliasing, grad_fn
names, version counters and autograd's errors. With sizes traced as symbols (`dynamic=True`, or a batch size that
changed between calls), torch's Python dispatcher decomposes dropout and batch norm otherwise than eager's kernels;
capture traces them as eager dispatches them (compat/internals.py `eager_dispatch`)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from harness import grad_fn_chain, no_fallback, same, same_state

import dealias


def dropout_eval_then_written(x):
    y = F.dropout(x, 0.5, training=False)  # eager: y is x itself
    y.add_(1)
    return y


def test_dropout_outside_training_returns_its_input():
    """Eager's dropout outside training returns the input tensor itself, so a write through the result writes the
    input. A symbolic trace (here after the size changed) decomposed it into a clone: the input stayed unwritten
    (a silent wrong result)."""
    jf = dealias.jit(dropout_eval_then_written, executor="torch")
    with no_fallback():
        for n in (3, 5):
            x = torch.randn(n, 4)
            want_x = x.clone()
            want = dropout_eval_then_written(want_x)
            got = jf(x)
            same(x, want_x)
            assert (got is x) == (want is want_x) is True
            assert x._version == want_x._version


def dropout_module_eval(m, x):
    return m(x)


def test_dropout_module_eval_symbolic_is_its_input():
    m = nn.Dropout(0.5).eval()
    jf = dealias.jit(dropout_module_eval, executor="torch", dynamic=True)
    with no_fallback():
        x = torch.randn(3, 4, requires_grad=True)
        assert dropout_module_eval(m, x) is x
        assert jf(m, x) is x


def dropout_train(x):
    return F.dropout(x * 2, 0.3, training=True)


def test_dropout_in_training_symbolic_draws_as_eager():
    """Eager's CPU dropout draws a Bernoulli mask and multiplies (MulBackward0); the decomposition drew through
    native_dropout (NativeDropoutBackward0). Same draws, same values, eager's node."""
    jf = dealias.jit(dropout_train, executor="torch", dynamic=True)
    with no_fallback():
        for n in (30, 50):
            x = torch.randn(n, 40, requires_grad=True)
            torch.manual_seed(3)
            want = dropout_train(x)
            torch.manual_seed(3)
            got = jf(x)
            same(got, want)
            assert grad_fn_chain(got) == grad_fn_chain(want) == ["MulBackward0", "MulBackward0"]


def forward(m, x):
    return m(x)


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_with_symbolic_sizes_records_eagers_node(dims, train):
    """BatchNorm1d/2d/3d with the batch size symbolic (`dynamic=True`, as after a batch size changed): eager's
    NativeBatchNormBackward0 (not NativeBatchNormLegit[NoTraining]Backward0), the running statistics updated in
    place by eager's op (counters as eager's), gradients as eager's."""
    torch.manual_seed(0)
    eager_m = getattr(nn, f"BatchNorm{dims}d")(3).train(train)
    jit_m = copy.deepcopy(eager_m)
    jf = dealias.jit(forward, executor="torch", dynamic=True)
    spatial = {1: (5,), 2: (4, 4), 3: (2, 3, 3)}[dims]
    with no_fallback():
        for n in (2, 4):
            x = torch.randn(n, 3, *spatial)
            xe, xj = x.clone().requires_grad_(), x.clone().requires_grad_()
            want, got = forward(eager_m, xe), jf(jit_m, xj)
            same(got, want)
            same_state(eager_m, jit_m)
            assert grad_fn_chain(got) == grad_fn_chain(want) == ["NativeBatchNormBackward0"]
            assert [b._version for b in jit_m.buffers()] == [b._version for b in eager_m.buffers()]
            want.square().sum().backward()
            got.square().sum().backward()
            same(xj.grad, xe.grad)
            for a, b in zip(eager_m.parameters(), jit_m.parameters()):
                same(b.grad, a.grad)
    if train:
        source = str(dealias.last_traces(jf)[-1])
        assert ".copy_(" not in source and "set_version_counters" not in source, source


@pytest.mark.parametrize(
    "module", [nn.InstanceNorm2d(3), nn.BatchNorm2d(3, track_running_stats=False)], ids=["instance", "no_stats"]
)
def test_norms_without_running_statistics_symbolic(module):
    jf = dealias.jit(forward, executor="torch", dynamic=True)
    with no_fallback():
        x = torch.randn(2, 3, 4, 4)
        xe, xj = x.clone().requires_grad_(), x.clone().requires_grad_()
        want, got = forward(module, xe), jf(module, xj)
        same(got, want)
        assert grad_fn_chain(got) == grad_fn_chain(want)
        assert "NativeBatchNormBackward0" in grad_fn_chain(want)
        want.sum().backward()
        got.sum().backward()
        same(xj.grad, xe.grad)


def checkpointed(m, x):
    return torch.utils.checkpoint.checkpoint(m, x, use_reentrant=False)


@pytest.mark.parametrize("executor", ["torch", "tiered"])
def test_checkpointed_training_batch_norm_backward_runs_as_eagers(executor):
    """A training BatchNorm inside a non-reentrant checkpoint: eager's checkpoint saves only its arguments, so the
    module's `num_batches_tracked.add_(1)` (again at the recompute) raises nothing; dynamo's operator passed the
    buffers as arguments and backward raised "modified by an inplace operation". State (updated twice, as eager's),
    values and gradients as eager's."""
    torch.manual_seed(0)
    eager_m = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).train()
    jit_m = copy.deepcopy(eager_m)
    jf = dealias.jit(checkpointed, executor=executor)
    for _ in range(2):
        x = torch.randn(5, 4)
        xe, xj = x.clone().requires_grad_(), x.clone().requires_grad_()
        want, got = checkpointed(eager_m, xe), jf(jit_m, xj)
        same(got, want)
        want.square().sum().backward()
        got.square().sum().backward()
        same_state(eager_m, jit_m)
        same(xj.grad, xe.grad)
        for a, b in zip(eager_m.parameters(), jit_m.parameters()):
            same(b.grad, a.grad)


def checkpoint_writes_its_argument(x, c):
    def body(x, c):
        c.add_(1)
        return x * c

    return torch.utils.checkpoint.checkpoint(body, x, c, use_reentrant=False)


def checkpoint_writes_what_it_closes_over(x, c):
    def body(x):
        c.add_(1)
        return x * c

    return torch.utils.checkpoint.checkpoint(body, x, use_reentrant=False)


@pytest.mark.parametrize("fn", [checkpoint_writes_its_argument, checkpoint_writes_what_it_closes_over])
def test_checkpoint_write_raises_where_eagers_raises(fn):
    """A tensor given to checkpoint as an argument is saved by eager's checkpoint: written inside, backward raises;
    the same tensor closed over is saved by nothing: backward runs. Both as eager's, `c` written twice."""
    results = []
    for f in (fn, dealias.jit(fn, executor="torch")):
        x, c = torch.randn(3, requires_grad=True), torch.zeros(3)
        out = f(x, c)
        try:
            out.sum().backward()
            results.append(("ran", x.grad.tolist(), c.tolist()))
        except RuntimeError as e:
            assert "modified by an inplace operation" in str(e)
            results.append(("raised", c.tolist()))
    assert results[1] == results[0]


# Autograd's "modified by an inplace operation" check against a compiled call: a tensor saved for backward before
# the call (outside it), the call writing it (or not, or where autograd cannot see): backward raises exactly where
# eager's raises. Each program gets `c` (requires no grad), `x` (a non-leaf requiring grad) and `w`.
def writes_c(c, x, w):
    c.add_(1)
    return x * 2


def writes_c_twice(c, x, w):
    c.add_(1)
    c.mul_(2)
    return x * 2


def writes_a_row_of_c(c, x, w):
    c[0].add_(1)
    return x * 2


def writes_c_under_no_grad(c, x, w):
    with torch.no_grad():
        c.add_(1)
    return x * 2


def writes_c_through_data(c, x, w):
    c.data.add_(1)  # (hidden from autograd: eager's counter stays)
    return x * 2


def reads_c(c, x, w):
    return x * c


def writes_x(c, x, w):
    x.add_(1)
    return x * 2


def writes_x_through_data(c, x, w):
    x.data.mul_(2)
    return x * 2


def copies_into_c(c, x, w):
    c.copy_(x.detach())
    return w * c


def chunk_element_written(c, x, w):
    c.unsafe_chunk(2)[0].add_(1)  # (an unsafe_chunk element has a counter of its own: eager's c stays)
    return x * 2


@pytest.mark.parametrize("executor", ["torch", "tiered"])
@pytest.mark.parametrize(
    "program",
    [
        writes_c,
        writes_c_twice,
        writes_a_row_of_c,
        writes_c_under_no_grad,
        writes_c_through_data,
        reads_c,
        writes_x,
        writes_x_through_data,
        copies_into_c,
        chunk_element_written,
    ],
)
def test_backward_through_saved_tensors_raises_where_eagers_raises(program, executor):
    jf = dealias.jit(program, executor=executor)
    for _ in range(3):  # (later calls: the cached program, and on "tiered" the tier chosen)
        outcomes = []
        for f in (program, jf):
            g = torch.Generator().manual_seed(0)
            leaf = torch.randn(4, 3, generator=g, requires_grad=True)
            w = torch.randn(4, 3, generator=g, requires_grad=True)
            c, x = torch.randn(4, 3, generator=g), leaf * 1
            saved = (w * c).sum() + (x * x).sum()  # (mul saves c and x)
            before = (c._version, x._version)
            out = f(c, x, w)
            moved = (c._version != before[0], x._version != before[1])
            try:
                (saved + out.sum()).backward()
                outcomes.append(("ran", moved, leaf.grad, w.grad, c.clone()))
            except RuntimeError as e:
                assert "modified by an inplace operation" in str(e), e
                outcomes.append(("raised", moved, None, None, c.clone()))
        (kind, moved, *tensors), (jkind, jmoved, *jtensors) = outcomes
        assert (jkind, jmoved) == (kind, moved)
        for a, b in zip(tensors, jtensors):
            assert (a is None) == (b is None)
            if a is not None:
                same(b, a)


def stats_read_first(m, x):
    s = m.running_mean.sum()  # (read before the BatchNorm: not only written back, so not updated on the caller's)
    return m(x) + s


def stats_returned(m, x):
    return m(x), m.running_var * 1


@pytest.mark.parametrize("program", [stats_read_first, stats_returned])
@pytest.mark.parametrize("dynamic", [False, True])
def test_training_batch_norm_with_its_statistics_read_records_eagers_node(program, dynamic):
    """Where the running statistics are read besides the BatchNorm's update, eager's `native_batch_norm` runs on
    copies of them (not `_native_batch_norm_legit_functional`): NativeBatchNormBackward0 as eager's, values, state,
    counters and gradients as eager's."""
    torch.manual_seed(0)
    eager_m = nn.BatchNorm2d(3).train()
    jit_m = copy.deepcopy(eager_m)
    jf = dealias.jit(program, executor="torch", dynamic=dynamic)
    with no_fallback():
        for n in (2, 4):
            x = torch.randn(n, 3, 4, 4)
            xe, xj = x.clone().requires_grad_(), x.clone().requires_grad_()
            want, got = program(eager_m, xe), jf(jit_m, xj)
            same(got, want)
            same_state(eager_m, jit_m)
            assert "NativeBatchNormBackward0" in grad_fn_chain(want[0] if isinstance(want, tuple) else want)
            for a, b in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
                assert grad_fn_chain(b) == grad_fn_chain(a)
            assert [b._version for b in jit_m.buffers()] == [b._version for b in eager_m.buffers()]
            (want[0] if isinstance(want, tuple) else want).square().sum().backward()
            (got[0] if isinstance(got, tuple) else got).square().sum().backward()
            same(xj.grad, xe.grad)
            for a, b in zip(eager_m.parameters(), jit_m.parameters()):
                same(b.grad, a.grad)
