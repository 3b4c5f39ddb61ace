"""The fused executor: the lowered graph, its writes into the caller's memory included, compiled by inductor.

Inductor fuses a write's value into its store, so `buf[123] = row` becomes one kernel over the row's bytes and
`p.copy_(p - lr * g)` one kernel updating `p` in place. It is given the graph directly (no functionalization of
its own, which would turn the row write into a copy of the whole buffer).

Inductor alone is not safe on a graph that writes: it may compute a value where it is used rather than where
the program computed it. A value read from memory before a write to that memory and used after the write would
then read the new contents (`t = buf[0].clone(); buf[0] = buf[1]; buf[1] = t` gives two equal rows). The hazard
rule: such a value is materialized by `dealias::snapshot`, an op inductor cannot see into and runs as a kernel of
its own, in program order. `check_hazards` verifies the rule on every graph handed to inductor.

Index bounds are checked in a prologue, before any write: eager's error, the caller's tensors untouched.
What this path cannot run exactly stays on the torch executor, with the reason in the execution trace
(`unfusable` before lowering, `Unfusable` after): alias groups, random draws, symbolic sizes, ops that may raise
on their values, functional scatters and dtype views and `as_strided` (three things inductor gets wrong or ties
to one placement of the inputs), writes to memory that is not an input.

A graph autograd records (BatchNorm training with parameters that require grad) takes another way
(`fused_autograd_executor`): its functional graph, write-backs done by the epilogue after it as on the torch
executor, goes to inductor through AOTAutograd, which partitions it into a forward and a backward. The
partition is inductor's min-cut one, or AOTAutograd's default one (the forward saves what the graph computed,
nothing is recomputed from inputs) if the min-cut one saves an input the epilogue then writes into, and the
graph is refused if both do: eager saved the value before its write, and a saved caller tensor written
afterwards would make backward raise "modified by an inplace operation" where eager does not.

A short attention (a decode step: a few queries over at most 1,024 keys) is computed by matmuls and softmax
that inductor fuses, not by ATen's flash kernel, which is faster only on longer ones (measured).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from operator import getitem
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from ..errors import InternalError, node_location, with_location
from ..ir.checks import bounds_check, index_args, index_policy, indexed_write
from ..ir.gradops import bump_version
from ..ir.opfacts import OpKind, bind_args, facts, has_effect, is_view_node, may_raise, op_name
from ..ir.plan import alias_group_of

aten = torch.ops.aten


@torch.library.custom_op("dealias::snapshot", mutates_args=())
def snapshot(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` made where the program made `t`: inductor cannot move it past a later write."""
    return t.clone()


@snapshot.register_fake
def _(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t)


_SNAPSHOT = torch.ops.dealias.snapshot.default

# Ops inductor generates slower code for than ATen's kernel on this machine: on 1M floats, 1 and 2 threads,
# inductor/ATen = 1.36-1.38 for gelu and 1.16-1.18 for digamma (`python bench/keep_aten.py`; every other unary
# op, softmax and layer_norm measured 1.06 or less, most of them far less). Each is handed to inductor as an
# opaque twin that calls the ATen op, so inductor runs ATen's kernel for it and fuses the ops around it; only
# on tensors of KEEP_ATEN_MIN_NUMEL elements or more: on small ones a kernel of its own costs more than it
# saves (the decoder_step workload, MLP width 1024: 0.99x eager with ATen's gelu, 0.71x with inductor's).
KEEP_ATEN = (aten.gelu.default, aten.digamma.default)
KEEP_ATEN_MIN_NUMEL = 1 << 16
_LIB = torch.library.Library("dealias", "FRAGMENT")


def _aten_twin(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    """`dealias::aten_<name>`, with `op`'s schema and `op` as its kernel (for fake tensors too)."""
    name = f"aten_{op_name(op)}"
    _LIB.define(f"{name}{str(op._schema)[len(op._schema.name) :]}")
    _LIB.impl(name, op, "CompositeExplicitAutograd")
    return getattr(torch.ops.dealias, name).default


_TWINS = {op: _aten_twin(op) for op in KEEP_ATEN}


def unfusable(gm: fx.GraphModule) -> str | None:
    """Why the fused executor cannot run `gm` exactly, or None. "autograd records the graph" is returned only
    when no other reason holds (`fused_autograd_executor` can run such a graph)."""
    records = False
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            if alias_group_of(n) is not None:
                return "inputs share memory (an alias group)"
            if not isinstance(n.meta.get("val"), torch.Tensor):
                return "a symbolic scalar input"
            t = n.meta["val"]
            if any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride(), t.storage_offset())):
                return "symbolic sizes"
        if n.op != "call_function":
            continue
        records = records or bool(n.meta.get("rg"))  # (without it, grad mode switches change nothing)
        op = n.target
        if isinstance(op, torch._ops.OpOverload) and facts(op).nondeterministic and not _no_dropout(n):
            return f"{op} draws random numbers (inductor's generator is not eager's)"
        if not isinstance(op, torch._ops.OpOverload) and has_effect(op) and not _in_prologue(n):
            return f"{op_name(op)} runs in Python"
    return AUTOGRAD if records else None


AUTOGRAD = "autograd records the graph"


def _no_dropout(n: fx.Node) -> bool:
    """An op tagged random only for its dropout, called without it (attention with `dropout_p=0.0`)."""
    p = bind_args(n.target._schema, n.args, n.kwargs, defaults=True).get("dropout_p")
    return p is not None and p == 0


def _scatter(op: Any) -> bool:
    """A functional op computing its first argument with some elements replaced (`slice_scatter`, `index_put`,
    dealias's `as_strided_scatter_rel`), which inductor may run in place."""
    name = op_name(op)
    return name.endswith("scatter") or name.endswith("scatter_rel") or name in ("index_put", "index_copy")


