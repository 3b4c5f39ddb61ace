"""Whether the user ran the backward of a call's outputs: hooks on their autograd nodes that only note it.

In a program's first call recording autograd (tiers.Tiered, FUSE_FIRST), the runs on copies time each tier's forward
and its backward apart. Where the tier fastest on the forward is not the one fastest on both, what the user runs
decides: a training step waits for both, a forward never backpropagated (a training-mode forward with grad, for its
outputs' values) for the forward alone. The user's second call tells which, without timing any user call, where a
backward through the first call's outputs ran by then (`Watch.seen`).

Each hook is a node pre-hook (`Node.register_prehook`) that sets a flag and returns None: the gradients passed on
are those it was given, whatever hooks run before or after it (the engine calls a node's pre-hooks in the order they
were registered, over a snapshot of them, so one removed while they run, ours by another thread's call, is safe).
It is removed once the choice is made (`Watch.remove`); the handles hold their node's hooks weakly, so a graph the
user drops is freed with its hooks, and `freed` then says no backward can come.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from ..compat.internals import compiled_autograd_in_force, storage_id


class Watch:
    """Hooks on the autograd nodes of one call's outputs: `seen` once a backward ran through any of them."""

    def __init__(self) -> None:
        self.seen = False
        self.handles: list[Any] = []

    def _hook(self, grad_outputs: Any) -> None:
        self.seen = True  # (nothing else: the gradients go on unchanged, the hooks removed by the choice)
        return None

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


def watch(out: Any, inputs: Any = ()) -> tuple[Watch | None, str]:
    """Hooks on the autograd nodes of the outputs `out` that carry history (each node once: an output returned
    several times, several outputs of one node), but for outputs that are the call's `inputs` themselves (their node
    the user's, not the call's); (None, why) where none can be set: compiled autograd in force
    (its compiler, the user's, would trace our hook into the user's backward), no output with a grad_fn, or an
    output whose grad_fn cannot be read (a view eager forbids to backpropagate through, which the user's own
    backward then reports)."""
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
    try:
        for node in nodes.values():
            w.handles.append(node.register_prehook(w._hook))
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
