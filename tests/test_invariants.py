"""The checks between passes (dealias.passes.invariants): each one fires, with the check's name, the node and the user's
line, on a graph broken the way a faulty pass would break it; real programs pass all of them."""

from __future__ import annotations

import dataclasses
import operator
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx as fx

import dealias
from dealias.errors import InvariantError
from dealias.ir.gradops import write_back_now
from dealias.passes import invariants, pipeline

aten = torch.ops.aten


@dataclasses.dataclass
class Stage:
    fp: Any  # a copy of the pass's FunctionalProgram (graph and plan)
    functional: fx.GraphModule | None  # the optimized functional graph (for the lowered one)
    aliases: dict[fx.Node, list[fx.Node]]


def _copy(fp: Any, aliases: Any) -> tuple[Any, dict[fx.Node, list[fx.Node]]]:
    graph, nodes = fx.Graph(), {}
    graph.output(graph.graph_copy(fp.gm.graph, nodes))
    gm = fx.GraphModule(fp.gm, graph)
    copied = {nodes[b]: [nodes[m] for m in ms] for b, ms in (aliases or {}).items()}
    return dataclasses.replace(fp, gm=gm), copied


@pytest.fixture
def compiles(monkeypatch):
    """`run(fn, *args)`: call `dealias.jit(fn)` and return, per compile, each checked pass's program as the checks
    saw it (copied: later passes rewrite graphs in place)."""
    real = pipeline.checker
    seen: list[dict[str, Stage]] = []

    def recording(captured):
        check = real(captured)
        stages: dict[str, Stage] = {}
        seen.append(stages)

        def record(stage, fp, functional=None, aliases=None):
            check(stage, fp, functional, aliases)
            copied, copied_aliases = _copy(fp, aliases)
            stages[stage] = Stage(copied, functional, copied_aliases)

        return record

    monkeypatch.setattr(pipeline, "checker", recording)
    monkeypatch.setenv("DEALIAS_CHECK", "1")  # (on in test runs anyway, unless a run times itself without them)

    def run(fn, *args, **jit_kw):
        seen.clear()
        dealias.jit(fn, **jit_kw)(*args)
        return list(seen)

    return run


def _node(gm: fx.GraphModule, target: Any) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.target is target)


def _add_after(gm: fx.GraphModule, anchor: fx.Node, target: Any, *args: Any) -> fx.Node:
    """A node `target(*args)` right after `anchor`, with anchor's meta (so only what a test breaks is broken)."""
    with gm.graph.inserting_after(anchor):
        node = gm.graph.call_function(target, args)
    node.meta.update(anchor.meta)
    return node


def scale_then_shift(x):
    y = x * 2
    return y + 1


# -- 1. the functional graph writes nothing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "op, args, kind",
    [
        (aten.add_.Tensor, (1,), "inplace"),
        (aten.copy_.default, (), "inplace"),  # (copy_(y, y): the test's source is y itself)
        (aten.unsqueeze_.default, (0,), "inplace_view"),  # Tag.inplace_view: a metadata write
        (aten.exp.out, (), "out"),
    ],
)
def test_a_write_in_the_functional_graph_is_caught(compiles, op, args, kind):
    (stages,) = compiles(scale_then_shift, torch.randn(3))
    for stage in ("functionalize", "optimize"):
        gm = stages[stage].fp.gm
        mul = _node(gm, aten.mul.Tensor)
        if op is aten.copy_.default:
            args = (mul,)
        if op is aten.exp.out:
            bad = _add_after(gm, mul, op, mul)
            bad.kwargs = {"out": mul}
        else:
            bad = _add_after(gm, mul, op, mul, *args)
        with pytest.raises(InvariantError, match="functional graph writes nothing") as e:
            invariants.functional_writes_nothing(gm, stage)
        message = str(e.value)
        assert f"after {stage} at {bad.name} = {op}" in message and f"(kind: {kind})" in message, message
        assert "y = x * 2" in message  # the user's line of the op the node came from


