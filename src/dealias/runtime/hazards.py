"""The hazard rule of the fused executor: what inductor may not be handed as it is, and the snapshots that make it
safe.

Inductor alone is not safe on a graph that writes: it may compute a value where it is used rather than where
the program computed it. A value read from memory before a write to that memory and used after the write would
then read the new contents (`t = buf[0].clone(); buf[0] = buf[1]; buf[1] = t` gives two equal rows). The hazard
rule: such a value is materialized by `dealias::snapshot`, which inductor lowers to ATen's clone into a buffer of
its own where the program has it (compat/inductor.py; never fused), never recomputed after the write; or, where
every later write of what it reads stores each element where the value read it (`_fusable`), by
`dealias::aligned_snapshot`, a copy inductor generates and may fuse with those writes (in registers).
`check_hazards` verifies the rule on every graph handed to inductor. Here too: which memory each node is
(`memory_of`), what it is computed from (`reads_of`), and one store for a tensor written whole twice
(`merge_full_writes`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from operator import getitem
from typing import Any

import torch
import torch.fx as fx

from ..errors import InternalError
from ..ir.opfacts import OpKind, bind_args, facts, is_view_node, op_name
from ..ir.sharing import has_symbols, overlaps
from ..ir.viewops import same_layout, surely

aten = torch.ops.aten


@torch.library.custom_op("dealias::snapshot", mutates_args=())
def snapshot(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` made where the program made `t`: inductor cannot move it past a later write."""
    return t.clone()


@snapshot.register_fake
def _(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t)


@snapshot.register_autograd
def _(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    return grad  # (a copy: fused_autograd keeps a clone of an input as one, for what backward saves)


SNAPSHOT = torch.ops.dealias.snapshot.default


@torch.library.custom_op("dealias::aligned_snapshot", mutates_args=())
def aligned_snapshot(t: torch.Tensor) -> torch.Tensor:
    """A snapshot (the same copy) that inductor may fuse with the writes after it: inserted only where every later
    write of memory `t` reads stores each element where `t`'s element at the same position read it, or apart
    from what `t` reads (`_fusable`), so one loop computing the copy and those writes element by element reads
    each element before it stores it. compat/inductor.py lowers it to a copy inductor generates (in registers
    when fused), where `snapshot` is ATen's clone, a kernel of its own."""
    return t.clone()


@aligned_snapshot.register_fake
def _(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t)


ALIGNED_SNAPSHOT = torch.ops.dealias.aligned_snapshot.default
SNAPSHOTS = frozenset([SNAPSHOT, ALIGNED_SNAPSHOT])  # (values read from their own buffer, never recomputed)


class Unfusable(Exception):
    """The lowered graph holds what the fused executor cannot run exactly; the torch executor runs it."""


def is_scatter(op: Any) -> bool:
    """A functional op computing its first argument with some elements replaced (`slice_scatter`, `index_put`,
    dealias's `as_strided_scatter_rel`), which inductor may run in place."""
    name = op_name(op)
    return name.endswith("scatter") or name.endswith("scatter_rel") or name in ("index_put", "index_copy")


def reads_of(gm: fx.GraphModule) -> dict[fx.Node, frozenset[fx.Node]]:
    """For each node, the placeholders whose memory its value may be computed from when inductor recomputes
    it at a use: through views and through values it may inline (anything but a snapshot)."""
    reads: dict[fx.Node, frozenset[fx.Node]] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            reads[n] = frozenset([n])
        elif n.op == "call_function" and n.target is aten.copy_.default:
            # Inductor's copy_ stores its source into the destination's memory and returns that memory: a later
            # read of its result loads the stored elements, it never recomputes the source.
            reads[n] = reads.get(n.args[0], frozenset())
        elif n.op == "call_function" and n.target in _METADATA:
            reads[n] = frozenset()  # (a size: no write changes it; `n - 1` of it is no value of the memory)
        elif foreach_element(n) is not None:
            reads[n] = frozenset().union(*(reads.get(a, frozenset()) for a in foreach_element(n)[0]))
        elif n.op == "call_function" and n.target not in SNAPSHOTS:
            reads[n] = frozenset().union(*(reads.get(a, frozenset()) for a in n.all_input_nodes))
        else:
            reads[n] = frozenset()
    return reads


def _is_foreach(n: Any) -> bool:
    return (
        isinstance(n, fx.Node)
        and n.op == "call_function"
        and isinstance(n.target, torch._ops.OpOverload)
        and n.target._schema.name.startswith("aten::_foreach_")
        and not facts(n.target).mutated
    )


def foreach_element(n: fx.Node) -> tuple[list[fx.Node], list[fx.Node]] | None:
    """For `getitem(_foreach_op(..), i)`: (what element i is computed from, those of them taken whole), or None.
    A foreach op computes its i-th result from the i-th tensor of each list it takes and from its arguments that
    are not lists (a scalar tensor, `_foreach_addcdiv`'s tensor of scalars): only those, not every tensor of the
    lists. Without this every result read all the memory of its lists, and an optimizer step's writes of the
    first parameter made a hazard of every other parameter's new value (Adam: 40 snapshots for 10 parameters)."""
    if n.op != "call_function" or n.target is not getitem or not _is_foreach(n.args[0]):
        return None
    op, i = n.args
    results = op.meta.get("val")
    element, whole = [], []
    for a in [*op.args, *op.kwargs.values()]:
        if isinstance(a, (list, tuple)) and isinstance(results, (list, tuple)) and len(a) == len(results):
            element += [a[i]] if isinstance(a[i], fx.Node) else []
        elif isinstance(a, (list, tuple)):  # (not a list of one item per result: read whole, to be safe)
            whole += [x for x in a if isinstance(x, fx.Node)]
        elif isinstance(a, fx.Node):
            whole.append(a)
    return element + whole, whole


def writes_of(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node]]:
    """(write, placeholder written) for each op writing a caller's memory, in program order."""
    return memory_of(gm)[0]


