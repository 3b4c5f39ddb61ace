"""Double backward of a fused autograd graph (fused_autograd.py). AOTAutograd's compiled backward is not
differentiable again, where eager's and the torch executor's are: a backward with create_graph=True (a gradient
penalty) recomputes the graph with eager's ops, from the inputs as the call had them (copies of those the call
writes), and differentiates that. AOTAutograd's own Function is given that backward when its metadata allow it
(`takes_double_backward`); else each call runs inside a `TwiceDifferentiable`, which costs more. Results in
parts eager's graph keeps apart (`separate_parts`: two networks' losses) always run in one, so that each part can
be backpropagated on its own, as eager's."""

from __future__ import annotations

from collections.abc import Callable
from operator import getitem
from typing import Any, NamedTuple

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from ..compat import saved_hooks
from ..compat.internals import backward_keeps_graph, dynamo_hook, skip_frames
from ..ir.opfacts import fact_per_signature
from . import dependence_record
from .fused import inputs_memory
from .hazards import Unfusable


def double_backward_of_its_own(compiled: Any, example: list[Any], rg_results: list[int]) -> tuple[bool, int]:
    """Whether AOTAutograd's Function in `compiled` can take dealias's double backward (`takes_double_backward`),
    asked of a run on copies of the example inputs (the graph may write its inputs); and which result's backward
    node is its own (the first requiring grad).

    The run also checks that the results eager's require grad (`rg_results`) come back requiring it. Inductor
    drops a no-op (`x * 1`) and returns its argument's buffer: where a result requiring no grad (computed under
    no_grad) is that same tensor, AOTAutograd's `mark_non_differentiable`, which goes by the tensor's identity,
    marks the other result too, and it came back with no history (fuzz seed 2472399, torch 2.14). Unfusable then:
    the torch executor runs the graph."""
    # Copies in the inputs' own strides: the compiled kernels index with the traced strides, and `clone()` of a view
    # with gaps (a split's column block, strides (5, 1) for (5, 2)) is dense, so they wrote past its memory (fuzz
    # seed 2110098 with executor="inductor" and autograd: the heap corrupted, the process aborted).
    # The caller's saved-tensor hooks set aside: this run saved its tensors through them, 3 more packs in the first
    # call of a Linear-Tanh-Linear, and a non-reentrant checkpoint of that call, counting them, raised CheckpointError
    # in the user's backward (7 tensors saved by its forward, 4 by its recomputation).
    copies = [_copy_strided(a) if isinstance(a, torch.Tensor) else a for a in example]
    with torch.enable_grad(), saved_hooks.set_aside():
        outs = compiled(*copies)
    lost = next((i for i in rg_results if isinstance(outs[i], torch.Tensor) and not outs[i].requires_grad), None)
    if lost is not None:
        raise Unfusable(
            f"result {lost} requires grad, and the compiled graph returns it without history (AOTAutograd marks "
            "results non-differentiable by identity, and inductor may return one tensor for several)"
        )
    first = next((i for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad), None)
    if first is None:
        return False, 0
    return takes_double_backward(outs[first].grad_fn, copies, outs), first


def _copy_strided(a: torch.Tensor) -> torch.Tensor:
    """A copy of `a` in its own sizes and strides, in memory of its own covering all the elements they reach."""
    extent = sum((n - 1) * st for n, st in zip(a.shape, a.stride())) + 1 if a.numel() else 0
    copy = torch.empty(extent, dtype=a.dtype, device=a.device).as_strided(a.shape, a.stride())
    src, dst = a.detach(), copy
    for d, (n, st) in enumerate(zip(a.shape, a.stride())):
        if st == 0 and n > 1:  # (expanded: one copy of the repeated elements, copy_ refuses to write them twice)
            src, dst = src.narrow(d, 0, 1), dst.narrow(d, 0, 1)
    try:
        dst.copy_(src)
    except RuntimeError:  # other elements sharing memory (an unfold whose windows overlap): eager's copy is dense
        copy = a.detach().clone()
    return copy.requires_grad_(a.requires_grad)


