"""The graph split at a hook's registration, not at the later write, for dealias's compiles only (issue 39).

`x.mul_(2); x.register_hook(h); x.add_(1)` on a graph input x: eager hooks x's version at the registration (the
one `mul_` made). dealias's hook_write_break (dynamo_tensor.py) finds the later write only once dynamo traces it,
and breaks the graph there: dynamo then runs that write, a tensor op, eagerly between the two graphs (fuzz:
"part of the program runs eagerly"). Where hook_early (dynamo_hooks.py) cannot register the hook before the graph
(x was written before the registration, or the hook is a closure), this correction moves the break back to the
registration's call with dynamo's own mechanism for breaking at an earlier instruction, its speculation log: the
`CALL` of `x.register_hook(h)` has an entry (break_graph_if_unsupported takes one for every call); at the later
write that entry is failed and dynamo's analysis restarts, and at the failed entry dynamo compiles the graph so far,
runs the call itself (the registration, a Python call: no tensor op) and compiles the rest of the frame as the
resume function's graph, where the write then is. The hook lands where eager's does (on x as the first graph left
it, before anything else ran), as with the break at the write.

Only where dynamo itself could break the graph at the registration and resume after it: the registration is
traced by the frame's root translator (in a function dynamo inlines, the break would move out to the call of that
function, which runs eagerly as a whole), with no loop that could jump back over it (a break in a loop makes dynamo
skip the frame: the break at the write keeps today's warning there), outside try blocks and generic context
managers, with no fullgraph/error_on_graph_break. Elsewhere, and where the speculation log's shape differs from
what this expects, the break stays at the write (exact). The break is named with `SPLIT` so that `dealias.jit`
lists it (graph_breaks) without warning that a part of the program runs eagerly: none does.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import Missing, active, correction, require, require_module

NAME = "hook_split"
# The reason of a break at a hook's registration (the first line of dynamo's GraphCompileReason): api.py lists such a
# break as a split into graphs, without a GraphBreakWarning (no tensor op runs between the graphs).
SPLIT = "dealias: a hook registration between two graphs"
_POINTS = "_dealias_hook_splits"  # attribute on dynamo's OutputGraph: hooked node -> (entry, user stack, eogb)
_CALLS = ("CALL", "CALL_KW")  # (the call instructions break_graph_if_unsupported wraps; 1 argument: the hook)
_reason_cls: Any = None
_lazy: Any = None
_livevars: Any = None


def splittable(tx: Any) -> bool:
    """Whether `tx`'s current instruction is a call of one argument (the hook's registration, not a call that makes
    it: `map(x.register_hook, ..)`) at which dynamo would break the graph and resume after it (not skip the frame,
    nor move the break out to an enclosing call): the conditions of break_graph_if_unsupported's partial graph."""
    try:
        inst = tx.current_instruction
        return (
            inst.opname in _CALLS
            and inst.arg == 1
            and tx.parent is None
            and tx is tx.output.root_tx
            and not tx.one_graph
            and not tx.error_on_graph_break
            and tx.should_compile_partial_graph()
            and not tx.maybe_has_backedge()
            and _resumable(tx)
        )
    except Exception:  # noqa: BLE001 - dynamo's translator moved: the break stays where it was
        return False


def _resumable(tx: Any) -> bool:
    """Whether the frame's tensors at this point can be handed to the resume function: not a view of a function
    returning several views (`split`) whose base was written since, whose `grad_fn` autograd refuses to give (dynamo
    fails to take it as an input then, and the code after the break runs eagerly; fuzz seed 1204101). Only the
    variables dynamo hands over: those read from here on (its liveness analysis), its cells, and the stack."""
    live = _livevars(tx.instructions, tx.current_instruction) | set(tx.cell_and_freevars())
    for v in [*(v for k, v in tx.symbolic_locals.items() if k in live), *tx.stack]:
        if _lazy in type(v).__mro__:  # (not isinstance, nor getattr: either would build the variable, and guard it)
            if not v.is_realized():
                continue  # (a value the frame has not used yet: as it came in)
            v = v.unwrap()
        node = getattr(getattr(v, "proxy", None), "node", None)
        fake = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
        if isinstance(fake, torch.Tensor):
            try:
                fake.grad_fn  # noqa: B018 - (the check: autograd raises on it)
            except RuntimeError:
                return False
    return True