def memory_of(gm: fx.GraphModule) -> tuple[list[tuple[fx.Node, fx.Node]], dict[fx.Node, fx.Node]]:
    """The writes (see `writes_of`), and the placeholder whose memory each alias (view, in-place result) is."""
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


def hazards(gm: fx.GraphModule) -> Iterator[tuple[fx.Node, fx.Node, bool]]:
    """(value, write, at_write): a value computed, not viewed, from a caller's memory before a write to that memory and
    used after it, directly or through a view of it made before the write; or the write's own source, when it reads
    that memory anywhere but at the elements each element of the write receives or elements the write does not touch
    (`x[1:] = x[:-1]`: one kernel would read what it already wrote; `at_write`).
    In the order of the writes, each write's values in program order. Lazily: `insert_snapshots` removes one at a
    time and asks again, so the first is found without scanning the graph per write (the values computed from each
    memory, with the running maximum of their last uses' positions: the first value before a write used after it
    is found by bisection), which made this pass cubic in the program's length (a 300-statement program: 9 s)."""
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    reads = reads_of(gm)
    writes, root = memory_of(gm)
    # per memory: the values computed from it (not views, writes or snapshots) in program order, their positions,
    # and the running maximum of their last uses' positions
    values: dict[fx.Node, list[fx.Node]] = {}
    positions: dict[fx.Node, list[int]] = {}
    last_uses: dict[fx.Node, list[int]] = {}
    reach: dict[fx.Node, list[int]] = {}
    through = _last_uses_through_views(nodes, order)
    for n in nodes:
        if n.op != "call_function" or n.target in SNAPSHOTS or not reads[n] or _alias(n):
            continue
        last = through[n]
        for m in reads[n]:
            values.setdefault(m, []).append(n)
            positions.setdefault(m, []).append(order[n])
            last_uses.setdefault(m, []).append(last)
            running = reach.setdefault(m, [])
            running.append(max(last, running[-1]) if running else last)
    for w, m in writes:
        at = order[w]
        before = bisect.bisect_left(positions.get(m, []), at)  # (the values computed before the write)
        first = bisect.bisect_right(reach.get(m, []), at, 0, before)  # (the first one used after it, if any)
        for i in range(first, before):
            if last_uses[m][i] > at:
                yield values[m][i], w, False
        written = _arg(w, facts(w.target).mutated[0])
        for a in w.all_input_nodes:
            if a is written or m not in reads[a]:
                continue
            if w.target is not aten.copy_.default or not _in_place(a, written.meta["val"], m, reads, root):
                yield a, w, True
    for n in nodes:  # a functional scatter of a caller's memory from a decomposition: inductor may
        if n.op == "call_function" and is_scatter(n.target) and n.args and n.args[0] in root:  # run it in place
            m = root[n.args[0]]
            yield from ((a, n, True) for a in n.all_input_nodes if a is not n.args[0] and m in reads[a])


