"""A hook on a graph input registered after a write of it, then another write (compat/dynamo_hook_split.py): the
graph splits at the registration's call, so that only the registration runs between the graphs (no tensor op
eagerly, no warning; listed by graph_breaks as a split) and the later write compiles in the second graph. The hook
sees eager's gradient and is called as often as eager's, first and cached call. Where dynamo could not break at the
registration and resume after it (in an inlined function, a try block, a loop), the break stays at the write."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import grads_like_eager

import dealias
from dealias import compat
from dealias.tools.fuzz.generator import generate
from dealias.tools.fuzz.runner import run_program

CALLS: list[tuple[str, torch.Tensor]] = []


def seen(tag):
    """A hook that records its gradient (for the hook's own view of eager's) and changes it."""

    def hook(g):
        CALLS.append((tag, g.clone()))
        return g * 2 + 1

    return hook


def written_hooked_written(x):
    x.mul_(2.0)  # (with grad on: the version the hook attaches to exists only inside the first graph)
    x.register_hook(seen("a"))
    x.add_(1.0)
    return x * 3


def two_hooks_then_a_write(x):
    x.mul_(2.0)
    x.register_hook(seen("a"))
    x.register_hook(seen("b"))  # (the split is at the latest registration: "a" is registered after the graph)
    x.add_(1.0)
    return x * 3


def hooks_between_writes(x):
    x.mul_(2.0)
    x.register_hook(seen("a"))
    x.add_(1.0)
    x.register_hook(seen("b"))
    x.sin_()
    return x * 3


def two_inputs(x, y):
    x.mul_(2.0)
    x.register_hook(seen("a"))
    y.mul_(3.0)
    y.register_hook(seen("b"))
    y.add_(1.0)
    x.add_(1.0)  # (after the split: x was hooked in the first graph's frame, not in the resume function's)
    return x * y


def written_through_an_aliasing_input(x, v):
    x.mul_(2.0)
    x.register_hook(seen("a"))
    v.add_(1.0)  # v is a view of x
    return x * 3


def hook_closing_over_a_graph_value(x):
    w = x * 2
    x.mul_(2.0)
    x.register_hook(lambda g: g * w)
    x.add_(1.0)
    return x * 3


def loop_after_the_registration(x):
    x.mul_(2.0)
    x.register_hook(seen("a"))
    for _ in range(2):
        x.add_(1.0)
    return x * 3


def _write(t):
    t.add_(1.0)


def written_in_an_inlined_function(x):
    x.mul_(2.0)
    x.register_hook(seen("a"))
    _write(x)
    return x * 3


def written_under_no_grad(x):
    x.mul_(2.0)
    x.register_hook(seen("a"))
    with torch.no_grad():
        x.add_(1.0)
    return x * 3


def registered_under_no_grad(x):
    x.mul_(2.0)
    with torch.no_grad():
        x.register_hook(seen("a"))
        x.add_(1.0)
    return x * 3


def hook_by_keyword(x):
    x.mul_(2.0)
    x.register_hook(hook=seen("a"))
    x.add_(1.0)
    return x * 3


def a_second_hook_on_an_input_hooked_before_the_graph(x):  # fuzz seeds 1202170, 1203829
    x.register_hook(lambda g: g + 1)  # (nothing wrote x before: registered before the graph, compat's hook_early)
    x.mul_(2.0)
    x.register_hook(seen("b"))  # on the written version: the graph splits here
    x.add_(1.0)
    return x * 3


def one():
    return (torch.linspace(-1, 1, 4, requires_grad=True) * 1,)


def two():
    return (torch.linspace(-1, 1, 4, requires_grad=True) * 1, torch.linspace(-2, 1, 4, requires_grad=True) * 1)


def aliased():
    a = torch.linspace(-1, 1, 4, requires_grad=True) * 1
    return a, a[1:]


SPLITS = [  # (program, arguments, graphs, splits)
    (written_hooked_written, one, 2, 1),
    (two_hooks_then_a_write, one, 2, 1),
    (hooks_between_writes, one, 3, 2),
    (two_inputs, two, 2, 1),
    (written_through_an_aliasing_input, aliased, 2, 1),
    (hook_closing_over_a_graph_value, one, 2, 1),
    (loop_after_the_registration, one, 2, 1),
    (written_in_an_inlined_function, one, 2, 1),
    (written_under_no_grad, one, 2, 1),
    (registered_under_no_grad, one, 2, 1),
    (hook_by_keyword, one, 2, 1),
    (a_second_hook_on_an_input_hooked_before_the_graph, one, 2, 1),
]


def hook_calls(f, make, calls=2):
    """The hooks' calls (tag, gradient) over `calls` calls of `f` with a backward each."""
    CALLS.clear()
    for _ in range(calls):
        out = f(*make())
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    return [(tag, g.tolist()) for tag, g in CALLS]


