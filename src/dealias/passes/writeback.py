"""Write-back lowering: move only the bytes that were written.

Functionalization turns `cache[:, pos] = k` into `region_write(cache, cache.select(1, pos), k)` (a new
cache, regions.py) and a write-back copying the whole cache back. This pass reads, in the optimized functional
graph, each storage's sequence of versions

    P = V0 -> V1 -> ... -> Vn = the value written back,

where each step is a region write node ("V(i-1) with the region `chain` replaced by `value`") or an op with
an in-place form on V(i-1), and executes it in place instead: `P.select(1, pos).copy_(k)` at the point Vi was
computed, with every later read of Vi reading P. A step that is not a region write (e.g. `x.add_(1)`) is a
full write: `P.copy_(Vi)`. The region writes left (not exact in place) are decomposed into view inverses.

It is applied to a storage only when it is exact: no read of an older version (through any view) comes
after the write that supersedes it, the storage's bases are dense, and no tensor in the graph requires
grad (autograd needs the functional values). Otherwise the storage keeps the functional form and its
whole-buffer write-back. Intermediates are lowered by the same rule, so in-place updates of them run in
place too (peak memory at eager's level).

The functional trace stays free of mutation; only the execution graph holds these in-place writes, and
each is ordered after every read of the memory it overwrites.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx

from ..errors import UnsupportedError
from ..ir.checks import guard_index_writes, indexed_write
from ..ir.draws import draw_like
from ..ir.emitter import Emitter
from ..ir.gradops import bump_version
from ..ir.opfacts import (
    OpKind,
    facts,
    has_effect,
    inplace_variant,
    is_view_node,
    removable_if_unused,
)
from ..ir.plan import (
    FunctionalProgram,
    OutputSlot,
    Ref,
    RefKind,
    ResultArg,
    WriteBackReport,
    root_node,
)
from ..ir.regions import decompose, is_region_write, region_views, step_of
from ..ir.viewops import (
    ViewStep,
    chain_text,
    internal_overlap,
    map_chain_args,
    op_name,
    repeated_dims,
    surely,
)

aten = torch.ops.aten


@dataclass(frozen=True)
class RegionWrite:
    chain: tuple[ViewStep, ...]  # from the storage's base; () writes all of it
    value: fx.Node
    nbytes: int


def region_parts(node: fx.Node) -> tuple[fx.Node, tuple[ViewStep, ...], fx.Node] | None:
    """If `node` is a region write that can run as an in-place copy, its (base, chain, value). A region whose
    elements share memory (a uniform write through `expand`) cannot be the target of an in-place copy."""
    if not is_region_write(node):
        return None
    views = region_views(node)
    if any(internal_overlap(v.meta["val"]) != "no" for v in views):
        return None
    return node.args[0], tuple(step_of(v) for v in views), node.args[2]


def _updated_in_place(node: fx.Node) -> fx.Node | None:
    """For `op(B, ...)` of B's shape and dtype where `op` has an in-place form (`add(x, 1)` for `x.add_(1)`,
    `index_copy(x, ...)`, `copy(x, src)`): B. Such a node is a full write of B's memory when B is dead
    after it."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) or not node.args:
        return None
    b = node.args[0]
    if not isinstance(b, fx.Node) or is_view_node(b) or inplace_variant(node.target) is None:
        return None
    return b if _fits(b, node) else None


def _fits(b: fx.Node, node: fx.Node) -> bool:
    """Whether `node`'s value has B's shape, dtype and layout: it can be computed into B's memory."""
    bv, nv = b.meta.get("val"), node.meta.get("val")
    if not isinstance(bv, torch.Tensor) or not isinstance(nv, torch.Tensor):
        return False
    # An optimization's question: asked without guards on symbolic sizes (`surely`), so that it never narrows
    # the values a program holds for; where it cannot tell, the write stays a copy.
    same_shape = bv.dim() == nv.dim() and all(surely(x == y) for x, y in zip(bv.shape, nv.shape))
    # (the layout too: running `cumsum` in place on a transposed buffer would return eager's fresh,
    # contiguous result with the buffer's strides)
    return same_shape and bv.dtype == nv.dtype and _same_layout(bv, nv)


