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

from .alias import Storage
from .capture import TENSOR_SLOT, Captured
from .functionalize import FunctionalProgram, OutputSlot
from .viewops import replay_chain


def _torch_call(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return op(*args, **kwargs)


@dataclass
class CompiledProgram:
    captured: Captured
    functional: FunctionalProgram
    run_graph: Callable[..., Any]  # the executor's callable for `functional.gm`
    traces: list[Any]

    def caller_tensor(self, s: Storage, tensors: list[torch.Tensor]) -> torch.Tensor:
        if s.kind == "input":
            return tensors[s.index]
        return self.functional.constants[s.constant]

    def __call__(self, leaves: list[Any]) -> Any:
        cap, fp = self.captured, self.functional
        tensors = [leaves[p] for p in cap.tensor_positions]
        results = self.run_graph(*tensors)
        for wb in fp.writebacks:
            self.caller_tensor(wb.storage, tensors).copy_(results[wb.output])
        outs = [self._output(slot, tensors, results) for slot in fp.outputs]
        for mw in fp.metadata_writebacks:
            self.caller_tensor(mw.storage, tensors).as_strided_(mw.size, mw.stride, mw.offset)
        it = iter(outs)
        out_leaves = [next(it) if t is TENSOR_SLOT else t for t in cap.out_template]
        return pytree.tree_unflatten(out_leaves, cap.out_spec)

    def _output(self, slot: OutputSlot, tensors: list[torch.Tensor], results: Any) -> torch.Tensor:
        if slot.kind == "caller":
            base = self.caller_tensor(slot.storage, tensors)
            return replay_chain(slot.chain, base, _torch_call)
        base = results[slot.index]
        shift = base.storage_offset() - slot.storage.root_meta.storage_offset()
        return replay_chain(slot.chain, base, _torch_call, shift)


def torch_executor(gm: fx.GraphModule) -> Callable[..., Any]:
    """Run the functional graph op by op through its generated Python code; autograd works through it."""
    return gm
