"""A correction to dynamo's clean-up of its graph, for dealias's compiles only: an unused read at an index tensor
or list keeps its IndexError (`x.add_(1); x[idx]` with idx out of range raises in eager and returned with every
backend). See `install`."""

from __future__ import annotations

import functools
import operator
from typing import Any

import torch

from .registry import active, correction, require, require_module
from .settings import for_dealias


def tensor_getitem(x: Any, index: Any) -> Any:
    """`x[index]`, called by a dealias graph in place of `operator.getitem` for an unused read at an index tensor
    (`_install_kept_reads`)."""
    return x[index]


@correction(
    "kept_index_reads",
    corrects="an unused read at an index tensor (`x.add_(1); x[idx]`) is dropped: its IndexError is lost",
    without="such a read is dropped, as with every backend (no IndexError for an index out of range)",
)
def install() -> None:
    """Wrap `OutputGraph.remove_unused_graphargs`, whose clean-up drops every unused `operator.getitem` node (meant
    for tuple elements), tensor indexing included: `x[idx]` with an index out of range raises IndexError in eager,
    and returned with every backend (`x.add_(1); x[idx]`). For dealias's compiles such a read whose index holds a
    tensor or a list (values no trace checks) calls `tensor_getitem` instead, which the clean-up keeps, and
    dealias's own dead-code elimination keeps the read too (opfacts.may_raise): its index is checked as the program
    runs."""
    OutputGraph = require(require_module("torch._dynamo.output_graph"), "OutputGraph")  # noqa: N806
    original = require(OutputGraph, "remove_unused_graphargs", "self")

    @functools.wraps(original)
    def remove_unused_graphargs(self: Any) -> None:
        if active("kept_index_reads") and for_dealias(getattr(self, "compiler_fn", None)):
            for node in self.graph.find_nodes(op="call_function", target=operator.getitem):
                if not node.users and _indexes_by_tensor(node):
                    node.target = tensor_getitem
        return original(self)

    OutputGraph.remove_unused_graphargs = remove_unused_graphargs


def _indexes_by_tensor(node: torch.fx.Node) -> bool:
    """A dynamo graph's `operator.getitem` node indexing a tensor with an index that holds a tensor or a list
    (`x[[9]]`: indexing makes it an index tensor)."""

    def tensor(a: Any) -> bool:
        return isinstance(a, torch.fx.Node) and isinstance(a.meta.get("example_value"), torch.Tensor)

    index = node.args[1] if len(node.args) == 2 else None
    parts = index if isinstance(index, tuple) else (index,)
    advanced = any(isinstance(p, list) for p in parts) or any(tensor(a) for a in torch.utils._pytree.tree_leaves(index))
    return tensor(node.args[0]) and advanced
