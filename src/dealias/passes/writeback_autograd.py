"""Write-back lowering of graphs autograd records (writeback.lower's part for them, and the fused executor's).

Such a graph stays functional (autograd needs the functional values), with these exceptions, each eager's own
behaviour: on the torch executor, an intermediate eager updated in place is updated in place again
(`eager_updates_in_place`), and a mutable op eager ran on caller's tensors requiring no grad runs on them again
(`eager_mutations_in_place`); for AOTAutograd, whole write-backs of inputs requiring no grad become `copy_` at the
graph's end (`whole_writes_in_graph`).
"""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import Any

import torch
import torch.fx as fx

from ..ir.opfacts import OpKind, bind_args, facts, inplace_variant, op_name
from ..ir.plan import FunctionalProgram, Ref, RefKind, ResultArg, WriteBackReport, alias_group_of
from ..ir.viewops import chain_args, internal_overlap
from .writeback import _fresh, _reads_its_target, _remapped, _same_layout, _updated_in_place, whole_report

aten = torch.ops.aten


def eager_updates_in_place(graph: fx.Graph) -> list[fx.Node]:
    """In a graph autograd records: `op(B, ..)` where eager ran `B.op_(..)` (meta "eager_in_place", from
    functionalization) runs as that in-place op again, when B is an intermediate of its own (a fresh result, no
    view, of op's shape, dtype and layout) that nothing else reads, and op reads B through no other argument
    (`_reads_its_target`). Eager updated this very tensor in place, so autograd records what eager's recorded
    (`conv -> batch_norm -> relu_`: relu's backward reads its result, as eager's), and no new tensor is made: a
    ReLU over a training BatchNorm's 1 MB output took 80 us out of place against 25 in place (a fresh
    result's memory is cold). A B nothing else reads was read by eager after the write only through the updated
    tensor, which the later nodes read. Returns the in-place nodes made."""
    made = []
    for n in list(graph.nodes):
        if n.op != "call_function" or not n.meta.get("eager_in_place"):
            continue
        b = _updated_in_place(n)
        if b is None or not _fresh(b) or set(b.users) != {n} or _reads_its_target(n, b):
            continue
        op_ = inplace_variant(n.target)
        with graph.inserting_before(n):
            new = graph.call_function(op_, n.args, dict(n.kwargs))
        new.meta = dict(n.meta)
        new.meta["counts_as"] = n.target  # (invariants.compute_ops: the same op as the functional graph's)
        n.replace_all_uses_with(new)
        name = n.name
        graph.erase_node(n)
        new._rename(name)  # (the functional trace's name: `relu = getitem.relu_()`)
        made.append(new)
    return made


def _mutable_variant(op: Any) -> Any:
    """The mutable overload whose functional counterpart is `op` (`_native_batch_norm_legit_functional` ->
    `_native_batch_norm_legit`), found by the naming rule functional counterparts follow (`foo` -> `foo_functional`)."""
    name = op_name(op)
    packet = getattr(torch.ops.aten, name.removesuffix("_functional"), None) if name.endswith("_functional") else None
    for ov in (getattr(packet, o) for o in packet.overloads()) if packet is not None else ():
        if facts(ov).kind is OpKind.MUTABLE and facts(ov).functional is op:
            return ov
    return None


def _eager_op(n: fx.Node) -> Any:
    """The mutable op eager ran where functionalization made `n` (meta "eager_in_place"), if its functional form
    is n's: `native_batch_norm`, which writes a training BatchNorm's running statistics without declaring it, so
    that ADInplaceOrView moves no counter of theirs and autograd records eager's NativeBatchNormBackward0, where
    `_native_batch_norm_legit` would move both counters (set back after the call) and record another node."""
    op = n.meta.get("eager_in_place")
    if not isinstance(op, torch._ops.OpOverload) or facts(op).kind is not OpKind.MUTABLE:
        return None
    return op if facts(op).functional is n.target and facts(op).mutated else None