def _foreach_op(node: Any) -> bool:
    """A functional foreach op (`_foreach_add(xs, 1)`) whose in-place form updates the list `xs` (its first
    argument) tensor by tensor: `_foreach_add_(xs, 1)`."""
    return (
        isinstance(node, fx.Node)
        and node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and op_name(node.target).startswith("_foreach_")
        and bool(node.args)
        and isinstance(node.args[0], (list, tuple))
        and inplace_variant(node.target) is not None
    )


def _foreach_element_base(node: fx.Node) -> fx.Node | None:
    """For `getitem(F, k)`, the k-th result of a foreach op F with an in-place form: F's k-th list element, of
    which it is the new value when the in-place form runs (`torch._foreach_add_(steps, 1)`, each step its own
    storage) and the result has the element's shape, dtype and layout. (Which of a list's results are written in
    place together is `_foreach_in_place`'s decision; until then each is a full write of its element.)"""
    if node.op != "call_function" or node.target is not operator.getitem or not _foreach_op(node.args[0]):
        return None
    xs, k = node.args[0].args[0], node.args[1]
    if not isinstance(k, int) or not 0 <= k < len(xs) or not isinstance(xs[k], fx.Node) or is_view_node(xs[k]):
        return None
    return xs[k] if _fits(xs[k], node) else None


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same strides, but where a dimension has a single element (they place nothing), shapes being equal."""
    return all(surely(x == y) for n, x, y in zip(a.shape, a.stride(), b.stride()) if not surely(n <= 1))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def versions(
    final: fx.Node, root: fx.Node | None, stop: set[fx.Node] = frozenset(), foreach: bool = True
) -> list[tuple[fx.Node, RegionWrite]]:
    """The writes that turn `root` into `final`, oldest first: (node of the version, its write). With no
    `root` (an intermediate), the walk ends at a caller's tensor, at a node in `stop`, or at a full write.
    With `foreach`, a foreach op's result is a write of its list's element (`_foreach_element_base`)."""
    out: list[tuple[fx.Node, RegionWrite]] = []
    node = final
    while node is not root:
        m = region_parts(node)
        if m is not None:
            base, chain, value = m
        else:
            base = _updated_in_place(node) or (_foreach_element_base(node) if foreach else None)
            chain, value = (), node
        if base is None or (base is not root and (base.op != "call_function" or base in stop)):
            out.append((node, RegionWrite((), node, _nbytes(node.meta["val"]))))  # everything before: overwritten
            break
        out.append((node, RegionWrite(chain, value, _nbytes(value.meta["val"]))))
        node = base
    out.reverse()
    return out


def _readers(node: fx.Node) -> list[fx.Node]:
    """Nodes that read `node`'s memory: its users, looking through views (which alias it)."""
    seen, todo, out = set(), [node], []
    while todo:
        n = todo.pop()
        for u in n.users:
            if u in seen:
                continue
            seen.add(u)
            if u.target is bump_version:
                continue  # (it moves the tensor's version counter and reads none of its memory)
            (todo if is_view_node(u) else out).append(u)
    return out


def _construction(version: fx.Node, previous: fx.Node, order: dict[fx.Node, int]) -> set[fx.Node]:
    """The nodes building `version` from `previous` (inverses, replayed bases, re-striding), which the
    in-place write replaces. Nodes placed before `previous` (in `order`; nodes added since are walked) are not
    built from it: the walk stops there, so its cost does not grow with the program's length."""
    out, todo = set(), [version]
    start = order.get(previous, -1)
    while todo:
        n = todo.pop()
        if n in out or n is previous or n.op != "call_function" or order.get(n, start) < start:
            continue
        out.add(n)
        todo.extend(a for a in n.all_input_nodes)
    return out


