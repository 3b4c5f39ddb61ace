"""Runs on copies: in a program's first call (tiers.FUSE_FIRST), its tiers timed on copies of the call's tensors, so
that the user's later calls are not the measured ones (a foreach optimizer's step runs 1.2x eager on the exact tiers).
`copies_refusal` says where that cannot be done without effects eager does not have; `run_on_copies` runs them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._dynamo.convert_frame import compile_lock

from ..compat import saved_hooks, warns
from ..compat.internals import compiled_autograd_in_force
from ..ir.draws import kept_rng
from ..ir.plan import RefKind
from ..runtime.verify import clone_args

# The exact tiers measured in that first call on copies of the call's tensors (their timed calls then take no user's
# call: a foreach optimizer's step runs 1.2x eager on them), where those tensors take at most this many bytes.
COPY_BYTES = 256 << 20
# ...and while those runs took at most this many seconds in all: each is one more run of the program in the first
# call (a 2.3 s program ran 5 more times, 12 s); the tiers not measured there are measured on the user's calls.
COPIES_SECONDS = 1.0


def has_history(out: Any) -> bool:
    """Whether a call's outputs may carry autograd history, whose backward the next call's timing then includes.
    (`requires_grad`, not `grad_fn`: reading a view's grad_fn after its base was written rebuilds it, or raises
    where eager forbids it, a view made under no_grad; an output that is a leaf only times a little more.)"""
    if not torch.is_grad_enabled():
        return False
    outs = out if isinstance(out, (list, tuple)) else (out,)
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in outs)


def graph_tier_refusal(program: Any) -> str:
    """Why dynamo's graph, run as it is, may not be eager's behaviour for this compiled program; "" when it is.
    Each reason is something dealias corrects or rebuilds around the graph for this layout."""
    cap, fp = program.captured, program.functional
    if cap.groups:
        return "inputs share memory"
    if fp.metadata_writebacks or any(slot.restride is not None for slot in fp.outputs):
        return "it changes a tensor's sizes or strides in place"
    # (Version counters that dealias's write-back would move where eager's writes do not, FunctionalProgram.
    # unmoved_counters: BatchNorm's running statistics, writes through `x.data` or unsafe_split elements, are
    # dealias's correction of its own write-back, not of dynamo's graph, whose ops move them as eager's do.)
    if cap.detached or cap.restricted:
        return "an input is detached in place or is a view whose writes eager restricts"
    return ""


def run_on_copies(
    entry: Any,
    leaves: list[Any],
    tiers: list[str],
    measure: Callable,
    samples_per_tier: int,
    measure_seconds: float,
    lazy: frozenset[str] = frozenset(),
    warm: frozenset[str] = frozenset(),
) -> tuple[dict[str, list[float]], set[str], list[str], dict[str, list[float]] | None]:
    """In the first call (FUSE_FIRST), the warm-up and timed runs of the tiers `tiers` of the cache entry `entry`
    (tiers.Tiered; the fused program among them once compiled) on copies of the call's tensors (`copies_refusal`
    says where not): each run on fresh copies of those the plan writes, as the user's call would run, the random
    state set back after. Where a run's results carry autograd history, each run is the forward and its backward on
    the copies (`_backward`; `backward_refusal` says where not), timed apart, but for the tiers in `lazy`, whose
    runs are their forwards alone (the fused program's backward, compiled at its first backward: frontend/choosing.py).
    The tiers in `warm` ran their first forward and backward on copies already: no warm-up run.
    Returns each tier's timed runs (seconds; none for a tier of `lazy` whose runs record autograd), the tiers warmed
    up, notes on what was not measured and why, and, where the timed runs include their backward, the same runs'
    forwards alone (else None; every tier's): a user who never runs the backward waits for those.

    The fused program's runs here are its warm-up too: its first calls after the compile ran 1.1-1.3x eager for 2-4
    calls (a foreach optimizer's step, a decode step), eager's own calls after the compile as slow (the process's
    caches and Python's specializations cold after the compile's seconds of other work), then 0.6x."""
    notes: list[str] = []
    why = copies_refusal(entry.first, leaves, entry.backend.gm) if tiers else ""
    if not tiers or why:
        notes += [f"tiers measured on the calls: {why}"] if why else []
        return {}, set(), notes, None
    tensors = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    written = sorted({entry.first.captured.tensor_positions[r.ref.key] for r in entry.first.reports})
    grad = torch.is_grad_enabled()
    samples: dict[str, list[float]] = {}
    forwards: dict[str, list[float]] = {}  # (the forward of each timed run, where runs include their backward)
    warmed: set[str] = set()
    total = 0.0  # (every run on copies, warm-ups included: COPIES_SECONDS)
    records: bool | None = None  # (outputs with autograd history: each run its forward and backward; None: unknown)
    warm_only = False
    try:
        # (the caller's saved-tensor hooks set aside: a run on copies that records autograd called the user's
        # pack hooks, once per saved tensor: counting, offloading, 3 times in the first call where eager's once.
        # Warnings ignored: dynamo's graph calls torch's Python functions, `F.softmax(x)` without a dim warned
        # once per run, 6 more times in the first call. Python's filters and the default generator are the
        # process's, set aside and back here as by compiles in other threads: under dynamo's compile lock, as
        # the fused compile before, so that none restores another's. Another thread's warnings in these runs'
        # fraction of a second are ignored too.)
        with compile_lock, kept_rng(entry.backend.gm, leaves), saved_hooks.set_aside(), warns.ignored():
            if saved_hooks.in_force():  # (hooks that could not be set aside)
                notes.append("tiers measured on the calls: saved-tensor hooks in force")
                return {}, set(), notes, None
            base = list(leaves)  # (every tensor copied once: a write the plan would not name stays in the copy)
            for i, c in zip(tensors, clone_args([leaves[i] for i in tensors])):
                base[i] = c
            if any(_layout(base[i]) != _layout(leaves[i]) for i in tensors):
                # (clone_args recomputes a computed tensor requiring grad, `* 1`: dense, where the caller's may
                # have gaps, an autograd.Function's `empty_strided` result; the tiers' programs, the fused one's
                # kernels, index with the call's strides: past the copy's memory)
                notes.append("tiers measured on the calls: a copy's layout is not the call's")
                return {}, set(), notes, None
            spent = dict.fromkeys(tiers, 0.0)
            # Each tier's warm-up first (untimed), then SAMPLES rounds, a run of each tier measured on per round
            # (so that a noisy stretch of the machine falls on them all).
            for k in range(samples_per_tier + 1):
                for t in [t for t in tiers if spent[t] < measure_seconds and (k == 0 or t in samples)]:
                    if total >= COPIES_SECONDS:
                        break
                    if k == 0 and t in warm:
                        samples.setdefault(t, [])
                        warmed.add(t)
                        continue
                    copies = list(base)
                    for i, c in zip(written, clone_args([leaves[i] for i in written])):
                        copies[i] = c
                    out, seconds = measure(t, entry.runs[t], copies)
                    torch._C._set_grad_enabled(grad)
                    forward = seconds
                    if records and not warm_only and t not in lazy:  # (its backward timed apart: a measure too)
                        _, backward = measure(t, _backward_run(out), copies)
                        torch._C._set_grad_enabled(grad)
                        seconds += backward
                    if records is None:  # (the first run: its backward, untimed, warms that up too)
                        records = has_history(out)
                        refusal = backward_refusal(entry.backend.gm) if records else ""
                        if records and not refusal and compiled_autograd_in_force():
                            refusal = "compiled autograd in force"  # (its compiler, the user's, called for copies)
                        if refusal:  # (the copies then only warm the tiers up: the user's calls are timed ones)
                            notes.append(f"tiers measured on the calls: {RECORDS} ({refusal})")
                            warm_only = True
                        elif records and t not in lazy:
                            start = time.thread_time()
                            _backward(out, copies)
                            seconds += time.thread_time() - start
                            torch._C._set_grad_enabled(grad)
                    del out
                    warmed.add(t)
                    if k == 0 and t == "fused":
                        # (not counted: the fused program's first run, its lazily built parts, inductor's backward
                        # compiled in its first backward where that is run here, is the user's cost either way)
                        samples.setdefault(t, [])
                        continue
                    total += seconds
                    if k:
                        if not (records and t in lazy):  # (a lazy tier's forward alone is no `whole`)
                            samples[t].append(seconds)
                        forwards.setdefault(t, []).append(forward)
                        spent[t] += seconds
                    else:
                        samples.setdefault(t, [])
                if warm_only:
                    break
    except Exception as e:  # noqa: BLE001 - the user's calls measure the tiers, as without copies
        torch._C._set_grad_enabled(grad)
        notes.append(f"tiers measured on the calls: a run on copies raised {type(e).__name__}")
        return {}, set(), notes, None
    backward = bool(records) and not warm_only
    samples = {t: s for t, s in samples.items() if s}
    timed = set(forwards) if backward else set(samples)
    if not warm_only and total >= COPIES_SECONDS and any(t not in timed for t in tiers):
        notes.append(f"tiers measured on the calls too: runs on copies stopped after {total:.1f} s")
    return samples, warmed, notes, {t: forwards[t] for t in forwards if t in tiers} if backward else None


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    return t.shape, t.stride(), t.storage_offset(), t.untyped_storage().nbytes()


def _backward_run(out: Any) -> Callable[[list[Any]], Any]:
    """The backward of a run's results `out`, as a run of the copies (timed by `measure`, as the forward is)."""

    def run(copies: list[Any]) -> Any:
        return _backward(out, copies)

    run.backward = True  # (tests faking `measure` tell a backward from a forward by it)
    return run


def _backward(out: Any, copies: list[Any]) -> Any:
    """The backward of a run on copies: what a call recording autograd costs besides its forward (the user's calls
    time it, up to the next call). Gradients of ones for every result with history, computed for the copies that
    require grad (`torch.autograd.grad`: into no tensor's `.grad`, and no further back than the copies: clone_args
    made fresh leaves of the caller's leaves and a fresh graph under each computed tensor, a graph break's earlier
    graph's results, which every run shares), so no tensor, graph or hook of the caller's is reached: given
    `inputs`, autograd's engine runs only the nodes on a path from the outputs to them. (The graph's tensors are
    all among the copies, its attributes lifted to inputs, graph_inputs.lift_attributes; a tensor that were not would
    only be left out of the backward, where walking the graph for its leaves ran the caller's nodes and hooks.)"""
    flat = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    outs = [t for t in flat if t.requires_grad and t.grad_fn is not None]  # (has_history: requires_grad first)
    inputs = [c for c in copies if isinstance(c, torch.Tensor) and c.requires_grad]
    if outs and inputs:
        torch.autograd.grad(outs, inputs, [torch.ones_like(t) for t in outs], allow_unused=True)
    return out


def backward_refusal(gm: torch.fx.GraphModule) -> str:
    """Why a call recording autograd cannot be timed with its backward on copies; "" when it can: a backward that
    is the user's Python (an autograd.Function's, `autograd_function_apply`), a hook dynamo put in the graph,
    runs once per run on copies where eager runs it once a call (or never, without the user's backward)."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op not in ("call_function", "call_method", "call_module"):
            continue  # (an input's name says where dynamo found it: a forward hook's default, `..._forward_hooks_0_`)
        if isinstance(target, torch._ops.HigherOrderOperator) and target.name() == "autograd_function_apply":
            return "a backward of the user's"
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)
        if "hook" in name.lower() or "hook" in str(node.target).lower():
            return "a hook in the graph"
    for sub in gm.children():
        refusal = backward_refusal(sub) if isinstance(sub, torch.fx.GraphModule) else ""
        if refusal:
            return refusal
    return ""


def copies_refusal(program: Any, leaves: list[Any], gm: torch.fx.GraphModule | None = None) -> str:
    """Why the exact tiers cannot be timed on copies of what `program` (the torch executor's) writes in this call; ""
    when they can. (A call whose results carry autograd history is timed with its backward and the user's code up
    to the next call, which a run on copies has not: RECORDS, seen on the first run on copies.) The tensors must
    be ordinary CPU ones (a GPU's memory is not to be doubled, nor its errors risked) of at most COPY_BYTES in
    all, and everything written a caller's argument the plan names (not inputs sharing memory, a tensor the graph
    reads as an attribute, a size)."""
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    if any(x.device.type != "cpu" or x.layout != torch.strided or x.is_inference() for x in tensors):
        return "not all its tensors are ordinary CPU tensors"
    refusal = graph_tier_refusal(program)
    if refusal:
        return refusal
    if any(r.ref.kind is not RefKind.INPUT for r in program.reports):
        return "it writes a tensor it reads as an attribute"
    storages = {x.untyped_storage()._cdata: x.untyped_storage().nbytes() for x in tensors}
    if sum(storages.values()) > COPY_BYTES:
        return f"its tensors take more than {COPY_BYTES >> 20} MB"
    opaque = _opaque_call(gm) if gm is not None else ""
    return f"it calls {opaque}, whose effects eager has once a call" if opaque else ""


# Callables a graph may call any number of times unseen: torch's own functions and ops, Python's operators. Anything
# else, a custom op (torch.library: its Python body may count, log, write a file, or be a collective that every rank
# must call alike), a function `allow_in_graph` put in the graph, or a higher-order op with effects, would run once
# per run on copies: SAMPLES + 1 times per exact tier in the first call, where eager runs it once. (dealias's own ops
# are eager's kernels under other names, compat/tensor_scalars.py, dynamo_rng.py: the random state kept_rng keeps.)
_PURE_NAMESPACES = ("aten", "prims", "dealias")
_PURE_MODULES = ("torch", "_operator", "operator", "builtins", "math")
_PURE_HOPS = (
    "wrap",
    "wrap_with_set_grad_enabled",
    "wrap_with_autocast",
    "tag_activation_checkpoint",
    "autograd_function_apply",
)


def _opaque_call(gm: torch.fx.GraphModule) -> str:
    """The first call in dynamo's graph `gm` (or a subgraph of it) whose effects may be more than its results; ""
    when there is none."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_module":
            sub = gm.get_submodule(target)
            opaque = _opaque_call(sub) if isinstance(sub, torch.fx.GraphModule) else ""
            if opaque or not type(sub).__module__.startswith("torch."):
                return opaque or type(sub).__qualname__
        if node.op != "call_function":
            continue
        if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            namespace = target.namespace if isinstance(target, torch._ops.OpOverload) else target._qualified_op_name
            if namespace.split("::")[0] not in _PURE_NAMESPACES:
                return str(target)
        elif isinstance(target, torch._ops.HigherOrderOperator):
            if target.name() not in _PURE_HOPS:
                return f"higher-order op {target.name()}"
        elif (getattr(target, "__module__", None) or "").split(".")[0] not in _PURE_MODULES:
            return getattr(target, "__qualname__", str(target))
    for sub in gm.children():  # (the subgraphs higher-order ops take)
        opaque = _opaque_call(sub) if isinstance(sub, torch.fx.GraphModule) else ""
        if opaque:
            return opaque
    return ""


# Why a call recording autograd is timed on the user's calls, where its backward is not to be run on copies
# (`backward_refusal`, seen on the first run on copies: a graph may switch grad off inside, `with torch.no_grad()`).
RECORDS = "its calls record autograd"