def eager_mutations_in_place(
    fp: FunctionalProgram, aliases: dict[fx.Node, list[fx.Node]]
) -> tuple[FunctionalProgram, list[WriteBackReport]]:
    """In a graph autograd records (the torch executor): a mutable op eager ran on caller's tensors that require
    no grad, `native_batch_norm` updating a training BatchNorm's running statistics, runs as its mutable op on those
    tensors again, where functionalization made it `op_functional(.., clone(P), ..)` and the new value of P is only
    P's write-back: no clones, no copies back (the call still sets back the counters eager's kernel leaves,
    FunctionalProgram.unmoved_counters, which it now leaves too). Each P is a placeholder of its own (no alias
    group, no overlap, requiring no grad, of the new value's layout) read by nothing else; autograd saves P
    itself, as eager's op does. Returns the program and a report per tensor so written."""
    graph = fp.gm.graph
    out_node = graph.output_node()
    results = list(out_node.args[0])
    written = _only_written_back(fp, results)
    placeholders = graph.find_nodes(op="placeholder")
    aliased = set(aliases) | {a for group in aliases.values() for a in group}
    dropped: set[int] = set()
    reports: list[WriteBackReport] = []
    for n in list(graph.nodes):
        if (
            n.op != "call_function"
            or not n.meta.get("eager_in_place")
            or not isinstance(n.target, torch._ops.OpOverload)
        ):
            continue
        mutable = _eager_op(n) or _mutable_variant(n.target)
        if mutable is None or any(u.target is not operator.getitem for u in n.users):
            continue
        returns = len(mutable._schema.returns)
        bound = bind_args(mutable._schema, n.args, n.kwargs)
        news = {u.args[1]: u for u in n.users}
        swap: dict[fx.Node, fx.Node] = {}  # clone(P) -> P
        drops = []
        for k, name in enumerate(facts(mutable).mutated):
            clone, new = bound.get(name), news.get(returns + k)
            if not isinstance(clone, fx.Node) or clone.target is not aten.clone.default or clone.kwargs:
                break
            p = clone.args[0]
            if p.op != "placeholder" or p in aliased or p.meta.get("rg") or set(p.users) != {clone}:
                break
            if set(clone.users) != {n} or new is None or set(new.users) != {out_node}:
                break
            wb = written.get(results.index(new))
            if wb is None or wb.target != Ref(RefKind.INPUT, placeholders.index(p)) or _requires_grad(new):
                break
            pv, nv = p.meta.get("val"), new.meta.get("val")
            if not isinstance(pv, torch.Tensor) or internal_overlap(pv) != "no" or pv.dtype != nv.dtype:
                break
            if tuple(pv.shape) != tuple(nv.shape) or not _same_layout(pv, nv):
                break
            swap[clone] = p
            drops.append((results.index(new), wb))
        else:
            if not swap:
                continue
            with graph.inserting_before(n):
                op = graph.call_function(mutable, *fx.node.map_arg((n.args, n.kwargs), lambda a, s=swap: s.get(a, a)))
            op.meta = dict(n.meta)
            op.meta["counts_as"] = n.target  # (invariants.compute_ops: the functional graph's op, and its clones)
            op.meta["absorbs"] = [aten.clone.default, operator.getitem] * len(swap)  # (the new values read)
            for i, g in news.items():
                if i < returns:
                    g.args = (op, i)
            if mutable is _eager_op(n):  # eager's own kernel: the counters of what it writes move as eager's did
                unmoved = {Ref(RefKind.INPUT, placeholders.index(p)) for p in swap.values()}
                fp.unmoved_counters = [r for r in fp.unmoved_counters if r not in unmoved]
            for i, wb in drops:
                dropped.add(i)
                reports.append(whole_report(wb.target, results[i], f"x by {op_name(mutable)}(..)", "in place"))
                results[i] = None
            out_node.args = (tuple(results),)
            for g in [g for i, g in news.items() if i >= returns]:
                graph.erase_node(g)
            graph.erase_node(n)
            for clone in swap:
                graph.erase_node(clone)
    if not dropped:
        return fp, []
    if not fp.unmoved_counters:  # (the moved ones are read only to be set again after the unmoved are set back)
        fp.moved_counters = []
    return _drop_results(fp, results, dropped), reports