# A tensor's size, stride, numel or offset: no write changes them, and a snapshot of the SymInt (a dynamic
# shape's `n = x.shape[0]` before a write, used after it) failed inductor's compile (the program ran unfused).
_METADATA = frozenset([aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default])


def _in_place(a: fx.Node, layout: torch.Tensor, m: fx.Node, reads: dict, root: dict) -> bool:
    """Whether a write's source `a` may be computed in the kernel storing it (`_aligned` or `_apart`). The memos:
    a source built as a diamond-shaped DAG (`a, b = b, a + b` in a loop) has exponentially many paths (20 steps
    took minutes of a compile). A source deeper than Python's recursion limit (a chain of some 300 ops) keeps its
    copy: a missed fusion, not a failed compile."""
    try:
        return _aligned(a, layout, m, reads, root, {}) or _apart(a, layout, m, reads, root, {})
    except RecursionError:
        return False


def _last_uses_through_views(nodes: list[fx.Node], order: dict[fx.Node, int]) -> dict[fx.Node, int]:
    """Each node's last use, where a use by a view of it counts as that view's own last use: a view made before a
    write (`r = a[0]` of `a = buf.clone()`, `r.sum()` before `buf[0] = buf[1]`) and read after it reads the value
    there, and inductor may compute the value there too (`r.neg()` read the new `buf[0]`)."""
    last: dict[fx.Node, int] = {}
    for n in reversed(nodes):
        uses = [order[u] for u in n.users]
        uses += [last[u] for u in n.users if is_view_node(u) and u.args[0] is n]  # (split(..)[i]: of the split)
        last[n] = max(uses, default=-1)
    return last


# Layouts and shapes are compared for every value of the program's symbols (`surely`): a comparison that held only
# for the compiling call would add a guard to the program, or decide for calls it does not hold for.
def _same_layout(a: fx.Node, b: fx.Node) -> bool:
    return same_layout(a.meta["val"], b.meta["val"])


def _same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dim() == b.dim() and all(surely(x == y) for x, y in zip(a.shape, b.shape))


def _aligned(
    n: fx.Node,
    layout: torch.Tensor,
    m: fx.Node,
    reads: dict[fx.Node, frozenset[fx.Node]],
    root: dict,
    memo: dict | None = None,
) -> bool:
    """Whether each element of `n` reads memory `m` only at the element of `layout` (the written region's value)
    it is stored to: `n` is a view of `m` laid out as the written region, or an elementwise op (no broadcast of
    such a read) of such. `memo`: the answers for this layout and memory so far (`_in_place`)."""
    memo = {} if memo is None else memo
    if n not in memo:
        memo[n] = _aligned_uncached(n, layout, m, reads, root, memo)
    return memo[n]