def test_an_unknown_function_target_in_the_functional_graph_is_caught(compiles):
    def sneaky(t):
        return t

    (stages,) = compiles(scale_then_shift, torch.randn(3))
    gm = stages["optimize"].fp.gm
    _add_after(gm, _node(gm, aten.mul.Tensor), sneaky, _node(gm, aten.mul.Tensor))
    with pytest.raises(InvariantError, match="unknown function target <function .*sneaky"):
        invariants.functional_writes_nothing(gm, "optimize")


def test_write_back_now_is_allowed_only_under_autograd(compiles):
    (stages,) = compiles(scale_then_shift, torch.randn(3))
    gm = stages["optimize"].fp.gm
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    mul = _node(gm, aten.mul.Tensor)
    _add_after(gm, mul, write_back_now, x, mul)
    with pytest.raises(InvariantError, match="write_back_now in a program where no input requires grad"):
        invariants.functional_writes_nothing(gm, "optimize")
    x.meta["rg"] = True  # the documented exception: under autograd, into a caller's tensor
    invariants.functional_writes_nothing(gm, "optimize")


def saves_the_caller(x):
    y = x * 2
    x.relu_()  # eager saves x itself for relu's backward: run in place on the caller's tensor
    return y


def test_the_in_place_op_on_the_callers_tensor_under_autograd_passes(compiles):
    (stages,) = compiles(saves_the_caller, torch.randn(3, requires_grad=True).clone())
    gm = stages["optimize"].fp.gm
    assert any(n.target is aten.relu_.default for n in gm.graph.nodes)  # the documented write is there...
    invariants.functional_writes_nothing(gm, "optimize")  # ...and allowed
    relu_ = _node(gm, aten.relu_.default)
    relu_.args = (_node(gm, aten.mul.Tensor),)  # ...but not on anything else
    with pytest.raises(InvariantError, match="relu_.default writes memory"):
        invariants.functional_writes_nothing(gm, "optimize")


# -- 2. every node carries its metadata --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, says", [("val", "no fake value"), ("grad", "no grad mode"), ("stack_trace", "no source line")]
)
def test_a_node_without_its_metadata_is_caught(compiles, key, says):
    (stages,) = compiles(scale_then_shift, torch.randn(3))
    for stage in ("functionalize", "optimize", "lower", "torch executor"):
        gm = stages[stage].fp.gm
        mul = next(n for n in gm.graph.nodes if n.name == "mul")
        invariants.carries_metadata(gm, stage)
        del mul.meta[key]
        with pytest.raises(InvariantError, match=f"every node carries its metadata.*{says}") as e:
            invariants.carries_metadata(gm, stage)
        assert key == "stack_trace" or "y = x * 2" in str(e.value)


def test_a_program_whose_captured_ops_have_no_lines_is_not_asked_for_them(compiles):
    (stages,) = compiles(scale_then_shift, torch.randn(3))
    gm = stages["optimize"].fp.gm
    del _node(gm, aten.mul.Tensor).meta["stack_trace"]
    invariants.carries_metadata(gm, "optimize", located=False)


def cache_write(cache, k):
    cache[:, 2] = k
    cache[0].add_(1)
    return cache[1]


def test_the_execution_traces_setitem_keeps_the_users_line(compiles):
    # The torch executor runs `x[idx].copy_(v)` as `x[idx] = v`; the node it builds kept no meta, so the README
    # example's `cache[:, 2] = k` had no source line in the execution trace (and no grad mode).
    (stages,) = compiles(cache_write, torch.zeros(2, 5, 3), torch.ones(2, 3))
    gm = stages["torch executor"].fp.gm
    setitem = _node(gm, operator.setitem)
    assert "cache[:, 2] = k" in setitem.meta["stack_trace"] and setitem.meta["grad"] is True
    jf = dealias.jit(cache_write)
    jf(torch.zeros(2, 5, 3), torch.ones(2, 3))
    line = next(x for x in str(dealias.last_traces(jf)[-1]).splitlines() if x.strip().startswith("cache[:, 2] = k"))
    assert "test_invariants.py" in line and "cache[:, 2] = k" in line.split("#")[1]


def index_write(x, i, v):
    x.index_put_((i,), v)