def lower(
    fp: FunctionalProgram,
    aliases: dict[fx.Node, list[fx.Node]],
    fused: bool = False,
    autograd_in_place: bool = False,
) -> tuple[FunctionalProgram, list[WriteBackReport]]:
    """Lower write-backs (and in-place updates of intermediates) to in-place region writes where exact.

    `aliases` maps a caller base placeholder to the other placeholders that alias its memory (members of
    an alias group), whose reads must also come before the first in-place write. For the fused executor
    (`fused`), a region write stays `region.copy_(value)`, which inductor fuses into one store, except indexed
    writes (bounds-checked before any write), and intermediates stay functional (inductor plans their
    buffers). A graph autograd records stays functional, but with `autograd_in_place` (the torch executor)
    for what eager itself updated in place (writeback_autograd.py)."""
    gm = fp.gm
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    out_node = graph.output_node()
    results = list(out_node.args[0])
    if _builds_autograd(gm):
        for wb in fp.writebacks:
            _refuse_whole_copy_into_overlap(gm, wb, results[wb.output])
        in_place: list[WriteBackReport] = []
        if autograd_in_place:
            from .writeback_autograd import (  # (it imports this module)
                eager_input_updates_in_place,
                eager_mutations_in_place,
                eager_ops_on_copies,
                eager_updates_in_place,
            )

            eager_updates_in_place(graph)
            fp, in_place = eager_mutations_in_place(fp, aliases)
            eager_ops_on_copies(graph)
            fp, inputs_in_place = eager_input_updates_in_place(fp, aliases)
            in_place += inputs_in_place
        decompose(gm)
        results = list(out_node.args[0])
        return fp, in_place + [whole_report(wb.target, results[wb.output]) for wb in fp.writebacks]

    reports: list[WriteBackReport] = []
    copies: dict[fx.Node, tuple[list[str], int]] = {}  # a whole copy made by _apply -> its report's region
    dropped: set[int] = set()
    writebacks_before = list(fp.writebacks)
    for wb in fp.writebacks:
        final = results[wb.output]
        root = root_node(gm, wb.target)
        # (A fused program keeps a foreach result a value of its own: inductor writes it into the caller's tensor
        # in the kernel computing it; a chain of in-place copies would store each version.)
        plan = versions(final, root, foreach=not fused) if root is not None else None
        # A version that is also a user output (CSE merged `v = x + x` with `x.add_(x)`'s value) must stay
        # a tensor of its own: run in place, it would come back as the caller's tensor.
        returned = {n for i, n in enumerate(results) if i != wb.output}
        if plan is None or returned & {v for v, _ in plan} or not _safe(plan, root, order, aliases.get(root, [])):
            _refuse_whole_copy_into_overlap(gm, wb, final)
            reports.append(whole_report(wb.target, final))
            continue
        regions, nbytes, chains = _apply(graph, plan, root, order, fused, copies)
        reports.append(WriteBackReport(wb.target, "in place", regions, nbytes, chains=chains))
        dropped.add(wb.output)
        order = {n: i for i, n in enumerate(graph.nodes)}
    # Intermediates: a base updated by writes whose old versions are dead is updated in place. The walk may
    # reach back past the storage's first version; the longest safe suffix is kept.
    seen: set[fx.Node] = {n for n in graph.nodes if n.op != "call_function"}
    for tip in reversed(list(graph.nodes) if not fused else []):
        if tip in seen or tip.op != "call_function" or not isinstance(tip.meta.get("val"), torch.Tensor):
            continue
        plan = versions(tip, None, seen)
        seen.update(v for v, _ in plan)
        for k in range(len(plan) - 1):
            root, writes = plan[k][0], plan[k + 1 :]
            if _fresh(root) and _safe(writes, root, order, []):
                _apply(graph, writes, root, order, copies=copies)
                order = {n: i for i, n in enumerate(graph.nodes)}
                break
    if not fused:
        _foreach_in_place(graph, copies, aliases)
    new_results = [r for i, r in enumerate(out_node.args[0]) if i not in dropped]
    out_node.args = (tuple(new_results),)
    remap = {old: new for new, old in enumerate(i for i in range(len(results)) if i not in dropped)}
    fp.writebacks = [replace(wb, output=remap[wb.output]) for wb in fp.writebacks if wb.output not in dropped]
    fp.outputs = [_remapped(s, remap) for s in fp.outputs]
    graph.eliminate_dead_code(is_impure_node=lambda n: n.op != "call_function" or not removable_if_unused(n.target))
    guard_index_writes(graph, [root_node(gm, wb.target) for wb in writebacks_before])
    decompose(gm)  # the region writes left run as view inverses
    return fp, reports