def _in_prologue(n: fx.Node) -> bool:
    """Python steps of a graph that run before its compiled call: index bounds checks, and version bumps
    (`x.copy_(x)`: with no autograd recording in the graph, when the bump happens inside the call is not
    observable)."""
    return _is_bounds_check(n) or n.target is bump_version


def _is_bounds_check(n: fx.Node) -> bool:
    return getattr(n.target, "__name__", "") == "check_index_bounds"


class Unfusable(Exception):
    """The lowered graph holds what the fused executor cannot run exactly; the torch executor runs it."""


def _prologue(gm: fx.GraphModule) -> Callable[[tuple[Any, ...]], None] | None:
    """The graph's Python steps (`_in_prologue`), taken out of it, as one function of the call's inputs (None if
    it has none)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    checks = []
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and _scatter(n.target):
            # Inductor re-inplaces a functional scatter into its base and may read the base elsewhere in the
            # same kernel (`v.addcmul_(v.flip(0), ..)` over a scattered base read the flipped elements already
            # written). Only writes dealias lowered in place (checked by the hazard rule) are handed over.
            raise Unfusable(f"{n.target} writes a region functionally (a write not lowered in place)")
        if n.op == "call_function" and may_raise(n.target) and not indexed_write(n.target):
            # Inductor checks indices inside its kernels, after earlier kernels wrote the caller's memory, and
            # raises its own error. An index read from a graph input (`embedding(w, token)`, `x[idx]`) is checked
            # here instead, with eager's error, before anything runs; other value checks keep the graph unfused.
            checks += _read_checks(n, placeholders)
            continue
        if n.op != "call_function" or not _in_prologue(n):
            continue
        if n.target is bump_version:
            if n.args[0] not in placeholders:
                raise Unfusable("a version bump of a tensor made inside the graph")
            checks.append((n.target, placeholders.index(n.args[0]), ()))
        else:
            index, size, dim = n.args
            if index not in placeholders or isinstance(size, fx.Node):
                raise Unfusable("an index checked before any write is computed inside the graph")
            checks.append((n.target, placeholders.index(index), (size, dim)))
        gm.graph.erase_node(n)

    if not checks:
        return None

    def check(args: tuple[Any, ...]) -> None:
        for fn, i, rest in checks:
            fn(args[i], *rest)

    return check


def _read_checks(n: fx.Node, placeholders: list[fx.Node]) -> list[tuple[Any, int, tuple[Any, ...]]]:
    """Bounds checks of the index arguments of a read that raises on an index out of range (`checks.index_args`),
    each as (check, placeholder position, (size, dim)). Raises Unfusable where an index is computed inside the
    graph, a size is symbolic, or the op may raise on other values."""
    reads = index_args(n)
    if not reads or any(index not in placeholders for index, _, _ in reads):
        raise Unfusable(f"{n.target} may raise on values computed inside the graph (eager's error is not kept yet)")
    out = []
    for index, dim, negative in reads:
        indexed = n.args[0].meta["val"]
        size = indexed.shape[dim] if indexed.dim() > 0 else 1
        if not isinstance(size, int):
            raise Unfusable(f"{n.target} indexes a dimension of symbolic size")
        where = with_location(f" ({n.target})", node_location(n))
        out.append((bounds_check(index_policy(n, index, negative), where), placeholders.index(index), (size, dim)))
    return out


def _reads(gm: fx.GraphModule) -> dict[fx.Node, frozenset[fx.Node]]:
    """For each node, the placeholders whose memory its value may be computed from when inductor recomputes
    it at a use: through views and through values it may inline (anything but a snapshot)."""
    reads: dict[fx.Node, frozenset[fx.Node]] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            reads[n] = frozenset([n])
        elif n.op == "call_function" and n.target is not _SNAPSHOT:
            reads[n] = frozenset().union(*(reads.get(a, frozenset()) for a in n.all_input_nodes))
        else:
            reads[n] = frozenset()
    return reads


def _writes(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node]]:
    """(write, placeholder written) for each op writing a caller's memory, in program order."""
    return _memory(gm)[0]


def _memory(gm: fx.GraphModule) -> tuple[list[tuple[fx.Node, fx.Node]], dict[fx.Node, fx.Node]]:
    """The writes (see `_writes`), and the placeholder whose memory each alias (view, in-place result) is."""
    root: dict[fx.Node, fx.Node] = {}
    out = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            root[n] = n
        elif is_view_node(n) and n.args[0] in root:
            root[n] = root[n.args[0]]
        elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            for name in facts(n.target).mutated:
                arg = _arg(n, name)
                if arg is None:
                    continue
                if arg not in root:  # an attribute (inductor takes those for constants), or a decomposition's buffer
                    raise Unfusable(f"{n.target} writes {arg.name}, not an input of the graph")
                out.append((n, root[arg]))
                if _returns_written(n):
                    root[n] = root[arg]
    return out, root


def _returns_written(n: fx.Node) -> bool:
    """An in-place op returning the tensor it wrote (`copy_`, `index_put_`): its result is that memory."""
    return isinstance(n.target, torch._ops.OpOverload) and facts(n.target).kind is OpKind.INPLACE


def _alias(n: fx.Node) -> bool:
    return is_view_node(n) or _returns_written(n)


def _arg(n: fx.Node, name: str) -> fx.Node | None:
    v = bind_args(n.target._schema, n.args, n.kwargs).get(name)
    return v if isinstance(v, fx.Node) else None


