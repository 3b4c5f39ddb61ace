"""The fused executor: the lowered graph, its writes into the caller's memory included, compiled by inductor.

Inductor fuses a write's value into its store, so `buf[123] = row` becomes one kernel over the row's bytes and
`p.copy_(p - lr * g)` one kernel updating `p` in place. It is given the graph directly (no functionalization of
its own, which would turn the row write into a copy of the whole buffer).

Inductor alone is not safe on a graph that writes: it may compute a value where it is used rather than where the
program computed it. The hazard rule and the snapshots that keep it are in hazards.py. Index bounds are checked,
and indices the graph computes are computed, in a prologue before any write (prologue.py).
What this path cannot run exactly stays on the torch executor, with the reason in the execution trace
(`unfusable` before lowering, `Unfusable` after): alias groups, random draws, complex tensors, results of symbolic
sizes in a layout other than a dense one, index checks against sizes computed in the graph, ops that may raise
on their values (an integer division by a tensor), functional scatters into memory of the caller's and dtype
views and `as_strided` (three things inductor gets wrong or ties to one placement of the inputs), writes to memory
that is not an input. (A functional
scatter into memory the graph made, `out = torch.zeros(..); out[idx] = x`, is inductor's own buffer: fused.)

A program over symbols (a position, a sequence length) is compiled for the capture's fake tensors and symbols:
the guards inductor's decisions add go into the program's ShapeEnv, and from there into its shape guard; the
decisions taken here hold for every value of the symbols (`surely`), so they add none.

A graph autograd records goes to inductor another way (fused_autograd.py).

A short attention (a decode step: a few queries over at most 1,024 keys) is computed by matmuls and softmax
that inductor fuses, not by ATen's flash kernel, which is faster only on longer ones (measured), unless its queries
are a pointwise expression inductor would recompute per key (a rotary embedding); and a product
of a few rows by a weight as the reduction inductor generates, where that is faster here (row_products.py).
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator
from operator import getitem, itemgetter
from typing import Any

import torch
import torch.fx as fx
from torch._dynamo.convert_frame import compile_lock
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import free_symbols

from ..compat.graph_cache import graph_cache
from ..compat.inductor import dealias_compile, floats_as_tensors, layout_options, size_asserts
from ..compat.internals import increment_versions, version_counters_missing
from ..compat.registry import Missing
from ..compat.vec_isa import vec_isa_config
from ..errors import InternalError
from ..ir.island import island
from ..ir.opfacts import bind_args, facts, has_effect, is_view_node, op_name
from ..ir.plan import alias_group_of
from ..ir.viewops import surely, symbolic_layout
from . import island_op
from .conv_layout import channels_last, one_by_one_as_matmuls
from .hazards import Unfusable, check_hazards, insert_snapshots, merge_full_writes, writes_of
from .inductor_fixes import decompositions
from .keep_aten import twin_for
from .kernel_checks import check_kernels
from .prologue import example_like, in_prologue, make_prologue
from .row_products import by_reduction

aten = torch.ops.aten


def unfusable(gm: fx.GraphModule) -> str | None:
    """Why the fused executor cannot run `gm` exactly, or None. "autograd records the graph" is returned only
    when no other reason holds (`fused_autograd_executor` can run such a graph)."""
    records = False
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and val.is_complex():
            # Inductor generates no code for complex ops: it falls back to ATen's, and a write through
            # `view_as_real(c)` (`c.real.add_(x)`) then never reached the caller's tensor.
            return "complex tensors (inductor has no code generation for them)"
        if n.op == "placeholder":
            if alias_group_of(n) is not None:
                return "inputs share memory (an alias group)"
            if not isinstance(val, (torch.Tensor, torch.SymInt, torch.SymFloat)):
                return f"a symbolic {type(val).__name__} input"
        if n.op != "call_function":
            continue
        records = records or bool(n.meta.get("rg"))  # (without it, grad mode switches change nothing)
        op = n.target
        if isinstance(op, torch._ops.OpOverload) and facts(op).nondeterministic and not _no_dropout(n):
            return f"{op} draws random numbers (inductor's generator is not eager's)"
        if getattr(op, "dealias_draw", False):  # (ir.draws: an in-place draw on fresh memory)
            return f"{n.args[0]} draws random numbers (inductor's generator is not eager's)"
        if isinstance(why := getattr(op, "dealias_unfused", None), str):  # (gradops.stale_saved)
            return why
        if getattr(op, "dealias_island", False):  # (ir.island: eager's kernel on a copy of the caller's layout)
            if facts(n.args[0]).nondeterministic:
                return f"{n.args[0]} draws random numbers (inductor's generator is not eager's)"
            if not n.users or island_op.encode(n) is None:  # (unused: inductor would drop it, and eager's errors)
                return f"{n.args[0]} reads what it writes in eager's order (an eager island inductor cannot take)"
            continue  # (runtime/island_op.py: an extern kernel of inductor's)
        if not isinstance(op, torch._ops.OpOverload) and has_effect(op) and not in_prologue(n):
            return f"{op_name(op)} runs in Python"
        if _integer_division(n):
            return f"{op_name(op)} divides integers by a divisor that may be zero (inductor's kernel writes or crashes)"
    return AUTOGRAD if records else None


AUTOGRAD = "autograd records the graph"


# Integer divisions eager checks for a zero divisor before writing anything (RuntimeError "ZeroDivisionError").
# Inductor's kernels check in the loop, after the elements before it were stored (`x.floor_divide_(y)` left x half
# written), or not at all: a truncating division by zero stops the process with SIGFPE (torch.compile's too).
_DIVISIONS = ("div", "div_", "floor_divide", "floor_divide_", "remainder", "remainder_", "fmod", "fmod_")


def _integer_division(n: fx.Node) -> bool:
    """An integer division, remainder or fmod whose divisor is a tensor or a zero: its values may make eager raise."""
    op = n.target
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten" or op_name(op) not in _DIVISIONS:
        return False
    val = n.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.is_floating_point() or val.is_complex():
        return False
    bound = bind_args(op._schema, n.args, n.kwargs, defaults=True)
    if op_name(op).startswith("div") and bound.get("rounding_mode") is None:
        return False  # (a true division: a float result)
    divisor = bound.get("other")
    return not isinstance(divisor, (int, float)) or divisor == 0


def _no_dropout(n: fx.Node) -> bool:
    """An op tagged random only for its dropout, called without it (attention with `dropout_p=0.0`)."""
    p = bind_args(n.target._schema, n.args, n.kwargs, defaults=True).get("dropout_p")
    return p is not None and p == 0


def fused_executor(gm: fx.GraphModule, example: list[Any], kept: Any = None) -> Callable[..., Any]:
    """Compile the lowered graph `gm` (called with tensors like `example`) with inductor. Raises Unfusable. `kept`:
    where the graph's retrace for inductor is kept for a later process (passes/program_cache.Retraces), or None."""
    from torch._inductor.compile_fx import compile_fx_inner

    result_layouts(gm)  # (raises Unfusable before inductor's compile, not after)
    raising = check_kernels(gm, example)  # (eager's checks of dtypes, sizes, devices: kernel_checks.py)
    if raising is not None:
        return raising
    prologue = make_prologue(gm)
    layout = channels_last(gm)  # (convolutions channels-last, or in eager's layout: measured, conv_layout.py)
    example = [
        *example,
        *(example_like(ph.meta["val"], example) for ph in gm.graph.find_nodes(op="placeholder")[len(example) :]),
    ]
    for n in gm.graph.nodes:
        twin = twin_for(n)  # (ATen's kernel, where it is faster here than inductor's code: keep_aten.py)
        if twin is not None:
            n.target = twin
        if _short_attention(n):
            n.target = _attention_by_matmuls
        reduction = by_reduction(n)  # (a decode step's one-row products: row_products.py)
        if reduction is not None:
            n.target = reduction
        if n.target is island:  # (eager's kernel as an extern kernel, in program order: island_op.py)
            n.target, n.args, n.kwargs = torch.ops.dealias.island.default, island_op.encode(n), {}
        by_tensors = _by_tensor_scalar(n)
        if by_tensors is not None:
            n.target, n.kwargs = by_tensors, {**n.kwargs, "dtype": n.meta["val"].dtype}
    gm.recompile()
    table = decompositions(gm)
    key = kept.key(gm, table.float64_passes) if kept is not None else None
    loaded = kept.load(key) if kept is not None else None
    if loaded is None:
        traced, floats, written = _retrace(gm, example, table)
        if kept is not None:
            kept.save(key, traced, floats, written)
    else:
        traced, floats, written = loaded
    float_inputs = [ph.meta["val"] for ph in traced.graph.find_nodes(op="placeholder")]
    example = [float_inputs[i] if i in floats else x for i, x in enumerate(example)]
    if written and (why := version_counters_missing(moved=True)):
        raise Unfusable(why)
    handed = copy.deepcopy(traced)  # inductor's passes rewrite the graph they are given (no-op clones go)
    handed.meta["channels_last"] = layout  # (for traces and tests: the convolutions' layout, None: inductor's)
    # No size/stride asserts in inductor's wrapper where every call's inputs have the traced sizes and strides
    # (dynamo's guards or the cache entry's tensor check held before the program runs); over symbols they bind
    # the symbols (compat/inductor.py).
    options = {"size_asserts": size_asserts(traced), **layout_options(layout, one_by_one_as_matmuls(gm, layout))}

    def compile_now() -> Any:
        try:
            # Inductor's FX graph cache in use (a second process loads the generated code: compat/graph_cache.py).
            with (
                torch._inductor.config.patch({**options, **vec_isa_config()}),  # (a first probe: in the compile)
                dealias_compile(),
                graph_cache(list(example)) as handed_example,
            ):
                return compile_fx_inner(traced, handed_example)
        except Exception as e:  # noqa: BLE001 - an op inductor cannot compile: the torch executor runs the graph
            first_line = str(e).splitlines()[0][:200] if str(e) else ""
            raise Unfusable(f"inductor could not compile it: {type(e).__name__}: {first_line}") from e

    # Over symbols, inductor's decisions add guards to the program's ShapeEnv, which its shape guard is made from
    # when the program is built: such a compile cannot be left for later.
    later = getattr(_background, "on", False) and not any(
        free_symbols(ph.meta.get("val")) for ph in traced.graph.find_nodes(op="placeholder")
    )
    compiled = Background(compile_now) if later else compile_now()
    # (the call's tensors, or the capture's fakes, which keep requires_grad; the placeholders' values too, to err on
    # the side of switching grad off)
    values = [*example, *(ph.meta.get("val") for ph in gm.graph.find_nodes(op="placeholder"))]
    rg = any(isinstance(a, torch.Tensor) and a.requires_grad for a in values)
    run = runner(gm, compiled, prologue, written=written, floats=floats, any_requires_grad=rg)
    run.graph = handed  # type: ignore[attr-defined]  # what inductor was given: for traces and tests
    run.prologue = prologue  # type: ignore[attr-defined]  # (its generated source: `prologue.source`)
    run.pending = compiled if later else None  # type: ignore[attr-defined]
    return run