def _remapped(slot: OutputSlot, remap: dict[int, int]) -> OutputSlot:
    """`slot` with the graph results it reads (its source, symbolic arguments of its chain, the history it is
    given) renumbered."""
    if slot.same_as is not None:
        return slot
    if slot.source.kind is RefKind.RESULT:
        slot = replace(slot, source=Ref(RefKind.RESULT, remap[slot.source.key]))
    if slot.history is not None:
        slot = replace(slot, history=remap[slot.history])
    return replace(slot, chain=map_chain_args(slot.chain, ResultArg, lambda r: ResultArg(remap[r.index])))


def _safe(
    plan: list[tuple[fx.Node, RegionWrite]], root: fx.Node, order: dict[fx.Node, int], others: list[fx.Node]
) -> bool:
    """Each write may happen in place at its version's position: nothing reads the memory it overwrites
    (the previous version, through any view, or another input aliasing it) after that position, nor does an op
    run in place read it through another of its arguments (`_reads_its_target`)."""
    previous = root
    for version, write in plan:
        pos = order[version]
        built = _construction(version, previous, order)
        for alias in [previous, *others] if previous is root else [previous]:
            if any(order[r] > pos for r in _readers(alias) if r not in built):
                return False
            if write.value is version and _updated_in_place(version) is previous and _reads_its_target(version, alias):
                return False
        previous = version
    return True


def _reads_its_target(node: fx.Node, memory: fx.Node) -> bool:
    """Whether `op(B, ...)`, to run in place into `memory` (B's), also reads that memory through another argument:
    in place it would read what it already wrote, or eager's kernel refuses the partial overlap (fuzz seed
    1003301: `mul(x, x[1:2])` into x). The same tensor given to a pointwise op (`x.mul_(x)`) reads each element
    before writing it."""
    for a in torch.utils._pytree.tree_leaves((node.args[1:], node.kwargs)):
        b = a
        while is_view_node(b) and isinstance(b.args[0], fx.Node):
            b = b.args[0]
        if b is memory and not (a is memory and torch.Tag.pointwise in node.target.tags):
            return True
    return False


def _builds_autograd(gm: fx.GraphModule) -> bool:
    """Whether autograd records some op of the graph (meta "rg", propagated by functionalization): in-place
    rewrites could then change what a backward reads. Ops under `torch.no_grad()` record nothing."""
    return any(n.op == "call_function" and n.meta.get("rg") for n in gm.graph.nodes)


def _fresh(n: fx.Node) -> bool:
    """A base that owns its memory: the result of a functional (non-view) op."""
    if n.op != "call_function":
        return False
    if n.target is operator.getitem:
        return True
    return isinstance(n.target, torch._ops.OpOverload) and facts(n.target).kind is OpKind.FUNCTIONAL


def _apply(
    graph: fx.Graph,
    plan: list[tuple[fx.Node, RegionWrite]],
    root: fx.Node,
    order: dict[fx.Node, int],
    indexed_only: bool = False,
    copies: dict[fx.Node, tuple[list[str], int]] | None = None,
) -> tuple[list[str], int, list[tuple[ViewStep, ...]]]:
    """Write each version into `root` in place, right where it was computed; later reads read `root`
    (`indexed_only`: only indexed writes run as their in-place op). Returns the regions written, their
    bytes, and their view chains from `root`; `copies` gets each whole copy left and its region's entry."""
    regions: list[str] = []
    chains = [write.chain for _, write in plan]
    nbytes = 0
    previous = root
    emit = Emitter(graph, root.meta["val"].fake_mode)
    for version, write in plan:
        built = _construction(version, previous, order)
        emit.stack_trace, emit.grad = version.meta.get("stack_trace"), version.meta.get("grad")
        anchor = version
        target = root
        for step in write.chain:
            with graph.inserting_after(anchor):
                target = anchor = emit.call(step.op, target, *step.args, **dict(step.kwargs))
        value = write.value
        reads: set[fx.Node] = set()  # the nodes that read the version being written: not redirected to root
        for d in repeated_dims(target.meta["val"]):
            # An expanded caller tensor: each element of memory appears along dim d many times, all with one
            # value (only uniform writes such as fill_ reach such a tensor), and copy_ refuses the overlap.
            with graph.inserting_after(anchor):
                target = anchor = emit.call(aten.narrow.default, target, d, 0, 1)
            with graph.inserting_after(anchor):
                value = anchor = emit.call(aten.narrow.default, value, d, 0, 1)
            reads.add(value)
        with graph.inserting_after(anchor):
            copy = emit.call(aten.copy_.default, target, value)
        reads.add(copy)
        version.replace_all_uses_with(root, delete_user_cb=lambda user, reads=reads: user not in reads)
        _erase_dead(graph, built - {write.value})
        op = _reinplace_value(emit, copy, write, root, indexed_only)
        region = chain_text("x", write.chain)
        if op is None:
            regions.append(f"{region}.copy_(..)")
            nbytes += write.nbytes
            if copies is not None:
                copies[copy] = (regions, len(regions) - 1)
        else:
            regions.append(f"{region}.{op_name(op.target)}(..)")
            nbytes += _written_bytes(op)
        previous = version
    return regions, nbytes, chains


