"""Dealias's corrections to inductor and AOTAutograd, and what it needs to know of their behaviour that differs
between torch releases. Both corrections install at the first fused compile (importing dealias imports no
inductor) and apply only while inductor compiles a graph of dealias's.

`inductor_view_strides`: a view of a computed value handed to an ATen kernel (`mm(view(h, [1, 256]), w.t())`,
the decode step of every linear layer) is passed as `reinterpret_tensor(buf, (1, 256), (0, 1))`: inductor derives
the view's strides from its index expression, where a dim of size 1 has no variable, so its stride comes out 0
(pytorch issue 174869). Any stride is valid for a dim of size 1, but ATen's `mm` takes its BLAS path only for a
leading stride of at least the row's length, and copies a (0, 1)-strided matrix first: 25 of the 29 matmuls of a
4-layer Llama decode step made such a copy (torch.compile's graph, whose views are not shared between consumers,
9). Such strides are set to the ones a contiguous layout gives those dims (the next inner dim's stride times its
size), which changes no element's address. Without it: the copies (slower, the same values).

`aot_no_donated_buffers`: AOTAutograd compiles with no saved tensor "donated" to the backward. A donated buffer is
freed (reused) by the backward, so torch raises at every `backward(retain_graph=True)` after the first backward,
which eager allows (a training step over changing lengths, HF's Mistral). `config.donated_buffer=False` cannot do
it for dealias's compiles alone: the flag is read again at each backward, where the compile's missing list of
donated buffers (None, not []) then raises. The list is made empty instead, by torch's own function for it patched
during the compile (a compile of torch.compile's in another thread meanwhile only donates nothing). Without it, a
graph autograd records runs on the torch executor.

Size asserts: dealias's fused graphs over symbols take each symbol from an input's size (a decode step's cache
length), with no SymInt placeholder of its own. Inductor's wrapper binds such a symbol to the input's size at
each call; torch 2.13 always did, torch 2.14 does it only while it also asserts the inputs' sizes
(`config.size_asserts`), and otherwise calls its kernels with an unbound name (a NameError at the first call).
dealias turns the asserts off where every call's sizes are already guarded (static sizes: dynamo's guards or the
cache entry's check held before the program runs), and keeps them on for graphs over symbols, on every release:
they cost a check per input and call, and they are what binds the symbols.

`compile_beside_calls()`: whether an inductor compile may run in a thread of its own while other threads call
compiled functions. Inductor traces with FX while it compiles (its pattern matcher's replacements), and dynamo
refuses a call of a compiled function while FX traces ("Detected that you are using FX to symbolically trace a
dynamo-optimized function"). Torch 2.14 keeps that flag per thread; torch 2.13 keeps one for the process, so a
compile in another thread would make calls of any compiled function (torch.compile's too) raise meanwhile.
"""

from __future__ import annotations

import contextlib
import threading
import unittest.mock
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import free_symbols

from .registry import Missing, active, correction, ensure, require, require_module

_local = threading.local()


def compile_beside_calls() -> bool:
    """FX's tracing flag is per thread on this torch (above)."""
    import torch.fx._symbolic_trace as symbolic_trace

    return isinstance(getattr(symbolic_trace, "_is_fx_tracing_tls", None), threading.local)


@contextlib.contextmanager
def dealias_compile() -> Iterator[None]:
    """While inductor compiles a graph of dealias's (on this thread): the corrections below apply."""
    ensure("inductor_view_strides")
    ensure("inductor_snapshot_lowering")
    before = getattr(_local, "active", False)
    _local.active = True
    try:
        yield
    finally:
        _local.active = before


@correction(
    "inductor_view_strides",
    corrects="a view handed to ATen's mm gets stride 0 on a dim of size 1, and mm copies it first",
    without="ATen's mm copies such views first (slower, the same values)",
    lazy=True,
)
def install_view_strides() -> None:
    ir = require_module("torch._inductor.ir")
    kernel = require(ir, "ExternKernel")
    for name in ("FixedLayout", "ReinterpretView"):
        require(ir, name)
    original = require(kernel, "convert_to_reinterpret_view", "x").__func__

    def convert_to_reinterpret_view(cls: Any, x: Any) -> Any:
        view = original(cls, x)
        if not getattr(_local, "active", False) or not active("inductor_view_strides") or view is x:
            return view
        return _unit_dims_strided(ir, view)

    kernel.convert_to_reinterpret_view = classmethod(convert_to_reinterpret_view)


