"""A fused build's first call made cheaper (issue 38): kernel_checks.py's verdicts remembered per op and metadata
(runtime/kernel_verdicts.py), and the fused build from a front lowering the front's own copy of the functional
graph. Each is compared with eager: an op whose kernel raises still raises eager's error, whatever was remembered
for the same op on other metadata; a fused build that fails after lowering leaves the torch executor's program and
the functional trace as eager's."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from harness import first_difference
from torch.fx.experimental.proxy_tensor import make_fx

from dealias.passes.pipeline import compile_program
from dealias.runtime import kernel_checks, kernel_verdicts


@pytest.fixture(autouse=True)
def verdicts(monkeypatch, tmp_path):
    """An empty verdict store in `tmp_path` (the process's memory of it cleared before and after)."""
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    kernel_verdicts.clear()
    yield tmp_path
    kernel_verdicts.clear()


def put(buf, idx, v):
    return torch.ops.aten.index_put.default(buf, [idx], v)


def traced_put(src_dtype: torch.dtype, idx_dtype: torch.dtype = torch.int64) -> fx.GraphModule:
    """`put` traced over fake tensors: the graph the kernel checks read (each node's `val`)."""
    return make_fx(put, tracing_mode="fake")(
        torch.zeros(8, 4), torch.zeros(3, dtype=idx_dtype), torch.zeros(3, 4, dtype=src_dtype)
    )


def eager_error(src_dtype: torch.dtype) -> BaseException:
    with pytest.raises(Exception) as info:
        put(torch.zeros(8, 4), torch.tensor([0, 1, 2]), torch.ones(3, 4, dtype=src_dtype))
    return info.value


def count_probes(monkeypatch) -> list[str]:
    probed: list[str] = []
    ask = kernel_checks.metadata_error

    def counted(n, at_hints=False):
        probed.append(str(n.target))
        return ask(n, at_hints=at_hints)

    monkeypatch.setattr(kernel_checks, "metadata_error", counted)
    return probed


def test_an_accepted_op_is_not_probed_again_in_the_next_process(monkeypatch):
    probed = count_probes(monkeypatch)
    assert kernel_checks.first_metadata_error(traced_put(torch.float32)) is None
    assert probed == ["aten.index_put.default"]
    kernel_verdicts.clear()  # (the next process: only the disk file)
    assert kernel_checks.first_metadata_error(traced_put(torch.float32)) is None
    assert probed == ["aten.index_put.default"]  # (not probed again)


def test_a_raising_op_is_probed_and_raises_eagers_error_whatever_was_remembered(monkeypatch):
    # float64 into float32: eager's index_put raises, fake tensors accept it. The same op accepted for float32
    # sources, and for an int32 index, must not answer for it.
    assert kernel_checks.first_metadata_error(traced_put(torch.float32)) is None
    assert kernel_checks.first_metadata_error(traced_put(torch.float32, torch.int32)) is None
    kernel_verdicts.clear()
    probed = count_probes(monkeypatch)
    for _ in range(2):  # (an error is never remembered: probed each time, eager's message each time)
        found = kernel_checks.first_metadata_error(traced_put(torch.float64))
        assert found is not None
        expected = eager_error(torch.float64)
        assert type(found[1]) is type(expected) and str(found[1]) == str(expected)
    assert probed == ["aten.index_put.default"] * 2


def test_keys_name_dtypes_layouts_sharing_and_where_arguments_stand():
    def key(f, *args):
        graph = make_fx(f, tracing_mode="fake")(*args)
        return [kernel_verdicts.key_of(n) for n in graph.graph.nodes if n.op == "call_function"][-1]

    x, y = torch.zeros(4, 4), torch.zeros(4, 4)
    add = lambda a, b: torch.ops.aten.add.Tensor(a, b)  # noqa: E731
    base = key(add, x, y)
    assert base is not None and base == key(add, torch.ones(4, 4), torch.ones(4, 4))  # (values are not keyed)
    assert base != key(add, x, y.double())
    assert base != key(add, x, y.t())
    assert base != key(lambda a: add(a, a), x)  # (one memory for both arguments)
    cat = lambda a, b, c: torch.ops.aten.cat.default([a, b, c])  # noqa: E731
    z = torch.zeros(2, 4)
    assert key(cat, x, y, z) != key(cat, z, x, y)
    assert key(lambda a: torch.ops.aten.mul.Tensor(a, 2), x) != key(lambda a: torch.ops.aten.mul.Tensor(a, 3), x)


def test_a_symbolic_graph_is_not_kept():
    graph = make_fx(lambda a: torch.ops.aten.mul.Tensor(a, 2), tracing_mode="symbolic")(torch.zeros(4, 5))
    assert [kernel_verdicts.key_of(n) for n in graph.graph.nodes if n.op == "call_function"] == [None]


def through_int_view(x):
    x.view(torch.int32).add_(1)
    return x * 2


@pytest.mark.inductor
def test_a_fused_build_from_a_front_that_fails_after_lowering_leaves_eagers_program():
    # A dtype view is refused after the fused build lowered the front's graph and traced it for inductor
    # (fused.py); the torch executor's program compiled instead must be eager's, and the functional trace intact.
    gm = fx.symbolic_trace(through_int_view)
    make = lambda: [torch.randn(3, 4)]  # noqa: E731
    first = compile_program(gm, make(), ["x"])
    functional = first.traces[2].graph.code
    program = compile_program(gm, make(), ["x"], "inductor", front=first.front)
    assert program.tier == "torch" and "dtype view" in program.unfused, program.unfused
    assert program.traces[2].graph.code == functional and "add_" not in functional  # (the trace's graph untouched)
    # (the graph the torch executor runs: the functional graph lowered once, as a compile of its own lowers it)
    # (its graph a lazy copy, compat/fx_lazy.py: the callable must be the generated forward, not the module's call)
    assert "_lazy" not in program.run_graph.__func__.__qualname__
    ops = lambda p: [(n.op, str(n.target)) for n in p.functional.gm.graph.nodes]  # noqa: E731
    assert ops(program) == ops(compile_program(gm, make(), ["x"]))
    for _ in range(2):
        args, expected_args = make(), None
        expected_args = [a.clone() for a in args]
        expected = through_int_view(*expected_args)
        got = program(args)
        assert first_difference(expected, got, expected_args, args) is None
        assert args[0]._version == expected_args[0]._version


def test_the_torch_executors_graph_runs_its_generated_code():
    # compile_program's graph modules are lazy (compat/fx_lazy.py): the torch executor's callable must be the
    # generated forward, not a lazy module's `_lazy_forward` (the module's __call__ on every call).
    import dealias

    def f(x, y):
        x.add_(1)
        return x * y

    jf = dealias.jit(f, executor="torch")
    for _ in range(2):
        args = [torch.randn(4), torch.randn(4)]
        expected_args = [a.clone() for a in args]
        assert first_difference(f(*expected_args), jf(*args), expected_args, args) is None
    run = jf.last.run_graph
    assert getattr(run, "__name__", "") == "forward" and "_lazy" not in run.__func__.__qualname__
