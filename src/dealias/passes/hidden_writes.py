"""A write autograd does not see, after a read with grad on since the last write it records: where dealias would
give the tensor another grad_fn than eager's (hidden_write_after_a_read).

A write autograd does not see (under no_grad, through `detach()` / `.data`, through a dtype view leaving floating
point) leaves eager's tensor the grad_fn its last recorded write (or, for memory the program made, the op that
made it) gave it. A read of the tensor with grad on since that write (`v = x * 2`) sends its gradient through that
node. So, at the end of the graph, the gradient that reaches the tensor's grad_fn in eager is the gradient of every
such read plus that of what comes later; a hook registered on the tensor after the graph (by the caller, or by the
program: dynamo registers a hook after the graph), `retain_grad()`, or `torch.autograd.grad(.., x)` sees that sum.

dealias computes the hidden write functionally: the value it hands back (written back into the caller's tensor, or
returned) gets its history at its write-back or return (gradops.keep_history), or at the hidden write when a read
follows (autograd_facts._write_back_now), a node the earlier read's gradient never passes. The gradients of the
leaves are eager's, but a hook on the tensor would miss the read's gradient (fuzz seed 1940010: silently).

That differs only when all of these hold:
- the read carries the tensor's history: with grad on, not a view op (a view reads nothing; reads of it count),
  not through a detached or dtype view, into a differentiable result (not `x > 0`, not `zeros_like(x)`);
- the read's result reaches something the caller holds after the graph: a graph output, a caller's tensor
  (written by an op reading it), directly or through ops and writes of the program's memory in between (a dead
  read sends no gradient anywhere);
- the hidden write comes after it, with no write autograd records after the hidden write (that one gives eager's
  tensor a new grad_fn that the read's gradient does not pass either, as dealias's write-back does);
- the tensor is one the caller can hook after the graph: a caller's tensor (or an alias of it), or memory the
  program made and returns (or a view of it).

Then, for a caller's own tensor (an input of its own, not an alias group, no internal overlap), the graph does what
eager does: the tensor receives its value at its last recorded write (the anchor; AutogradFacts._write_back_now,
with grad on), the reads after it read the caller's tensor, and each hidden write after it is written into the
caller's tensor in place under no_grad (AutogradFacts.hidden_write_back): its grad_fn stays the anchor's
write-back, through which every read since went, and its version counter moves at each write as eager's. Elsewhere
(an alias group, memory the program made and returns) the graph runs eagerly.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..errors import UnsupportedError, node_location, with_location
from ..ir.emitter import differentiable
from ..ir.opfacts import bind_args, facts, is_view_node
from ..ir.plan import StorageKind
from ..ir.viewops import internal_overlap
from .alias import AliasInfo, Storage, Value


def hidden_write_after_a_read(gm: fx.GraphModule, info: AliasInfo, requires_grad: list[bool]) -> dict[Storage, fx.Node]:
    """Where a hidden write of a tensor follows a live read with grad on since its last recorded write, and no
    recorded write follows (see the module's docstring): for a caller's own tensor (not an alias group, no
    internal overlap), its last recorded write (the anchor: the caller's tensor receives its value there and
    its later hidden writes in place, see AutogradFacts.hidden_write_back); elsewhere UnsupportedError."""
    from .saved import tensor_values, written_storages

    nodes = list(gm.graph.nodes)
    storage_rg: dict[Storage, bool] = {}  # whether eager's tensors of each storage require grad (over-approximated)
    reads: dict[Storage, list[int]] = {}  # reads with history since the last recorded write (by position)
    pending: dict[Storage, fx.Node] = {}  # a hidden write after a live read, no recorded write after it
    recorded: dict[Storage, fx.Node] = {}  # the last recorded write
    anchors: dict[Storage, fx.Node] = {}  # of the pending ones: the recorded write their reads came after
    node_rg: dict[fx.Node, bool] = {}  # a multi-result op's: its `getitem`s' take it
    known: dict[int, bool] = {}

    def arg_rg(a: fx.Node) -> bool:
        v = info.values.get(a)
        return isinstance(v, Value) and storage_rg.get(v.storage, False)

    def live(r: int) -> bool:
        # (each walk is the rest of the graph: past _WALKS of them, a read counts as live unasked)
        if r not in known:
            known[r] = len(known) >= _WALKS or _live(r, nodes, info)
        return known[r]

    for i, n in enumerate(nodes):
        v = info.values.get(n)
        if n.op in ("placeholder", "get_attr") and isinstance(v, Value):
            caller = requires_grad[info.input_index[n]] if n.op == "placeholder" else _attr(gm, n.target)
            storage_rg[v.storage] = storage_rg.get(v.storage, False) or bool(getattr(caller, "requires_grad", caller))
            continue
        if n.op != "call_function":
            continue
        grad = bool(n.meta.get("grad"))
        values = tensor_values(n, info)
        written = written_storages(n, info, metadata=False) if isinstance(n.target, torch._ops.OpOverload) else set()
        from_args = any(storage_rg.get(x.storage, False) for x in values)
        if n.target is operator.getitem and isinstance(n.args[0], fx.Node):
            from_args = node_rg.get(n.args[0], False)
        rg = node_rg[n] = grad and from_args and differentiable(n, arg_rg)
        # Reads first: an op reads its arguments before it writes (`x.add_(x)` is a recorded write, not a read).
        if grad and not is_view_node(n) and differentiable(n, arg_rg):
            for x in values:
                if x.storage in reads and x.storage not in written and not _hidden_chain(x):
                    reads[x.storage].append(i)
        for s in written:
            storage_rg[s] = storage_rg.get(s, False) or rg
            targets = [x for x in _written_values(n, info) if x.storage is s]
            hidden = not grad or any(_hidden_chain(x) for x in targets)
            if not hidden and storage_rg[s]:  # recorded by autograd: a new grad_fn
                reads[s] = []
                recorded[s] = n
                pending.pop(s, None)
                anchors.pop(s, None)
            elif hidden and s not in pending and any(live(r) for r in reads.get(s, ())):
                pending[s] = n
                anchors[s] = recorded.get(s)
        if isinstance(v, Value) and v.storage not in storage_rg:  # memory the program made: its grad_fn is n's
            storage_rg[v.storage] = rg
            if rg and not is_view_node(n):
                reads[v.storage] = []
    if not pending:
        return {}
    returned = _storages(next(n for n in nodes if n.op == "output"), info)
    for s, n in pending.items():
        if _in_place(s) and anchors[s] is not None:
            continue
        if s.kind is not StorageKind.INTERMEDIATE or s in returned:
            raise UnsupportedError(
                with_location(
                    f"{n.target} writes a tensor that requires grad invisibly to autograd after a read with grad "
                    "on since its last recorded write (a hook on it would see the read's gradient in eager)",
                    node_location(n),
                )
            )
    return {s: a for s, a in anchors.items() if s in pending and _in_place(s) and a is not None}


def _in_place(s: Storage) -> bool:
    """Whether the caller's tensor of `s` can take its value at its anchor and its hidden writes in place: one
    tensor of its own (an alias group's members are views of a base the graph writes through), no element of
    it sharing memory with another (one write-back of each repeat is kept to the end)."""
    return s.kind is StorageKind.INPUT and internal_overlap(s.root_meta) == "no"


def _written_values(write: fx.Node, info: AliasInfo) -> list[Value]:
    """The values `write` writes (its mutated arguments; not what else it reads of the same memory)."""
    f = facts(write.target)
    bound = bind_args(write.target._schema, write.args, write.kwargs)
    return [
        v
        for name in f.mutated
        for x in pytree.tree_leaves(bound.get(name))
        if isinstance(x, fx.Node) and isinstance(v := info.values.get(x), Value)
    ]


def moves_counter(write: fx.Node, s: Storage, info: AliasInfo) -> bool:
    """Whether eager's `write` moves the version counter of the caller's tensor of `s`: it writes an argument of that
    memory whose counter its kernel moves (OpFacts.counted), not through an alias with a counter of its own
    (`x.data`)."""
    from .saved import _own_counter_chain

    f = facts(write.target)
    bound = bind_args(write.target._schema, write.args, write.kwargs)
    return any(
        isinstance(x, fx.Node)
        and isinstance(v := info.values.get(x), Value)
        and v.storage is s
        and not _own_counter_chain(x)
        for name in f.mutated
        if name in f.counted
        for x in pytree.tree_leaves(bound.get(name))
    )


def _hidden_chain(v: Value) -> bool:
    """Whether `v` is reached from its base through a view autograd does not follow: `detach()` (`.data` too),
    or a dtype view leaving floating point (as functionalize/timeline.py's through_detached)."""
    return any(
        step.op is torch.ops.aten.detach.default
        or step.op is torch.ops.aten.view.dtype
        and not (step.args[0].is_floating_point or step.args[0].is_complex)
        for step in v.chain
    )


def _attr(gm: fx.GraphModule, target: str) -> object:
    obj: object = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def _storages(node: fx.Node, info: AliasInfo) -> set[Storage]:
    return {
        v.storage
        for x in pytree.tree_leaves((node.args, node.kwargs))
        if isinstance(x, fx.Node) and isinstance(v := info.values.get(x), Value)
    }


_WALKS = 64


def _live(start: int, nodes: list[fx.Node], info: AliasInfo) -> bool:
    """Whether the result of `nodes[start]` reaches the graph's output or a caller's memory: through any op
    reading it or memory holding something computed from it (over-approximated: any data dependence)."""
    from .saved import written_storages

    tainted_nodes = {nodes[start]}
    tainted: set[Storage] = set()

    def taint(n: fx.Node) -> bool:
        v = info.values.get(n)
        if isinstance(v, Value):
            tainted.add(v.storage)
        if isinstance(n.target, torch._ops.OpOverload):
            tainted.update(written_storages(n, info, metadata=False))
        tainted_nodes.add(n)
        return any(s.kind is not StorageKind.INTERMEDIATE for s in tainted)

    if taint(nodes[start]):
        return True
    for n in nodes[start + 1 :]:
        inputs = n.all_input_nodes
        reads_tainted = any(a in tainted_nodes for a in inputs) or bool(_storages(n, info) & tainted)
        if n.op == "output":
            return reads_tainted
        if reads_tainted and taint(n):
            return True
    return False


def last_writes(gm: fx.GraphModule, info: AliasInfo, read_later: bool = True) -> dict[Storage, fx.Node]:
    """For each storage of the caller's tensors (one tensor, or an alias group) written (and, with `read_later`,
    read with grad on after its last write): its last write."""
    from .saved import tensor_values, written_storages

    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]
    last: dict[Storage, fx.Node] = {}
    for n in nodes:
        for s in written_storages(n, info, metadata=False):  # (the last write of the data)
            if s.kind in (StorageKind.INPUT, StorageKind.GROUP):
                last[s] = n
    order = {n: i for i, n in enumerate(nodes)}
    later_reads = set()
    for n in nodes:
        if n.meta.get("grad"):
            later_reads |= {
                v.storage for v in tensor_values(n, info) if v.storage in last and order[n] > order[last[v.storage]]
            }
    return {s: w for s, w in last.items() if s in later_reads or not read_later}