def _aligned_uncached(n: fx.Node, layout: torch.Tensor, m: fx.Node, reads: dict, root: dict, memo: dict) -> bool:
    if root.get(n) is m:  # (or elements the write does not touch: `_apart`)
        # (sizes, strides and offset count elements of each tensor's own dtype: laid out alike, a float16 view of a
        # float32 buffer reads other bytes at each position than the write stores there)
        v = n.meta["val"]
        return (same_layout(v, layout) and v.element_size() == layout.element_size()) or _disjoint(v, layout)
    if m not in reads[n]:
        return True
    op = n.target
    element = foreach_element(n)
    if element is not None:  # one result of a foreach op: its elementwise op over the i-th tensor of each list
        inputs, whole = element
        if op_name(n.args[0].target).removeprefix("_foreach_") not in FOREACH_ELEMENTWISE:
            return False
        if any(m in reads[a] for a in whole):  # (a tensor every result reads, at other elements than its own)
            return False
    elif op is aten.copy.default:  # functional setitem: the values of its source, in its first argument's layout
        inputs = [n.args[1]]
    elif op is aten._to_copy.default or (isinstance(op, torch._ops.OpOverload) and torch.Tag.pointwise in op.tags):
        inputs = n.all_input_nodes
    else:
        return False
    return all(
        m not in reads[a] or (_same_shape(a.meta["val"], n.meta["val"]) and _aligned(a, layout, m, reads, root, memo))
        for a in inputs
        if isinstance(a, fx.Node)
    )


def _apart(
    n: fx.Node,
    layout: torch.Tensor,
    m: fx.Node,
    reads: dict[fx.Node, frozenset[fx.Node]],
    root: dict,
    memo: dict | None = None,
) -> bool:
    """Whether `n` reads memory `m` only through views sharing no element with `layout` (the written region): its
    value is the same computed before, during or after the write, so one kernel may store the write's elements
    while it loads these. A red-black Gauss-Seidel sweep writes one colour of a grid from its neighbours, the
    other colour (`c.copy_((up + down + left + right) * 0.25)`, strided views of one buffer): without this the
    source was computed into a buffer, snapshotted (a clone through ATen) and copied into the grid, each colour.
    `memo` as `_aligned`'s."""
    memo = {} if memo is None else memo
    if n not in memo:
        memo[n] = _apart_uncached(n, layout, m, reads, root, memo)
    return memo[n]


def _apart_uncached(n: fx.Node, layout: torch.Tensor, m: fx.Node, reads: dict, root: dict, memo: dict) -> bool:
    if root.get(n) is m:
        return _disjoint(n.meta.get("val"), layout)
    if m not in reads[n]:
        return True
    if n.op != "call_function" or _alias(n):  # (a view or write of other memory reading m: not followed)
        return False
    element = foreach_element(n)  # (one result of a foreach op: computed from the i-th tensors of its lists)
    if element is not None:
        inputs = element[0]
    elif n.target is aten.copy.default:  # (functional setitem: its source's values, its first argument's layout)
        inputs = [n.args[1]]
    else:
        inputs = n.all_input_nodes
    return all(not isinstance(a, fx.Node) or _apart(a, layout, m, reads, root, memo) for a in inputs)


