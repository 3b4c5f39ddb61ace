"""A compiled program's call is generated once from the plan (runtime/generated_call.py): the execution trace prints
the very source that runs, and each step of its epilogue (write-backs in their grad modes, expanded targets, alias
groups' bases, grad-mode switches, outputs made before the graph, from other outputs, as multi-output views, with
symbolic arguments, layouts set in place, metadata write-backs, version counters, returned structures) gives
eager's values, caller tensors, aliasing, version counters and gradients."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from harness import check, grads_like_eager
from torch.utils import _pytree as pytree

import dealias
from dealias.passes.pipeline import compile_program
from dealias.runtime.verify import first_difference


def write_after_a_no_grad_view(x):  # OutputSlot.early; a whole write-back with grad on
    with torch.no_grad():
        v = x[0]
    x.mul_(2)
    return v


def fill_expanded_then_read(x, w):  # an expanded caller's tensor: one element of each repeat copied
    x.fill_(2.0)
    return x * w


def overlapping_writes(a, b):  # an alias group's base
    a.add_(1)
    b.mul_(2)
    return a.sum()


def write_under_no_grad(x, y):  # the graph switches grad mode: the call's set back after it
    with torch.no_grad():
        x.add_(1)
    return x * y


def split_element(x):  # OutputSlot.multi_output
    x.add_(1)
    return x.split(2)[1]


def view_of_an_output(x):  # OutputSlot.from_output
    v2 = x.flatten()
    return v2, v2.view(-1)


def t_between_views(x):  # OutputSlot.restride, views made before and after it
    y = x * 2
    z = y[0]
    y.t_()
    w = y[1]
    return y, z, w


def batch_norm_training(x, mean, var):  # FunctionalProgram.unmoved_counters
    return F.batch_norm(x, mean, var, training=True, momentum=0.1)


def _overlapping():
    base = torch.zeros(10)
    return base[:6], base[2:]


CASES = [
    (write_after_a_no_grad_view, lambda: (torch.randn(2, 3, requires_grad=True).clone(),), "set_grad_enabled(False)\n"),
    (fill_expanded_then_read, lambda: (torch.randn(1).expand(3), torch.randn(3, requires_grad=True)), ".narrow(0, 0,"),
    (overlapping_writes, _overlapping, "base_of_group0(a, b)"),
    (write_under_no_grad, lambda: (torch.zeros(4), torch.ones(4, requires_grad=True)), "set_grad_enabled(True)"),
    (split_element, lambda: (torch.zeros(6),), "aten_split_Tensor(x, 2)[1]"),
    (view_of_an_output, lambda: (torch.randn(2, 3).t(),), "out0.view([-1])"),
    (t_between_views, lambda: (torch.randn(3, 4, requires_grad=True),), "as_strided_keeping_version(mul,"),
    (batch_norm_training, lambda: (torch.randn(4, 3), torch.zeros(3), torch.ones(3)), "set_version_counters(kept"),
]


def printed_call(jf) -> str:
    """The call as the execution trace prints it."""
    text = dealias.last_traces(jf)[-1].text
    return text.split("# the call, generated from the plan (this source runs)\n")[1]


@pytest.mark.parametrize("fn,make,step", CASES, ids=[c[0].__name__ for c in CASES])
def test_each_epilogue_step_matches_eager_and_is_printed_as_it_runs(fn, make, step):
    jf = check(fn, *make())
    program = jf.last
    assert step in program.source, program.source
    # The function that runs was compiled from this source (linecache holds it under the code's own file name), and
    # the trace prints the same text.
    assert inspect.getsource(program.lean_call) == program.source
    assert printed_call(jf) == program.source.rstrip()
    if any(a.requires_grad for a in make() if isinstance(a, torch.Tensor)):
        grads_like_eager(fn, dealias.jit(fn), make)


def cache_prefix(cache, k, pos):
    cache.select(1, pos).copy_(k)
    out = cache[:, : pos + 1]  # a view whose size the graph computes (a ResultArg of the chain)
    return out, out.mean(1)


def test_an_output_view_with_a_symbolic_size_takes_it_from_the_results():
    jf = dealias.jit(cache_prefix, dynamic=True)
    for pos in (3, 4, 7):
        from dealias.runtime.verify import compare_call

        assert compare_call(cache_prefix, jf, (torch.zeros(2, 12, 3), torch.randn(2, 3), pos)) is None
    assert dealias.cache_info(jf).misses == 1
    source = jf.last.source
    (line,) = [s for s in source.splitlines() if "aten_slice_Tensor" in s]
    assert line.split(", ")[-1].rstrip(")") in source.split(" = execute(")[0], source  # a result's name


def test_the_call_in_the_other_grad_mode_runs_its_own_source():
    # A program is keyed by grad mode; called in the other one (a piece of a split graph, a direct call) it hands the
    # call to the source generated for that mode: the write-back and the view then as eager's under no_grad.
    fn = write_after_a_no_grad_view
    jf = check(fn, torch.randn(2, 3, requires_grad=True).clone())
    program = jf.last
    assert "call_with_grad_off(leaves)" in program.source
    leaf = torch.randn(2, 3, requires_grad=True)
    x, x_eager = leaf.clone(), leaf.clone()
    with torch.no_grad():
        (got,), expected = program.lean_call([x]), fn(x_eager)
    assert first_difference(expected, got, (x_eager,), (x,)) is None
    assert got.requires_grad == expected.requires_grad and x._version == x_eager._version


def t_and_detach(x, y):
    x.t_()
    y.detach_()
    return x + 1


def test_metadata_write_backs_set_layouts_without_moving_counters_and_detach():
    # Dynamo breaks the graph at an in-place layout change of an input: the program is compiled here directly.
    gm = torch.fx.symbolic_trace(t_and_detach)
    make = lambda: (torch.randn(2, 3), torch.randn(3, requires_grad=True) * 1)  # noqa: E731
    program = compile_program(gm, list(make()), ["x", "y"])
    assert "as_strided_keeping_version(x, [3, 2], [1, 3], 0)" in program.source and "y.detach_()" in program.source
    for _ in range(2):
        args = make()
        expected_args = tuple(a.detach().clone().requires_grad_(a.requires_grad) * 1 for a in args)
        expected = t_and_detach(*expected_args)
        got = program(list(args))
        assert first_difference(expected, got, expected_args, args) is None
        assert [a._version for a in args] == [a._version for a in expected_args]
        assert [a.requires_grad for a in args] == [a.requires_grad for a in expected_args]


def structured(x, y):
    x.add_(1)
    return {"a": x[0], "b": [y * 2, "s", 1.5, None]}, (x.shape[0], "t")


def test_a_returned_structure_is_eagers():
    # A tuple of outputs and constants is returned as a literal; another structure (here fx's immutable containers
    # of a graph traced without dynamo: dynamo's graphs return tuples) as pytree rebuilds it.
    gm = torch.fx.symbolic_trace(structured)
    make = lambda: (torch.zeros(2, 3), torch.ones(3))  # noqa: E731
    program = compile_program(gm, list(make()), ["x", "y"])
    assert "return pack([out0, mul])" in program.source, program.source
    args, expected_args = make(), make()
    expected, got = structured(*expected_args), program(list(args))
    assert first_difference(pytree.tree_leaves(expected), pytree.tree_leaves(got), expected_args, args) is None
    assert got[1] == (2, "t") and got[0]["b"][1:] == ["s", 1.5, None]