def hazards(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node, bool]]:
    """(value, write, at_write): a value computed, not viewed, from a caller's memory before a write to that memory and
    used after it; or the write's own source, when it reads that memory anywhere but at the elements each
    element of the write receives (`x[1:] = x[:-1]`: one kernel would read what it already wrote; `at_write`)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    reads = _reads(gm)
    writes, root = _memory(gm)
    found = []
    for w, m in writes:
        for n in gm.graph.nodes:
            if order[n] >= order[w]:
                break
            if n.op != "call_function" or _alias(n) or n.target is _SNAPSHOT or m not in reads[n]:
                continue
            if any(order[u] > order[w] for u in n.users):
                found.append((n, w, False))
        written = _arg(w, facts(w.target).mutated[0])
        for a in w.all_input_nodes:
            if a is written or m not in reads[a]:
                continue
            if w.target is not aten.copy_.default or not _aligned(a, _layout(written), m, reads, root):
                found.append((a, w, True))
    for n in gm.graph.nodes:  # a functional scatter of a caller's memory from a decomposition: inductor may
        if n.op == "call_function" and _scatter(n.target) and n.args and n.args[0] in root:  # run it in place
            m = root[n.args[0]]
            found += [(a, n, True) for a in n.all_input_nodes if a is not n.args[0] and m in reads[a]]
    return found


def _layout(n: fx.Node) -> tuple[Any, ...]:
    t = n.meta["val"]
    return tuple(t.shape), tuple(t.stride()), t.storage_offset()


def _aligned(
    n: fx.Node, layout: tuple[Any, ...], m: fx.Node, reads: dict[fx.Node, frozenset[fx.Node]], root: dict
) -> bool:
    """Whether each element of `n` reads memory `m` only at the element of `layout` it is stored to: `n` is a
    view of `m` laid out as the written region, or an elementwise op (no broadcast of such a read) of such."""
    if root.get(n) is m:
        return _layout(n) == layout
    if m not in reads[n]:
        return True
    op = n.target
    if op is aten.copy.default:  # functional setitem: the values of its source, in its first argument's layout
        inputs = [n.args[1]]
    elif op is aten._to_copy.default or (isinstance(op, torch._ops.OpOverload) and torch.Tag.pointwise in op.tags):
        inputs = n.all_input_nodes
    else:
        return False
    shape = tuple(n.meta["val"].shape)
    return all(
        m not in reads[a] or (tuple(a.meta["val"].shape) == shape and _aligned(a, layout, m, reads, root))
        for a in inputs
        if isinstance(a, fx.Node)
    )


def merge_full_writes(gm: fx.GraphModule) -> int:
    """A caller's tensor written whole twice (`v.mul_(b2).addcmul_(g, g)`) gets one store of its final value:
    reads of the memory between the two writes read the first value instead, and the first store goes.
    Only when every such read is of the whole tensor by an op that computes (not a view, not a write).
    Returns how many stores were removed."""
    removed = 0
    changed = True
    while changed:
        changed = False
        writes, root = _memory(gm)
        nodes = list(gm.graph.nodes)
        order = {n: i for i, n in enumerate(nodes)}
        per_memory: dict[fx.Node, list[fx.Node]] = {}
        for w, m in writes:
            per_memory.setdefault(m, []).append(w)
        # Successive writes of one memory (writes of other tensors may come between: an optimizer updates a
        # parameter, then its moments, then the parameter again).
        pairs = [(w1, w2, m) for m, ws in per_memory.items() for w1, w2 in zip(ws, ws[1:])]
        for w1, w2, m1 in pairs:
            if not (_stores_whole(w1, m1) and _stores_whole(w2, m1)):
                continue
            between = nodes[order[w1] + 1 : order[w2]]
            readers = [n for n in between if any(root.get(a) is m1 for a in n.all_input_nodes)]
            if any(_alias(n) or n.op != "call_function" for n in readers):
                continue
            if any(_layout(a) != _layout(m1) for n in readers for a in n.all_input_nodes if root.get(a) is m1):
                continue
            value = w1.args[1]
            for n in readers:
                for a in [a for a in n.all_input_nodes if root.get(a) is m1]:
                    n.replace_input_with(a, value)
            w1.replace_all_uses_with(w1.args[0])
            gm.graph.erase_node(w1)
            removed += 1
            changed = True
            break
    return removed


def _stores_whole(w: fx.Node, m: fx.Node) -> bool:
    """`w` copies a value of `m`'s dtype and shape over all of `m`."""
    if w.target is not aten.copy_.default:
        return False
    dst, src = w.args[0].meta["val"], w.args[1].meta["val"]
    return _layout(w.args[0]) == _layout(m) and src.dtype == dst.dtype and src.shape == dst.shape


def insert_snapshots(gm: fx.GraphModule) -> int:
    """Remove each hazard: a value stored whole by the write it precedes (`m.copy_(m * b + g)`, then `m * b +
    g` read again) is read back from where it was stored, when nothing writes there later; any other is
    materialized where the program computed it. Returns how many snapshots were inserted."""
    count = 0
    while found := hazards(gm):
        value, write, at_write = found[0]
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        later = [u for u in value.users if order[u] > order[write]]
        if not at_write and _stored_whole(gm, value, write) and all(u.op != "output" for u in later):
            for u in later:
                u.replace_input_with(value, write.args[0])
            continue
        with gm.graph.inserting_after(value):
            snap = gm.graph.call_function(_SNAPSHOT, (value,))
        snap.meta["val"] = value.meta.get("val")
        value.replace_all_uses_with(snap, delete_user_cb=lambda u, s=snap: u is not s)
        count += 1
    return count


def _stored_whole(gm: fx.GraphModule, value: fx.Node, write: fx.Node) -> bool:
    """`write` copies all of `value`, unconverted, into memory no later op writes."""
    if write.target is not aten.copy_.default or write.args[1] is not value:
        return False
    dst, src = write.args[0].meta["val"], value.meta["val"]
    if dst.shape != src.shape or dst.dtype != src.dtype:
        return False
    writes = _writes(gm)
    root = next(m for w, m in writes if w is write)
    after = False
    for w, m in writes:
        if after and m is root:
            return False
        after = after or w is write
    return True


def check_hazards(gm: fx.GraphModule) -> None:
    """The invariant the fused executor relies on (see the module's docstring)."""
    found = hazards(gm)
    if found:
        value, write, _ = found[0]
        raise InternalError(f"fused graph reads {value.name} after {write.name} overwrote the memory it came from")