def _unit_dims_strided(ir: Any, view: Any) -> Any:
    """`view` with each stride of 0 on a dim of size 1 set to the next inner dim's stride times its size (1 for
    the innermost), as a contiguous layout has it."""
    layout = view.layout
    sizes, strides = list(layout.size), list(layout.stride)
    changed = False
    for i in reversed(range(len(sizes))):
        if sizes[i] == 1 and strides[i] == 0:
            strides[i] = strides[i + 1] * sizes[i + 1] if i + 1 < len(sizes) else 1
            changed = True
    if not changed:
        return view
    fixed = ir.FixedLayout(layout.device, layout.dtype, sizes, strides, layout.offset, layout.is_pinned)
    return ir.ReinterpretView(data=view.data, layout=fixed)


@correction(
    "inductor_snapshot_lowering",
    corrects="(dealias's own op) `dealias::snapshot` called through Python in fused code, ~25 us each",
    without="each snapshot calls the custom op through Python (slower, the same values)",
    lazy=True,
)
def install_snapshot_lowering() -> None:
    """`dealias::snapshot` as ATen's clone called from inductor's wrapper, instead of a call of the custom op:
    inductor called that through Python (the dispatcher, then `clone`), ~25 us a snapshot on small tensors. A
    buffer of its own, written by a kernel inductor never fuses, is what the snapshot is for: inductor's scheduler
    orders it before any later write of the memory it reads, and a consumer loads the buffer instead of
    recomputing its value after the write. (A copy inductor generated instead was fused with the write it must
    precede: below.) Only dealias's graphs hold the op, so registering it for every compile changes no other."""
    lowering = require_module("torch._inductor.lowering")
    register = require(lowering, "register_lowering")
    from ..runtime.hazards import SNAPSHOT

    fallback = require(lowering, "fallback_handler")
    extern_clone = fallback(torch.ops.aten.clone.default, add_to_fallback_set=False)

    def snapshot(x: Any) -> Any:
        # ATen's clone called from inductor's wrapper (no Python), not a copy inductor generates: its scheduler
        # fused a generated copy with the `copy_` of it into the memory it read, after an earlier write there
        # (`x0[3:] = 3.0; x0 += x0.flip(0)`: one loop read x0[5 - i] after writing it), the very hazard a
        # snapshot is for. An extern kernel is never fused.
        return extern_clone(x)

    register(SNAPSHOT, type_promotion_kind=None)(snapshot)


@correction(
    "aot_no_donated_buffers",
    corrects="AOTAutograd donates saved buffers: a second backward(retain_graph=True) raises where eager's runs",
    without="a graph autograd records runs on the torch executor, not fused",
    lazy=True,
)
def install_no_donated_buffers() -> None:
    graph_compile = require_module("torch._functorch._aot_autograd.graph_compile")
    require(graph_compile, "collect_bw_donated_buffer_idxs")


@contextlib.contextmanager
def no_donated_buffers() -> Iterator[None]:
    """While AOTAutograd compiles a graph of dealias's: no buffer donated (raises Missing where this torch has no
    such function to patch: the caller runs the graph unfused)."""
    if not ensure("aot_no_donated_buffers"):
        raise Missing("aot_no_donated_buffers is not in force")
    from torch._functorch._aot_autograd import graph_compile

    with unittest.mock.patch.object(graph_compile, "collect_bw_donated_buffer_idxs", lambda *args, **kwargs: []):
        yield


def size_asserts(gm: fx.GraphModule) -> bool:
    """Whether inductor must keep its input size asserts for `gm`: some input's sizes or strides are symbolic."""
    for ph in gm.graph.find_nodes(op="placeholder"):
        value = ph.meta.get("val")
        if value is not None and free_symbols(value):
            return True
    return False


