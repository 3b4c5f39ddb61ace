"""Differential harness for the tests: dealias.runtime.verify's comparison, on a first (tracing) call and on cached
calls, plus the expected number of compilations."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _pytree as pytree

import dealias
from dealias.runtime.verify import ULP_TOLERANT, alias_pattern, clone_args, compare_call, first_difference  # noqa: F401


class Ident(torch.autograd.Function):
    """An autograd.Function that returns a copy of its input: dynamo splits the graph at its call (tests of the
    pieces of a split graph, whose inputs are the first piece's results)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g


def check(fn: Callable[..., Any], *args: Any, calls: int = 2, allow_fallback: bool = False, **jit_kw: Any) -> Any:
    """Compare `fn` eager vs jitted on `calls` successive calls with fresh copies of `args`. Returns the
    jitted function (for structural checks). Fails on any difference, and on a silent eager fallback
    unless `allow_fallback`."""
    jf = dealias.jit(fn, **jit_kw)
    for call in range(calls):
        with warnings.catch_warnings():
            warnings.simplefilter("error" if not allow_fallback else "ignore", dealias.FallbackWarning)
            diff = compare_call(fn, jf, args)
        assert diff is None, f"call {call + 1}: {diff}"
    info = dealias.cache_info(jf)
    compiled_once = info.misses == 1 and info.hits == calls - 1
    raised = info.entries == 0  # every call raised (eager's error): nothing was cached
    assert raised or compiled_once, f"expected one compile and {calls - 1} hits, got {info}"
    return jf


def grads_like_eager(fn: Callable[..., Any], jf: Any, make_args: Callable[[], Any], calls: int = 2) -> list[Any]:
    """Values, inputs after the call, aliasing and gradients of every leaf as eager's on `calls` calls, each on
    fresh `make_args()`; returns the FallbackWarnings dealias gave (each call's, recorded)."""
    from dealias.tools.fuzz import _compare_grads

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dealias.FallbackWarning)
        for call in range(calls):
            diff = compare_call(fn, jf, make_args())
            assert diff is None, f"call {call + 1}: {diff}"
            diff = _compare_grads(fn, jf, make_args)
            assert diff is None, f"call {call + 1}: {diff}"
    return [w for w in caught if issubclass(w.category, dealias.FallbackWarning)]


def like_eager_within_ulps(fn: Callable[..., Any], jf: Any, *args: Any) -> None:
    """One call of `jf` on `args` against eager's `fn` on copies (outputs, inputs after, aliasing), values within a
    few ulps: fused kernels are not bit-equal."""
    token = ULP_TOLERANT.set(True)
    try:
        diff = compare_call(fn, jf, args)
    finally:
        ULP_TOLERANT.reset(token)
    assert diff is None, diff


def fused_eval_like_eager(model: torch.nn.Module, x: torch.Tensor) -> Any:
    """`model` in eval mode (a copy) on the fused executor, its no_grad forward of `x` compared with eager's within
    the conv tests' tolerance; returns the jitted module, whose last graph says the layout taken."""
    expected = model(x)
    jf = dealias.jit(copy.deepcopy(model), executor="inductor")
    with torch.no_grad():
        got = jf(x)
    torch.testing.assert_close(got, expected.detach(), rtol=1e-4, atol=1e-4)
    return jf


def functional_ops(jf: Any) -> list[str]:
    """The targets of the functional trace of the last program `jf` ran."""
    gm = jf.last.functional_gm
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def same(got, expected):
    """Exact equality of values, dtypes and shapes (the torch executor runs eager's own kernels)."""
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def same_state(eager: torch.nn.Module, jitted: torch.nn.Module) -> None:
    a, b = eager.state_dict(), jitted.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=lambda m, k=k: f"state {k}: {m}")


class no_fallback(warnings.catch_warnings):
    """Any FallbackWarning inside is an error."""

    def __enter__(self):
        out = super().__enter__()
        warnings.simplefilter("error", dealias.FallbackWarning)
        return out


def captured_targets(fn, *args) -> list:
    """The node targets of the graphs dynamo captures for `fn(*args)` under a backend that only collects them and
    runs them as they are (what a backend other than dealias's is handed)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(fn, backend=backend)(*args)
    return [n.target for gm in graphs for n in gm.graph.nodes]


def fallback_messages(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, dealias.FallbackWarning)]


def no_fakes_in(obj) -> list[str]:
    """Paths of FakeTensors reachable from a module through vars(), parameters and buffers."""
    found = []
    for name, mod in obj.named_modules():
        for k, v in vars(mod).items():
            for leaf in pytree.tree_leaves(v) if isinstance(v, (dict, list, tuple)) else [v]:
                if isinstance(leaf, FakeTensor):
                    found.append(f"{name}.{k}")
        for k, t in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False)):
            if isinstance(t, FakeTensor) or isinstance(getattr(t, "data", None), FakeTensor):
                found.append(f"{name}.{k}")
    return found


def check_real_parameters(model: torch.nn.Module) -> None:
    for name, p in model.named_parameters():
        assert type(p) is torch.nn.Parameter, f"{name} is a {type(p).__name__}"
        assert not isinstance(p.data, FakeTensor), name
    for name, b in model.named_buffers():
        assert type(b) is torch.Tensor, f"{name} is a {type(b).__name__}"
    assert no_fakes_in(model) == []


class HalvesGradient(torch.autograd.Function):
    """A custom Function: the identity forward, half the gradient backward. Dynamo runs it eagerly between two
    compiled pieces (a graph break that keeps autograd), and a gradient through it is told apart."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 0.5


def decode_prefix(kc, vc, q, k, v, pos: int):
    """A decode step over a position that changes every call (test_inductor_tiers.py, test_inductor_symbolic.py)."""
    kc[:, :, pos] = k
    vc[:, :, pos] = v
    return torch.nn.functional.scaled_dot_product_attention(q, kc[:, :, : pos + 1], vc[:, :, : pos + 1])


class AddsItsInput(torch.autograd.Function):
    """A custom Function whose backward is not zero for a zero gradient (`g * 3 + x`): whether eager runs it (a
    zero gradient sent into its result) shows in the leaf's gradient."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 + x


def wide_autograd_seed(seed: int, executor: str = "torch") -> Any:
    """The fuzzer's outcome (tools.fuzz.Outcome) for `dealias fuzz --autograd --wide` program `seed`, warnings
    ignored: the programs warn as eager does (deprecated ops, FallbackWarnings)."""
    from dealias.tools.fuzz import generate, run_program

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_program(generate(seed, autograd=True, wide=True), executor=executor)


def execution_ops(jf) -> list[str]:
    """The ops of the last program's execution graph by name (`relu_`, `native_batch_norm`), whether the torch
    executor calls them as methods, as OpOverloads or as torch functions."""
    ops = []
    for n in jf.last.functional.gm.graph.nodes:
        if n.op == "call_method":
            ops.append(n.target)
        elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            ops.append(n.target._schema.name.split("::")[-1])
        elif n.op == "call_function":
            ops.append(getattr(n.target, "__name__", ""))
    return ops


def grad_fn_chain(out: torch.Tensor) -> list[str]:
    """The names of `out`'s backward nodes, following each node's first input that is not a leaf's accumulator."""
    names, fn = [], out.grad_fn
    while fn is not None:
        names.append(type(fn).__name__)
        fn = next((f for f, _ in fn.next_functions if f is not None and "AccumulateGrad" not in type(f).__name__), None)
    return names


class ConvBnRelu(torch.nn.Module):
    """conv + BatchNorm + ReLU, for training (test_partition_record.py, test_dependence_record.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x)).relu()