def version_positions(example: Any, written: Any) -> tuple[int, ...]:
    """The positions of the arguments whose version counters a double backward checks (recompute_double_backward):
    the tensors (fixed per program: those of `example`) that the call does not write."""
    return tuple(i for i, a in enumerate(example) if isinstance(a, torch.Tensor) and i not in written)


def takes_double_backward(node: Any, args: Any, outs: Any) -> bool:
    """Whether the backward node `node` of AOTAutograd's Function (outputs `outs`, inputs `args`) is one whose class
    can run dealias's recompute for a backward with create_graph=True (`recompute_double_backward`): every result
    requiring grad is one of its outputs, its inputs are `args` in order, and it mutates and aliases nothing. Its
    class is then given a backward that does so; its first-order backward stays AOTAutograd's."""
    cls = getattr(type(node), "_forward_cls", None)
    meta = getattr(cls, "metadata", None)
    if meta is None or meta.num_intermediate_bases or meta.tokens:
        return False
    # (An input write AOTAutograd keeps in the compiled graph has no output of its own; others would.)
    if any(
        i.mutates_metadata or i.mutates_data and i.mutation_type.name != "MUTATED_IN_GRAPH" for i in meta.input_info
    ):
        return False
    if len(meta.output_info) != len(outs) or any(o.output_type.name != "non_alias" for o in meta.output_info):
        return False
    if any(isinstance(o, torch.Tensor) and o.requires_grad and o.grad_fn is not node for o in outs) or len(
        node.next_functions
    ) != len(args):
        return False
    for (fn, _), a in zip(node.next_functions, args):  # input i's gradient goes to args[i]'s history
        if not isinstance(a, torch.Tensor) or not a.requires_grad:
            expected = fn is None
        elif a.grad_fn is not None:
            expected = fn is a.grad_fn
        else:  # a leaf: its gradient accumulator
            expected = getattr(fn, "variable", None) is a
        if not expected:
            return False
    if not getattr(cls, "dealias_double_backward", False):
        first_order, boxed = cls.backward, getattr(cls, "boxed_grads_call", False)

        def backward(ctx: Any, *grads: Any) -> Any:
            if dynamo_hook() is not None:  # (a backward run inside a frame dynamo evaluates: see skip_frames)
                return without_dynamo(ctx, *grads)
            if torch.is_grad_enabled() and hasattr(ctx, "dealias_recompute"):
                ctx.saved_tensors  # noqa: B018 - raises eager's error if a backward freed the graph
                return recompute_double_backward(*ctx.dealias_recompute, grads[0] if boxed else grads)
            result = first_order(ctx, *grads)
            if not backward_keeps_graph():  # the graph is freed: so are the inputs
                ctx.__dict__.pop("dealias_recompute", None)
            return result

        # Dynamo must not convert it (see recompute_double_backward): its frames are skipped, and where dynamo's hook
        # is on, it runs again under `disable`, which turns the hook off for all it calls.
        without_dynamo = torch._dynamo.disable(backward)
        cls.backward = staticmethod(skip_frames(backward))
        cls.dealias_double_backward = True
    return True


