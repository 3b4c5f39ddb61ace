"""Post-conditions of the passes, checked between them when `DEALIAS_CHECK=1` (on in every test run).

Each check is a plain function of one graph (and the plan it comes with) that raises `InvariantError`, naming
the check, the node and the user's source line, at the first violation. Every check is linear in the graph's
size. `pipeline.compile_program` calls `checker(captured)(stage, program, ...)` after each pass:

- functionalize, optimize: `functional_writes_nothing`, `carries_metadata`, `matches_plan`;
- lower (write-back lowering): `carries_metadata`, `executes_no_region_write`, `no_stale_view_reads`,
  `writes_inside_memory`, `computes_the_same_ops` (against the optimized functional graph), `matches_plan`;
- the torch executor: `carries_metadata` of the graph it runs.

dealias's own Python-function targets are classified in the tables below by what they do to memory; a new one
is one line in one of them.
"""

from __future__ import annotations

import bisect
import operator
import os
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload
from torch.utils import _pytree as pytree

from ..errors import InvariantError, node_location, with_location
from ..ir.checks import is_bounds_check
from ..ir.draws import draw_like
from ..ir.gradops import (
    bump_version,
    caller_after,
    caller_tensor,
    grad_leaf,
    keep_history,
    overwritten,
    rewritten,
    stale_saved,
    write_back_now,
)
from ..ir.island import island
from ..ir.opfacts import OpKind, bind_args, facts, is_view_node, writes_nothing
from ..ir.plan import RefKind, ResultArg, root_node
from ..ir.regions import is_region_write, region_write
from ..ir.viewops import as_strided_rel, as_strided_scatter_rel, chain_args, index_scatter_rel, op_name, surely

aten = torch.ops.aten

ENV = "DEALIAS_CHECK"


def enabled() -> bool:
    """Whether checks run: `DEALIAS_CHECK` set to anything but "" or "0" (read on each compile)."""
    return os.environ.get(ENV, "") not in ("", "0")


# -- dealias's own function targets -----------------------------------------------------------------------------

# Pure functions of tensors (they write nothing), with the argument whose memory their result may share (None: a
# tensor of its own): `keep_history(old, new)`, `overwritten(old, new)` and `rewritten(old, new)` return `new` (or
# `new.detach()`), `grad_leaf(v)` a detached `v`, `caller_tensor(t)` and `caller_after(t, written)` `t` itself,
# `stale_saved(t, m)` `t` or a detached `t`; `draw_like` draws into memory it allocates (a random draw: pure but for
# the generator it moves, as a functional random op).
PURE_FUNCTIONS: dict[Callable[..., Any], int | None] = {
    draw_like: None,
    island: None,
    keep_history: 1,
    overwritten: 1,
    rewritten: 1,
    grad_leaf: 0,
    caller_tensor: 0,
    caller_after: 0,
    stale_saved: 0,
}

# Region writes in functional form: a new base, `base` with one region replaced. Lowering replaces them by
# in-place writes (`copy_` into the region), so the op comparison (`computes_the_same_ops`) ignores them.
SCATTERS: set[Any] = {
    aten.select_scatter.default,
    aten.slice_scatter.default,
    aten.diagonal_scatter.default,
    aten.as_strided_scatter.default,
    as_strided_scatter_rel,
    index_scatter_rel,
    region_write,
}

# The only writes a functional graph holds (docs/architecture.md, "Autograd facts"), by the argument whose data
# they write. `write_back_now(target, value)`, only under autograd: a caller's tensor that ops save for backward
# receives its final value where its last write was, so the tensor eager saves is the caller's own (argument 0, a
# placeholder). `bump_version(t)`: `x.copy_(x)` of a caller's tensor writes no value (None) but moves its version
# counter, as eager's does (autograd's check of saved tensors reads it, and so can the caller).
OWN_WRITES: dict[Callable[..., Any], int | None] = {write_back_now: 0, bump_version: None}
_AUTOGRAD_ONLY = {write_back_now}

