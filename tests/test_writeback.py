"""Write-back moves only what changed: structure of the execution graph for slice writes into big inputs,
and values (against eager) for every pattern."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from harness import check

import dealias

N = 64  # the buffer is N x N x 4: a full copy would move 64 KiB


def _full_size_temporaries(jf, numel: int) -> list[str]:
    """Nodes of the execution graph that produce a new tensor as large as the buffer (a whole copy)."""
    gm = jf.last.functional.gm
    out = []
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if n.op != "call_function" or not isinstance(v, torch.Tensor) or v.numel() < numel:
            continue
        name = str(n.target)
        if any(
            k in name for k in ("scatter", "clone", "copy.default", "index_put.default", "index_copy.default", "region")
        ):
            out.append(name)
        elif not name.endswith("_") and "_." not in name and "view" not in name and "select" not in name:
            if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.name.endswith("_"):
                continue
            from dealias.ir.opfacts import OpKind, facts

            if isinstance(n.target, torch._ops.OpOverload) and facts(n.target).kind is OpKind.FUNCTIONAL:
                out.append(name)
    return out


def int_setitem(buf, row):
    buf[3] = row


def slice_setitem(buf, rows):
    buf[2:4] = rows


def step_setitem(buf, v):
    buf[::16, 1] = v


def tensor_index_setitem(buf, idx, rows):
    buf[idx] = rows


def index_copy_(buf, idx, rows):
    buf.index_copy_(0, idx, rows)


def index_put_(buf, idx, rows):
    buf.index_put_((idx,), rows, accumulate=True)


def transposed_write(buf, col):
    buf.transpose(0, 1)[5].copy_(col)


def selected_write(buf, v):
    buf.select(2, 1)[7].fill_(0.5)
    buf[1, 2] = v


def two_writes(buf, row):
    buf[0] = row
    buf[1] = row * 2


def nested_views(buf, idx, v):
    buf[0][:, idx] = v


def inplace_on_slice(buf, row):
    buf[3].add_(row)
    buf[4].mul_(2)


def write_then_read(buf, row):
    buf[5] = row
    return buf[4:6].sum()


CASES = [
    (int_setitem, lambda: (torch.randn(N, N, 4), torch.randn(N, 4))),
    (slice_setitem, lambda: (torch.randn(N, N, 4), torch.randn(2, N, 4))),
    (step_setitem, lambda: (torch.randn(N, N, 4), torch.randn(4, 4))),
    (tensor_index_setitem, lambda: (torch.randn(N, N, 4), torch.tensor([1, 7]), torch.randn(2, N, 4))),
    (index_copy_, lambda: (torch.randn(N, N, 4), torch.tensor([1, 7]), torch.randn(2, N, 4))),
    (index_put_, lambda: (torch.randn(N, N, 4), torch.tensor([1, 1]), torch.randn(2, N, 4))),
    (transposed_write, lambda: (torch.randn(N, N, 4), torch.randn(N, 4))),
    (selected_write, lambda: (torch.randn(N, N, 4), torch.randn(4))),
    (two_writes, lambda: (torch.randn(N, N, 4), torch.randn(N, 4))),
    (nested_views, lambda: (torch.randn(N, N, 4), torch.tensor([2, 3]), torch.randn(N, 2))),
    (inplace_on_slice, lambda: (torch.randn(N, N, 4), torch.randn(N, 4))),
    (write_then_read, lambda: (torch.randn(N, N, 4), torch.randn(N, 4))),
]


@pytest.mark.parametrize("fn,make", CASES, ids=[c[0].__name__ for c in CASES])
def test_writes_only_the_region(fn, make):
    jf = check(fn, *make())
    buf_bytes = N * N * 4 * 4
    assert _full_size_temporaries(jf, N * N * 4) == [], str(dealias.last_traces(jf)[3])
    (report,) = dealias.explain(jf)
    assert report.mode == "in place", report
    assert 0 < report.nbytes <= buf_bytes // 16, report
    assert "copy_(" not in str(dealias.last_traces(jf)[3]).split("write-back into")[-1] or report.mode == "in place"


def test_whole_copy_when_old_value_is_read_after_the_write():
    def f(buf, row):
        old = buf[3]  # a view, read after the write: it must see the new row (eager aliasing)
        snapshot = buf.sum()
        buf[3] = row
        return old * 1, snapshot

    jf = check(f, torch.randn(8, 4), torch.randn(4))
    (report,) = dealias.explain(jf)
    assert report.mode == "in place"


def product_with_own_row_then_cumsum(x):
    v = torch.full_like(x, 1.5)
    torch.mul(x, x[1:2], out=v)  # not in place in the program: x[1:2] is read whole
    torch.cumsum(v, 0, out=x)
    return x


def test_full_write_reading_its_target_through_a_view_is_not_run_in_place():
    # mul(x, x[1:2]) then cumsum, both of x's shape, were run in place into x: `x.mul_(x[1:2])` raised eager's
    # partial-overlap error where the program's out-of-place mul is fine (fuzz seed 1003301).
    jf = check(product_with_own_row_then_cumsum, torch.randn(2, 3))
    (report,) = dealias.explain(jf)
    assert report.mode == "whole copy"


def test_old_value_needed_later_keeps_function_form():
    def f(buf, row):
        y = buf * 1  # reads buf before the write: fine
        z = buf.clone()
        buf[0] = row
        return y + z

    check(f, torch.randn(8, 4), torch.randn(4))


def test_reinplaced_intermediate_has_no_scatter():
    def f(x, idx):
        y = torch.zeros(N, N)
        y[idx] = x
        y[:, 0].add_(1)
        return y

    jf = check(f, torch.randn(2, N), torch.tensor([3, 9]))
    ops = [str(n.target) for n in jf.last.functional.gm.graph.nodes]
    assert not any("scatter" in o for o in ops), ops


def test_autograd_keeps_functional_form():
    def f(buf, w):
        buf[0] = w * 2
        return buf.sum()

    w = torch.randn(4, requires_grad=True)
    buf = torch.zeros(3, 4)
    out = dealias.jit(f)(buf, w)
    (report,) = dealias.explain(dealias.jit(f)) or [None]
    out.backward()
    assert torch.equal(w.grad, torch.full((4,), 2.0))


def test_index_out_of_range_leaves_inputs_untouched():
    def f(buf, idx, rows):
        buf[0] = rows[0]  # an in-place write before the failing one
        buf.index_copy_(0, idx, rows)

    # Eager writes buf[0] and then raises; dealias raises the same IndexError before writing anything.
    check(f, torch.zeros(4, 3), torch.tensor([1, 9]), torch.ones(2, 3))
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 4"):
        dealias.jit(f)(torch.zeros(4, 3), torch.tensor([1, 9]), torch.ones(2, 3))
    # Several out of range: eager names the first, in order (not the largest), and so does the check.
    with pytest.raises(IndexError, match="index 6 is out of bounds for dimension 0 with size 4"):
        dealias.jit(f)(torch.zeros(4, 3), torch.tensor([1, 6, 9]), torch.ones(3, 3))
    with pytest.raises(IndexError, match="index 6 is out of bounds for dimension 0 with size 4"):
        f(torch.zeros(4, 3), torch.tensor([1, 6, 9]), torch.ones(3, 3))


def _execution_ops(jf) -> list[str]:
    """The ops of the execution graph by name (`relu_`), whether the torch executor calls them as methods or not."""
    ops = []
    for n in jf.last.functional.gm.graph.nodes:
        if n.op == "call_method":
            ops.append(n.target)
        elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            ops.append(n.target._schema.name.split("::")[-1])
        elif n.op == "call_function":  # (`torch._native_batch_norm_legit`)
            ops.append(getattr(n.target, "__name__", ""))
    return ops


def _conv_bn_relu() -> tuple[torch.Tensor, ...]:
    """A conv's input, weight and bias, then a training BatchNorm's running statistics, weight and bias."""
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3, requires_grad=True), torch.randn(4, requires_grad=True)
    return x, w, b, torch.zeros(4), torch.ones(4), torch.rand(4, requires_grad=True), torch.randn(4, requires_grad=True)


def conv_bn_relu(x, w, b, mean, var, gamma, beta):
    y = F.batch_norm(F.conv2d(x, w, b), mean, var, gamma, beta, training=True)
    return F.relu(y, inplace=True)


def test_eager_in_place_update_of_an_intermediate_runs_in_place_under_autograd():
    """`ReLU(inplace=True)` on a training BatchNorm's output (grad on, parameters requiring grad): the torch
    executor runs eager's relu_ on the BatchNorm result, not a relu into a new tensor, and the batch norm as the
    mutable op on the caller's running statistics, not on clones copied back; outputs, running statistics, version
    counters and gradients are eager's."""
    from harness import grads_like_eager

    jf = dealias.jit(conv_bn_relu, executor="torch")
    assert not grads_like_eager(conv_bn_relu, jf, _conv_bn_relu, calls=2)
    ops = _execution_ops(jf)
    assert "relu_" in ops and "relu" not in ops, ops
    assert "_native_batch_norm_legit" in ops and "clone" not in ops, ops
    assert [r.mode for r in dealias.explain(jf)] == ["in place", "in place"]  # (mean, var)
    for f in (conv_bn_relu, jf):  # autograd saved the caller's running mean, as eager's: written after, backward raises
        args = _conv_bn_relu()
        out = f(*args)
        args[3].zero_()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
    assert jf(*_conv_bn_relu())._version == conv_bn_relu(*_conv_bn_relu())._version == 1


def test_out_of_place_op_of_an_intermediate_stays_out_of_place_under_autograd():
    """Only what eager ran in place runs in place: `y.relu()` (y dead after it) makes a tensor of its own, and
    `y.relu_()` with y read afterwards through another value keeps the functional form."""

    def f(x, w):
        y = x * w
        return y.relu()

    def g(x, w):
        y = x * w
        z = y + 1
        y.relu_()
        return z, y

    w = torch.randn(4, requires_grad=True)
    assert "relu" in _execution_ops(check(f, torch.randn(4), w, executor="torch"))
    ops = _execution_ops(check(g, torch.randn(4), w, executor="torch"))
    assert "relu" in ops and "relu_" not in ops, ops
