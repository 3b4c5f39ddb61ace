"""Ops for autograd facts of eager that no aten op states, called by functional graphs where eager's
tensors carry a history their values do not:

- `keep_history(old, new)`: the values of `new` with the history of `old`. Eager writes a tensor that requires
  grad under `no_grad` (or through `detach()` / a dtype view) without touching its autograd history: gradients
  flow to what the tensor was computed from, as if the write had not happened. The functional value computed by
  the write has no such history; this joins the two.
- `overwritten(old, new)`: eager's tensor that requires grad, overwritten with grad on by values that do not,
  still requires grad; the functional value, made of those values alone, would not.
- `rewritten(old, new)`: eager's tensor that requires grad, overwritten with grad on through a view covering all of
  it by a `copy_` of values that do: its old history still gets a zero gradient (CopySlices'), which the functional
  value, the values reshaped back, would not give it.
- `write_back_now(target, value)`: a caller's tensor written in the graph and then read by ops that save it for
  backward: eager saves the caller's tensor itself, so a later in-place write (in a later graph, or in eager
  code) makes backward raise. The graph writes it back where its last write was and reads it afterwards.
- `attach_history(t, history)`: an `unsafe_split` element returned after other tensors wrote its memory keeps,
  in eager, the history it had at the split; the graph's value of it then is that history.
- `bump_version(t)`: eager's `x.copy_(x)` writes no value but moves the caller's version counter.
- `stale_saved(t, messages)`: `t`, whose eager op saved a tensor the program then wrote: backward raises eager's
  error where it reaches eager's node for that op.
- `grad_leaf(view)`: a view made under `no_grad` of a tensor that requires grad is, in eager, a leaf that
  requires grad: ops on it with grad on are differentiable, and their gradient stops there. A functional replay
  of the view from its base would send it on to the base.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ..compat.internals import set_version_counters


class _KeepHistory(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return new.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def keep_history(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    if not (torch.is_grad_enabled() and old.requires_grad):
        return new
    return _KeepHistory.apply(old, new)


class _Overwritten(torch.autograd.Function):
    """`new`'s values, a zero gradient to `old`'s history and `grad` to `new`'s (dropped where `new` requires no
    grad: `overwritten`)."""

    @staticmethod
    def forward(ctx: Any, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return new.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros_like(grad), grad


def overwritten(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """A tensor that requires grad, overwritten with grad on by values that do not (`y.copy_(c)`): eager's
    still requires grad, and its old history gets a zero gradient."""
    if not (torch.is_grad_enabled() and old.requires_grad) or new.requires_grad:
        return new
    return _Overwritten.apply(old, new)


def rewritten(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """A tensor that requires grad, written with grad on through a view that covers all of it (`y.view(-1).copy_(v)`)
    by values the write's op did not compute from it (regions.covers_without_reading): eager's CopySlices still
    calls the node of its old history, with a zero gradient where the write went, so a leaf behind it gets a gradient
    of zeros (not None) and an op there whose saved tensor the program wrote raises; the functional value, the
    written values reshaped back, has no edge to that history. This node gives it one, the gradient passing on to
    `new` as it is."""
    if not (torch.is_grad_enabled() and old.requires_grad and new.requires_grad):
        return new
    return _Overwritten.apply(old, new)


class _AttachHistory(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        ctx.mark_dirty(t)  # (t's own history is replaced by this node's, as an in-place op's is)
        return t

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, grad


def attach_history(t: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """`t` (an `unsafe_split` element of the caller's memory, returned) with the history of `history` (its value
    when eager split it): eager's element keeps the history it had at the split (UnsafeSplitBackward), whatever
    wrote its memory since through other tensors. Its version counter, its own, is left where it was."""
    if not history.requires_grad:
        return t
    version = t._version
    # `t`, split after the write-back, has a grad_fn of its own (UnsafeSplitBackward to the input as it is now,
    # through the write-back's history). _AttachHistory gives it no gradient, but autograd would still walk that
    # edge, calling its nodes with zeros: a write whose eager op saved a tensor the program then wrote
    # (`x0.mul_(x0)`, stale_saved) raised in backward where eager's never reaches it (fuzz seed 1262072). Eager's
    # element has no edge to what was written after the split: cut it, in place, as `t` stays the object the
    # caller gets (an `unsafe_split` element is no autograd view, which detach_ refuses).
    if not t._is_view():
        t.detach_()
    with torch.enable_grad():
        out = _AttachHistory.apply(t, history)
    set_version_counters((out,), (version,))
    return out


def write_back_now(target: torch.Tensor, value: torch.Tensor, keep_counter: bool = False) -> torch.Tensor:
    """The caller's tensor receives its final value inside the graph, where its last write was; later reads are
    of the caller's tensor itself (see AutogradFacts._write_back_now). `keep_counter`: through an alias with a
    version counter of its own (as `x.data`), for a tensor eager's writes leave the counter of (written through
    `x.data`, an `unsafe_chunk` element, by a mutable op: FunctionalProgram.unmoved_counters); autograd records
    none of those writes."""
    (target.data if keep_counter else target).copy_(value)
    return target


write_back_now._dealias_effect = True  # type: ignore[attr-defined]  # a write: never dropped or merged


def caller_tensor(t: torch.Tensor) -> torch.Tensor:
    """The caller's tensor itself, not the clone later reads of a written input go through (see
    AutogradFacts.run_in_place_on_caller): the graph runs a write on it in place."""
    return t


def caller_after(t: torch.Tensor, written: torch.Tensor) -> torch.Tensor:
    """`t` after the in-place op whose result is `written` (so reads come after the op)."""
    return t


def bump_version(t: torch.Tensor) -> None:
    """Eager's `x.copy_(x)` and in-place metadata changes (`x[1:].unsqueeze_(0)`) change no value, but move the
    version counter of the caller's tensor: what autograd saved of it before is stale, and backward raises."""
    torch.autograd.graph.increment_version(t)