# Grad-mode switches the torch executor places around ops run under no_grad: not ops, no value, no source line.
GRAD_SWITCHES = {torch._C._set_grad_enabled}
# (Views of dealias's own, `as_strided_rel`, are marked `dealias_view`: `opfacts.is_view_node` knows them.)


# -- reporting ---------------------------------------------------------------------------------------------------


def _fail(check: str, stage: str, node: fx.Node | None, message: str) -> None:
    where = f" at {node.name} = {_target_text(node)}(...)" if node is not None else ""
    text = f"invariant '{check}' broken after {stage}{where}: {message}"
    raise InvariantError(with_location(text, node_location(node) if node is not None else None))


def _target_text(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, str):  # a Tensor method (the torch executor's graph)
        return f".{t}"
    return str(t) if isinstance(t, OpOverload) else getattr(t, "__name__", str(t))


def _calls(gm: fx.GraphModule) -> Iterator[fx.Node]:
    return (n for n in gm.graph.nodes if n.op in ("call_function", "call_method"))


def _is_size(value: Any) -> bool:
    """A value of size arithmetic (a symbolic size, a shape, a Python scalar), not a tensor."""
    leaves = pytree.tree_leaves(value)
    return value is not None and bool(leaves) and not any(isinstance(x, torch.Tensor) for x in leaves)


def _has_tensor(value: Any) -> bool:
    return any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(value))


# -- 1. the functional graph writes nothing ----------------------------------------------------------------------


def functional_writes_nothing(gm: fx.GraphModule, stage: str = "functionalize") -> None:
    """No node writes memory: no in-place, out= or mutable op (from `opfacts.facts`: `copy_` is in-place,
    `Tag.inplace_view` ops are INPLACE_VIEW), unless called so that it writes nothing (BatchNorm in eval mode);
    no function target but views, scatters, size arithmetic and `PURE_FUNCTIONS`. The documented exceptions:
    `bump_version` (no data written), and, only in a program with an input that requires grad, `write_back_now`
    into a caller's tensor and the in-place op `run_in_place_on_caller` runs on (a view of) the caller's tensor itself
    (`caller_tensor(x)` or `write_back_now(x, ..)`), whose backward saves its result as eager's does."""
    check = "functional graph writes nothing"
    autograd = any(n.op == "placeholder" and n.meta.get("rg") for n in gm.graph.nodes)
    for node in _calls(gm):
        t = node.target
        if isinstance(t, OpOverload):
            f = facts(t)
            if f.kind in (OpKind.FUNCTIONAL, OpKind.VIEW) or _writes_nothing_here(node):
                continue
            if f.kind is OpKind.INPLACE and autograd and _on_caller_tensor(node):
                continue
            _fail(check, stage, node, f"{t} writes memory (kind: {f.kind.value})")
        elif t in PURE_FUNCTIONS or t in SCATTERS or t is operator.getitem or is_view_node(node):
            continue
        elif _is_size(node.meta.get("val")) and not any(_has_tensor(a.meta.get("val")) for a in node.all_input_nodes):
            continue  # arithmetic on sizes and positions
        elif t in OWN_WRITES:
            arg = OWN_WRITES[t]
            if t in _AUTOGRAD_ONLY and not autograd:
                _fail(check, stage, node, f"{op_name(t)} in a program where no input requires grad")
            if arg is not None and node.args[arg].op not in ("placeholder", "get_attr"):
                _fail(check, stage, node, "it writes a tensor other than a caller's")
        else:
            _fail(check, stage, node, f"unknown function target {t!r}")


def _writes_nothing_here(node: fx.Node) -> bool:
    f = facts(node.target)
    return writes_nothing(node.target, node.args, node.kwargs, f.mutated)