def _retrace(gm: fx.GraphModule, example: list[Any], table: Any) -> tuple[fx.GraphModule, set[int], tuple[int, ...]]:
    """The graph inductor is given: `gm` traced again with inductor's own decompositions `table` (index_copy_ ->
    index_put_, ...; a variance's: inductor_fixes.py), dealias's helpers traced to aten ops, each node keeping the
    user's source line; its float inputs as tensors, its writes merged and snapshots taken (hazards.py). With the
    positions of its float inputs and of the inputs it writes. Raises Unfusable."""
    with fx.traceback.preserve_node_meta(), torch.no_grad():  # nothing records autograd (`unfusable`)
        interpret = lambda *args: fx.Interpreter(gm).run(*args)  # noqa: E731
        traced = make_fx(interpret, decomposition_table=table, tracing_mode="fake")(*example)
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    for ph, name in zip(traced.graph.find_nodes(op="placeholder"), names):
        ph.name = ph.target = name
    if any(n.target is aten.view.dtype for n in traced.graph.nodes):
        # Inductor writes through an integer view of float memory as a float store of the converted integer.
        raise Unfusable("a dtype view (x.view(torch.int32))")
    if any(n.target is aten.as_strided.default for n in traced.graph.nodes):
        # Its storage offset is absolute: traced from one call's placement, it would be baked into the kernels,
        # while a program serves every placement of its inputs.
        raise Unfusable("an as_strided view (its storage offset is absolute)")
    try:
        floats = floats_as_tensors(traced)  # (a float input: a 0-d float64 tensor, its arithmetic tensor arithmetic)
    except Missing as e:
        raise Unfusable(f"a float input inductor cannot take: {e}") from e
    # Inductor's kernels write the caller's tensors through pointers, which moves no version counter: the call
    # moves each written one itself, or what autograd saved of it before would be read as if unchanged.
    traced_inputs = traced.graph.find_nodes(op="placeholder")
    written = tuple(sorted({traced_inputs.index(ph) for _, ph in writes_of(traced)}))  # (only inputs are written)
    merge_full_writes(traced)
    insert_snapshots(traced)
    check_hazards(traced)
    traced.recompile()
    return traced, set(floats), written