def remember(tx: Any, node: torch.fx.Node) -> None:
    """At a registration of a hook on the tensor of graph node `node`: keep the speculation entry of the
    registration's call, where the graph can be split should a write of the tensor follow. The latest one is kept:
    nothing wrote the tensor since its first registration (such a write breaks the graph), so the hooks registered
    before the split, which dynamo registers after the first graph, land on the version eager hooks too."""
    if not active(NAME) or not splittable(tx):
        return
    try:
        log = tx.speculation_log
        entry = log.entries[log.index - 1] if log.index > 0 else None
        inst = tx.current_instruction
        ours = (
            entry is not None
            and entry.inst is inst
            and entry.instruction_pointer == tx.instruction_pointer - 1
            and not entry._failed
            and entry.reason is None
        )
        if ours:
            points = tx.output.__dict__.setdefault(_POINTS, {})
            points[node] = (entry, [tx.frame_summary()], tx.error_on_graph_break)
    except Exception:  # noqa: BLE001 - the log's shape moved: no split point, the break stays at the write
        return


def split(output: Any, tensor: torch.fx.Node, write: str) -> None:
    """Before a write (`write`, for the message) of the hooked graph input `tensor`: where the hook's registration
    has a split point, fail its speculation entry (dynamo restarts its analysis and breaks the graph at the
    registration; this raises). Returns where there is none (the caller breaks at the write)."""
    point = output.__dict__.get(_POINTS, {}).get(tensor) if active(NAME) else None
    if point is None:
        return
    entry, stack, error_on_graph_break = point
    name = getattr(getattr(tensor.meta.get("grapharg"), "source", None), "name", tensor.name)
    name = name if isinstance(name, str) else tensor.name  # (a property in 2.13 and 2.14, once a method)
    entry.reason = _reason_cls(
        f"{SPLIT} ({name} is written after its hook's registration, by {write}: the hook must see the version "
        "before that write)",
        stack,
    )
    entry.fail_and_restart_analysis(error_on_graph_break)


def is_split(reason: str) -> bool:
    """Whether dynamo's graph break reason `reason` is a split at a hook's registration (no tensor op eager)."""
    return reason.startswith(SPLIT)


@correction(
    NAME,
    corrects="a write of a graph input after `x.register_hook(h)` breaks the graph at the write (it runs eagerly)",
    without="the graph breaks before the write (hook_write_break): the write runs eagerly, with a warning",
)
def install() -> None:
    global _reason_cls, _lazy, _livevars
    livevars = require(
        require_module("torch._dynamo.bytecode_analysis"), "livevars_analysis", "instructions", "instruction"
    )
    lazy = require(require_module("torch._dynamo.variables.lazy"), "LazyVariableTracker")
    require(lazy, "is_realized", "self"), require(lazy, "unwrap", "self")
    symbolic_convert = require_module("torch._dynamo.symbolic_convert")
    require(require(symbolic_convert, "SpeculationEntry"), "fail_and_restart_analysis", "self", "error_on_graph_break")
    log = require(symbolic_convert, "SpeculationLog")
    require(log, "next", "self", "filename", "lineno", "instruction_pointer", "inst")
    translator = require(symbolic_convert, "InstructionTranslatorBase")
    for attr in (
        "speculate",
        "should_compile_partial_graph",
        "maybe_has_backedge",
        "frame_summary",
        "cell_and_freevars",
    ):
        require(translator, attr, "self")
    fields = require(symbolic_convert.SpeculationEntry, "__dataclass_fields__")
    if not {"inst", "instruction_pointer", "_failed", "reason"} <= set(fields):
        raise Missing("SpeculationEntry's fields moved")
    _reason_cls = require(require_module("torch._dynamo.output_graph"), "GraphCompileReason", "reason", "user_stack")
    _lazy, _livevars = lazy, livevars