def test_bounds_checks_carry_the_line_of_their_write(compiles):
    (stages,) = compiles(index_write, torch.zeros(5), torch.tensor([1, 3]), torch.ones(2))
    gm = stages["lower"].fp.gm
    check = next(n for n in gm.graph.nodes if invariants.is_bounds_check(n.target))
    assert check.meta["val"] is None and "x.index_put_((i,), v)" in check.meta["stack_trace"]


# -- 3. no view made before an in-place write is read after it ---------------------------------------------------


def read_then_write(x):
    y = x[0] * 2
    x[1].add_(1)
    return y


def test_a_region_write_left_for_the_executor_is_caught(compiles):
    # Lowering runs each region write in place or decomposes it; one left behind would reach the executor.
    (stages,) = compiles(intermediate_region_write, torch.randn(3, 2, requires_grad=True))
    gm = stages["lower"].fp.gm
    invariants.executes_no_region_write(gm, "lower")
    functional = stages["optimize"].fp.gm
    with pytest.raises(InvariantError, match="executes no region write") as e:
        invariants.executes_no_region_write(functional, "lower")
    assert "y[1] = y[0] * 3" in str(e.value)


def intermediate_region_write(x):
    y = x * 2
    y[1] = y[0] * 3
    return y


def test_a_read_moved_after_the_write_is_caught(compiles):
    (stages,) = compiles(read_then_write, torch.zeros(3, 4))
    gm = stages["lower"].fp.gm
    add_ = _node(gm, aten.add_.Tensor)  # written in place: the read of x[0] comes first
    mul = _node(gm, aten.mul.Tensor)
    invariants.no_stale_view_reads(gm, "lower")
    add_.append(mul)  # the read of x[0] now runs after a write of x's memory (memory, not regions, is compared)
    with pytest.raises(InvariantError, match="no view made before an in-place write is read after it") as e:
        invariants.no_stale_view_reads(gm, "lower")
    message = str(e.value)
    assert f"at {mul.name} = aten.mul.Tensor" in message and f"made before {add_.name} wrote it" in message
    assert "y = x[0] * 2" in message and "x[1].add_(1)" in message  # the read's line and the write's


def test_a_view_made_before_a_write_and_read_after_it_is_caught(compiles):
    (stages,) = compiles(cache_write, torch.zeros(2, 5, 3), torch.ones(2, 3))
    gm = stages["lower"].fp.gm
    cache = next(n for n in gm.graph.nodes if n.op == "placeholder")
    first_write = next(n for n in gm.graph.nodes if invariants._written(n))
    with gm.graph.inserting_before(first_write):
        early = gm.graph.call_function(aten.select.int, (cache, 0, 1))
    early.meta.update(first_write.meta)
    last_write = [n for n in gm.graph.nodes if invariants._written(n)][-1]
    _add_after(gm, last_write, aten.neg.default, early)
    with pytest.raises(InvariantError, match=f"reads {early.name}, an alias of cache made before"):
        invariants.no_stale_view_reads(gm, "lower")


def test_a_view_of_an_alias_group_member_counts_as_its_groups_memory(compiles):
    def f(a, b):
        a.mul_(2)
        b.add_(1)

    x = torch.zeros(6)
    (stages,) = compiles(f, x[:4], x[2:])
    stage = stages["lower"]
    gm = stage.fp.gm
    members = [m for ms in stage.aliases.values() for m in ms]
    assert len(members) == 2
    first_write = next(n for n in gm.graph.nodes if invariants._written(n))
    with gm.graph.inserting_before(first_write):
        early = gm.graph.call_function(aten.select.int, (members[1], 0, 0))
    early.meta.update(first_write.meta)
    _add_after(gm, [n for n in gm.graph.nodes if invariants._written(n)][-1], aten.neg.default, early)
    invariants.no_stale_view_reads(gm, "lower")  # without the groups, b looks like memory of its own
    with pytest.raises(InvariantError, match="an alias of alias_group0 made before"):
        invariants.no_stale_view_reads(gm, "lower", stage.aliases)


# -- 4. write regions lie inside their memory --------------------------------------------------------------------


def write_a_row(x):
    x[1].add_(1)


