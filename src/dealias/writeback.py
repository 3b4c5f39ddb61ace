"""Write-back lowering: move only the bytes that were written.

Functionalization turns `cache[:, pos] = k` into `select_scatter(cache, k, 1, pos)` (a copy of the whole
cache) and a write-back copying the whole cache back. This pass recognizes, in the optimized functional
graph, each storage's sequence of versions

    P = V0 -> V1 -> ... -> Vn = the value written back,

where each step is a *region write* ("V(i-1) with the region `chain` replaced by `value`", as built by
functionalization's view inverses), and executes it in place instead: `P.select(1, pos).copy_(k)` at the
point Vi was computed, with every later read of Vi reading P. A step that is not a region write (e.g.
`x.add_(1)`) is a full write: `P.copy_(Vi)`.

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
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .checks import guard_index_writes, indexed_write
from .emitter import Emitter
from .functionalize import FunctionalProgram, OutputSlot, Ref, ResultArg
from .opfacts import OpKind, facts, has_effect, inplace_variant, is_view_node, removable_if_unused
from .viewops import ViewStep, chain_text, internal_overlap, inverse, map_chain_args, op_name

aten = torch.ops.aten


@dataclass(frozen=True)
class RegionWrite:
    chain: tuple[ViewStep, ...]  # from the storage's base; () writes all of it
    value: fx.Node
    nbytes: int


@dataclass
class WriteBackReport:
    """What one caller tensor receives per call, for `dealias.explain`."""

    target: str
    mode: str  # "in place" (only the written regions move) or "whole copy"
    regions: list[str] = field(default_factory=list)
    nbytes: int = 0


def _step_of(view: fx.Node) -> ViewStep:
    return ViewStep(view.target, tuple(view.args[1:]), tuple(sorted(view.kwargs.items())))


class _Hole:
    """Stands for the written value while an inverse is recorded symbolically."""


def _recorded_inverse(step: ViewStep, base: fx.Node, view: fx.Node) -> tuple[Any, tuple[Any, ...], dict] | None:
    hole = _Hole()
    calls: list[tuple[Any, tuple[Any, ...], dict]] = []

    def record(op: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((op, args, kwargs))
        return calls[-1]

    try:
        inverse(step, base.meta["val"], view.meta["val"], base, hole, record)
    except Exception:  # noqa: BLE001 - an inverse that cannot be built is simply no match
        return None
    if len(calls) != 1:
        return None
    op, args, kwargs = calls[0]
    return op, tuple(hole if a is hole else a for a in args), kwargs


def _same_args(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_args(x, y) for x, y in zip(a, b))
    return a is b if isinstance(a, fx.Node) or isinstance(b, fx.Node) else a == b


def _strip_restride(n: fx.Node) -> fx.Node:
    """`copy(empty_strided(..), x)` only re-lays x out: as a value it is x."""
    if (
        n.target is aten.copy.default
        and isinstance(n.args[0], fx.Node)
        and n.args[0].target is aten.empty_strided.default
    ):
        return n.args[1]
    return n


def match_region_write(node: fx.Node) -> tuple[fx.Node, tuple[ViewStep, ...], fx.Node] | None:
    """If `node` is "B with region `chain` replaced by `value`", return (B, chain, value)."""
    node = _strip_restride(node)
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    # Scatter inverses: node = scatter(B, Y, args) for the view b1 = view(B, args).
    base = node.args[0]
    for b1 in _views_inverted_by(base, node.target):
        if b1 is not node:
            found = _match_inverse(node, base, b1)
            if found is not None:
                return found
    # Pure-view inverses: node = inv(Y), where Y was written into the view b1 = view(B) that inv inverts:
    # Y is a region write into b1, or Y was computed from b1 (`e = c.flatten(); e += d.flatten()`). The inverse
    # of a view is a view: any other node is not one, and is not taken apart (the recursion into Y would
    # otherwise run down every earlier version: a RecursionError at ~1,000 in-place statements).
    if not is_view_node(node):
        return None
    y = node.args[0]
    inner = match_region_write(y)
    if inner is not None:
        candidates = [inner[0]]
    else:
        first = [y.args[0]] if y.args and isinstance(y.args[0], fx.Node) else []
        candidates = first + [a for a in y.all_input_nodes if a not in first]
    for b1 in candidates:
        if not is_view_node(b1) or not isinstance(b1.args[0], fx.Node):
            continue
        rec = _recorded_inverse(_step_of(b1), b1.args[0], b1)
        if rec is not None and _matches(rec, node, y):
            chain, value = (inner[1], inner[2]) if inner is not None else ((), y)
            return b1.args[0], (_step_of(b1), *chain), value
    return None


def _known(cond: Any) -> bool:
    """True only if `cond` holds for every value of its symbols (no guard added); plain bools as they are."""
    return statically_known_true(cond) if isinstance(cond, torch.SymBool) else bool(cond)


def _updated_in_place(node: fx.Node) -> fx.Node | None:
    """For `op(B, ...)` of B's shape and dtype where `op` has an in-place form (`add(x, 1)` for `x.add_(1)`,
    `index_copy(x, ...)`, `copy(x, src)`): B. Such a node is a full write of B's memory when B is dead
    after it."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) or not node.args:
        return None
    b = node.args[0]
    if not isinstance(b, fx.Node) or is_view_node(b) or inplace_variant(node.target) is None:
        return None
    bv, nv = b.meta.get("val"), node.meta.get("val")
    if not isinstance(bv, torch.Tensor) or not isinstance(nv, torch.Tensor):
        return None
    # An optimization's question: asked without guards on symbolic sizes (`_known`), so that it never narrows
    # the values a program holds for; where it cannot tell, the write stays a copy.
    same_shape = bv.dim() == nv.dim() and all(_known(x == y) for x, y in zip(bv.shape, nv.shape))
    same_layout = all(_known(x == y) for n, x, y in zip(bv.shape, bv.stride(), nv.stride()) if not _known(n <= 1))
    # (the layout too: running `cumsum` in place on a transposed buffer would return eager's fresh,
    # contiguous result with the buffer's strides)
    return b if same_shape and bv.dtype == nv.dtype and same_layout else None