@pytest.mark.parametrize("fn, make, graphs, splits", SPLITS, ids=[c[0].__name__ for c in SPLITS])
def test_the_graph_splits_at_the_registration(fn, make, graphs, splits):
    jf = dealias.jit(fn)
    assert grads_like_eager(fn, jf, make) == []  # (values, inputs, gradients; first and cached call; no warning)
    assert hook_calls(jf, make) == hook_calls(fn, make)
    breaks = dealias.graph_breaks(jf)
    assert len(breaks) == splits and all(b.startswith(dealias.api.SPLIT) for b in breaks), breaks
    assert all("register_hook" in b for b in breaks)
    assert len(jf.stats.graphs) == graphs
    info = dealias.cache_info(jf)
    assert info.misses == 1 and info.eager_entries == 0


def test_only_the_registration_runs_between_the_graphs():
    # The second graph has the write: dynamo ran no tensor op outside the graphs.
    jf = dealias.jit(written_hooked_written)
    jf(*one())
    ops = [str(n.target) for g in jf.stats.graphs for n in g.gm.graph.nodes if n.op in ("call_method", "call_function")]
    assert any("mul_" in o for o in ops) and any("add_" in o for o in ops)


def _register(t):
    t.register_hook(seen("n"))


def registered_in_an_inlined_function(x):
    x.mul_(2.0)
    _register(x)  # (a break here would run the whole call eagerly: the break stays at the write)
    x.add_(1.0)
    return x * 3


def registered_in_a_try_block(x):
    x.mul_(2.0)
    try:
        x.register_hook(seen("a"))  # (dynamo does not resume inside a try block)
    finally:
        pass
    x.add_(1.0)
    return x * 3


def registered_in_a_loop(x):
    for _ in range(2):
        x.mul_(2.0)
        x.register_hook(seen("a"))  # (a break in a loop makes dynamo skip the frame: warned about, as before)
        x.add_(1.0)
    return x * 3


def a_stale_split_view_alive_at_the_registration(x):  # fuzz seed 1204101
    v = x.split(2, 0)[0]
    x.neg_()  # (v's grad_fn is refused from here on: dynamo could not take v as the resume function's input)
    x.register_hook(seen("a"))
    with torch.no_grad():
        w = v * 2
    x.fill_(1.5)
    return x * 3, w


@pytest.mark.parametrize(
    "fn, warning",
    [
        (registered_in_an_inlined_function, "a write after a hook on a graph input"),
        (registered_in_a_try_block, "a write after a hook on a graph input"),
        (registered_in_a_loop, "runs eagerly: dynamo gave up on the whole frame"),
        (a_stale_split_view_alive_at_the_registration, "a write after a hook on a graph input"),
    ],
)
def test_where_dynamo_cannot_break_at_the_registration_the_break_stays_at_the_write(fn, warning):
    jf = dealias.jit(fn)
    told = grads_like_eager(fn, jf, one)
    assert told and warning in str(told[0].message)
    assert hook_calls(jf, one) == hook_calls(fn, one)
    assert not any(b.startswith(dealias.api.SPLIT) for b in dealias.graph_breaks(jf))


def handle_removed(x):
    x.mul_(2.0)
    h = x.register_hook(seen("a"))
    x.add_(1.0)
    h.remove()  # eager: the hook is gone before backward
    return x * 3


def test_a_handle_kept_past_the_split_is_exact():
    # Dynamo cannot hand the resume function the handle (as with the break at the write): the code after the
    # registration runs eagerly, with a warning. Exact either way.
    jf = dealias.jit(handle_removed)
    told = grads_like_eager(handle_removed, jf, one)
    assert told and "RemovableHandle" in str(told[0].message)
    assert hook_calls(jf, one) == hook_calls(handle_removed, one) == []


def test_without_the_correction_the_break_is_at_the_write():
    with compat.forced_off("hook_split"):
        jf = dealias.jit(written_hooked_written)
        told = grads_like_eager(written_hooked_written, jf, one)
        assert hook_calls(jf, one) == hook_calls(written_hooked_written, one)
    assert [w.category for w in told] == [dealias.GraphBreakWarning]
    assert "a write after a hook on a graph input" in str(told[0].message) and "x.add_(1.0)" in str(told[0].message)


def test_other_backends_trace_as_before():
    # Dynamo alone hooks the written version after its one graph (a different gradient): unchanged by dealias.
    counts = []

    def backend(gm, example_inputs):
        counts.append(1)
        return gm

    fn = torch.compile(written_hooked_written, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calls = hook_calls(fn, one, calls=1)
    assert len(counts) == 1 and len(calls) == 1


def test_the_fuzz_runner_counts_a_split_apart():
    outcome = run_program(generate(1200089), "torch")  # x0.add_; x0.register_hook(..); x0.bernoulli_(0.5)
    assert outcome.status == "split" and outcome.detail.startswith(dealias.api.SPLIT), outcome