def test_a_write_outside_its_inputs_memory_is_caught(compiles):
    big = torch.zeros(4, 3)
    (stages,) = compiles(write_a_row, big[1:3])  # x holds rows 1..2 of a larger storage
    gm = stages["lower"].fp.gm
    write = _node(gm, aten.add_.Tensor)
    invariants.writes_inside_memory(gm, "lower")
    target = write.args[0]
    x = target.meta["val"]
    with x.fake_mode:  # the region one row further on: still inside the storage, outside x (big's row 3)
        target.meta["val"] = x.as_strided(x.shape, x.stride(), x.storage_offset() + 3)
    with pytest.raises(InvariantError, match="write regions lie inside their memory") as e:
        invariants.writes_inside_memory(gm, "lower")
    assert "writes bytes 36..47 of the storage; x holds 12..35" in str(e.value)
    assert "x[1].add_(1)" in str(e.value)


def test_a_write_into_another_storage_is_caught(compiles):
    (stages,) = compiles(write_a_row, torch.zeros(2, 3))
    gm = stages["lower"].fp.gm
    target = _node(gm, aten.add_.Tensor).args[0]
    with target.meta["val"].fake_mode:
        target.meta["val"] = torch.empty(3)
    with pytest.raises(InvariantError, match=f"{target.name} is not in x's storage"):
        invariants.writes_inside_memory(gm, "lower")


# -- 5. the executor's graph computes what the functional one does -----------------------------------------------


def add_scaled(x, y):
    x.add_(y * 2)


def test_an_op_dropped_or_added_by_lowering_is_caught(compiles):
    (stages,) = compiles(add_scaled, torch.zeros(3), torch.ones(3))
    stage = stages["lower"]
    gm = stage.fp.gm
    assert any(n.target is aten.add_.Tensor for n in gm.graph.nodes)  # `add` ran as `add_`: the same op
    invariants.computes_the_same_ops(stage.functional, gm, "lower")
    neg = _add_after(gm, _node(gm, aten.mul.Tensor), aten.neg.default, _node(gm, aten.mul.Tensor))
    with pytest.raises(InvariantError, match=f"at {neg.name} = aten.neg.default.*lowering added 1 x aten.neg"):
        invariants.computes_the_same_ops(stage.functional, gm, "lower")
    gm.graph.erase_node(neg)
    mul = _node(gm, aten.mul.Tensor)
    mul.replace_all_uses_with(mul.args[0])
    gm.graph.erase_node(mul)
    with pytest.raises(InvariantError, match="lowering dropped 1 x aten.mul.Tensor") as e:
        invariants.computes_the_same_ops(stage.functional, gm, "lower")
    assert "x.add_(y * 2)" in str(e.value)  # named at the functional graph's node, with its line


def test_an_in_place_op_counts_as_its_functional_form():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(aten.mul_.Tensor, (x, 2)))
    assert invariants.compute_ops(fx.GraphModule({}, graph)) == {aten.mul.Tensor: 1}


# -- the plan ----------------------------------------------------------------------------------------------------


def write_and_return(x):
    x.mul_(2)
    return x + 1


def test_a_plan_that_does_not_match_the_graphs_outputs_is_caught(compiles):
    (stages,) = compiles(write_and_return, torch.ones(3))
    fp = stages["optimize"].fp
    out = next(n for n in fp.gm.graph.nodes if n.op == "output")
    assert len(fp.writebacks) == 1 and len(out.args[0]) == 2
    invariants.matches_plan(fp, "optimize")
    results = out.args[0]
    out.args = (results[:1],)  # the output base dropped
    with pytest.raises(InvariantError, match="output count matches the plan.*output 0 reads result 1 of 1"):
        invariants.matches_plan(fp, "optimize")
    out.args = ((*results, results[1]),)  # one result too many
    with pytest.raises(InvariantError, match=r"results \[2\] are read by no output"):
        invariants.matches_plan(fp, "optimize")
    out.args = ((results[1], results[0]),)  # the write-back receives the output base... of the same shape
    invariants.matches_plan(fp, "optimize")
    fp.writebacks = [dataclasses.replace(fp.writebacks[0], output=1)]
    with pytest.raises(InvariantError, match="write-back 0 reads result 1"):
        invariants.matches_plan(fp, "optimize")