def _matches(rec: tuple[Any, tuple[Any, ...], dict], node: fx.Node, value: fx.Node) -> bool:
    op, args, kwargs = rec
    want = tuple(value if isinstance(a, _Hole) else a for a in args)
    return op is node.target and _same_args(want, node.args) and _same_args(kwargs, dict(node.kwargs))


def _inverse_of_view(base: fx.Node, b1: fx.Node) -> tuple[Any, tuple[Any, ...], dict] | None:
    """`_recorded_inverse` of the view b1 = view(base), computed once per view node: a base read through many
    views is matched against each of them for every version (quadratic in the program's length otherwise)."""
    cached = b1.meta.get("_dealias_inverse")
    if cached is not None and cached[0] is base:  # (a copied graph's node carries its original's meta)
        return cached[1]
    rec = _recorded_inverse(_step_of(b1), base, b1)
    b1.meta["_dealias_inverse"] = (base, rec)
    return rec


def _views_inverted_by(base: fx.Node, op: Any) -> list[fx.Node]:
    """The views b1 = view(base) whose recorded inverse is a call of `op`, in `base.users` order. Indexed once
    per base and kept while its users stay the same (users are appended at the end, so a change shows in their
    number or in the last one): each version of a base read through many views would otherwise scan them all."""
    users = base.users
    stamp = (len(users), next(reversed(users), None))
    cached = base.meta.get("_dealias_views")
    if cached is None or cached[0] != stamp:
        index: dict[Any, list[fx.Node]] = {}
        for b1 in users:
            if is_view_node(b1) and b1.args[0] is base:
                rec = _inverse_of_view(base, b1)
                if rec is not None:
                    index.setdefault(rec[0], []).append(b1)
        cached = (stamp, index)
        base.meta["_dealias_views"] = cached
    return cached[1].get(op, [])