def _on_caller_tensor(node: fx.Node) -> bool:
    """The in-place op writes (a view of) the caller's tensor itself, as `_in_place_on_caller` emits it."""
    written = _written(node)
    if len(written) != 1:
        return False
    a = written[0]
    while is_view_node(a) and isinstance(a.args[0], fx.Node):
        a = a.args[0]
    return a.target in (caller_tensor, write_back_now)


# -- 2. every node carries its metadata --------------------------------------------------------------------------


def source_facts(captured_gm: fx.GraphModule) -> tuple[bool, bool]:
    """Whether every op of the captured graph computing tensors has a source line, and a grad mode: then every
    node later passes build from them must too (nodes of programs whose captured ops lack lines, e.g. inside
    torch.nn modules, cannot be matched to them and are not asked for one)."""
    ops = [n for n in captured_gm.graph.nodes if n.op == "call_function" and _has_tensor(n.meta.get("val"))]
    return all(n.meta.get("stack_trace") for n in ops), all("grad" in n.meta for n in ops)


def carries_metadata(gm: fx.GraphModule, stage: str, located: bool = True, grads: bool = True) -> None:
    """Every op node has `meta["val"]` (its fake value; None for functions run for their effect); every node
    computing tensors has `meta["grad"]` (the grad mode it runs in; `grads`), and a source line
    (`meta["stack_trace"]`; `located`). Exempt, having no user line: size arithmetic (symbolic sizes placed
    after the inputs by `Emitter._early`, `sym_size` of bounds checks), the executor's grad-mode switches, and
    the clones `protect_written_inputs` (functionalize/inputs.py) reads written inputs through (and their views
    for alias-group members): copies of the caller's tensors on entry, for no op of the user's."""
    for node in _calls(gm):
        if node.target in GRAD_SWITCHES:
            continue
        if "val" not in node.meta:
            _fail("every node carries its metadata", stage, node, "no fake value (meta['val'])")
        val = node.meta["val"]
        if _is_size(val):
            continue
        if grads and _has_tensor(val) and "grad" not in node.meta:
            _fail("every node carries its metadata", stage, node, "no grad mode (meta['grad'])")
        if located and not node.meta.get("stack_trace") and not _entry_copy(node):
            _fail("every node carries its metadata", stage, node, "no source line (meta['stack_trace'])")


def _entry_copy(node: fx.Node) -> bool:
    if node.target is as_strided_rel and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    clone = node.target in (aten.clone.default, "clone")  # (the torch executor calls it as a method)
    return clone and isinstance(node.args[0], fx.Node) and node.args[0].op == "placeholder"


# -- memory identity ---------------------------------------------------------------------------------------------


def _alias_source(node: fx.Node) -> fx.Node | None:
    """The node whose memory `node`'s result is (part of): a view's base, the tensor an in-place op writes and
    returns, the argument a pure function of dealias's returns. None: memory of its own."""
    if node.op != "call_function":
        return None
    t = node.target
    arg: Any = None
    if is_view_node(node):
        arg = node.args[0]
    elif isinstance(t, OpOverload):
        f = facts(t)
        if f.kind is OpKind.INPLACE and f.mutated == ("self",) and isinstance(node.meta.get("val"), torch.Tensor):
            arg = bind_args(t._schema, node.args, node.kwargs).get("self")
    elif t in PURE_FUNCTIONS and PURE_FUNCTIONS[t] is not None:
        arg = node.args[PURE_FUNCTIONS[t]]
    elif t in OWN_WRITES and OWN_WRITES[t] is not None:
        arg = node.args[OWN_WRITES[t]]
    return arg if isinstance(arg, fx.Node) else None


def memory_roots(gm: fx.GraphModule, aliases: dict[fx.Node, list[fx.Node]] | None = None) -> dict[fx.Node, fx.Node]:
    """Every node's memory root, in one pass (nodes come after their arguments). Members of an alias group
    (`aliases`: group base placeholder -> member placeholders) have the group's base as root."""
    roots: dict[fx.Node, fx.Node] = {}
    for base, members in (aliases or {}).items():
        for m in members:
            roots[m] = base
    for n in gm.graph.nodes:
        if n in roots:
            continue
        source = _alias_source(n)
        roots[n] = n if source is None else roots.get(source, source)
    return roots


