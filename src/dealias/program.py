"""A compiled program: the functional graph plus the run-time epilogue that writes mutations back into
the caller's tensors and rebuilds outputs that alias inputs or each other.

The epilogue runs only after the whole graph has run, so a call that fails inside the graph leaves every
input as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from .capture import TENSOR_SLOT, Captured
from .functionalize import FunctionalProgram, Ref
from .viewops import replay_chain


def _torch_call(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return op(*args, **kwargs)


@dataclass
class CompiledProgram:
    captured: Captured
    functional: FunctionalProgram
    run_graph: Callable[..., Any]  # the executor's callable for `functional.gm`
    traces: list[Any]
    functional_gm: fx.GraphModule  # the functional graph before write-back lowering (for inspection)
    reports: list[Any]  # WriteBackReport per caller tensor written

    def resolve(self, ref: Ref, tensors: list[torch.Tensor], bases: list[torch.Tensor], results: Any) -> torch.Tensor:
        if ref.kind == "input":
            return tensors[ref.key]
        if ref.kind == "group":
            return bases[ref.key]
        if ref.kind == "constant":
            return self.functional.constants[ref.key]
        return results[ref.key]

    def __call__(self, leaves: list[Any]) -> Any:
        cap, fp = self.captured, self.functional
        tensors = [leaves[p] for p in cap.tensor_positions]
        bases = [g.base_of(tensors) for g in cap.groups]
        results = self.run_graph(*tensors, *bases)
        for wb in fp.writebacks:
            self.resolve(wb.target, tensors, bases, results).copy_(results[wb.output])
        outs = []
        for slot in fp.outputs:
            source = self.resolve(slot.source, tensors, bases, results)
            outs.append(replay_chain(slot.chain, source, _torch_call))
        for mw in fp.metadata_writebacks:
            t = self.resolve(mw.target, tensors, bases, results)
            t.as_strided_(mw.size, mw.stride, t.storage_offset() + mw.rel)
        it = iter(outs)
        out_leaves = [next(it) if t is TENSOR_SLOT else t for t in cap.out_template]
        return pytree.tree_unflatten(out_leaves, cap.out_spec)


def torch_executor(gm: fx.GraphModule) -> Callable[..., Any]:
    """Run the functional graph op by op through its generated Python code; autograd works through it."""
    return gm