def _match_inverse(node: fx.Node, base: fx.Node, b1: fx.Node) -> tuple[fx.Node, tuple[ViewStep, ...], fx.Node] | None:
    rec = _inverse_of_view(base, b1)
    if rec is None or rec[0] is not node.target:
        return None
    hole_at = next((i for i, a in enumerate(rec[1]) if isinstance(a, _Hole)), None)
    if hole_at is None or hole_at >= len(node.args) or rec[1][0] is not base:
        return None
    value = node.args[hole_at]
    if not _matches(rec, node, value) or internal_overlap(b1.meta["val"]) != "no":
        return None  # a region whose elements share memory cannot be the target of an in-place copy
    # A nested write: the value is itself a region write into b1 (`cache[0][:, idx] = v`).
    inner = match_region_write(value) if isinstance(value, fx.Node) else None
    if inner is not None and inner[0] is b1:
        return base, (_step_of(b1), *inner[1]), inner[2]
    return base, (_step_of(b1),), value


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def versions(
    final: fx.Node, root: fx.Node | None, stop: set[fx.Node] = frozenset()
) -> list[tuple[fx.Node, RegionWrite]]:
    """The writes that turn `root` into `final`, oldest first: (node of the version, its write). With no
    `root` (an intermediate), the walk ends at a caller's tensor, at a node in `stop`, or at a full write."""
    out: list[tuple[fx.Node, RegionWrite]] = []
    node = final
    while node is not root:
        m = match_region_write(node)
        if m is not None:
            base, chain, value = m
        else:
            base, chain, value = _updated_in_place(node), (), node
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
    fp: FunctionalProgram, aliases: dict[fx.Node, list[fx.Node]], fused: bool = False
) -> tuple[FunctionalProgram, list[WriteBackReport]]:
    """Lower write-backs (and in-place updates of intermediates) to in-place region writes where exact.

    `aliases` maps a caller base placeholder to the other placeholders that alias its memory (members of
    an alias group), whose reads must also come before the first in-place write. For the fused executor
    (`fused`), a region write stays `region.copy_(value)`, which inductor fuses into one store, except indexed
    writes (bounds-checked before any write), and intermediates stay functional (inductor plans their
    buffers)."""
    gm = fp.gm
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    out_node = graph.output_node()
    results = list(out_node.args[0])
    if _builds_autograd(gm):
        return fp, [whole_report(wb.target, results[wb.output]) for wb in fp.writebacks]

    reports: list[WriteBackReport] = []
    dropped: set[int] = set()
    writebacks_before = list(fp.writebacks)
    for wb in fp.writebacks:
        final = results[wb.output]
        root = _root_placeholder(gm, wb.target)
        plan = versions(final, root) if root is not None else None
        # A version that is also a user output (CSE merged `v = x + x` with `x.add_(x)`'s value) must stay
        # a tensor of its own: run in place, it would come back as the caller's tensor.
        returned = {n for i, n in enumerate(results) if i != wb.output}
        if plan is None or returned & {v for v, _ in plan} or not _safe(plan, root, order, aliases.get(root, [])):
            reports.append(whole_report(wb.target, final))
            continue
        reports.append(WriteBackReport(_ref_name(wb.target), "in place", *_apply(graph, plan, root, order, fused)))
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
                _apply(graph, writes, root, order)
                order = {n: i for i, n in enumerate(graph.nodes)}
                break
    new_results = [r for i, r in enumerate(out_node.args[0]) if i not in dropped]
    out_node.args = (tuple(new_results),)
    remap = {old: new for new, old in enumerate(i for i in range(len(results)) if i not in dropped)}
    fp.writebacks = [replace(wb, output=remap[wb.output]) for wb in fp.writebacks if wb.output not in dropped]
    fp.outputs = [_remapped(s, remap) for s in fp.outputs]
    graph.eliminate_dead_code(is_impure_node=lambda n: n.op != "call_function" or not removable_if_unused(n.target))
    guard_index_writes(graph, [_root_placeholder(gm, wb.target) for wb in writebacks_before])
    graph.lint()
    gm.recompile()
    return fp, reports