def _disjoint(a: Any, b: torch.Tensor) -> bool:
    """Two views of one memory that surely share no element, for every value of the program's symbols."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    (la, ha), (lb, hb) = [_byte_range(t) for t in (a, b)]
    if surely(ha <= lb) or surely(hb <= la):
        return True
    if has_symbols(a) or has_symbols(b):
        return False  # (interleaved at symbolic positions: a decision for this call's symbols would add a guard)
    if max(ha, hb) - min(la, lb) > _EXACT_BYTES:
        return False  # (the exact test marks each element of the span: kept to small spans, a compile's cost)
    return not overlaps(a, b)  # (exact, by the elements each touches)


_EXACT_BYTES = 1 << 24


def _byte_range(t: torch.Tensor) -> tuple[Any, Any]:
    """[first, end) bytes of a tensor's elements in its storage (strides are never negative; an empty tensor's
    range may be off, but it shares no element with anything, so "apart" drawn from it is right)."""
    last = t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.storage_offset() * t.element_size(), (last + 1) * t.element_size()


# Foreach ops whose i-th result is an elementwise op over the i-th tensors (the op of the same name is tagged
# pointwise; `_foreach_copy`: its source's values in the destination's layout, where `_aligned` checks the shapes
# are equal: no broadcast). Not `_foreach_max` / `_foreach_norm` (reductions).
FOREACH_ELEMENTWISE = frozenset(
    "abs acos add addcdiv addcmul asin atan ceil clamp_max clamp_min copy cos cosh div erf erfc exp expm1 floor frac "
    "lerp lgamma log log10 log1p log2 maximum minimum mul neg pow reciprocal round rsqrt sigmoid sign sin sinh sqrt "
    "sub tan tanh trunc".split()
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
        writes, root = memory_of(gm)
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
            if not all(_same_layout(a, m1) for n in readers for a in n.all_input_nodes if root.get(a) is m1):
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
    return _same_layout(w.args[0], m) and src.dtype == dst.dtype and _same_shape(src, dst)


def insert_snapshots(gm: fx.GraphModule) -> int:
    """Remove each hazard: a value stored whole by the write it precedes (`m.copy_(m * b + g)`, then `m * b +
    g` read again) is read back from where it was stored, when nothing writes there later; any other is
    materialized where the program computed it. Returns how many snapshots were inserted."""
    count = 0
    while (found := next(hazards(gm), None)) is not None:
        value, write, at_write = found
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        later = [u for u in value.users if order[u] > order[write]]
        # (read back only where the value's later users read it directly: a view of it made before the write
        # would read the memory the write stored there at its uses before the write too)
        viewed_across = any(is_view_node(u) and order[u] < order[write] for u in value.users)
        stored = not at_write and not viewed_across and _stored_whole(gm, value, write)
        if stored and all(u.op != "output" for u in later):
            for u in later:
                u.replace_input_with(value, write.args[0])
            continue
        if not at_write and _sink_write(gm, value, write):
            continue
        op = ALIGNED_SNAPSHOT if not at_write and _fusable(gm, value) else SNAPSHOT
        with gm.graph.inserting_after(value):
            snap = gm.graph.call_function(op, (value,))
        snap.meta["val"] = value.meta.get("val")
        value.replace_all_uses_with(snap, delete_user_cb=lambda u, s=snap: u is not s)
        count += 1
    # A write moved by `_sink_write` after an aligned snapshot was decided may now follow it: decided again.
    context = (reads_of(gm), memory_of(gm), list(gm.graph.nodes))
    for n in gm.graph.nodes:
        if n.target is ALIGNED_SNAPSHOT and not _fusable(gm, n.args[0], context):
            n.target = SNAPSHOT
    return count


def _fusable(gm: fx.GraphModule, value: fx.Node, context: tuple | None = None) -> bool:
    """Whether a copy of `value` made where the program computed it may be fused by inductor with the writes after
    it: each later write of memory `value` reads is a `copy_` of a region that each element of `value` reads only
    at the element of its own position (`_aligned`: the region laid out as `value`) or not at all (`_apart`), and
    no functional scatter of such memory follows (inductor may run one in place). A loop computing the copy and
    such a write then reads each element before it stores it, in whatever kernels inductor splits them into.
    Adadelta's step with weight decay: `delta` reads acc_delta and the parameter, and each write needs the other's
    old value (a cycle no moved write removes); its snapshot as ATen's clone split each parameter's update into
    two kernels around a copy (2x torch.compile's step)."""
    if not isinstance(value.meta.get("val"), torch.Tensor):
        return False
    reads, (writes, root), nodes = context or (reads_of(gm), memory_of(gm), list(gm.graph.nodes))
    mine = reads[value]
    at = nodes.index(value)
    order = {n: i for i, n in enumerate(nodes)}
    for w, m in writes:
        if order[w] <= at or m not in mine:
            continue
        if w.target is not aten.copy_.default:
            return False
        if not _in_place(value, w.args[0].meta["val"], m, reads, root):
            return False
    return not any(
        n.op == "call_function" and is_scatter(n.target) and n.args and root.get(n.args[0]) in mine
        for n in nodes[at + 1 :]
    )


def _sink_write(gm: fx.GraphModule, value: fx.Node, write: fx.Node) -> bool:
    """Move `write` to just after the last use of `value` (through views made of it), when no op in between takes
    the written memory (a view of it, the placeholder, a write to it, the write's own result): the write then
    lands where the program no longer needs what it overwrote, and no copy is made. Every op passed reads other
    memory (the fused executor's inputs never share memory: an alias group is unfusable), so it computes the same
    values whichever side of the write it runs. Adadelta's step: its `deltas`, computed from `acc_delta` before
    the write to `acc_delta` and added to the parameters after it, was one snapshot per parameter (a clone each,
    and the kernels split around it: 2.3x torch.compile's step)."""
    writes, root = memory_of(gm)
    m = next((mem for w, mem in writes if w is write), None)
    if m is None:
        return False
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    last = _last_uses_through_views(nodes, order)
    end = last[value]
    if end <= order[write]:
        return False
    # What the write stores is read where the write lands: a write passed to memory its source was computed from
    # would make that source a hazard of its own (Adadelta with weight decay: the new acc_delta reads the
    # parameter, the new parameter reads acc_delta; whichever write goes first, the other needs a copy).
    reads = reads_of(gm)
    sources = frozenset().union(*(reads.get(a, frozenset()) for a in write.all_input_nodes))
    written_by = dict(writes)
    i = order[write] + 1
    while i <= end:
        n = nodes[i]
        if n.op != "call_function" or root.get(n) is m or any(root.get(a) is m for a in n.all_input_nodes):
            return False
        if written_by.get(n) in sources:
            return False
        if m in reads.get(n, frozenset()):
            # A value computed from `value` (or another old value of m) that the write now passes: it reads m's
            # old contents too, so the write goes past its uses as well. Found here in one sweep; left to the
            # next round of `insert_snapshots`, a chain of k ops after the write cost k rounds over the whole
            # graph (800 ops: 6 s of a compile, against one snapshot's 0.01 s).
            end = max(end, last[n])
        i += 1
    nodes[end].append(write)
    return True


def _stored_whole(gm: fx.GraphModule, value: fx.Node, write: fx.Node) -> bool:
    """`write` copies all of `value`, unconverted, into memory no later op writes."""
    if write.target is not aten.copy_.default or write.args[1] is not value:
        return False
    dst, src = write.args[0].meta["val"], value.meta["val"]
    if not _same_shape(dst, src) or dst.dtype != src.dtype:
        return False
    writes = writes_of(gm)
    root = next(m for w, m in writes if w is write)
    after = False
    for w, m in writes:
        if after and m is root:
            return False
        after = after or w is write
    return True


def check_hazards(gm: fx.GraphModule) -> None:
    """The invariant the fused executor relies on (see the module's docstring)."""
    found = next(hazards(gm), None)
    if found is not None:
        value, write, _ = found
        raise InternalError(f"fused graph reads {value.name} after {write.name} overwrote the memory it came from")
    context = (reads_of(gm), memory_of(gm), list(gm.graph.nodes))
    for n in gm.graph.nodes:
        if n.target is ALIGNED_SNAPSHOT and not _fusable(gm, n.args[0], context):
            raise InternalError(f"fused graph's {n.name} may be fused with a write of memory it reads elsewhere")