def eager_ops_on_copies(graph: fx.Graph) -> list[fx.Node]:
    """In a graph autograd records (the torch executor), after `eager_mutations_in_place`: a functional node whose
    eager op declares no write (`native_batch_norm`, see `_eager_op`) that rule left functional (the running
    statistics read elsewhere, aliased, or not only written back) runs as eager's op on copies of the written
    arguments, fresh tensors read by nothing else, whose values after it are the functional node's new values:
    autograd records eager's NativeBatchNormBackward0, not `_native_batch_norm_legit_functional`'s node, from the
    same kernel and values. A copy is the functional graph's own `clone` where only this node reads it. Returns the
    nodes made."""
    made = []
    for n in list(graph.nodes):
        mutable = _eager_op(n) if n.op == "call_function" else None
        if mutable is None or any(u.target is not operator.getitem for u in n.users):
            continue
        returns = len(mutable._schema.returns)
        bound = bind_args(mutable._schema, n.args, n.kwargs)
        written = [bound.get(name) for name in facts(mutable).mutated]
        if not all(isinstance(a, fx.Node) for a in written) or len(set(written)) != len(written):
            continue
        if any(a in n.args[:1] for a in written):  # (read as another argument too)
            continue
        copies: dict[fx.Node, fx.Node] = {}
        with graph.inserting_before(n):
            for a in written:
                if a.target is aten.clone.default and not a.kwargs and set(a.users) == {n}:
                    copies[a] = a
                    continue
                c = graph.call_function(aten.clone.default, (a,))
                c.meta = {**n.meta, "val": a.meta.get("val"), "rg": False}  # (made for the op: its line, grad mode)
                c.meta.pop("eager_in_place", None)
                c.meta["counts_as"] = None  # (a copy for the op to write, not a value the functional graph computes)
                copies[a] = c
            op = graph.call_function(mutable, *fx.node.map_arg((n.args, n.kwargs), lambda a, c=copies: c.get(a, a)))
        op.meta = dict(n.meta)
        op.meta["counts_as"] = n.target
        news = [(i, g) for i, g in ((u.args[1], u) for u in list(n.users))]
        op.meta["absorbs"] = [operator.getitem] * sum(i >= returns for i, _ in news)
        for i, g in news:
            if i < returns:
                g.args = (op, i)
            else:
                g.replace_all_uses_with(copies[written[i - returns]])
                graph.erase_node(g)
        graph.erase_node(n)
        made.append(op)
    return made


def eager_input_updates_in_place(
    fp: FunctionalProgram, aliases: dict[fx.Node, list[fx.Node]]
) -> tuple[FunctionalProgram, list[WriteBackReport]]:
    """In a graph autograd records (the torch executor): `op(P, ..)` where eager ran `P.op_(..)` on a caller's
    tensor P requiring no grad (a training BatchNorm's `num_batches_tracked.add_(1)`) runs as that in-place op on
    P again, where its value is only P's whole write-back: no new tensor, no copy back, P's counter moved once by
    the op as eager's was. P is a placeholder of its own (no alias group, no overlap) that nothing else reads
    (so no earlier value of it is read after the write, and autograd saves none), the value requires no grad
    (`_requires_grad`: the op records nothing), and the op reads P through no other argument."""
    graph = fp.gm.graph
    out_node = graph.output_node()
    results = list(out_node.args[0])
    written = _only_written_back(fp, results)
    placeholders = graph.find_nodes(op="placeholder")
    aliased = set(aliases) | {a for group in aliases.values() for a in group}
    dropped: set[int] = set()
    reports: list[WriteBackReport] = []
    for n in list(graph.nodes):
        if n.op != "call_function" or not n.meta.get("eager_in_place") or set(n.users) != {out_node}:
            continue
        p = _updated_in_place(n)
        if p is None or p.op != "placeholder" or p in aliased or p.meta.get("rg") or set(p.users) != {n}:
            continue
        wb = written.get(results.index(n)) if results.count(n) == 1 else None
        if wb is None or wb.target != Ref(RefKind.INPUT, placeholders.index(p)) or _requires_grad(n):
            continue
        if internal_overlap(p.meta["val"]) != "no" or _reads_its_target(n, p):
            continue
        with graph.inserting_before(n):
            new = graph.call_function(inplace_variant(n.target), n.args, dict(n.kwargs))
        new.meta = dict(n.meta)
        new.meta["counts_as"] = n.target  # (invariants.compute_ops: the same op as the functional graph's)
        i = results.index(n)
        results[i] = None
        out_node.args = (tuple(results),)
        graph.erase_node(n)
        dropped.add(i)
        reports.append(whole_report(wb.target, new, f"x.{op_name(new.target)}(..)", "in place"))
    if not dropped:
        return fp, []
    return _drop_results(fp, results, dropped), reports