def floats_as_tensors(gm: fx.GraphModule) -> tuple[int, ...]:
    """Each float input of `gm` (a SymFloat placeholder: a learning rate dynamo made dynamic, frontend/floats.py)
    made a 0-d float64 tensor input, and the float arithmetic over it tensor arithmetic, by torch's own pass for
    torch.compile's dynamic floats (`tensorify_python_scalars`): inductor generates no code for a float symbol (its C++
    did not compile). Ops it cannot take a tensor for get the float specialized, a guard in the program's ShapeEnv
    (its shape guard then holds the value). Returns those inputs' positions. Raises Missing where this torch has no
    such pass, or it gives up (it would have restarted dynamo's analysis)."""
    import torch
    from torch._guards import detect_fake_mode

    module = require_module("torch.fx.passes._tensorify_python_scalars")
    tensorify = require(module, "tensorify_python_scalars", "gm", "shape_env", "fake_mode")
    restart = require(require_module("torch._dynamo.exc"), "TensorifyScalarRestartAnalysis")
    placeholders = gm.graph.find_nodes(op="placeholder")
    found = [i for i, ph in enumerate(placeholders) if isinstance(ph.meta.get("val"), torch.SymFloat)]
    if not found:
        return ()
    fake_mode = detect_fake_mode([ph.meta.get("val") for ph in placeholders])
    shape_env = placeholders[found[0]].meta["val"].node.shape_env
    if fake_mode is None or shape_env is None:
        raise Missing("no fake mode or ShapeEnv for a float input")
    _alpha_as_product(gm)
    # The pass specializes (a guard on the float's value: a compile per learning rate) what it cannot make tensor
    # arithmetic, and its guards cannot be taken back: such a graph is refused before it runs.
    supported = require(module, "SUPPORTED_OPS")
    for n in gm.graph.nodes:
        if isinstance(n.meta.get("val"), torch.SymFloat):
            _tensorifiable(n, supported)
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for i in found:
        ph = placeholders[i]
        with gm.graph.inserting_before(first):
            item = gm.graph.call_function(torch.ops.aten._local_scalar_dense.default, (ph,))
        item.meta["val"] = ph.meta["val"]
        ph.replace_all_uses_with(item, delete_user_cb=lambda u, item=item: u is not item)
        with fake_mode:
            ph.meta["val"] = torch.empty((), dtype=torch.float64)
    try:
        tensorify(gm, shape_env, fake_mode)
    except restart as e:
        raise Missing("tensorify_python_scalars gave up on a float input") from e
    left = [n for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.SymFloat)]
    if left:
        raise Missing(f"a float input left as a float: {left[0].format_node()}")
    gm.recompile()
    return tuple(found)


def _alpha_as_product(gm: fx.GraphModule) -> None:
    """`add(x, y, alpha=a)` (and `sub`) with a float input's `a` as `add(x, mul(y, a))`, and `_foreach_mul(xs, a)`
    (add, div) as `_foreach_mul(xs, 1.0 * a)` with a 0-d tensor (its `Tensor` overload): forms the pass takes."""
    import torch

    aten = torch.ops.aten
    by_tensor = {aten._foreach_mul.Scalar: aten._foreach_mul.Tensor, aten._foreach_add.Scalar: aten._foreach_add.Tensor}
    by_tensor[aten._foreach_div.Scalar] = aten._foreach_div.Tensor
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target in by_tensor and isinstance(n.args[1], fx.Node):
            value = n.args[1].meta.get("val")
            if not isinstance(value, torch.SymFloat):
                continue
            fake_mode = next(v for v in (x.meta.get("val") for x in n.args[0]) if isinstance(v, torch.Tensor)).fake_mode
            with gm.graph.inserting_before(n):
                one = gm.graph.call_function(aten.scalar_tensor.default, (1.0,), {"dtype": torch.float64})
                scalar = gm.graph.call_function(aten.mul.Tensor, (one, n.args[1]))  # (exact: the float in float64)
            with fake_mode:
                one.meta["val"] = scalar.meta["val"] = torch.empty((), dtype=torch.float64)
            n.target, n.args = by_tensor[n.target], (n.args[0], scalar)
            continue
        alpha = n.kwargs.get("alpha") if n.op == "call_function" else None
        if n.target not in (aten.add.Tensor, aten.sub.Tensor) or not isinstance(alpha, fx.Node):
            continue
        if not isinstance(alpha.meta.get("val"), torch.SymFloat) or not isinstance(n.args[1], fx.Node):
            continue
        with gm.graph.inserting_before(n):
            scaled = gm.graph.call_function(aten.mul.Tensor, (n.args[1], alpha))
        scaled.meta["val"] = n.meta["val"]  # (the product's dtype: promoted as the sum's)
        n.args, n.kwargs = (n.args[0], scaled), {}


def _tensorifiable(n: fx.Node, supported: Any) -> None:
    """Raise Missing unless every use of the float `n` is float arithmetic over float inputs only, or a
    positional argument of an op `tensorify_python_scalars` makes a tensor op."""
    import torch
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    if not all(symbol_is_type(s, SymT.FLOAT) for s in n.meta["val"].node.expr.free_symbols):
        raise Missing(f"{n.format_node()} mixes a float input with other symbols")
    for u in n.users:
        if isinstance(u.meta.get("val"), torch.SymFloat):
            continue  # (float arithmetic: its own uses are checked, the pass computes it from the symbols)
        tensor_op = u.op == "call_function" and u.target in supported and isinstance(u.meta.get("val"), torch.Tensor)
        if not tensor_op or n in u.kwargs.values():
            raise Missing(f"{u.format_node()} takes a float input where no tensor goes")


def layout_options(channels_last: bool | None) -> dict[str, Any]:
    """Inductor's config for a graph whose convolutions go channels-last (`channels_last`) or stay in eager's layout;
    {} (inductor's own choice) for None, or where this release has no such setting (runtime/conv_layout.py)."""
    import torch._inductor.config as config

    if channels_last is None or not hasattr(config, "layout_optimization"):
        return {}
    return {"layout_optimization": channels_last}