def _foreach_in_place(
    graph: fx.Graph, copies: dict[fx.Node, tuple[list[str], int]], aliases: dict[fx.Node, list[fx.Node]]
) -> None:
    """`F = _foreach_op(xs, ..)` whose every result k is only copied into xs[k] (`xs[k].copy_(F[k])`, _apply's
    write of a foreach version into its element) -> `_foreach_op_(xs, ..)`: each tensor updated in place, as
    eager's `torch._foreach_add_(steps, 1)` did, without a new list and a copy per tensor (an Adam step of 10
    parameters: 30 copies of whole tensors). Only where nothing runs between F and its copies (_apply placed each
    copy where its version was computed, and the write-back checked that nothing reads an old version after it),
    the elements are distinct tensors sharing memory with nothing else of the caller's, and F reads no element's
    memory through another argument except that element itself at its own index (foreach ops go tensor by tensor,
    elementwise: `_foreach_mul_(xs, xs)` reads each element before writing it)."""
    for f in [n for n in graph.nodes if _foreach_op(n)]:
        xs = list(f.args[0])
        if not xs:
            continue
        items = {u.args[1]: u for u in f.users if u.target is operator.getitem}
        if len(items) != len(f.users) or sorted(items) != list(range(len(xs))) or len(set(xs)) != len(xs):
            continue
        writes = [next(iter(items[k].users), None) if len(items[k].users) == 1 else None for k in range(len(xs))]
        if not all(
            c in copies and c.target is aten.copy_.default and c.args == (x, items[k]) and not c.users
            for k, (x, c) in enumerate(zip(xs, writes))
        ):
            continue
        shared = {n for base, others in aliases.items() if others for n in (base, *others)}
        if shared.intersection(xs) or _reads_other_elements(f, xs):
            continue
        # From F to its last copy, only F's results and their copies: nothing else runs where the in-place op now
        # writes every element at once.
        ours, pending, node = {*items.values(), *writes}, set(writes), f.next
        while pending and node in ours:
            pending.discard(node)
            node = node.next
        if pending:
            continue
        op_ = inplace_variant(f.target)
        emit = Emitter(graph, xs[0].meta["val"].fake_mode)
        emit.stack_trace, emit.grad = f.meta.get("stack_trace"), f.meta.get("grad")
        with graph.inserting_after(f):
            new = emit.call(op_, *f.args, **dict(f.kwargs))
        new.meta["counts_as"] = f.target  # (invariants.compute_ops: the same op as the functional graph's,
        new.meta["absorbs"] = [operator.getitem] * len(items)  # its results' getitems folded into it)
        for c in writes:
            regions, i = copies.pop(c)
            regions[i] = f"x.{op_name(op_)}(..)"
            graph.erase_node(c)
        for g in items.values():
            graph.erase_node(g)
        graph.erase_node(f)


def _reads_other_elements(f: fx.Node, xs: list[fx.Node]) -> bool:
    """Whether foreach op `f` over list `xs` reads an element's memory through another argument other than as
    the same element at the same index of a list (or through a view of one)."""
    bases = set(xs)
    for arg in [*f.args[1:], *f.kwargs.values()]:
        items = list(enumerate(arg)) if isinstance(arg, (list, tuple)) else [(None, arg)]
        for k, a in items:
            if not isinstance(a, fx.Node):
                continue
            b = a
            while is_view_node(b) and isinstance(b.args[0], fx.Node):
                b = b.args[0]
            if b in bases and not (k is not None and k < len(xs) and a is xs[k]):
                return True
    return False