def _written(node: fx.Node) -> list[fx.Node]:
    """The tensors `node` writes (data, not metadata)."""
    t = node.target
    if node.op != "call_function":
        return []
    if isinstance(t, OpOverload):
        f = facts(t)
        if f.kind not in (OpKind.INPLACE, OpKind.OUT, OpKind.MUTABLE) or _writes_nothing_here(node):
            return []
        bound = bind_args(t._schema, node.args, node.kwargs)
        return [a for name in f.mutated for a in pytree.tree_leaves(bound.get(name)) if isinstance(a, fx.Node)]
    arg = OWN_WRITES.get(t)
    return [node.args[arg]] if arg is not None else []


# -- 3. no view made before an in-place write is read after it ---------------------------------------------------


def no_stale_view_reads(
    gm: fx.GraphModule, stage: str = "lower", aliases: dict[fx.Node, list[fx.Node]] | None = None
) -> None:
    """For each write into memory M (an in-place op, `copy_`, `write_back_now`), no alias of M made before the
    write (a view, or an in-place op's result) is used by a node after it: in a functional graph a node stands
    for the values it had when made, at run time an alias shows M's current contents. M's owner itself (an input,
    an intermediate's base) is exempt: reads of it after the write are meant to see the write. So is
    `caller_after(t, written)`, which exists to read `t` after the write, and `bump_version(t)`, which reads none
    of its memory. Memory by `memory_roots` (views followed back to their base; alias group members are their
    group's memory)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    roots = memory_roots(gm, aliases)
    writes: dict[fx.Node, list[fx.Node]] = {}  # memory -> its writes, in graph order
    for n in gm.graph.nodes:
        for a in _written(n):
            ws = writes.setdefault(roots[a], [])
            if not ws or ws[-1] is not n:
                ws.append(n)
    if not writes:
        return
    positions = {m: [order[w] for w in ws] for m, ws in writes.items()}
    for v in gm.graph.nodes:
        m = roots[v]
        if m is v or m not in writes:
            continue
        i = bisect.bisect_right(positions[m], order[v])
        if i == len(positions[m]):
            continue
        write = writes[m][i]
        for u in v.users:
            if order[u] > order[write] and u.target not in (caller_after, bump_version):
                _fail(
                    "no view made before an in-place write is read after it",
                    stage,
                    u,
                    f"reads {v.name}, an alias of {m.name} made before {write.name} wrote it "
                    f"(the write: {node_location(write) or 'no source line'})",
                )


# -- 4. write regions lie inside their memory --------------------------------------------------------------------


def _extent(t: torch.Tensor) -> tuple[Any, Any]:
    """First and last byte a tensor reaches in its storage (non-negative strides; in bytes, since a dtype view
    such as `view_as_real` counts elements of another size than its base)."""
    last = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    size = t.element_size()
    return t.storage_offset() * size, last * size + size - 1


def writes_inside_memory(
    gm: fx.GraphModule, stage: str = "lower", aliases: dict[fx.Node, list[fx.Node]] | None = None
) -> None:
    """The fake value of every written tensor lies inside the memory of its root (the input, alias group base or
    intermediate it is a view of): the same storage, and the first and last byte it reaches (from storage offset,
    sizes, strides and element size) within the root's; a write outside would land in a neighbour's memory. Symbolic
    sizes: only a violation that holds for every value of the symbols is reported (no guard is added)."""
    roots = memory_roots(gm, aliases)
    for n in gm.graph.nodes:
        for a in _written(n):
            root = roots[a]
            t, r = a.meta.get("val"), root.meta.get("val")
            if not isinstance(t, torch.Tensor) or not isinstance(r, torch.Tensor):
                continue
            if surely(t.numel() == 0):
                continue
            if a is not root and not _same_storage(t, r):
                _fail("write regions lie inside their memory", stage, n, f"{a.name} is not in {root.name}'s storage")
            (lo, hi), (rlo, rhi) = _extent(t), _extent(r)
            if surely(lo < rlo) or surely(hi > rhi) or surely(r.numel() == 0):
                _fail(
                    "write regions lie inside their memory",
                    stage,
                    n,
                    f"it writes bytes {lo}..{hi} of the storage; {root.name} holds {rlo}..{rhi}",
                )


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return a.untyped_storage()._cdata == b.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # a tensor without a storage to compare: nothing to tell
        return True


# -- 5. the executor's graph computes what the functional one does -----------------------------------------------

# Copies lowering adds or removes: `region.copy_(value)` replaces a scatter, a functional setitem `copy(old, src)`
# becomes `copy_`, and re-striding (`copy(empty_strided(..), x)`) of a version written in place goes.
_COPIES = {aten.copy.default, aten.copy_.default, aten.empty_strided.default}


def compute_ops(gm: fx.GraphModule) -> Counter[Any]:
    """The multiset of ops that compute values: in-place ops counted as their functional form; views, scatters,
    copies, size arithmetic and bounds checks left out."""
    out = Counter(op for n in gm.graph.nodes if (op := _counted_as(n)) is not None)
    for (
        n
    ) in gm.graph.nodes:  # (ops a lowering folded into a node: the clones writeback._eager_mutations_in_place drops)
        out.update(n.meta.get("absorbs", ()))
    return out


def computes_the_same_ops(functional: fx.GraphModule, lowered: fx.GraphModule, stage: str = "lower") -> None:
    """Write-back lowering changes how values are stored, not what is computed. What `writeback.lower` may
    change, from reading it: it decomposes the region writes it leaves (their nodes are marked and count as the
    write: scatters, views, re-striding), adds views (each region's chain on the root, `narrow` of repeated dims),
    `copy_` into regions, bounds checks with their `sym_size`, and runs a value's op as its in-place variant
    (`add` -> `add_`, found through `opfacts.inplace_variant`, so counted as `add`; a `draw_like(op_, ..)` as
    `op_`, which it counts as; a foreach op whose results are all copied into its list as
    `_foreach_op_`, absorbing their getitems); it removes the scatters and
    pure-view inverses that built each version, the re-striding copies, views of older versions, and the
    functional `copy` of a setitem (now `copy_`). Everything else, each op computing a value, stays, as many
    times: the multisets of `compute_ops` are equal. (User-level scatters and copies are left out of the
    comparison too: lowering's cannot be told from them.)"""
    before, after = compute_ops(functional), compute_ops(lowered)
    if before == after:
        return
    lost, added = before - after, after - before
    if added:
        op = next(iter(added))
        node = next(n for n in lowered.graph.nodes if _counted_as(n) is op)
        _fail("the executor's graph computes the same ops", stage, node, f"lowering added {added[op]} x {op}")
    op = next(iter(lost))
    node = next(n for n in functional.graph.nodes if _counted_as(n) is op)
    _fail("the executor's graph computes the same ops", stage, node, f"lowering dropped {lost[op]} x {op}")


def _counted_as(n: fx.Node) -> Any:
    """The op `n` counts as in `compute_ops` (None: not counted)."""
    t = n.target
    if n.op != "call_function" or is_view_node(n) or t in SCATTERS or t in _COPIES or is_bounds_check(t):
        return None
    if "decomposes" in n.meta:  # a node of a region write's decomposition (regions.decompose): the write itself
        return None
    if _is_size(n.meta.get("val")) and t is not operator.getitem:
        return None
    if "counts_as" in n.meta:  # (an op lowering ran in place: writeback._reinplace_value)
        return n.meta["counts_as"]
    if t is draw_like:
        return n.args[0]
    if isinstance(t, OpOverload):
        f = facts(t)
        if f.kind is OpKind.INPLACE and f.functional is not None:
            return f.functional
    return t


def executes_no_region_write(gm: fx.GraphModule, stage: str = "lower") -> None:
    """A region write is the functional graph's record of a write (regions.py): lowering runs it in place or
    decomposes it into view inverses, so no executor ever sees one."""
    for n in _calls(gm):
        if is_region_write(n):
            _fail("executes no region write", stage, n, "a region write was left for the executor")


# -- the plan ----------------------------------------------------------------------------------------------------


def matches_plan(fp: Any, stage: str) -> None:
    """The graph's results are what the plan reads: write-backs first, as results 0..k-1 in order, each of its
    target's shape and dtype; then the output bases and symbolic arguments the output slots refer to (a slot's
    `source` of kind "result", `ResultArg`s of its chain), each referred to at least once; `same_as` refers to
    an earlier slot."""
    gm = fp.gm
    out = next(n for n in gm.graph.nodes if n.op == "output")
    results = list(out.args[0])
    k = len(fp.writebacks)
    for i, wb in enumerate(fp.writebacks):
        if wb.output != i:
            _fail("output count matches the plan", stage, out, f"write-back {i} reads result {wb.output}")
        target = root_node(gm, wb.target)
        if target is None:
            _fail("output count matches the plan", stage, out, f"write-back {i} writes {wb.target}: no such tensor")
        got, want = results[i].meta.get("val"), target.meta.get("val")
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
            same_shape = got.dim() == want.dim() and all(surely(x == y) for x, y in zip(got.shape, want.shape))
            if got.dtype != want.dtype or not same_shape:
                _fail(
                    "output count matches the plan",
                    stage,
                    results[i],
                    f"written back into {target.name} ({want.dtype}{list(want.shape)}) as {got.dtype}{list(got.shape)}",
                )
    used: set[int] = set()
    for position, slot in enumerate(fp.outputs):
        if slot.same_as is not None:
            if not 0 <= slot.same_as < position:
                _fail("output count matches the plan", stage, out, f"output {position} is the same as {slot.same_as}")
            continue
        refs = [slot.source.key] if slot.source.kind is RefKind.RESULT else []
        refs += [a.index for a in chain_args(slot.chain) if isinstance(a, ResultArg)]
        refs += [slot.history] if slot.history is not None else []  # (the history an element is given)
        for r in refs:
            if not k <= r < len(results):
                message = f"output {position} reads result {r} of {len(results)}"
                _fail("output count matches the plan", stage, out, message)
        used.update(refs)
        if slot.source.kind is not RefKind.RESULT and root_node(gm, slot.source) is None:
            _fail("output count matches the plan", stage, out, f"output {position} reads {slot.source}: no such tensor")
    orphans = sorted(set(range(k, len(results))) - used)
    if orphans:
        _fail("output count matches the plan", stage, out, f"results {orphans} are read by no output")


# -- the hook ----------------------------------------------------------------------------------------------------


def checker(captured: Any) -> Callable[..., None]:
    """`check(stage, program, functional=None, aliases=None)` for one compile: a no-op unless checks are on.
    `functional` is the optimized functional graph (for the lowered one), `aliases` the alias-group placeholders
    (`pipeline._alias_placeholders`)."""
    if not enabled():
        return lambda *args, **kwargs: None
    located, grads = source_facts(captured.gm)

    def check(stage: str, fp: Any, functional: fx.GraphModule | None = None, aliases: Any = None) -> None:
        gm = fp.gm
        if stage in ("functionalize", "optimize"):
            functional_writes_nothing(gm, stage)
        carries_metadata(gm, stage, located, grads)
        if stage == "lower":
            executes_no_region_write(gm, stage)
            no_stale_view_reads(gm, stage, aliases)
            writes_inside_memory(gm, stage, aliases)
            computes_the_same_ops(functional, gm, stage)
        if stage != "torch executor":
            matches_plan(fp, stage)

    return check
