"""The grad mode the steps of a returned view's chain were made in, before the view made under no_grad that the
chain ends in (autograd_facts._fragile_output): the call replays each step in it (OutputSlot.grad_before)."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..errors import UnsupportedError, node_location, with_location
from .alias import AliasInfo, Value


def steps_mode(info: AliasInfo, root: fx.Node, k: int) -> bool | None:
    """The grad mode the `k` view steps before the fragile view `root` were made in, when the graph switched to it
    before them (None: the call's mode). A piece of a graph split inside a no_grad region is called with grad off
    and switches it on: `v.reshape(-1)` of a transposed tensor there is a copy and its `_unsafe_view`, made with
    grad on, which replayed in the call's mode would not require grad, and neither would the no_grad view of it
    returned (fuzz seed 2300095). Steps made in different modes, or not traced back to their nodes: run eagerly."""
    call = torch.is_grad_enabled()  # (the passes run in the mode of the call they compile for)
    modes, node, chain = set(), root, info.value(root).chain
    for j in range(1, k + 1):
        node = _source(_source(node) if node.target is operator.getitem else node)  # (`unbind(v)[i]`: v)
        value = info.values.get(node) if node is not None else None
        if not isinstance(value, Value) or value.chain != chain[: len(chain) - j]:
            modes.add(None)  # (a step eager made not traced back to its node: its mode is not known)
            break
        modes.add(node.meta.get("grad"))
    if modes <= {call}:
        return None
    if len(modes) == 1 and None not in modes:
        return modes.pop()
    raise UnsupportedError(
        with_location(
            "a view made under no_grad is returned of views made in other grad modes than the call's; not compiled "
            "exactly yet",
            node_location(root),
        )
    )


def _source(node: fx.Node | None) -> fx.Node | None:
    return node.args[0] if node is not None and node.args and isinstance(node.args[0], fx.Node) else None
