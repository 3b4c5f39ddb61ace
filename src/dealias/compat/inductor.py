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
import operator
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
    """While inductor compiles a graph of dealias's (on this thread): the corrections below apply, inductor's
    precompiled-header calls are noted for the next process (header_prefetch.py), and inductor's per-process keys of
    torch and triton are filled in from the record (inductor_keys.py)."""
    from .header_prefetch import recording
    from .inductor_keys import prefill

    prefill()  # (once per process: the keys from the record, before the compile's cache lookups ask for them)
    ensure("inductor_view_strides")
    ensure("inductor_snapshot_lowering")
    before = getattr(_local, "active", False)
    _local.active = True
    try:
        with recording():
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

    # `dealias::aligned_snapshot` (hazards.py `_fusable`: every later write of what it reads stores each element
    # where the copy's element at the same position read it): a copy inductor generates, realized where the
    # program has it (its scheduler orders a buffer's computation before any later write of memory it reads, or
    # fuses the two into one loop, where the element is loaded before it is stored), kept in registers when
    # inductor fuses it with its users. Adadelta with weight decay: one kernel per parameter, as torch.compile's.
    generated_clone = require(lowering, "clone")
    from ..runtime.hazards import ALIGNED_SNAPSHOT

    def aligned_snapshot(x: Any) -> Any:
        copy = generated_clone(x)
        copy.realize()
        return copy

    register(ALIGNED_SNAPSHOT, type_promotion_kind=None)(aligned_snapshot)

    # `dealias::row` (row_products.py): the rows of a product by reduction, realized where the program has them, so
    # the reduction loads them instead of computing their expression (a norm, an activation) once per column.
    from ..runtime.row_products import ROW

    register(ROW, type_promotion_kind=None)(aligned_snapshot)


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
    """Ops that take a float input where `tensorify_python_scalars` takes none (an optimizer's lr or betas under a
    scheduler), rewritten as tensor arithmetic over the float as a 0-d float64 tensor (`1.0 * a`, exact), each as
    eager computes it in the tensors' dtype (eager casts the number to it):
    - `_foreach_mul(xs, a)` (add, div) as its `Tensor` overload;
    - `addcdiv(x, t1, t2, value=a)` (foreach too) as `add(x, div(mul(t1, a), t2))`: eager's `x + a * t1 / t2`,
      left to right (bit for bit in eager, float32 and float64);
    - `lerp(x, y, a)` (foreach: its `List` form) as `lerp` with `a` converted to x's dtype as a 0-d tensor (eager's
      bits), `full(size, a)` as `a` converted, expanded and cloned (dense, as `full`: dynamo's `_foreach_lerp_`
      polyfill fills the weight out so);
    - `pow(a, e)` (`_foreach_pow.ScalarAndTensor`: Adam's `beta1 ** step`) as `pow` of `a` converted to e's dtype
      (eager casts the wrapped number so; eager's bits);
    - `add(x, y, alpha=a)` (sub, foreach `List`) as `add(x, mul(y, a))` and `addcmul(x, t1, t2, value=a)` as
      `add(x, mul(mul(t1, a), t2))`: how inductor lowers these ops with a number (torch._refs), not eager's bits
      (eager's CPU kernels fuse a multiply-add there, aten has no fma op to say so): within the fused tolerance,
      as the same op with a constant is.
    The forms other than `_foreach_mul` (add, div) only where every tensor of each element is float32 or float64, one
    dtype (half and bfloat16 compute in float32 in eager, one rounding where this would round between ops); what is
    left is refused by `_tensorifiable`."""
    import torch

    from ..ir.opfacts import bind_args  # (not at import: ir imports compat)

    aten, prims = torch.ops.aten, torch.ops.prims
    graph = gm.graph
    full = (torch.float32, torch.float64)

    def is_float(a: Any) -> bool:
        return isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.SymFloat)

    def val(a: Any) -> Any:
        return [val(x) for x in a] if isinstance(a, (list, tuple)) else a.meta["val"] if isinstance(a, fx.Node) else a

    def fake_mode_of(n: fx.Node) -> Any:
        flat = [v for v in torch.utils._pytree.tree_leaves(val(list(n.args))) if isinstance(v, torch.Tensor)]
        return flat[0].fake_mode

    def emit(before: fx.Node, fake: Any, target: Any, *args: Any, last: bool = False) -> Any:
        """`target(*args)` before `before`; a foreach op's result as a list of its items (inductor's foreach
        lowerings take lists of nodes), but for the `last` one, which replaces a node its users index."""
        with graph.inserting_before(before):
            node = graph.call_function(target, args)
        with fake:
            node.meta["val"] = target(*val(list(args)))
        if last or not isinstance(node.meta["val"], (list, tuple)):
            return node
        items = []
        for i, v in enumerate(node.meta["val"]):
            with graph.inserting_before(before):
                items.append(graph.call_function(operator.getitem, (node, i)))
            items[-1].meta["val"] = v
        return items

    def as_tensor(before: fx.Node, fake: Any, a: fx.Node) -> fx.Node:
        with graph.inserting_before(before):
            one = graph.call_function(aten.scalar_tensor.default, (1.0,), {"dtype": torch.float64})
            scalar = graph.call_function(aten.mul.Tensor, (one, a))  # (exact: the float in float64)
        with fake:
            one.meta["val"] = scalar.meta["val"] = torch.empty((), dtype=torch.float64)
        return scalar

    def dtypes(*tensors: Any) -> set[Any]:
        return {t.dtype for t in torch.utils._pytree.tree_leaves(val(list(tensors)))}

    def on_cpu(*tensors: Any) -> bool:
        # (the float's tensor is a CPU one: a weight, base or fill made of it would be too, on another device)
        return all(t.device.type == "cpu" for t in torch.utils._pytree.tree_leaves(val(list(tensors))))

    def same_full(*lists: Any) -> bool:
        # (foreach: element by element one dtype, float32 or float64; a single op's tensors likewise)
        rows = zip(*[val(x) for x in lists]) if isinstance(lists[0], (list, tuple)) else [val(list(lists))]
        return all(len({t.dtype for t in row}) == 1 and row[0].dtype in full for row in rows)

    def replace(n: fx.Node, new: fx.Node) -> None:
        assert not isinstance(new, list)
        n.replace_all_uses_with(new)
        graph.erase_node(n)

    by_tensor = {aten._foreach_mul.Scalar: aten._foreach_mul.Tensor, aten._foreach_add.Scalar: aten._foreach_add.Tensor}
    by_tensor[aten._foreach_div.Scalar] = aten._foreach_div.Tensor
    add_like = {
        aten.add.Tensor: (aten.add.Tensor, aten.mul.Tensor),
        aten.sub.Tensor: (aten.sub.Tensor, aten.mul.Tensor),
    }
    add_like[aten._foreach_add.List] = (aten._foreach_add.List, aten._foreach_mul.Tensor)
    add_like[aten._foreach_sub.List] = (aten._foreach_sub.List, aten._foreach_mul.Tensor)
    addc = {aten.addcdiv.default: (aten.add.Tensor, aten.mul.Tensor, aten.div.Tensor)}
    addc[aten.addcmul.default] = (aten.add.Tensor, aten.mul.Tensor, aten.mul.Tensor)
    addc[aten._foreach_addcdiv.Scalar] = (aten._foreach_add.List, aten._foreach_mul.Tensor, aten._foreach_div.List)
    addc[aten._foreach_addcmul.Scalar] = (aten._foreach_add.List, aten._foreach_mul.Tensor, aten._foreach_mul.List)
    for n in list(graph.nodes):
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        named = bind_args(n.target._schema, n.args, n.kwargs)  # (the float by its schema argument's name)
        floats = [k for k, v in named.items() if is_float(v)]
        if len(floats) != 1:
            continue
        a = named[floats[0]]
        if n.target in by_tensor and floats == ["scalar"] and not n.kwargs:
            fake = fake_mode_of(n)
            n.target, n.args = by_tensor[n.target], (n.args[0], as_tensor(n, fake, a))
        elif n.target in add_like and floats == ["alpha"] and isinstance(named["other"], (fx.Node, list)):
            fake = fake_mode_of(n)
            add, mul = add_like[n.target]
            scaled = emit(n, fake, mul, named["other"], as_tensor(n, fake, a))
            replace(n, emit(n, fake, add, named["self"], scaled, last=True))
        elif n.target in addc and floats == ["value"]:
            x, t1, t2 = named["self"], named["tensor1"], named["tensor2"]
            if not same_full(x, t1, t2):
                continue
            fake = fake_mode_of(n)
            add, mul, then = addc[n.target]
            scaled = emit(n, fake, then, emit(n, fake, mul, t1, as_tensor(n, fake, a)), t2)
            replace(n, emit(n, fake, add, x, scaled, last=True))
        elif n.target in (aten.lerp.Scalar, aten._foreach_lerp.Scalar) and floats == ["weight"]:
            x, y = named["self"], named.get("end", named.get("tensors1"))
            if y is None or not same_full(x, y) or not on_cpu(x, y):
                continue
            fake = fake_mode_of(n)
            scalar = as_tensor(n, fake, a)
            weight = {d: emit(n, fake, prims.convert_element_type.default, scalar, d) for d in dtypes(x)}
            if n.target is aten.lerp.Scalar:
                replace(n, emit(n, fake, aten.lerp.Tensor, x, y, weight[val(x).dtype]))
            else:
                replace(n, emit(n, fake, aten._foreach_lerp.List, x, y, [weight[v.dtype] for v in val(x)], last=True))
        elif n.target in (aten.pow.Scalar, aten._foreach_pow.ScalarAndTensor) and floats == ["self"]:
            e = named["exponent"]
            if dtypes(e) - set(full) or not on_cpu(e):
                continue
            fake = fake_mode_of(n)
            scalar = as_tensor(n, fake, a)
            base = {d: emit(n, fake, prims.convert_element_type.default, scalar, d) for d in dtypes(e)}
            if n.target is aten.pow.Scalar:
                replace(n, emit(n, fake, aten.pow.Tensor_Tensor, base[val(e).dtype], e))
            else:
                replace(n, emit(n, fake, aten._foreach_pow.List, [base[v.dtype] for v in val(e)], e, last=True))
        elif n.target is aten.full.default and floats == ["fill_value"] and val(n).dtype in full and on_cpu(n):
            # (a weight filled out per tensor, dynamo's `_foreach_lerp_` polyfill: the float cast to the dtype, as
            # `full` casts it, and laid out as `full` lays it out)
            fake = n.meta["val"].fake_mode
            value = emit(n, fake, prims.convert_element_type.default, as_tensor(n, fake, a), val(n).dtype)
            replace(n, emit(n, fake, aten.clone.default, emit(n, fake, aten.expand.default, value, named["size"])))


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


def layout_options(channels_last: bool | None, matmuls: bool = False) -> dict[str, Any]:
    """Inductor's config for a graph whose convolutions go channels-last (`channels_last`) or stay in eager's layout,
    its 1x1 convolutions computed as matrix products (`matmuls`) or not; {} (inductor's own choice) for None, or where
    this release has no such setting (runtime/conv_layout.py)."""
    import torch._inductor.config as config

    if channels_last is None or not hasattr(config, "layout_optimization"):
        return {}
    products = {"conv_1x1_as_mm": True} if matmuls and hasattr(config, "conv_1x1_as_mm") else {}
    return {"layout_optimization": channels_last, **products}
