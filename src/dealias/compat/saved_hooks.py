"""The caller's saved-tensor hooks (`torch.autograd.graph.saved_tensors_hooks`, `save_on_cpu`): whether any is in
force, and setting them aside while a compile asks eager something (passes/saved.py's probes, passes/stale.py's
run on copies).

Set aside because a probe must neither call the user's pack hooks (a Python side effect per saved tensor: counting,
offloading; eager calls them once per call) nor lose eager's version check to them (under hooks eager checks no
version: `x.mul_(x)`'s own write went unseen). In force matters because eager's backward then raises nothing and
reads whatever the unpack hook gives: a graph whose saved tensor is written runs eagerly.

Private functions of torch._C._autograd, looked up by name: where one is missing, hooks count as in force (the
graphs that care run eagerly) and nothing is set aside.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_TOP = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
_PUSH = getattr(torch._C._autograd, "_push_saved_tensors_default_hooks", None)
_POP = getattr(torch._C._autograd, "_pop_saved_tensors_default_hooks", None)


def in_force() -> bool:
    """Whether saved-tensor hooks are in force (True where that cannot be told)."""
    if _TOP is None:
        return True
    try:
        return _TOP(True) is not None  # (True: whatever dynamo's tracing flag says, the user's hooks)
    except Exception:  # noqa: BLE001 - another signature: cannot tell
        return True


@contextlib.contextmanager
def set_aside() -> Iterator[None]:
    """Run the block without the caller's saved-tensor hooks; they are back in force, in their order, after it."""
    if _TOP is None or _PUSH is None or _POP is None:
        yield
        return
    stack = []
    try:
        while (top := _TOP(True)) is not None:
            stack.append(top)
            _POP()
    except Exception:  # noqa: BLE001 - another signature: leave the rest in force
        pass
    try:
        yield
    finally:
        for pack, unpack in reversed(stack):
            _PUSH(pack, unpack)