def test_a_write_back_of_another_shape_is_caught(compiles):
    (stages,) = compiles(write_and_return, torch.ones(3))
    fp = stages["optimize"].fp
    out = next(n for n in fp.gm.graph.nodes if n.op == "output")
    first = out.args[0][0]
    bad = _add_after(fp.gm, first, aten.sum.default, first)
    with first.meta["val"].fake_mode:
        bad.meta["val"] = torch.empty(())
    out.args = ((bad, *out.args[0][1:]),)
    with pytest.raises(InvariantError, match=r"written back into x \(torch.float32\[3\]\) as torch.float32\[\]"):
        invariants.matches_plan(fp, "optimize")


# -- the hook ----------------------------------------------------------------------------------------------------


def test_a_broken_invariant_propagates_instead_of_falling_back(monkeypatch):
    def broken(*args):
        raise InvariantError("invariant 'test' broken")

    monkeypatch.setattr(invariants, "computes_the_same_ops", broken)
    monkeypatch.setenv("DEALIAS_CHECK", "1")
    with pytest.raises(InvariantError, match="invariant 'test' broken"), warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)  # (not a fallback to eager)
        dealias.jit(add_scaled)(torch.zeros(3), torch.ones(3))
    monkeypatch.setenv("DEALIAS_CHECK", "0")  # checks off: nothing runs them
    dealias.jit(add_scaled)(torch.zeros(3), torch.ones(3))


def test_checks_are_on_in_test_runs_unless_turned_off(monkeypatch):
    monkeypatch.delenv("DEALIAS_CHECK", raising=False)
    assert not invariants.enabled()
    monkeypatch.setenv("DEALIAS_CHECK", "0")
    assert not invariants.enabled()
    monkeypatch.setenv("DEALIAS_CHECK", "1")
    assert invariants.enabled()
    conftest = (Path(__file__).parent / "conftest.py").read_text()
    assert 'os.environ.setdefault("DEALIAS_CHECK", "1")' in conftest  # `make test` runs with them


# -- real programs pass every check ------------------------------------------------------------------------------


def _assert_checked(compiled: list[dict[str, Stage]]) -> None:
    assert compiled, "nothing compiled"
    for stages in compiled:
        assert set(stages) == {"functionalize", "optimize", "lower", "torch executor"}, set(stages)


def test_an_optimizer_step_passes_every_check(compiles):
    torch.manual_seed(0)
    params = [torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()  # momentum buffers exist: the compiled step updates them in place
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dealias.FallbackWarning)
        compiled = compiles(opt.step)
    _assert_checked(compiled)
    writes = [n for c in compiled for n in c["lower"].fp.gm.graph.nodes if invariants._written(n)]
    assert len(writes) >= 4  # params and momentum buffers, written in place: checks 3 and 4 had work


def kv_cache(cache, k, pos):
    cache[:, pos] = k
    return cache[:, : pos + 1].sum()


def test_a_kv_cache_write_passes_every_check(compiles):
    cache = torch.zeros(2, 8, 4)
    compiled = compiles(kv_cache, cache, torch.ones(2, 4), 3)
    _assert_checked(compiled)
    gm = compiled[0]["lower"].fp.gm
    assert any(n.target is aten.copy_.default for n in gm.graph.nodes)  # the row is written in place
    jf = dealias.jit(kv_cache)
    for pos in range(1, 6):  # symbolic positions: the checks hold on symbolic sizes too
        jf(cache, torch.randn(2, 4), pos)


def test_batchnorm_training_passes_every_check(compiles):
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(inplace=True))
    compiled = compiles(net, torch.randn(5, 4))
    _assert_checked(compiled)
    with torch.no_grad():
        compiled = compiles(net, torch.randn(5, 4))
    _assert_checked(compiled)
    writes = [n for n in compiled[0]["lower"].fp.gm.graph.nodes if invariants._written(n)]
    assert writes  # running stats and the batch count, in place
