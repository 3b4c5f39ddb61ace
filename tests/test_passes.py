"""Pass-level tests: each pass on the small graph of one program, its output read node by node (the differential
tests compare whole programs with eager; these say which pass does what)."""

from __future__ import annotations

import torch
import torch.fx as fx

from dealias.ir.gradops import write_back_now
from dealias.ir.opfacts import OpKind, facts
from dealias.ir.plan import RefKind
from dealias.ir.regions import decompose, is_region_write, region_chain
from dealias.passes.alias import analyze
from dealias.passes.capture import capture
from dealias.passes.functionalize import functionalize
from dealias.passes.optimize import optimize
from dealias.passes.pipeline import _alias_placeholders
from dealias.passes.writeback import lower

aten = torch.ops.aten


def functional(fn, *args):
    """The program of `fn` as dynamo hands it to its backend, captured, functionalized and optimized; with its
    capture."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch.compile(fn, backend=record, fullgraph=True, dynamic=False)(*(a.clone() for a in args))
    ((gm, inputs),) = graphs
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    captured = capture(gm, inputs, names)
    fp = functionalize(captured, analyze(captured.gm, captured.groups))
    fp.gm = optimize(fp.gm, first_output=fp.first_output)
    return captured, fp


def calls(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def writes(x):
    x[1].mul_(2)
    x.t()[0].add_(1)
    return x.sum()


def test_functionalization_writes_nothing_and_records_each_region():
    _, fp = functional(writes, torch.randn(3, 2))
    nodes = calls(fp.gm)
    assert not [
        n
        for n in nodes
        if isinstance(n.target, torch._ops.OpOverload)
        and facts(n.target).kind is not OpKind.FUNCTIONAL
        and facts(n.target).kind is not OpKind.VIEW
    ]
    regions = [n for n in nodes if is_region_write(n)]
    assert [[s.describe() for s in region_chain(n)] for n in regions] == [["select(0, 1)"], ["t()", "select(0, 0)"]]
    assert regions[1].args[0] is regions[0]  # the second write is into the first one's result
    assert [wb.target.kind for wb in fp.writebacks] == [RefKind.INPUT]


def test_lowering_runs_the_region_writes_in_place_and_drops_the_write_back():
    captured, fp = functional(writes, torch.randn(3, 2))
    fp, reports = lower(fp, _alias_placeholders(fp.gm, captured))
    targets = [n.target for n in calls(fp.gm)]
    assert aten.mul_.Tensor in targets and aten.add_.Tensor in targets, targets
    assert not any(is_region_write(n) for n in calls(fp.gm))
    assert fp.writebacks == [] and reports[0].mode == "in place" and reports[0].nbytes == 8 + 12


def write_that_autograd_records(x, w):
    x[0].mul_(w)
    return x.sum()


def test_lowering_leaves_graphs_autograd_records_functional():
    # x receives a value that requires grad: in-place writes could change what backward reads, so the write
    # stays functional (its region write decomposed into select_scatter), and x receives the whole result at
    # its last write, inside the graph (so that what backward saves of x is x itself, as in eager).
    captured, fp = functional(write_that_autograd_records, torch.randn(2, 3), torch.randn(3, requires_grad=True))
    fp, reports = lower(fp, _alias_placeholders(fp.gm, captured))
    targets = [n.target for n in calls(fp.gm)]
    assert reports == [] and fp.writebacks == [] and write_back_now in targets, targets
    assert aten.select_scatter.default in targets and not any(is_region_write(n) for n in calls(fp.gm))


def unused_ops(x, i):
    torch.index_select(x, 0, i)  # unused, but raises for an index out of range
    x.view(-1)  # unused view
    return x + 1


def test_dead_code_keeps_ops_that_raise_on_their_values():
    _, fp = functional(unused_ops, torch.randn(3, 2), torch.tensor([1]))
    targets = [n.target for n in calls(fp.gm)]
    assert aten.index_select.default in targets and aten.view.default not in targets, targets


def two_draws(x):
    return torch.rand(3) + torch.rand(3) + x


def test_cse_never_merges_random_draws():
    _, fp = functional(two_draws, torch.randn(3))
    assert [n.target for n in calls(fp.gm)].count(aten.rand.default) == 2


def write_through_unsqueeze(x):
    y = x * 2
    y.unsqueeze(0).mul_(3)
    return y


def test_decompose_turns_a_pure_view_write_into_a_tensor_of_its_own():
    # The inverse of unsqueeze is a reshape of the written value: returned, it is `_unsafe_view` (not a view),
    # as eager's `y` is a tensor of its own.
    _, fp = functional(write_through_unsqueeze, torch.randn(3))
    assert sum(map(is_region_write, calls(fp.gm))) == 1
    decompose(fp.gm)
    out = fp.gm.graph.output_node().args[0][0]
    assert out.target is aten._unsafe_view.default and not any(is_region_write(n) for n in calls(fp.gm))
