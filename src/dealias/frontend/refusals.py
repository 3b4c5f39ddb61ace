"""Frames the backend hands back to dynamo to run eagerly: graphs dynamo traced wrongly for every backend, where
the correction of compat/ that would have traced them right was not in force (this torch's internals moved, or it
was turned off), or did not see the case.

A graph dynamo already traced cannot be repaired: the wrong fact is baked into bytecode dynamo generated (a stale
shape, a hook registered after the graph). So the backend raises SkipFrame: dynamo runs the frame eagerly, and
caches that decision; the user gets a FallbackWarning naming the line (strict raises UnsupportedError).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.fx as fx
from torch._dynamo.exc import SkipFrame

from .. import compat
from ..errors import FallbackWarning, UnsupportedError, node_location, with_location
from .segments import may_write, touches


def refuse_uncorrected(gm: fx.GraphModule, options: Any, name: str) -> None:
    """Run the frame of `gm` eagerly (raising SkipFrame) when dynamo may have traced it wrongly."""
    if not compat.settings_in_force():
        run_frame_eagerly(
            f"{name}: dealias's dynamo settings are not in force on this torch (`dealias doctor` says why); "
            "every frame runs eagerly",
            options,
        )
    if not compat.in_dealias_frame():
        # Dynamo traced this frame for a wrapper of dealias's backend that `for_dealias` cannot see through (a
        # lambda passing options, a graph counter): dealias's settings and corrections were not applied to it.
        run_frame_eagerly(
            f"{name}: dealias's backend was called through a wrapper dynamo's tracing did not recognise as dealias, "
            "so the frame was traced without dealias's settings and corrections; it runs eagerly (pass options "
            'through torch.compile(fn, backend="dealias", options={...}) or functools.partial)',
            options,
        )
    refuse_stale_metadata(gm, options, name)
    refuse_negative_nan(gm, options, name)
    refuse_late_hooks(gm, options, name)
    refuse_stale_autograd_facts(gm, options, name)
    refuse_version_reads(gm, options, name)


def run_frame_eagerly(message: str, options: Any) -> None:
    """Ask dynamo to run the frame eagerly (SkipFrame, cached by dynamo), with a warning; strict raises."""
    if options.strict:
        raise UnsupportedError(message)
    warnings.warn(f"dealias: {message}", FallbackWarning, stacklevel=4)
    raise SkipFrame(message)


def refuse_stale_metadata(gm: fx.GraphModule, options: Any, name: str) -> None:
    """Dynamo keeps a tensor's sizes and strides from when it was made: after an in-place metadata change inside
    the graph (`v = a[0]; v.unsqueeze_(0)`), Python code that reads `v.shape` gets the old shape, in every
    backend. compat's inplace_view_refresh refreshes them while dynamo traces and marks the op; an unmarked one
    (the correction not in force, or a path it does not see) runs the frame eagerly."""
    node = next((n for n in gm.graph.nodes if compat.inplace_view_node(n) and not n.meta.get(compat.REFRESHED)), None)
    if node is None:
        return
    op = node.target if isinstance(node.target, str) else node.target.__name__
    message = with_location(
        f"{name}: `{op}` changes a tensor's metadata inside the graph, and dynamo's view of the tensor goes stale;"
        " this frame runs eagerly",
        node_location(node),
    )
    run_frame_eagerly(message, options)


def _writes(gm: fx.GraphModule) -> list[fx.Node]:
    # (A metadata change of a view, `x.permute(..).squeeze_()`, leaves the input's history, and its hook, alone.)
    return [n for n in gm.graph.nodes if may_write(n) and not compat.inplace_view_node(n)]


def refuse_late_hooks(gm: fx.GraphModule, options: Any, name: str) -> None:
    """Dynamo registers a hook on a graph input (`x.register_hook(h)` in the user's code) after the graph has
    run, as a side effect: if the graph writes that input in place after the user's registration, the hook lands
    on the written version, where eager's hooks the version before the write, and the gradient differs (also with
    dynamo's own eager backend). compat's hook_write_break breaks the graph before such a write; a graph that has
    one all the same runs its frame eagerly. Writes before the registration are fine: eager hooks the written
    version too. (Where the registration was is recorded by compat's hook_record; without the record, any write
    of the tensor refuses; where dynamo's record of the frame's hooks cannot be read, any write of an input.)"""
    hooked = compat.hooks_of_frame()
    if hooked is None:
        inputs = gm.graph.find_nodes(op="placeholder")
        writer = next((w for w in _writes(gm) if any(touches(w, i) for i in inputs)), None)
        if writer is not None:
            message = f"{name}: this torch's record of the frame's tensor hooks cannot be read (dynamo's internals "
            run_frame_eagerly(
                with_location(message + "moved), and the graph writes an input", node_location(writer)), options
            )
        return
    # The hooked tensor need not be a graph input: a view of it may be (`x1 = x0[::2]` written, hook on x0).
    for tensor in hooked:
        if tensor.meta.get(compat.INPUT_ALIAS):
            # The graph changes this input's layout in place (`x.t_()`: dynamo's variable for it moved onto an
            # alias, compat/dynamo_inputs.py). dealias carries that change out on the caller's tensor after the call,
            # which gives it an autograd node of its own that the graph's outputs do not go through: dynamo's hook,
            # registered on the tensor after the graph, never fired (eager's, before or after the change, does).
            changes = (n for n in gm.graph.nodes if compat.inplace_view_node(n) and _on_input_alias(n))
            message = with_location(
                f"{name}: a hook on an input whose layout the graph changes in place would not see its gradient; "
                "this frame runs eagerly",
                node_location(next(changes, tensor)),
            )
            run_frame_eagerly(message, options)
        if tensor.meta.get(compat.HOOK_EARLY) and compat.active("hook_early"):
            continue  # (its hook is registered before the graph runs: on the version the frame received)
        before = tensor.meta.get(compat.HOOKED_AFTER, frozenset()) if compat.active("hook_record") else frozenset()
        writer = next((n for n in _writes(gm) if n not in before and touches(n, tensor)), None)
        if writer is None:
            continue
        message = with_location(
            f"{name}: a hook registered on {tensor.name} before the graph writes its memory in place would be "
            "registered after the graph by dynamo, on the written tensor; this frame runs eagerly",
            node_location(writer),
        )
        run_frame_eagerly(message, options)


def _on_input_alias(node: fx.Node) -> bool:
    first = node.args[0] if node.args else None
    return isinstance(first, fx.Node) and bool(first.meta.get(compat.INPUT_ALIAS))


def refuse_stale_autograd_facts(gm: fx.GraphModule, options: Any, name: str) -> None:
    """Without compat's autograd_facts correction, dynamo keeps a view's `requires_grad` and `grad_fn` from when
    the view was made, and re-reads them after a write only on the tensor written: a view made before a write
    that carries grad into its base (`v = t.diagonal(); t.mul_(w)`, w requiring grad) and read after it may have
    been traced with the stale facts (a branch on `v.requires_grad`, `F.apply(v)` traced without its backward).
    The view need not be in the graph (a read into Python leaves no node, and dynamo drops an unused view): any
    graph with an in-place write carrying grad runs its frame eagerly when the correction is not in force."""
    if compat.active("autograd_facts"):
        return
    for write in _writes(gm):
        carries = any(
            isinstance(v := a.meta.get("example_value"), torch.Tensor) and v.requires_grad
            for a in write.all_input_nodes[1:]
        )
        if carries:
            message = with_location(
                f"{name}: a write carries grad into a tensor, and this torch's dynamo keeps the autograd facts of "
                "its views from before that write (compat's autograd_facts is not in force); this frame runs eagerly",
                node_location(write),
            )
            run_frame_eagerly(message, options)


def refuse_negative_nan(gm: fx.GraphModule, options: Any, name: str) -> None:
    """Dynamo specializes a nan (its guards cannot reason about one) and bakes it into the graph as a constant, which
    fx's generated code prints as `nan`: a nan with its sign bit set (`-float("nan")`, which `x.copysign(s)` and
    `x * s` pass on) became a positive one, in every backend. dealias's guard tells the signs apart
    (compat/dynamo_guards.py); a graph holding a negative nan runs its frame eagerly."""
    import math

    for node in gm.graph.nodes:
        for a in torch.utils._pytree.tree_leaves((node.args, node.kwargs)):
            if type(a) is float and math.isnan(a) and math.copysign(1.0, a) < 0:
                run_frame_eagerly(
                    with_location(
                        f"{name}: a negative nan constant (generated code would make it positive)", node_location(node)
                    ),
                    options,
                )


def refuse_version_reads(gm: fx.GraphModule, options: Any, name: str) -> None:
    """`x._version` read in a graph that writes (`v = o._version; o.t().add_(1); o._version - v`): dynamo traces
    it as `prims._tensor_version`, which dealias's program does not order against its writes (the write-back to
    the caller's tensors): the difference above was 0 where eager's is 1, and `v` alone read the counter after
    the write. Such a frame runs eagerly; a graph that only reads counters compiles."""
    is_version = lambda n: isinstance(n.target, torch._ops.OpOverload) and n.target.name() == "prims::_tensor_version"
    node = next((n for n in gm.graph.nodes if is_version(n)), None)
    if node is None or not any(may_write(n) for n in gm.graph.nodes if not is_version(n)):
        return
    message = f"{name}: `._version` is read in a graph that writes; this frame runs eagerly"
    run_frame_eagerly(with_location(message, node_location(node)), options)
