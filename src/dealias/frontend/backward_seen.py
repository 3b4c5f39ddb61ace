"""Whether the user ran the backward of a call's outputs: hooks on their autograd nodes that only note it.

In a program's first call recording autograd (tiers.Tiered, FUSE_FIRST), the runs on copies time each tier's forward
and its backward apart. Where the tier fastest on the forward is not the one fastest on both, what the user runs
decides: a training step waits for both, a forward never backpropagated (a training-mode forward with grad, for its
outputs' values) for the forward alone. The end of the user's first backward through the first call's outputs tells
(the autograd engine's callback the first hook to run queues, `Watch.hook`), or else the user's next call, where a
backward ran by then (`Watch.seen`), without timing any user call.

Each hook is a node pre-hook (`Node.register_prehook`) that sets a flag and returns None: the gradients passed on
are those it was given, whatever hooks run before or after it (the engine calls a node's pre-hooks in the order they
were registered, over a snapshot of them, so one removed while they run, ours by another thread's call, is safe).
It is removed once the choice is made (`Watch.remove`); the handles hold their node's hooks weakly, so a graph the
user drops is freed with its hooks, and `freed` then says no backward can come.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..compat.internals import (
    autocast_now,
    compiled_autograd_in_force,
    queue_backward_callback,
    state_check,
    storage_id,
)

log = logging.getLogger("dealias")


class Watch:
    """Hooks on the autograd nodes of one call's outputs: `seen` once a backward ran through any of them."""

    def __init__(self) -> None:
        self.seen = False
        self.handles: list[Any] = []

    def hook(self, at_end: Callable[[], None] | None) -> Callable[[Any], None]:
        """The pre-hook set on each node: it notes the backward, and the first to run queues `at_end` for the end of
        that backward (where it cannot be queued: the caller's next call does the work). `at_end` is held by the
        hook alone, so by the user's graph: freed with it, or once the hooks are removed."""

        def pre_hook(grad_outputs: Any) -> None:
            nonlocal at_end
            self.seen = True  # (nothing else: the gradients go on unchanged, the hooks removed by the choice)
            if torch.compiler.is_compiling():
                # (compiled autograd, turned on for the user's backward alone, has dynamo trace this hook into the
                # user's compiled backward: `queue_callback` is no op it can trace, a graph break and a warning,
                # an error under fullgraph=True. The flag alone is traced, as before: the next call does the work)
                return None
            run, at_end = at_end, None
            if run is not None:
                queue_backward_callback(run)

        return pre_hook

    def remove(self) -> None:
        handles, self.handles = self.handles, []
        for handle in handles:
            handle.remove()

    @property
    def freed(self) -> bool:
        """Every hooked node is gone (the user dropped the outputs and their graph): no backward through them can
        come."""
        refs = [getattr(handle, "hooks_dict_ref", None) for handle in self.handles]
        return all(ref is not None and ref() is None for ref in refs)


def _at_end(after: Callable[[list[Any]], None], inputs: Any) -> Callable[[], None] | None:
    """`after(inputs)`, as the autograd engine's callback at the end of a backward: only where the thread's state
    then is the call's now (grad mode on and autocast, both set as in the call; deterministic algorithms, default
    dtype...: what dynamo's frames were compiled under) with no user's torch function or dispatch mode in force (it
    would see the programs run). Otherwise, and where this torch cannot check the state, nothing: the caller's next
    call does the work. Never raises an error into the user's backward (an interrupt, the user's, goes on).
    `inputs` are held as long as the hooks (`Watch.hook`): a graph break's intermediate, which the user does not
    hold, is among them."""
    check = state_check()
    if check is None:
        return None
    held = list(inputs)
    autocast = autocast_now()  # (the call's autocast, set again: a backward outside it is the mixed-precision idiom)

    def run() -> None:
        try:
            with torch.enable_grad(), autocast():
                if check():
                    after(held)
        except Exception as e:  # noqa: BLE001 - (the caller's next call does it, or its choice stays)
            log.info("dealias: the work at the end of a backward failed: %s", e, exc_info=True)

    return run


def watch(out: Any, inputs: Any = (), after: Callable[[list[Any]], None] | None = None) -> tuple[Watch | None, str]:
    """Hooks on the autograd nodes of the outputs `out` that carry history (each node once: an output returned
    several times, several outputs of one node), but for outputs that are the call's `inputs` themselves (their node
    the user's, not the call's); (None, why) where none can be set: compiled autograd in force
    (its compiler, the user's, would trace our hook into the user's backward), no output with a grad_fn, or an
    output whose grad_fn cannot be read (a view eager forbids to backpropagate through, which the user's own
    backward then reports). `after(inputs)` runs at the end of the first backward through them (`_at_end`)."""
    if not torch.is_grad_enabled():
        return None, "grad off"
    if compiled_autograd_in_force():
        return None, "compiled autograd in force"
    nodes: dict[int, Any] = {}
    given = {id(x) for x in inputs if isinstance(x, torch.Tensor)}
    try:
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.requires_grad and id(t) not in given:
                node = t.grad_fn
                if node is not None:
                    nodes.setdefault(id(node), node)
                    base = _intermediate_base(t, inputs)
                    if base is not None:
                        nodes.setdefault(id(base), base)
    except Exception:  # noqa: BLE001 - (RuntimeError from autograd; anything else: no hook, as where none fits)
        return None, "an output's grad_fn cannot be read"
    if not nodes:
        return None, "no output with a grad_fn"
    w = Watch()
    hook = w.hook(_at_end(after, inputs) if after is not None else None)
    try:
        for node in nodes.values():
            w.handles.append(node.register_prehook(hook))
    except Exception:  # noqa: BLE001 - the hooks set so far removed: the user's calls choose
        w.remove()
        return None, "a hook cannot be set on an output's node"
    return w, ""


def _intermediate_base(t: torch.Tensor, inputs: Any) -> Any:
    """The autograd node of the base of an output `t` that is a view of the call's own intermediate, else None. A
    write into such an output (the user's, after the call) rebuilds its grad_fn: its node at the call is then no
    longer in the graph the backward runs, the base's node is (under CopySlices). Not where the base may be the
    user's (sharing an input's storage: its node theirs), nor where that cannot be told."""
    try:
        base = t._base if t._is_view() else None
        if base is None or not base.requires_grad or base.grad_fn is None:
            return None
        storage = storage_id(base)
        if any(isinstance(x, torch.Tensor) and storage_id(x) == storage for x in inputs):
            return None
        return base.grad_fn
    except Exception:  # noqa: BLE001 - (a tensor without storage, a subclass: the output's own node only)
        return None