def _remapped(slot: OutputSlot, remap: dict[int, int]) -> OutputSlot:
    """`slot` with the graph results it reads (its source, symbolic arguments of its chain) renumbered."""
    if slot.same_as is not None:
        return slot
    if slot.source.kind == "result":
        slot = replace(slot, source=Ref("result", remap[slot.source.key]))
    return replace(slot, chain=map_chain_args(slot.chain, ResultArg, lambda r: ResultArg(remap[r.index])))


def _root_placeholder(gm: fx.GraphModule, target: Ref) -> fx.Node | None:
    placeholders = gm.graph.find_nodes(op="placeholder")
    if target.kind == "input":
        return placeholders[target.key]
    if target.kind == "group":
        return next((p for p in placeholders if p.name == f"alias_group{target.key}"), None)
    return next(iter(gm.graph.find_nodes(op="get_attr", target=target.key)), None)


def _safe(
    plan: list[tuple[fx.Node, RegionWrite]], root: fx.Node, order: dict[fx.Node, int], others: list[fx.Node]
) -> bool:
    """Each write may happen in place at its version's position: nothing reads the memory it overwrites
    (the previous version, through any view, or another input aliasing it) after that position."""
    previous = root
    for version, _ in plan:
        pos = order[version]
        built = _construction(version, previous, order)
        for alias in [previous, *others] if previous is root else [previous]:
            if any(order[r] > pos for r in _readers(alias) if r not in built):
                return False
        previous = version
    return True


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


def repeated_dims(t: torch.Tensor) -> list[int]:
    """Dimensions along which `t` repeats the same memory (stride 0, size > 1: an expanded tensor)."""
    return [d for d, (n, st) in enumerate(zip(t.shape, t.stride())) if st == 0 and n > 1]


def _apply(
    graph: fx.Graph,
    plan: list[tuple[fx.Node, RegionWrite]],
    root: fx.Node,
    order: dict[fx.Node, int],
    indexed_only: bool = False,
) -> tuple[list[str], int]:
    """Write each version into `root` in place, right where it was computed; later reads read `root`
    (`indexed_only`: only indexed writes run as their in-place op). Returns the regions written and their
    bytes."""
    regions: list[str] = []
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
        else:
            regions.append(f"{region}.{op_name(op.target)}(..)")
            nbytes += _written_bytes(op)
        previous = version
    return regions, nbytes


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
        if not isinstance(node, fx.Node) or not is_view_node(node) or _step_of(node) != step:
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
    if value.op != "call_function" or not isinstance(value.target, torch._ops.OpOverload):
        return None
    if set(value.users) != {copy} or not value.args or not _is_replay(value.args[0], root, write.chain):
        return None
    op_ = inplace_variant(value.target)
    if op_ is None or (indexed_only and not indexed_write(op_)):
        return None
    graph = emit.graph
    with graph.inserting_before(copy):
        new = emit.call(op_, copy.args[0], *value.args[1:], **dict(value.kwargs))
    graph.erase_node(copy)
    old = value.args[0]
    graph.erase_node(value)
    _erase_dead(graph, {old} if isinstance(old, fx.Node) and old is not root else set())
    return new


def _ref_name(ref: Ref) -> str:
    return f"input {ref.key}" if ref.kind == "input" else f"{ref.kind} {ref.key}"


def whole_report(target: Ref, final: fx.Node) -> WriteBackReport:
    return WriteBackReport(_ref_name(target), "whole copy", ["x.copy_(..)"], _nbytes(final.meta["val"]))