def _written_bytes(op: fx.Node) -> int:
    """Bytes an in-place op writes: all of its target, except indexed writes (index_put_, index_copy_,
    scatter_...), which write as many elements as their source holds."""
    target = op.args[0].meta["val"]
    full = _nbytes(target)
    name = op_name(op.target)
    if name.startswith(("index_put", "index_copy", "index_add", "scatter", "_index_put")):
        sources = [a.meta["val"] for a in op.args[1:] if isinstance(a, fx.Node) and "val" in a.meta]
        sources = [t for t in sources if isinstance(t, torch.Tensor) and t.dtype == target.dtype]
        if sources:
            return min(full, max(t.numel() for t in sources) * target.element_size())
    return full


def _erase_dead(graph: fx.Graph, nodes: set[fx.Node]) -> None:
    changed = True
    while changed:
        changed = False
        for n in list(nodes):
            if not n.users and not has_effect(n.target):
                graph.erase_node(n)
                nodes.discard(n)
                changed = True


def _is_replay(node: Any, root: fx.Node, chain: tuple[ViewStep, ...]) -> bool:
    for step in reversed(chain):
        if not isinstance(node, fx.Node) or not is_view_node(node) or step_of(node) != step:
            return False
        node = node.args[0]
    return node is root


def _reinplace_value(
    emit: Emitter, copy: fx.Node, write: RegionWrite, root: fx.Node, indexed_only: bool = False
) -> fx.Node | None:
    """`target.copy_(op(old_region, ...))` -> `op_(target, ...)` when the value is used only here and its
    first argument is the region's old contents: the update then runs in place, as eager's did (and
    `copy(old, src)`, functional setitem, becomes `target.copy_(src)`)."""
    value = write.value
    if value.op != "call_function" or set(value.users) != {copy}:
        return None
    if value.target is draw_like:  # (eager's own in-place draw, then on the region itself)
        op_, old, rest = value.args[0], value.args[1], value.args[2:]
    elif isinstance(value.target, torch._ops.OpOverload) and value.args:
        op_, old, rest = inplace_variant(value.target), value.args[0], value.args[1:]
    else:
        return None
    if not _is_replay(old, root, write.chain) or op_ is None or (indexed_only and not indexed_write(op_)):
        return None
    if has_effect(value.target) and not _same_layout(value.meta["val"], old.meta["val"]):
        return None  # (a draw fills memory in an order its layout sets: eager's drew into the value's)
    graph = emit.graph
    with graph.inserting_before(copy):
        new = emit.call(op_, copy.args[0], *rest, **dict(value.kwargs))
    new.meta["counts_as"] = op_ if value.target is draw_like else value.target  # (invariants.compute_ops)
    graph.erase_node(copy)
    graph.erase_node(value)
    _erase_dead(graph, {old} if isinstance(old, fx.Node) and old is not root else set())
    return new


def _refuse_whole_copy_into_overlap(gm: fx.GraphModule, wb: Any, final: fx.Node) -> None:
    """A caller's tensor whose elements overlap in memory (an expanded tensor, passed across a graph break) cannot
    take a value written through a view of it as a whole copy: its functional value holds the aliases of one
    location apart, and a write through one of them (`v[1].add_(1)`, a write of `v[0]` too) leaves them
    disagreeing, so the copy would store whichever comes last (fuzz seed 1740219: the old value). Written in
    place, every read after the write reads the memory itself; a write of the whole tensor (`fill_`, the only
    kind eager allows on it) gives every alias one value; otherwise the graph runs eagerly."""
    root = root_node(gm, wb.target)
    val = root.meta.get("val") if root is not None else None
    if not isinstance(val, torch.Tensor) or internal_overlap(val) == "no":
        return
    todo, seen = [final], {final}
    while todo:  # (a region write anywhere before the value: conservative, and rare)
        n = todo.pop()
        if is_region_write(n):
            raise UnsupportedError(f"{wb.target} is written through a view, and its elements overlap in memory")
        for a in n.all_input_nodes:
            if a not in seen:
                seen.add(a)
                todo.append(a)


def whole_report(target: Ref, final: fx.Node, region: str = "x.copy_(..)", how: str = "whole copy") -> WriteBackReport:
    return WriteBackReport(target, how, [region], _nbytes(final.meta["val"]), chains=[()])
