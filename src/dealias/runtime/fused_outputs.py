"""Outputs of a fused graph that eager made as tensors of their own by reshaping a value the graph computes (a
linear layer's 3-D result: `_unsafe_view` of its matmul's 2-D one), computed by the graph itself.

The generated call replays an output's view chain on the graph's result after the graph ran, so that outputs alias
inputs and each other exactly as eager's do. An output whose chain ends in `_unsafe_view` is no autograd view of
anything and has a version counter of its own, and where nothing else of the call reads the result it is made from,
nothing can tell it from a result the graph returns as it is. On the fused executor (nothing records autograd:
fused.unfusable) the chain then goes into the graph, where inductor returns the reshaped buffer without a kernel:
the replay was an aten call from Python after the kernels ran (GPT-2's logits: ~10 us with a warm cache, 40-60 us
a call after its 4 ms of kernels had evicted the interpreter's and the dispatcher's working set).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..ir.plan import FunctionalProgram, OutputSlot, RefKind, ResultArg

aten = torch.ops.aten


def outputs_in_graph(fp: FunctionalProgram) -> FunctionalProgram:
    """`fp` with each output chain that makes a tensor of its own from a graph result nothing else reads
    (`_foldable`) computed by its graph, the output then that result as it is."""
    graph = fp.gm.graph
    out_node = graph.output_node()
    results = list(out_node.args[0])
    read = Counter(wb.output for wb in fp.writebacks)  # (the results the call's epilogue reads)
    refs = [*fp.unmoved_counters, *fp.moved_counters, *(m.target for m in fp.metadata_writebacks)]
    read.update(r.key for r in refs if r.kind is RefKind.RESULT)
    for slot in fp.outputs:
        if slot.source.kind is RefKind.RESULT:
            read[slot.source.key] += 1
        read.update(a.index for a in pytree.tree_leaves([s.args for s in slot.chain]) if isinstance(a, ResultArg))
        read.update([slot.history] if slot.history is not None else [])
    slots, changed = list(fp.outputs), False
    for i, slot in enumerate(slots):
        if not _foldable(slot) or read[slot.source.key] != 1:
            continue
        node = results[slot.source.key]
        if not isinstance(node, fx.Node) or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        with graph.inserting_before(out_node):
            for step in slot.chain:
                made = graph.call_function(step.op, (node, *step.args), dict(step.kwargs))
                made.meta = {**node.meta, "val": step.op(node.meta["val"], *step.args, **dict(step.kwargs))}
                node = made
        results[slot.source.key] = node
        slots[i] = OutputSlot(slot.source, same_as=slot.same_as)
        changed = True
    if not changed:
        return fp
    out_node.args = (type(out_node.args[0])(results),)
    fp.gm.recompile()
    return dataclasses.replace(fp, outputs=slots)


def _foldable(slot: OutputSlot) -> bool:
    """A chain of aten views with constant arguments ending in `_unsafe_view` (a tensor of its own), replayed on a
    graph result with nothing else to do (no version counter set behind, no history, not made from another
    output, no layout set in place). Its grad mode does not matter where nothing records autograd."""
    plain = OutputSlot(slot.source, slot.chain, grad=slot.grad, same_as=slot.same_as)
    if slot != plain or slot.same_as is not None or slot.source.kind is not RefKind.RESULT or not slot.chain:
        return False
    if slot.chain[-1].op is not aten._unsafe_view.default:
        return False
    if not all(isinstance(s.op, torch._ops.OpOverload) for s in slot.chain):
        return False
    leaves = pytree.tree_leaves([(s.args, s.kwargs) for s in slot.chain])
    return not any(isinstance(a, (ResultArg, fx.Node, torch.SymInt, torch.SymFloat, torch.SymBool)) for a in leaves)