def fused_executor(gm: fx.GraphModule, example: list[Any]) -> Callable[..., Any]:
    """Compile the lowered graph `gm` (called with tensors like `example`) with inductor. Raises Unfusable."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table

    check = _prologue(gm)
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in _TWINS and n.meta["val"].numel() >= KEEP_ATEN_MIN_NUMEL:
            n.target = _TWINS[n.target]
        if _short_attention(n):
            n.target = _attention_by_matmuls
    gm.recompile()
    # Inductor's own decompositions (index_copy_ -> index_put_, ...), dealias's helpers traced to aten ops; each
    # node keeps the user's source line.
    with fx.traceback.preserve_node_meta(), torch.no_grad():  # nothing records autograd (`unfusable`)
        interpret = lambda *args: fx.Interpreter(gm).run(*args)  # noqa: E731
        traced = make_fx(interpret, decomposition_table=select_decomp_table(), tracing_mode="fake")(*example)
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
    # Inductor's kernels write the caller's tensors through pointers, which moves no version counter: the call
    # moves each written one itself, or what autograd saved of it before would be read as if unchanged.
    traced_inputs = traced.graph.find_nodes(op="placeholder")
    written = tuple(sorted({traced_inputs.index(ph) for _, ph in _writes(traced)}))  # (only inputs are written)
    merge_full_writes(traced)
    insert_snapshots(traced)
    check_hazards(traced)
    traced.recompile()
    handed = copy.deepcopy(traced)  # inductor's passes rewrite the graph they are given (no-op clones go)
    try:
        # No size/stride asserts in inductor's wrapper: every call's inputs have the traced sizes and strides (dynamo's
        # guards or the cache entry's tensor check held before the program runs).
        with torch._inductor.config.patch(size_asserts=False):
            compiled = compile_fx_inner(traced, list(example))
    except Exception as e:  # noqa: BLE001 - an op inductor cannot compile: the torch executor runs the graph
        raise Unfusable(f"inductor could not compile it: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    run = _runner(gm, compiled, check, written=written)
    run.graph = handed  # type: ignore[attr-defined]  # what inductor was given: for traces and tests
    return run


def _partition_saving_no_written_input(written: frozenset[int], copy_saved_results: bool) -> Any:
    """Inductor's custom partitioner: its own min-cut partition (which may recompute values from inputs in the
    backward) if it saves no input that AOTAutograd's default one (the forward saves what the graph computed, as
    eager does) does not save, else the default one; Unfusable if the one taken saves one of the `written` inputs
    (positions among the graph's placeholders). An input the min-cut partition alone saves would make backward
    raise if the caller writes it after the call (a buffer refilled before backward), where eager's goes on from
    what it saved. With `copy_saved_results`, a result the forward saves for backward is saved as a copy (see
    _save_copies_of_results). (Inductor is imported here, not when dealias is.)"""
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
    from torch._inductor.custom_graph_pass import CustomPartitionerFn

    def saved_inputs(fw: fx.GraphModule, num_fwd_outputs: int) -> set[int]:
        """The inputs the forward saves for backward, themselves or through a view of one (`x[0]`)."""
        primals = fw.graph.find_nodes(op="placeholder")  # (no parameters: the graph's inputs, in order)
        out = set()
        for s in fw.graph.output_node().args[0][num_fwd_outputs:]:
            while isinstance(s, fx.Node) and is_view_node(s):
                s = s.args[0]
            if s in primals:
                out.add(primals.index(s))
        return out

    class Partition(CustomPartitionerFn):
        def __call__(self, gm: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
            n = kwargs["num_fwd_outputs"]
            fw, bw = min_cut_rematerialization_partition(copy.deepcopy(gm), joint_inputs, **kwargs)
            kwargs.pop("compiler", None)
            default = default_partition(copy.deepcopy(gm), joint_inputs, **kwargs)
            saved, by_default = saved_inputs(fw, n), saved_inputs(default[0], n)
            if not saved <= by_default:
                (fw, bw), saved = default, by_default
            if saved & written:
                raise Unfusable(f"backward would save input {min(saved & written)}, which the epilogue writes into")
            if copy_saved_results:
                _save_copies_of_results(fw, n)
            return fw, bw

        def uuid(self) -> Any:  # inductor's graph cache key: a cached graph passed this check when compiled
            return (
                "dealias partition saving the inputs eager saves, none of",
                tuple(sorted(written)),
                copy_saved_results,
            )

    return Partition()


def _save_copies_of_results(fw: fx.GraphModule, num_fwd_outputs: int) -> None:
    """Make the forward `fw` save a copy of each result of the graph it saves for backward (exp's, sigmoid's). The
    compiled graph has one backward node for all its results, where eager has one per op: AOTAutograd's check of
    a saved result the caller wrote after the call would raise for a gradient through any result, where eager's
    exp backward runs only for a gradient through its own. On a copy, the check is dealias's pre-hook
    (_check_saved_results_at_backward), which asks where the gradient comes in."""

    def base(n: Any) -> Any:
        while isinstance(n, fx.Node) and is_view_node(n):
            n = n.args[0]
        return n

    outputs = list(fw.graph.output_node().args[0])
    results = {base(r) for r in outputs[:num_fwd_outputs]}  # (a view returned shares its base's counter)
    for k in range(num_fwd_outputs, len(outputs)):
        s = outputs[k]
        if base(s) in results and isinstance(s.meta.get("val"), torch.Tensor):
            with fw.graph.inserting_before(fw.graph.output_node()):
                copied = fw.graph.call_function(aten.clone.default, (s,))
            copied.meta = dict(s.meta)
            outputs[k] = copied
    fw.graph.output_node().args = (tuple(outputs),)
    fw.recompile()


def fused_autograd_executor(gm: fx.GraphModule, example: list[Any], written: frozenset[int]) -> Callable[..., Any]:
    """Compile the functional graph `gm`, which autograd records, with AOTAutograd and inductor; `written`: the
    placeholders written, by the epilogue after the graph or by a `copy_` at the graph's end (which AOTAutograd
    keeps in the compiled graph). Raises Unfusable."""
    from torch._inductor.compile_fx import compile_fx

    if any(isinstance(example[i], torch.Tensor) and example[i].requires_grad for i in written):
        raise Unfusable("an input that requires grad is written (a double backward could not recompute from it)")
    mode = torch.is_grad_enabled()  # the mode the program's calls enter with (keyed)
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            raise Unfusable("a constant of the program (AOTAutograd would lift it before the inputs)")
        if n.op == "call_function" and n.meta.get("grad", mode) != mode:
            # AOTAutograd records every op of the graph in the call's mode: an op eager ran under no_grad (or
            # enable_grad) would be recorded as the others (fuzz seed 962133: a result required grad).
            raise Unfusable(f"{op_name(n.target)} runs in another grad mode than the call")
        if n.op == "call_function" and not isinstance(n.target, torch._ops.OpOverload) and n.target is not getitem:
            raise Unfusable(f"{op_name(n.target)} runs in Python")
    handed = _without_input_writes(gm)  # (what a double backward recomputes, with eager's ops)
    results = gm.graph.output_node().args[0]
    # (A result the passes did not mark is taken to require grad: an input it reads is then never handed over
    # detached below.)
    rg_results = [i for i, n in enumerate(results) if isinstance(n, fx.Node) and n.meta.get("rg", True)]
    # An input requiring grad that no result requiring grad is computed from is handed over detached: the compiled
    # backward would give it zeros, not nothing, and run the backward of what made it (fuzz seed 964016: a custom
    # Function's `g * 3 + x` for a zero g gave the leaf 31, not eager's 3, whose graph never reaches that node).
    reaching = _results_reaching_inputs(gm, rg_results)
    cut = frozenset(
        i for i, a in enumerate(example) if isinstance(a, torch.Tensor) and a.requires_grad and not reaching[i]
    )
    example = [a.detach() if i in cut else a for i, a in enumerate(example)]
    try:
        partition = _partition_saving_no_written_input(written, copy_saved_results=len(rg_results) > 1)
        with torch._inductor.config.patch(size_asserts=False, custom_partitioner_fn=partition):
            compiled = compile_fx(copy.deepcopy(gm), list(example))
    except Exception as e:  # noqa: BLE001 - an op inductor cannot compile: the torch executor runs the graph
        cause = e
        while cause.__cause__ is not None and not isinstance(cause, Unfusable):
            cause = cause.__cause__
        if isinstance(cause, Unfusable):
            raise cause from None
        raise Unfusable(f"inductor could not compile it: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from e

    # Which inputs require grad is fixed per program (guarded), and so is the grad mode of its calls.
    builds_graph = any(isinstance(a, torch.Tensor) and a.requires_grad for a in example)
    if not builds_graph:
        if cut:  # (compiled for them detached: called so)
            detached = compiled
            compiled = lambda args: detached([a.detach() if i in cut else a for i, a in enumerate(args)])  # noqa: E731
        run = _runner(gm, compiled, None, autograd=True)
        run.graph = handed  # type: ignore[attr-defined]
        return run
    # The written inputs a result requiring grad is computed from: a double backward recomputes from copies taken
    # before the call writes them. And whether AOTAutograd's own Function can take the double backward (see
    # _recompute_double_backward), learned from a run on copies of the example inputs; else each call runs
    # inside a _TwiceDifferentiable, which costs more.
    reads = _written_inputs_read(gm, written)
    kept = tuple(frozenset().union(*(reads[i] for i in rg_results)))
    own, first = _double_backward_of_its_own(compiled, example)
    watched = _results_eager_saves(results, rg_results)
    # (every input's gradient coming from every result: nothing to set to None)
    partly = None if all(r == frozenset(rg_results) for i, r in enumerate(reaching) if i not in cut) else reaching

    def call(args: Any) -> Any:
        if cut:
            args = [a.detach() if i in cut else a for i, a in enumerate(args)]
        if not torch.is_grad_enabled():
            return compiled(*args)
        copies = {i: args[i].clone() for i in kept}
        if not own:
            outs = _TwiceDifferentiable.apply(compiled, handed, (copies, written), *args)  # (`handed`: eager's ops)
        else:
            outs = compiled(*args)
        _check_saved_results_at_backward(outs, watched)
        if partly is not None:
            _no_gradient_where_none_comes(outs, rg_results, partly, len(args))
        if not own:
            return outs
        # What a backward with create_graph=True recomputes from: the call's inputs, the copies, and the version
        # counters of the others.
        outs[first].grad_fn.dealias_recompute = (handed, args, copies, written, _versions(args))
        return outs

    run = _runner(gm, call, None, autograd=True)
    run.graph = handed  # type: ignore[attr-defined]
    return run


def _results_eager_saves(results: Any, rg_results: list[int]) -> list[tuple[int, fx.Node, frozenset[int]]]:
    """The results requiring grad (by position) whose memory eager's backward saves: made by an op that saves its
    result (`relu`, `y.relu_()`), or views of one. Eager's backward raises if the caller writes such a result after
    the call and a gradient then flows through the op; AOTAutograd's partition may save something else instead (a
    mask for relu) and would go on. With the op that saves it (for the message), and the results computed from
    it: a gradient into one of them flows through the op in eager."""
    from ..passes.saved import saves_its_result

    out = []
    for i in rg_results:
        n = results[i]
        while is_view_node(n) and isinstance(n.args[0], fx.Node):
            n = n.args[0]
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and saves_its_result(n):
            after = _computed_from(n)
            out.append((i, n, frozenset(j for j in rg_results if results[j] in after)))
    return out


def _check_saved_results_at_backward(outs: Any, watched: list[tuple[int, fx.Node, frozenset[int]]]) -> None:
    """Before the backward of this call's results runs, raise eager's error if a result eager saved (see
    _results_eager_saves) was written in place since and a gradient comes into a result computed from it (the
    backward node is one for the whole graph, where eager's are one per op). A detached alias shares the result's
    version counter without holding its history (no reference cycle through its grad_fn)."""
    if not watched:
        return
    kept = [(i, n, reached, outs[i].detach(), outs[i]._version) for i, n, reached in watched]

    def check(grad_outputs: Any) -> None:
        for i, n, reached, alias, version in kept:
            if alias._version != version and any(grad_outputs[j] is not None for j in reached):
                raise RuntimeError(
                    with_location(
                        "one of the variables needed for gradient computation has been modified by an inplace "
                        f"operation: [{alias.type()} {list(alias.shape)}], which is output {i} of a graph dealias "
                        f"fused, saved for backward by {op_name(n.target)} as in eager, is at version "
                        f"{alias._version}; expected version {version} instead",
                        node_location(n),
                    )
                )

    node = next((o.grad_fn for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None), None)
    if node is not None:  # (one node for every result requiring grad)
        node.register_prehook(check)


def _results_reaching_inputs(gm: fx.GraphModule, rg_results: list[int]) -> list[frozenset[int]]:
    """For each placeholder (by position), the results requiring grad computed from it."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    results = gm.graph.output_node().args[0]
    reached = [_computed_from(p) for p in placeholders]
    return [frozenset(j for j in rg_results if results[j] in after) for after in reached]


def _computed_from(n: fx.Node) -> set[fx.Node]:
    """`n` and every node computed from it."""
    after, todo = {n}, [n]
    while todo:
        for u in todo.pop().users:
            if u not in after:
                after.add(u)
                todo.append(u)
    return after


def _no_gradient_where_none_comes(outs: Any, rg_results: list[int], reaching: Any, num_args: int) -> None:
    """An input none of whose results received a gradient gets None from this call's backward node, as from
    eager's: the compiled backward, one node for all results, gives it zeros (fuzz seed 964788: with
    `allow_unused`, a leaf's gradient was zeros where eager's is None)."""

    def post(grad_inputs: Any, grad_outputs: Any) -> Any:
        given = {j for j in rg_results if grad_outputs[j] is not None}
        shift = len(grad_inputs) - num_args  # (_TwiceDifferentiable's own arguments come first)
        return tuple(None if k >= shift and not (reaching[k - shift] & given) else g for k, g in enumerate(grad_inputs))

    node = next((o.grad_fn for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None), None)
    if node is not None:  # (one node for every result requiring grad)
        node.register_hook(post)


def _without_input_writes(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of `gm` without its `copy_` into placeholders (see writeback.whole_writes_in_graph)."""
    out = copy.deepcopy(gm)
    for n in list(out.graph.nodes):
        if n.op == "call_function" and n.target is aten.copy_.default and n.args[0].op == "placeholder":
            out.graph.erase_node(n)
    out.recompile()
    return out


def _double_backward_of_its_own(compiled: Any, example: list[Any]) -> tuple[bool, int]:
    """Whether AOTAutograd's Function in `compiled` can take dealias's double backward (`_takes_double_backward`),
    asked of a run on copies of the example inputs (the graph may write its inputs); and which result's backward
    node is its own (the first requiring grad)."""
    copies = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in example]
    with torch.enable_grad():
        outs = compiled(*copies)
    first = next((i for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad), None)
    if first is None:
        return False, 0
    return _takes_double_backward(outs[first].grad_fn, copies, outs), first


def _versions(args: Any) -> list[int]:
    return [a._version for a in args]  # (a fused graph's inputs are tensors)


def _takes_double_backward(node: Any, args: Any, outs: Any) -> bool:
    """Whether the backward node `node` of AOTAutograd's Function (outputs `outs`, inputs `args`) is one whose class
    can run dealias's recompute for a backward with create_graph=True (`_recompute_double_backward`): every result
    requiring grad is one of its outputs, its inputs are `args` in order, and it mutates and aliases nothing. Its
    class is then given a backward that does so; its first-order backward stays AOTAutograd's."""
    cls = getattr(type(node), "_forward_cls", None)
    meta = getattr(cls, "metadata", None)
    if meta is None or meta.num_intermediate_bases or meta.tokens:
        return False
    # (An input write AOTAutograd keeps in the compiled graph has no output of its own; others would.)
    if any(
        i.mutates_metadata or i.mutates_data and i.mutation_type.name != "MUTATED_IN_GRAPH" for i in meta.input_info
    ):
        return False
    if len(meta.output_info) != len(outs) or any(o.output_type.name != "non_alias" for o in meta.output_info):
        return False
    if any(o.requires_grad and o.grad_fn is not node for o in outs) or len(node.next_functions) != len(args):
        return False
    for (fn, _), a in zip(node.next_functions, args):  # input i's gradient goes to args[i]'s history
        if not isinstance(a, torch.Tensor) or not a.requires_grad:
            expected = fn is None
        elif a.grad_fn is not None:
            expected = fn is a.grad_fn
        else:  # a leaf: its gradient accumulator
            expected = getattr(fn, "variable", None) is a
        if not expected:
            return False
    if not getattr(cls, "dealias_double_backward", False):
        first_order, boxed = cls.backward, getattr(cls, "boxed_grads_call", False)

        def backward(ctx: Any, *grads: Any) -> Any:
            if torch.is_grad_enabled() and hasattr(ctx, "dealias_recompute"):
                ctx.saved_tensors  # noqa: B018 - raises eager's error if a backward freed the graph
                return _recompute_double_backward(*ctx.dealias_recompute, grads[0] if boxed else grads)
            result = first_order(ctx, *grads)
            if not torch._C._autograd._get_current_graph_task_keep_graph():  # the graph is freed: so are the inputs
                ctx.__dict__.pop("dealias_recompute", None)
            return result

        cls.backward = staticmethod(backward)
        cls.dealias_double_backward = True
    return True


def _recompute_double_backward(
    graph: fx.GraphModule, args: Any, copies: dict[int, torch.Tensor], written: Any, versions: Any, grads: Any
) -> tuple[Any, ...]:
    """A backward with create_graph=True of a fused graph: the gradient must be differentiable in turn, which
    AOTAutograd's compiled backward is not. The graph runs again with eager's ops, from the call's inputs (of those
    written since by the epilogue, the copies taken before), and is differentiated with create_graph. An input
    written in place since the call makes it raise, naming the input: never a gradient of other values."""
    moved = next((i for i, a in enumerate(args) if i not in written and a._version != versions[i]), None)
    if moved is not None:
        raise RuntimeError(
            f"dealias: a backward with create_graph=True recomputes this fused graph from its inputs, and input "
            f"{moved} was modified in place since the call; compile with executor='torch' to differentiate it "
            "twice after such a write"
        )
    inputs = [copies.get(i, a) for i, a in enumerate(args)]
    with torch.enable_grad():
        outs = graph(*inputs)
    diff = [i for i, g in enumerate(grads) if g is not None and outs[i].requires_grad]
    wrt = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and a.requires_grad]
    differentiated, given = [outs[i] for i in diff], [grads[i] for i in diff]
    got = torch.autograd.grad(differentiated, [inputs[i] for i in wrt], given, create_graph=True, allow_unused=True)
    result: list[Any] = [None] * len(inputs)
    for k, i in enumerate(wrt):
        result[i] = got[k]
    return tuple(result)


def _written_inputs_read(gm: fx.GraphModule, written: frozenset[int]) -> list[frozenset[int]]:
    """For each result of `gm`, the `written` placeholders (by position) it is computed from. A result of a
    multi-output op is computed from the arguments its own output depends on in the op's decomposition (batch
    norm's output in training does not read the running statistics it updates); of other ops, from all."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    reads: dict[fx.Node, frozenset[int]] = {p: frozenset({i} & written) for i, p in enumerate(placeholders)}
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        source = n.args[0] if n.target is getitem and isinstance(n.args[0], fx.Node) else None
        if source is not None and any(reads.get(a) for a in source.all_input_nodes):
            depends = _output_dependence(source)
            if depends is not None:
                reads[n] = frozenset().union(*(reads.get(a, frozenset()) for a in depends[n.args[1]]))
                continue
        reads[n] = frozenset().union(*(reads.get(a, frozenset()) for a in n.all_input_nodes))
    return [
        reads.get(a, frozenset()) if isinstance(a, fx.Node) else frozenset() for a in gm.graph.output_node().args[0]
    ]


def _output_dependence(n: fx.Node) -> list[set[fx.Node]] | None:
    """For each output of the multi-output aten op `n`, the argument nodes it is computed from, read off the
    op's decomposition traced on meta tensors of the arguments' layouts; None if there is none to trace (no
    decomposition, symbolic sizes)."""
    from torch._decomp import decomposition_table

    op = n.target
    if not isinstance(op, torch._ops.OpOverload) or op not in decomposition_table:
        return None
    flat, spec = torch.utils._pytree.tree_flatten((n.args, n.kwargs))
    nodes = [a for a in flat if isinstance(a, fx.Node)]
    vals = [a.meta.get("val") for a in nodes]
    if not all(isinstance(v, torch.Tensor) and not _symbolic(v) for v in vals):
        return None
    metas = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta") for v in vals]

    def run(*tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        args, kwargs = torch.utils._pytree.tree_unflatten(
            [next(it) if isinstance(a, fx.Node) else a for a in flat], spec
        )
        return tuple(op(*args, **kwargs))

    try:
        traced = make_fx(run, decomposition_table={op: decomposition_table[op]})(*metas)
    except Exception:  # noqa: BLE001 - a decomposition that does not trace here: every output reads every argument
        return None
    inputs = traced.graph.find_nodes(op="placeholder")
    reach: dict[fx.Node, set[int]] = {p: {i} for i, p in enumerate(inputs)}
    for m in traced.graph.nodes:
        if m.op not in ("placeholder", "output"):
            reach[m] = set().union(*(reach.get(a, set()) for a in m.all_input_nodes))
    outs = traced.graph.output_node().args[0]
    return [{nodes[i] for i in reach.get(o, set())} if isinstance(o, fx.Node) else set() for o in outs]


def _symbolic(v: torch.Tensor) -> bool:
    return any(isinstance(d, torch.SymInt) for d in (*v.shape, *v.stride()))


class _TwiceDifferentiable(torch.autograd.Function):
    """AOTAutograd's compiled function inside a Function of dealias's, where its own Function cannot be given
    dealias's double backward (`_takes_double_backward`). Its own backward raises when differentiated
    again ("does not currently support double backward"), where eager's and the torch executor's do not. A
    first-order backward here runs the compiled backward; a backward that records a graph (`create_graph=True`)
    recomputes the graph with eager's ops, from the inputs as the call had them, and differentiates that, which
    can be differentiated again. Written inputs (none of which requires grad) are copied before the epilogue
    writes them, if a result that requires grad is computed from them (`reads`, per result: batch norm's output
    in training is not computed from the running statistics it updates, so nothing is copied). Other inputs are
    read as they are then, through aliases keeping their sizes and strides; one written in place since the call
    (a version counter moved) makes that backward raise, where eager's raises if it saved the tensor and would
    otherwise use what it saved (a mask computed from it, say): never a gradient from the new values. (It raises
    also where eager saved nothing of that input and goes on: which inputs the gradient's values depend on is
    not known here.)"""

    @staticmethod
    def forward(ctx: Any, compiled: Any, graph: fx.GraphModule, facts: Any, *args: Any) -> Any:
        copies, written = facts  # (copies of written inputs, taken before the graph writes them)
        leaves = [a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args]
        with torch.enable_grad():
            outs = compiled(*leaves)
        ctx.outs, ctx.leaves, ctx.graph = outs, leaves, graph
        ctx.args = [
            a if not isinstance(a, torch.Tensor) or a.requires_grad else copies[i] if i in copies else a.detach()
            for i, a in enumerate(args)
        ]
        ctx.versions = [(i, a._version) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in written]
        returned = tuple(o.detach() for o in outs)
        ctx.mark_non_differentiable(*[r for r, o in zip(returned, outs) if not o.requires_grad])
        return returned

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        if getattr(ctx, "freed", False):  # (nothing is saved with save_for_backward here: say it as autograd does)
            raise RuntimeError(
                "Trying to backward through the graph a second time (or directly access saved tensors after they "
                "have already been freed). Specify retain_graph=True if you need to backward a second time."
            )
        ctx.freed = not torch._C._autograd._get_current_graph_task_keep_graph()
        diff = [i for i, o in enumerate(ctx.outs) if o.requires_grad]
        wrt = [i for i, a in enumerate(ctx.leaves) if isinstance(a, torch.Tensor) and a.requires_grad]
        given = [grads[i] for i in diff]
        if torch.is_grad_enabled():  # create_graph=True: the gradient must be differentiable in turn
            moved = next((i for i, v in ctx.versions if ctx.args[i]._version != v), None)
            if moved is not None:
                raise RuntimeError(
                    f"dealias: a backward with create_graph=True recomputes this fused graph from its inputs, and "
                    f"input {moved} was modified in place since the call; compile with executor='torch' to "
                    "differentiate it twice after such a write"
                )
            with torch.enable_grad():
                outs = ctx.graph(*ctx.args)
            got = torch.autograd.grad(
                [outs[i] for i in diff], [ctx.args[i] for i in wrt], given, create_graph=True, allow_unused=True
            )
        else:  # (the compiled graph is kept: backward may be called again with retain_graph)
            outs = [ctx.outs[i] for i in diff]
            got = torch.autograd.grad(outs, [ctx.leaves[i] for i in wrt], given, retain_graph=True, allow_unused=True)
        result: list[Any] = [None] * len(ctx.leaves)
        for k, i in enumerate(wrt):
            result[i] = got[k]
        return (None, None, None, *result)


# Attention a few queries long over a short key sequence (a decode step) runs faster as inductor's matmuls and
# softmax than as ATen's flash kernel for CPU: 0.89x at 1 query over 1,024 keys, but 1.16-3.2x at 4,096 keys
# (measured: 16 heads of 64, 1 and 2 threads). Longer ones keep the flash kernel.
SHORT_ATTENTION_KEYS = 1024
SHORT_ATTENTION_QUERIES = 16
_FLASH_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default


def _short_attention(n: fx.Node) -> bool:
    """A flash attention call short enough to run by matmuls, whose logsumexp (for backward) nobody reads."""
    if n.op != "call_function" or n.target is not _FLASH_CPU:
        return False
    q, k = n.args[0].meta["val"], n.args[1].meta["val"]
    used = all(u.target is getitem and u.args[1] == 0 for u in n.users)
    return used and q.shape[-2] <= SHORT_ATTENTION_QUERIES and k.shape[-2] <= SHORT_ATTENTION_KEYS


def _attention_by_matmuls(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The flash kernel's result computed by torch's own decomposition of it (matmuls, softmax), which make_fx
    traces into the graph inductor fuses. Its second result is not the logsumexp (`_short_attention`: unread)."""
    return torch._decomp.decomposition_table[_FLASH_CPU](*args, **kwargs)


def _runner(
    gm: fx.GraphModule,
    compiled: Any,
    check: Callable[[tuple[Any, ...]], None] | None,
    autograd: bool = False,
    written: tuple[int, ...] = (),
) -> Callable[..., Any]:
    """The call of a compiled graph: prologue, inductor's callable (without autograd, unless it is AOTAutograd's
    and records it), the version counters of the inputs it wrote (`written`) moved, results in eager's layout."""
    # Eager's layout of each result, from the lowered graph (inductor's decompositions may change it: a constant
    # came back as an expanded tensor, strides (0, 1, 0)). Sizes are static (`unfusable`), so inductor gives each
    # result the same layout on every call: whether one must be restrided is learned on the first call.
    out_node = gm.graph.output_node()
    layouts = [
        (i, tuple(v.shape), tuple(v.stride()))
        for i, a in enumerate(out_node.args[0])
        if isinstance(a, fx.Node) and isinstance(v := a.meta.get("val"), torch.Tensor)
    ]
    state: dict[str, Any] = {"call": None, "restride": layouts}  # call: None until the first call returned

    def restrided(outs: list[Any]) -> Any:
        fixed = list(outs)
        for i, shape, stride in state["restride"]:  # (only results whose layout differs, since the first call)
            t = fixed[i]
            fixed[i] = torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device).copy_(t)
        return tuple(fixed)

    def first(outs: list[Any]) -> None:
        state["restride"] = [
            (i, shape, stride)
            for i, shape, stride in layouts
            if any(n > 1 and a != b for n, a, b in zip(shape, outs[i].stride(), stride))
        ]
        # After its first call (which ends inductor's autotune-cache bundling), the compiled graph's callable is
        # called directly: its wrapper only adds profiler labels and run-time metrics. (A graph without kernels
        # comes back as a plain function.)
        state["call"] = compiled if autograd else getattr(compiled, "current_callable", None) or compiled

    def run(*args: Any) -> Any:
        if autograd:
            outs = compiled(args)
            if state["call"] is None:
                first(outs)
            return restrided(outs) if state["restride"] else tuple(outs)
        if check is not None:
            check(args)
        # Autograd records nothing here (`unfusable`), but the aten kernels inductor falls back to would record
        # on inputs that require grad, through the detach() its decompositions dropped.
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        call = state["call"]
        try:
            outs = (call or compiled)(list(args))
        finally:
            torch._C._set_grad_enabled(grad)
        if written:
            # Once per call, however many writes eager made (what autograd checks is only whether it moved).
            torch._C._increment_version(tuple(args[i] for i in written))
        if call is None:
            first(outs)
        return restrided(outs) if state["restride"] else tuple(outs)

    return run