bump_version._dealias_effect = True  # type: ignore[attr-defined]  # a write: never dropped or merged


def grad_leaf(view: torch.Tensor) -> torch.Tensor:
    return view.detach().requires_grad_(view.requires_grad)


class _StaleSaved(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, messages: tuple[str, str]) -> torch.Tensor:
        ctx.messages = messages
        return t.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # (eager words its hint after whether anomaly detection is on when backward reads the saved tensor)
        raise RuntimeError(ctx.messages[1 if torch.is_anomaly_enabled() else 0])


def stale_saved(
    t: torch.Tensor, message: tuple[str, str], caller: torch.Tensor | None = None, version: int = 0
) -> torch.Tensor:
    """`t`, the result of an op whose eager backward node reads a saved tensor the program wrote afterwards
    (passes/stale.py): the values of `t`, and a backward node in front of its history that raises eager's error
    `message` when a backward reaches it, where eager's node would raise. A backward that does not reach it (or
    none) gets eager's gradients: the functional op saved nothing stale. `message` is eager's (without, with
    anomaly detection at backward) for a call where the caller's tensor `caller` (the saved tensor's memory, when
    it is a caller's) was at `version`: eager counts from the caller's counter, so its versions move by as much as
    the counter has since."""
    if not (torch.is_grad_enabled() and isinstance(t, torch.Tensor) and t.requires_grad):
        return t
    if caller is not None and caller._version != version:
        moved = caller._version - version
        message = tuple(  # type: ignore[assignment]
            _VERSIONS.sub(
                lambda m: f"is at version {int(m[1]) + moved}; expected version {int(m[2]) + moved} instead", said, 1
            )
            for said in message
        )
    return _StaleSaved.apply(t, message)


_VERSIONS = re.compile(r"is at version (\d+); expected version (\d+) instead")


# (a Python autograd.Function raising at backward: AOTAutograd would trace its backward, and raise, when compiling)
stale_saved.dealias_unfused = "a backward node raising eager's error at a stale saved tensor runs in Python"  # type: ignore[attr-defined]