@torch._dynamo.disable
def recompute_double_backward(
    graph: fx.GraphModule, args: Any, copies: dict[int, torch.Tensor], written: Any, versions: Any, grads: Any
) -> tuple[Any, ...]:
    """A backward with create_graph=True of a fused graph: the gradient must be differentiable in turn, which
    AOTAutograd's compiled backward is not. The graph runs again with eager's ops, from the call's inputs (of those
    written since by the epilogue, the copies taken before), and is differentiated with create_graph. An input
    written in place since the call makes it raise, naming the input: never a gradient of other values. (Dynamo
    must not see it: a backward run from the user's code between two graphs of a jitted function (a gradient
    penalty's `autograd.grad(.., create_graph=True)`) runs in a frame dynamo traces, and it compiled `graph` anew,
    with inductor, on every call: 61 programs for a WGAN-GP step.)"""
    moved = next((i for i, v in zip(*versions) if args[i]._version != v), None)  # ((positions, counters))
    if moved is not None:
        raise RuntimeError(
            f"dealias: a backward with create_graph=True recomputes this fused graph from its inputs, and input "
            f"{moved} was modified in place since the call; compile with executor='torch' to differentiate it "
            "twice after such a write"
        )
    inputs = [copies.get(i, a) for i, a in enumerate(args)]
    with torch.enable_grad():
        outs = graph(*inputs)
    diff = [i for i, g in enumerate(grads) if g is not None and outs[i].requires_grad]
    wrt = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and a.requires_grad]
    differentiated, given = [outs[i] for i in diff], [grads[i] for i in diff]
    got = torch.autograd.grad(differentiated, [inputs[i] for i in wrt], given, create_graph=True, allow_unused=True)
    result: list[Any] = [None] * len(inputs)
    for k, i in enumerate(wrt):
        result[i] = got[k]
    return tuple(result)


def written_inputs_read(gm: fx.GraphModule, written: frozenset[int]) -> list[frozenset[int]]:
    """For each result of `gm`, the `written` placeholders (by position) it is computed from. A result of a
    multi-output op is computed from the arguments its own output depends on in the op's decomposition (batch
    norm's output in training does not read the running statistics it updates); of other ops, from all."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    reads: dict[fx.Node, frozenset[int]] = {p: frozenset({i} & written) for i, p in enumerate(placeholders)}
    dependence: dict[fx.Node, list[set[fx.Node]] | None] = {}  # (one trace per op, not per result it gives)
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        source = n.args[0] if n.target is getitem and isinstance(n.args[0], fx.Node) else None
        if source is not None and any(reads.get(a) for a in source.all_input_nodes):
            if source not in dependence:
                dependence[source] = _output_dependence(source)
            depends = dependence[source]
            if depends is not None:
                reads[n] = frozenset().union(*(reads.get(a, frozenset()) for a in depends[n.args[1]]))
                continue
        reads[n] = frozenset().union(*(reads.get(a, frozenset()) for a in n.all_input_nodes))
    dependence_record.flush()  # (what this graph traced, for the next process)
    return [
        reads.get(a, frozenset()) if isinstance(a, fx.Node) else frozenset() for a in gm.graph.output_node().args[0]
    ]


def _output_dependence(n: fx.Node) -> list[set[fx.Node]] | None:
    """For each output of the multi-output aten op `n`, the argument nodes it is computed from, read off the
    op's decomposition traced on meta tensors of the arguments' layouts; None if there is none to trace (no
    decomposition, symbolic sizes)."""
    from torch._decomp import decomposition_table

    op = n.target
    if not isinstance(op, torch._ops.OpOverload) or op not in decomposition_table:
        return None
    flat, spec = torch.utils._pytree.tree_flatten((n.args, n.kwargs))
    nodes = [a for a in flat if isinstance(a, fx.Node)]
    vals = [a.meta.get("val") for a in nodes]
    if not all(isinstance(v, torch.Tensor) and not _symbolic(v) for v in vals):
        return None
    # The trace depends only on the op, the arguments' layouts and the other arguments' values: a net's batch
    # norms of one size are traced once (resnet18's training graph: 60 traces, ~1 CPU s of its first call).
    reached = fact_per_signature(
        _traced_dependence,
        op,
        flat,
        spec,
        lambda a: (tuple(a.meta["val"].shape), a.meta["val"].stride(), a.meta["val"].dtype),
        lambda parts: _recorded_dependence(op, flat, spec, vals, parts),
    )
    if reached is None:
        return None
    return [{nodes[i] for i in positions} for positions in reached]


_traced_dependence: dict[Any, list[frozenset[int]] | None] = {}


def _recorded_dependence(
    op: torch._ops.OpOverload, flat: list[Any], spec: Any, vals: list[torch.Tensor], parts: tuple[Any, ...]
) -> list[frozenset[int]] | None:
    """`_dependence_by_position`, or an earlier process's answer for the same signature (dependence_record.py)."""
    key = dependence_record.key_of(op, spec, (tuple(isinstance(a, fx.Node) for a in flat), parts))
    found, answer = dependence_record.lookup(key)
    if not found:
        answer = _dependence_by_position(op, flat, spec, vals)
        dependence_record.remember(key, answer)
    return answer