_background = threading.local()


@contextlib.contextmanager
def in_background(on: bool = True) -> Iterator[None]:
    """While on (in this thread), fused_executor leaves inductor's compile to a thread of its own (`Background`),
    where the graph has no symbols: executor "tiered" keeps serving calls on the exact tiers meanwhile."""
    before = getattr(_background, "on", False)
    _background.on = on
    try:
        yield
    finally:
        _background.on = before


class Background:
    """Inductor's compile of one graph in a daemon thread. Everything that reads the call's inputs (capture,
    lowering, the kernel checks, the trace for inductor) ran before, in the calling thread; the compile itself
    reads only the traced graph and its inputs' layouts. It takes dynamo's compile lock (re-entrant; the calling
    thread holds it while it builds the program, so the compile starts after): inductor's config patches and
    caches are the process's, and a compile of dynamo's in another thread waits for it, as it would wait for a
    compile in the calling thread. Until `done` is set nothing calls it; then `__call__` is the compiled graph's,
    or `error` is what the compile raised (Unfusable)."""

    def __init__(self, compile_now: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        grad = torch.is_grad_enabled()  # (a new thread starts with grad mode on)

        def work() -> None:
            try:
                with compile_lock:
                    torch._C._set_grad_enabled(grad)
                    self.result = compile_now()
            except BaseException as e:  # noqa: BLE001 - handed to the thread that adopts the program
                self.error = e
            finally:
                self.done.set()

        self.thread = threading.Thread(target=work, name="dealias fused compile", daemon=True)
        self.thread.start()

    def __call__(self, args: Any) -> Any:
        return self.result(args)

    def __getattr__(self, name: str) -> Any:  # current_callable, as the compiled graph's (runner's first call)
        return getattr(self.__dict__["result"], name)


# Attention a few queries long over a short key sequence (a decode step) runs faster as inductor's matmuls and
# softmax than as ATen's flash kernel for CPU: 0.89x at 1 query over 1,024 keys, but 1.16-3.2x at 4,096 keys
# (measured: 16 heads of 64, 1 and 2 threads). Longer ones keep the flash kernel.
SHORT_ATTENTION_KEYS = 1024
SHORT_ATTENTION_QUERIES = 16
_FLASH_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default


def _short_attention(n: fx.Node) -> bool:
    """A flash attention call short enough to run by matmuls, whose logsumexp (for backward) nobody reads, and whose
    queries are not computed by pointwise ops: inductor would compute them inside the product with the keys, once
    per key (a rotary embedding's cos/sin, HF Llama's decode step: 0.57x eager by matmuls, 0.51x by the flash
    kernel, torch.compile's 0.50x)."""
    if n.op != "call_function" or n.target is not _FLASH_CPU:
        return False
    q, k = n.args[0].meta["val"], n.args[1].meta["val"]
    used = all(u.target is getitem and u.args[1] == 0 for u in n.users)
    short = surely(q.shape[-2] <= SHORT_ATTENTION_QUERIES) and surely(k.shape[-2] <= SHORT_ATTENTION_KEYS)
    return used and short and not _pointwise_result(n.args[0])


def _pointwise_result(node: Any) -> bool:
    """Whether `node`, through views, is the result of a pointwise op (an expression inductor inlines where it is
    read), not of a kernel's (a matmul's) or an input."""
    while isinstance(node, fx.Node) and is_view_node(node):
        node = node.args[0]
    target = getattr(node, "target", None)
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags


def _attention_by_matmuls(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The flash kernel's result computed by torch's own decomposition of it (matmuls, softmax), which make_fx
    traces into the graph inductor fuses. Its second result is not the logsumexp (`_short_attention`: unread)."""
    return torch._decomp.decomposition_table[_FLASH_CPU](*args, **kwargs)


# `p.addcdiv_(m, d, value=t)` with a 0-d tensor t is traced as dealias's own op (compat/tensor_scalars.py), whose
# kernel reads t with `.item()` and calls eager's: inductor called it as an extern kernel, through Python and the
# dispatcher, once per parameter and call (a single-tensor Adagrad step: 10 of them, 2.7x torch.compile's time). In
# fused graphs of float32 and float64 it is the kernel's own arithmetic over tensors instead, which inductor fuses:
# the Scalar as eager's kernel takes it (t's value rounded once to the dtype), the same order of operations. Not for
# half-precision results: inductor keeps a fused bfloat16 operand (`v.abs() + 1`) in float32 where eager rounded it
# (1 bfloat16 ulp apart), which the op's own kernel, reading the rounded operand, avoids.
def _addcmul(self: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor, value: torch.Tensor, *, dtype: Any) -> Any:
    return self + value.to(dtype) * t1 * t2


def _addcdiv(self: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor, value: torch.Tensor, *, dtype: Any) -> Any:
    return self + value.to(dtype) * t1 / t2


def _add(self: torch.Tensor, other: torch.Tensor, alpha: torch.Tensor, *, dtype: Any) -> Any:
    return self + alpha.to(dtype) * other


_BY_TENSORS = {"addcmul": _addcmul, "addcdiv": _addcdiv, "add": _add}


def _by_tensor_scalar(n: fx.Node) -> Callable[..., Any] | None:
    """The tensor arithmetic for a functional `dealias::addcdiv` (addcmul, add) of a float32 or float64 result whose
    tensors all have its dtype, or None."""
    op = n.target
    if n.op != "call_function" or not isinstance(op, torch._ops.OpOverload) or op.namespace != "dealias":
        return None
    out = n.meta.get("val")
    if not isinstance(out, torch.Tensor) or out.dtype not in (torch.float32, torch.float64) or n.kwargs:
        return None
    operands = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in n.args[:-1]]
    if any(not isinstance(v, torch.Tensor) or v.dtype != out.dtype or v.device != out.device for v in operands):
        return None  # (mixed dtypes or devices: eager's kernel casts each operand; left to it)
    return _BY_TENSORS.get(op_name(op))


def inputs_memory(args: Any) -> set[int]:
    """The storages of the tensors among `args`, by id: which memory a result shares with an input."""
    return {a.untyped_storage()._cdata for a in args if isinstance(a, torch.Tensor)}


def runner(
    gm: fx.GraphModule,
    compiled: Any,
    prologue: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None,
    autograd: bool = False,
    written: tuple[int, ...] = (),
    floats: tuple[int, ...] = (),
    any_requires_grad: bool = True,
) -> Callable[..., Any]:
    """The call of a compiled graph: prologue (its checks, and the inputs it computes), inductor's callable (without
    autograd, unless it is AOTAutograd's and records it; `any_requires_grad`: whether an input requires grad, fixed
    per program), the version counters of the inputs it wrote (`written`) moved, results in eager's layout and in
    memory of their own."""
    layouts, dense = result_layouts(gm)
    out_node = gm.graph.output_node()
    # Results the graph computes (not an input or a view of one) that came back in an input's memory are copied too:
    # inductor simplifies `ones * x` to `x`, and AOTAutograd then returns x's memory, as a view of x (fuzz seed
    # 995738: `v = x.new_ones(..); v.mul_(x); return v`; torch.compile returns it so). Learned on the first call
    # (for a result of symbolic sizes, on the first call it is not empty: which memory inductor returns for it is
    # decided when it compiles, not by the sizes).
    made = {i for i, a in enumerate(out_node.args[0]) if isinstance(a, fx.Node) and made_by_the_graph(a)}
    # Results made of different values, which eager returns in memories of their own, may come back in one: inductor
    # drops a `clone` as a no-op (two `Ident.apply(v * 1)` of a constant-only value, each `x.clone()`, came back
    # one buffer: fuzz seed 2441434). Learned on the first call too; a result sharing its value with another result
    # (a view of it returned beside it) cannot be separated by a copy: that call raises.
    roots = {i: _root(out_node.args[0][i]) for i in made}
    # call: None until the first call returned; restride: (result, sizes, strides) to copy into; copied: results of
    # symbolic sizes that come back in an input's memory; pending: those not yet seen non-empty.
    state: dict[str, Any] = {"call": None, "restride": layouts, "copied": set(), "pending": made.intersection(dense)}
    # The written inputs picked in C on every call (a generator over them was ~2 us of a 40-tensor optimizer step,
    # as much as inductor's kernel call; torch.compile's wrapper has no such loop).
    pick_written = picker(written)

    def restrided(outs: list[Any]) -> Any:
        fixed = list(outs)
        for i, shape, stride in state["restride"]:  # (only results whose layout differs, since the first call)
            t = fixed[i]
            fixed[i] = torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device).copy_(t)
        for i in dense:
            t = fixed[i]
            if i in state["copied"] or not t.is_contiguous():
                fixed[i] = t.clone(memory_format=torch.contiguous_format)
        return tuple(fixed)

    def merged(outs: list[Any], done: set[int]) -> set[int]:
        """The results of `made` but `done` (seen before, kept as they are) in memory that a result of another value
        holds: one of `done`, or one before it."""
        holders: dict[int, fx.Node] = {}
        found = set()
        # (the results seen before hold their memories first: one of symbolic sizes, empty on the first call, meets
        # them only on a later one, whatever their order)
        for i in sorted(made, key=lambda i: (i not in done, i)):
            if not isinstance(outs[i], torch.Tensor) or not outs[i].numel():  # (a size the graph returns: an int)
                continue
            memory = outs[i].untyped_storage()._cdata
            if holders.setdefault(memory, roots[i]) is not roots[i] and i not in done:
                if sum(r is roots[i] for r in roots.values()) > 1:
                    raise InternalError(
                        f"inductor returned result {i} of the fused program in another result's memory, and it "
                        "shares its value with a third: not separable by a copy (executor='exact' runs it)"
                    )
                found.add(i)
        return found

    def first(outs: list[Any], args: Any) -> None:
        inputs = inputs_memory(args)
        apart = merged(outs, set())
        state["copied"] |= apart.intersection(dense)
        state["restride"] = [
            (i, shape, stride)
            for i, shape, stride in layouts
            if any(n > 1 and a != b for n, a, b in zip(shape, outs[i].stride(), stride))
            or i in apart
            or i in made
            and outs[i].numel()
            and outs[i].untyped_storage()._cdata in inputs
        ]
        # After its first call (which ends inductor's autotune-cache bundling), the compiled graph's callable is
        # called directly: its wrapper only adds profiler labels and run-time metrics. (A graph without kernels
        # comes back as a plain function.)
        state["call"] = compiled if autograd else getattr(compiled, "current_callable", None) or compiled

    def learn(outs: list[Any], args: Any) -> None:
        inputs = inputs_memory(args)
        apart = merged(outs, set(made) - state["pending"])
        for i in [i for i in state["pending"] if outs[i].numel()]:
            state["pending"].discard(i)
            if outs[i].untyped_storage()._cdata in inputs or i in apart:
                state["copied"].add(i)

    # The call itself, one generated function of the steps this program has (no branch per call on what is fixed
    # when it is built: a prologue, float inputs, written inputs, autograd): ~0.3 us of a small call's ~10 us.
    # `settled` (a global of it) says that nothing is left to learn from a call and results come back as they are;
    # until then `after` runs the first call's and the learning steps.
    env: dict[str, Any] = {
        "call": compiled,  # (inductor's callable itself from the second call on: `first`)
        "settled": False,
        "prologue": prologue,
        "floats": floats,
        "scalar": torch.scalar_tensor,
        "float64": torch.float64,
        "is_grad_enabled": torch.is_grad_enabled,
        "set_grad_enabled": torch._C._set_grad_enabled,
        "increment_versions": increment_versions,
        "pick_written": pick_written,
    }

    def after(outs: list[Any], args: Any) -> Any:
        if state["call"] is None:
            first(outs, args)
            env["call"] = state["call"]
        if state["pending"]:
            learn(outs, args)
        if state["restride"] or dense:
            return restrided(outs)
        env["settled"] = not state["pending"]
        return tuple(outs)

    env["after"] = after
    if autograd:  # (AOTAutograd's function, which records autograd, called in the call's grad mode)
        body = ["outs = call(args)"]
    else:
        body = []
        if prologue is not None:
            body.append("args = (*args, *prologue(args))")
        if floats:  # (float inputs taken as 0-d float64 tensors: floats_as_tensors)
            body.append("args = tuple(scalar(a, dtype=float64) if i in floats else a for i, a in enumerate(args))")
        if any_requires_grad:
            # Autograd records nothing here (`unfusable`), but the aten kernels inductor falls back to would record
            # on inputs that require grad, through the detach() its decompositions dropped. A call that comes with
            # grad off (an optimizer's step: torch.optim runs it under no_grad) records nothing either: the switch
            # and its try are skipped (~0.2 us a call).
            body += [
                "if is_grad_enabled():",
                "    set_grad_enabled(False)",
                "    try:",
                "        outs = call(list(args))",
                "    finally:",
                "        set_grad_enabled(True)",
                "else:",
                "    outs = call(list(args))",
            ]
        else:
            # No input requires grad (a tensor's requires_grad is in every guard a call passes to reach this program:
            # dynamo's tensor match, the cache entry's tensor check, guards.lean_check), and nothing in the graph
            # makes a tensor requiring grad (`unfusable`: such a graph goes to fused_autograd.py): no kernel can
            # record autograd whatever the grad mode, so it is not switched (~0.3 us a call).
            body.append("outs = call(list(args))")
        if written and written == tuple(range(len(gm.graph.find_nodes(op="placeholder")))):
            # Every input written (an optimizer step: parameters, gradients, state; `args` holds the prologue's
            # inputs too by now): the call's own tuple, not a tuple of it picked again (~0.2 us of a 30-tensor step).
            body.append("increment_versions(args)")
        elif written:
            # Once per call, however many writes eager made (what autograd checks is only whether it moved).
            body.append("increment_versions(pick_written(args))")
    body += ["if settled:", "    return tuple(outs)", "return after(outs, args)"]
    src = "def run(*args):\n" + "".join(f"    {line}\n" for line in body)
    exec(compile(src, "<dealias fused call>", "exec"), env)  # noqa: S102 - generated from the steps above only
    run = env["run"]
    run.source = src
    return run


def picker(positions: tuple[int, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function of a sequence giving its elements at `positions` as a tuple (itemgetter's, which gives one
    element bare where there is one position)."""
    if len(positions) == 1:
        (only,) = positions
        return lambda args: (args[only],)
    return itemgetter(*positions) if positions else lambda args: ()


def result_layouts(gm: fx.GraphModule) -> tuple[list[tuple[int, tuple[int, ...], tuple[int, ...]]], list[int]]:
    """Eager's layout of each result, from the lowered graph (inductor's decompositions may change it: a constant
    came back as an expanded tensor, strides (0, 1, 0)): (result, sizes, strides) for those of static sizes, and
    the results of symbolic sizes, each dense. A result of static sizes comes back from inductor in the same
    layout on every call, so whether it must be restrided is learned on its first call; one of symbolic sizes
    (its layout a function of the call's symbols) is checked on each call, which only a dense one can be cheaply:
    Unfusable for any other."""
    layouts, dense = [], []
    for i, a in enumerate(gm.graph.output_node().args[0]):
        if not isinstance(a, fx.Node) or not isinstance(v := a.meta.get("val"), torch.Tensor):
            continue
        if not symbolic_layout(v):
            layouts.append((i, tuple(v.shape), tuple(v.stride())))
        elif _surely_dense(v):
            dense.append(i)
        else:
            raise Unfusable(f"result {i} has symbolic sizes and a layout other than a dense one")
    return layouts, dense


def _surely_dense(t: torch.Tensor) -> bool:
    """Whether `t` is contiguous for every value of its symbols (as `is_contiguous()`: dims of size 1 aside)."""
    expected: Any = 1
    for n, st in reversed(list(zip(t.shape, t.stride()))):
        if not (surely(n == 1) or surely(st == expected)):
            return False
        expected = expected * n
    return True


def _root(n: fx.Node) -> fx.Node:
    """The value the graph result `n` is a view of (itself where it is none)."""
    while is_view_node(n) and isinstance(n.args[0], fx.Node):
        n = n.args[0]
    return n


def made_by_the_graph(n: fx.Node) -> bool:
    """Whether the graph result `n` is memory the graph makes: not an input nor a view of one."""
    return _root(n).op != "placeholder"