def _only_written_back(fp: FunctionalProgram, results: list[Any]) -> dict[int, Any]:
    """The graph's results that are a write-back's value and nothing else (no output reads them), by position."""
    read = _results_outputs_read(fp)
    return {wb.output: wb for wb in fp.writebacks if wb.output not in read and results.count(results[wb.output]) == 1}


def _drop_results(fp: FunctionalProgram, results: list[Any], dropped: set[int]) -> FunctionalProgram:
    """`fp` without the graph results at `dropped` (their write-backs now made inside the graph)."""
    out_node = fp.gm.graph.output_node()
    out_node.args = (tuple(r for i, r in enumerate(results) if i not in dropped),)
    remap = {old: new for new, old in enumerate(i for i in range(len(results)) if i not in dropped)}
    fp.writebacks = [replace(wb, output=remap[wb.output]) for wb in fp.writebacks if wb.output not in dropped]
    fp.outputs = [_remapped(slot, remap) for slot in fp.outputs]
    fp.gm.recompile()
    return fp


def whole_writes_in_graph(fp: FunctionalProgram) -> tuple[FunctionalProgram, frozenset[int]]:
    """For a graph autograd records, headed for AOTAutograd (which keeps a mutation of an input that does not
    require grad inside the compiled graph, as one store in the kernel that computes the value): the whole
    write-backs of such inputs become `copy_(input, value)` at the graph's end instead of copies after it. Only
    where no two inputs share memory, and the value requires no grad either. Returns the program and the
    positions of the placeholders now written inside the graph."""
    gm = fp.gm
    graph = gm.graph
    placeholders = graph.find_nodes(op="placeholder")
    if any(alias_group_of(p) is not None for p in placeholders):
        return fp, frozenset()
    out_node = graph.output_node()
    results = list(out_node.args[0])
    read = _results_outputs_read(fp)
    moved: dict[int, int] = {}  # result -> placeholder position
    for wb in fp.writebacks:
        if wb.target.kind is not RefKind.INPUT or wb.output in read:
            continue
        ph, value = placeholders[wb.target.key], results[wb.output]
        meta = ph.meta.get("val")
        if ph.meta.get("rg") or _requires_grad(value) or not isinstance(meta, torch.Tensor):
            continue
        if internal_overlap(meta) != "no" or results.count(value) > 1:
            continue
        moved[wb.output] = wb.target.key
    if not moved:
        return fp, frozenset()
    with graph.inserting_before(out_node):
        for k, i in moved.items():
            graph.call_function(torch.ops.aten.copy_.default, (placeholders[i], results[k]))
    out_node.args = (tuple(r for k, r in enumerate(results) if k not in moved),)
    remap = {old: new for new, old in enumerate(k for k in range(len(results)) if k not in moved)}
    fp.writebacks = [replace(wb, output=remap[wb.output]) for wb in fp.writebacks if wb.output not in moved]
    fp.outputs = [_remapped(slot, remap) for slot in fp.outputs]
    gm.recompile()
    return fp, frozenset(moved.values())


def _requires_grad(value: fx.Node) -> bool:
    """Whether eager's `value` requires grad: as functionalization marked it (meta "rg"; of a multi-output op's
    results, only those autograd differentiates: batch norm's updated running statistics are not, ir/emitter.py)."""
    return bool(value.meta.get("rg"))


def _results_outputs_read(fp: FunctionalProgram) -> set[int]:
    """The graph results the outputs are made from: as their source, in their view chains, as their history."""
    read = {s.source.key for s in fp.outputs if s.same_as is None and s.source.kind is RefKind.RESULT}
    read |= {a.index for s in fp.outputs for a in chain_args(s.chain) if isinstance(a, ResultArg)}
    return read | {s.history for s in fp.outputs if s.history is not None}