def _dependence_by_position(
    op: torch._ops.OpOverload, flat: list[Any], spec: Any, vals: list[torch.Tensor]
) -> list[frozenset[int]] | None:
    """`_output_dependence`'s trace: for each output of `op`, the positions (among the tensor arguments) it is
    computed from in the op's decomposition."""
    from torch._decomp import decomposition_table

    metas = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta") for v in vals]

    def run(*tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        args, kwargs = torch.utils._pytree.tree_unflatten(
            [next(it) if isinstance(a, fx.Node) else a for a in flat], spec
        )
        return tuple(op(*args, **kwargs))

    try:
        # (in one fake mode: traced as real tensors, make_fx made a fake mode per value, each taking the Python stack,
        # deep in dynamo's backend call: twice the trace's time, 0.06 CPU s of resnet18's training step's first call)
        traced = make_fx(run, decomposition_table={op: decomposition_table[op]}, tracing_mode="fake")(*metas)
    except Exception:  # noqa: BLE001 - a decomposition that does not trace here: every output reads every argument
        return None
    inputs = traced.graph.find_nodes(op="placeholder")
    reach: dict[fx.Node, set[int]] = {p: {i} for i, p in enumerate(inputs)}
    for m in traced.graph.nodes:
        if m.op not in ("placeholder", "output"):
            reach[m] = set().union(*(reach.get(a, set()) for a in m.all_input_nodes))
    outs = traced.graph.output_node().args[0]
    return [frozenset(reach.get(o, set())) if isinstance(o, fx.Node) else frozenset() for o in outs]


def _symbolic(v: torch.Tensor) -> bool:
    return any(isinstance(d, torch.SymInt) for d in (*v.shape, *v.stride()))


def apart_from_inputs(outs: Any, made: tuple[int, ...], args: Any) -> Any:
    """`outs` with each result the graph makes (`made`, by position) that came back as an autograd view of an
    argument's memory replaced by a copy, recorded by autograd. Inductor drops a no-op (`x * 1` on torch 2.14,
    `ones * x` on both) and returns the input's buffer, which AOTAutograd's Function returns as a view of that
    input, sharing its version counter; a TwiceDifferentiable keeps its results for its backward, and the caller's
    later write of the input (`x.masked_fill_(..)` after `Ident.apply(x * 1)`) then made that backward raise
    "Output 0 of CompiledFunction is a view and its base ... has been modified inplace" where eager's result is a
    tensor of its own (fuzz --dynamic seeds 2471268, 2471287, 2471299). Copied here, at the call, before anything
    can write the input."""
    # (Only views are looked at: a result sharing an input's memory without being a view has a version counter of
    # its own, and the runner copies its values; most calls return no view and compare no storage.)
    views = [i for i in made if isinstance(outs[i], torch.Tensor) and outs[i]._is_view()]
    if not views:
        return outs
    inputs = inputs_memory(args)
    apart = list(outs)
    for i in views:
        if apart[i].untyped_storage()._cdata in inputs:
            apart[i] = apart[i].clone()
    return type(outs)(apart) if isinstance(outs, tuple) else apart


def on_backward_node(outs: Any, hook: Callable[..., Any]) -> None:
    """Register `hook` (a post-hook) on the backward node of this call's results requiring grad (one for all)."""
    node = next((o.grad_fn for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None), None)
    if node is not None:
        node.register_hook(hook)


class Parts(NamedTuple):
    """The parts of a fused graph's results requiring grad (`separate_parts`): each result's part (by position),
    and each part's inputs (by position: what its results are computed from)."""

    of: dict[int, int]
    inputs: dict[int, frozenset[int]]


def separate_parts(gm: fx.GraphModule, rg_results: list[int]) -> Parts | None:
    """The results requiring grad (by position) grouped into parts no node of the graph requiring grad is shared
    between: eager's graph has a backward node per op, and the parts' nodes are disjoint, so a backward through
    one part's results leaves the other parts' nodes and saved tensors as they were (two losses of two networks,
    each backpropagated on its own, each network's optimizer stepping in between). None where there is one part.
    (Inputs are no node of the graph: two parts reading one parameter each accumulate its gradient, as eager's.)"""
    if len(rg_results) < 2:
        return None
    results = gm.graph.output_node().args[0]
    position = {p: i for i, p in enumerate(gm.graph.find_nodes(op="placeholder"))}
    part = {i: i for i in rg_results}

    def find(i: int) -> int:
        while part[i] != i:
            part[i] = part[part[i]]
            i = part[i]
        return i

    owner: dict[fx.Node, int] = {}  # (a node requiring grad the graph computes: the first result reading it)
    reads: dict[int, set[int]] = {}
    for i in rg_results:
        todo, seen, reads[i] = [results[i]], set(), set()
        while todo:
            n = todo.pop()
            if not isinstance(n, fx.Node) or n in seen:
                continue
            seen.add(n)
            if n in position:
                reads[i].add(position[n])
            elif n.op == "call_function" and n.meta.get("rg", True):
                if n in owner:
                    part[find(i)] = find(owner[n])
                else:
                    owner[n] = i
            todo.extend(n.all_input_nodes)
    of = {i: find(i) for i in rg_results}
    if len(set(of.values())) < 2:
        return None
    inputs: dict[int, set[int]] = {}
    for i, k in of.items():
        inputs.setdefault(k, set()).update(reads[i])
    return Parts(of, {k: frozenset(v) for k, v in inputs.items()})


def _read_by(ctx: Any, parts: set[int]) -> frozenset[int] | None:
    """The inputs (by position) the results of `parts` are computed from (a TwiceDifferentiable's); None: one part."""
    return frozenset().union(*(ctx.parts.inputs[k] for k in parts)) if ctx.parts is not None else None


def _others_written(ctx: Any, parts: set[int]) -> bool:
    """Whether an input only parts other than `parts` read was written since the call (a TwiceDifferentiable's)."""
    read = _read_by(ctx, parts)
    if read is None:
        return False
    others = frozenset().union(*(v for k, v in ctx.parts.inputs.items() if k not in parts)) - read
    return any(ctx.args[i]._version != v for i, v in ctx.versions if i in others)


class TwiceDifferentiable(torch.autograd.Function):
    """AOTAutograd's compiled function inside a Function of dealias's, where its own Function cannot be given
    dealias's double backward (`takes_double_backward`). Its own backward raises when differentiated
    again ("does not currently support double backward"), where eager's and the torch executor's do not. A
    first-order backward here runs the compiled backward; a backward that records a graph (`create_graph=True`)
    recomputes the graph with eager's ops, from the inputs as the call had them, and differentiates that, which
    can be differentiated again. Written inputs (none of which requires grad) are copied before the epilogue
    writes them, if a result that requires grad is computed from them (`reads`, per result: batch norm's output
    in training is not computed from the running statistics it updates, so nothing is copied). Other inputs are
    read as they are then, through aliases keeping their sizes and strides; one written in place since the call
    (a version counter moved) makes that backward raise, where eager's raises if it saved the tensor and would
    otherwise use what it saved (a mask computed from it, say): never a gradient from the new values. (It raises
    also where eager saved nothing of that input and goes on: which inputs the gradient's values depend on is
    not known here.)
    Where the results fall into parts eager's graph keeps apart (`separate_parts`), a backward through some parts'
    results only runs the compiled backward (a result no gradient came into gets none: the others' inputs get
    none); once that freed the compiled graph, a backward through another part recomputes that part with eager's
    ops, as a create_graph backward does, raising for an input of that part written since (the compiled backward
    would read every part's saved tensors, and another part's inputs may be written legitimately meanwhile: an
    optimizer step of the network already backpropagated), and one through a part a freeing backward went
    through raises as eager's."""

    @staticmethod
    def forward(ctx: Any, compiled: Any, graph: fx.GraphModule, facts: Any, *args: Any) -> Any:
        # (copies of written inputs, taken before the graph writes them; the results the graph makes, by position)
        copies, written, made, parts = facts
        ctx.set_materialize_grads(False)  # (a result no gradient came into gets None: its part is not run)
        ctx.parts, ctx.done = parts, set()  # (the parts a backward freeing the graph went through)
        leaves = [a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args]
        with torch.enable_grad():
            outs = apart_from_inputs(compiled(*leaves), made, leaves)
        ctx.outs, ctx.leaves, ctx.graph = outs, leaves, graph
        ctx.args = [
            a if not isinstance(a, torch.Tensor) or a.requires_grad else copies[i] if i in copies else a.detach()
            for i, a in enumerate(args)
        ]
        ctx.versions = [(i, a._version) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in written]
        # (A graph over symbols also returns ints: the sizes of its results' views, `OutputSlot.chain`.)
        returned = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in outs)
        ctx.mark_non_differentiable(
            *[r for r, o in zip(returned, outs) if isinstance(o, torch.Tensor) and not o.requires_grad]
        )
        return returned

    @staticmethod
    @torch._dynamo.disable  # (see recompute_double_backward)
    def backward(ctx: Any, *grads: Any) -> Any:
        diff = [i for i, o in enumerate(ctx.outs) if isinstance(o, torch.Tensor) and o.requires_grad]
        diff = [i for i in diff if grads[i] is not None]  # (the results a gradient came into)
        wrt = [i for i, a in enumerate(ctx.leaves) if isinstance(a, torch.Tensor) and a.requires_grad]
        given = [grads[i] for i in diff]
        parts = {ctx.parts.of[i] for i in diff} if ctx.parts is not None else {0}
        if ctx.done & parts:  # (nothing is saved with save_for_backward here: say it as autograd does)
            raise RuntimeError(
                "Trying to backward through the graph a second time (or directly access saved tensors after they "
                "have already been freed). Specify retain_graph=True if you need to backward a second time."
            )
        keeps = backward_keeps_graph()
        # (create_graph=True; or the compiled graph freed; or another part's input written since the call, which
        # the compiled backward, reading every part's saved tensors, would take for its own)
        recompute = torch.is_grad_enabled() or bool(ctx.done) or _others_written(ctx, parts)
        if not keeps:
            ctx.done |= parts
        if not diff:
            return (None, None, None, *[None] * len(ctx.leaves))
        if recompute:  # the gradient differentiable in turn, or a part's backward after another's freed the graph
            read = _read_by(ctx, parts)
            moved = next(
                (i for i, v in ctx.versions if ctx.args[i]._version != v and (read is None or i in read)), None
            )
            if moved is not None:
                why = "a backward with create_graph=True" if torch.is_grad_enabled() else "a backward of another part"
                raise RuntimeError(
                    f"dealias: {why} recomputes this fused graph from its inputs, and input {moved} was modified by "
                    "an inplace operation since the call; compile with executor='torch' to differentiate it after "
                    "such a write"
                )
            with torch.enable_grad():
                outs = ctx.graph(*ctx.args)
            args = [ctx.args[i] for i in wrt]
            got = torch.autograd.grad(
                [outs[i] for i in diff], args, given, create_graph=torch.is_grad_enabled(), allow_unused=True
            )
        else:  # (the compiled graph is kept only if this backward keeps it, as AOTAutograd's donated buffers need)
            outs = [ctx.outs[i] for i in diff]
            got = torch.autograd.grad(outs, [ctx.leaves[i] for i in wrt], given, retain_graph=keeps, allow_unused=True)
        result: list[Any] = [None] * len(ctx.leaves)
        for k, i in enumerate(wrt):
            result[i] = got[k]
        return (None, None, None, *result)
