"""The storage timeline: each storage's current base and version, and a write recorded as the storage's new base
(the written value pushed down the view chain by one region write)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from ...errors import EagerSemanticsError, UnsupportedError
from ...ir.plan import StorageKind
from ...ir.regions import emit_region_write, restride
from ...ir.viewops import ViewStep, as_strided_rel, internal_overlap, replay
from ..alias import Storage, Value
from ..writecheck import check_invertible, eager_metadata_error
from .counters import move_counter

if TYPE_CHECKING:
    from .walk import Functionalizer

aten = torch.ops.aten


@dataclass
class Timeline:
    """Where each storage stands in the functional graph. A value is read from `base` through its view chain; the
    `cache` keeps the node a value was last read as, valid while its storage's version has not moved."""

    base: dict[Storage, fx.Node] = field(default_factory=dict)  # current base value of each storage
    roots: dict[Storage, fx.Node] = field(default_factory=dict)  # first value: the caller's tensor for theirs
    version: dict[Storage, int] = field(default_factory=dict)  # writes recorded so far
    cache: dict[Value, tuple[fx.Node, int]] = field(default_factory=dict)  # value -> (node, storage version)

    def start(self, s: Storage, node: fx.Node) -> None:
        """Storage `s` begins as `node` (a placeholder, a constant, an op's result), unless it already has."""
        if s not in self.base:
            self.base[s] = node
            self.roots[s] = node
            self.version[s] = 0

    def advance(self, s: Storage, node: fx.Node) -> None:
        """Storage `s` now holds `node`: its views are replayed from it when next read."""
        self.base[s] = node
        self.version[s] += 1

    def written_callers(self) -> set[Storage]:
        """The caller's storages (inputs, groups, constants) some write moved."""
        return {s for s in self.base if s.kind is not StorageKind.INTERMEDIATE and self.version[s] > 0}

    def through_detached(self, v: Value) -> bool:
        """Whether `v` is reached from its base through a view autograd does not follow (`detach()`, a dtype view):
        eager writes through it without touching the base's history."""
        return any(_hides_grad(step, self.base[v.storage]) for step in v.chain)


def write(w: Functionalizer, v: Value, new: fx.Node, node: fx.Node, counted: bool = True) -> None:
    """`v` now holds `new`: rebuild its storage's base through the inverses of v's view chain."""
    timeline = w.timeline
    meta = v.meta
    new_meta = new.meta["val"]
    s = v.storage
    if tuple(new_meta.shape) != tuple(meta.shape) and _fresh_out(v):
        # An empty tensor made inside the program as an out= argument (composites do this: linalg.inv,
        # msort, log_sigmoid) is resized by eager to the result, contiguous: nothing else sees its memory, so
        # the result simply becomes that tensor.
        if new_meta.dtype != meta.dtype:
            new = w.emit.call(aten._to_copy.default, new, dtype=meta.dtype)
        w.advance(s, new)
        return
    if tuple(new_meta.shape) != tuple(meta.shape):
        raise UnsupportedError(
            f"{node.target} would resize its {tuple(meta.shape)} argument to {tuple(new_meta.shape)}; "
            "pass an argument of the result's shape"
        )
    if new_meta.dtype != meta.dtype:
        if not torch.can_cast(new_meta.dtype, meta.dtype):
            # Eager's in-place and out= kernels refuse to cast their result down a kind (`int.mul_(2.5)`);
            # fake tensors do not check it for every op, and the cast below would write the truncated value.
            error = eager_metadata_error(node)  # (in eager's words, where its kernel can be asked)
            if error is not None:
                raise error
            raise EagerSemanticsError(
                f"{node.target}: result type {_scalar_name(new_meta.dtype)} can't be cast to the desired "
                f"output type {_scalar_name(meta.dtype)}"
            )
        new = w.emit.call(aten._to_copy.default, new, dtype=meta.dtype)
    # Eager writes through a dtype or detached view without touching the base's autograd history.
    detached = timeline.through_detached(v)
    hidden = detached and timeline.base[s].meta.get("rg")
    if detached and new.meta.get("rg"):
        # ...but the view itself then has the history of the value written into it, which a view replayed
        # from the base cannot have.
        raise UnsupportedError(
            f"{node.target} writes a value that requires grad through a non-differentiable view (detach, "
            "an integer dtype view)"
        )
    # bases[i] is the value the i-th step of the chain applies to; bases[-1] is v itself.
    chain = w.steps(v.chain)
    bases = [timeline.base[s]]
    for step in chain:
        bases.append(replay(step, bases[-1], w.emit.call))
    overlapping = [k for k in range(1, len(bases)) if internal_overlap(bases[k].meta["val"]) != "no"]
    if overlapping and w.emit.grad and not hidden and timeline.base[s].meta.get("rg"):
        # Eager writes it, and its backward (copying the gradient into the overlapping view) raises "more than
        # one element of the written-to tensor refers to a single memory location": run eagerly.
        raise UnsupportedError(f"{node.target} writes an overlapping view of a tensor that requires grad")
    if overlapping:
        # A view in the chain overlaps itself (`x.expand(2, n)[0] = 1`, `x.expand(2, n).fill_(1)`): its
        # values cannot stand in for memory. Write the rest of the chain, from the last base before it
        # that has the view's dtype, as one strided region of that base (every alias of a location
        # receives the same value: see writecheck.UNIFORM_WRITES).
        view = bases[-1].meta["val"]
        starts = [
            i
            for i in range(overlapping[0])
            if all(b.meta["val"].dtype == view.dtype for b in bases[i:])
            and internal_overlap(bases[i].meta["val"]) == "no"
        ]
        if not starts:
            raise UnsupportedError(f"{node.target} writes through an overlapping view of another dtype")
        i = starts[-1]
        rel = view.storage_offset() - bases[i].meta["val"].storage_offset()
        step = ViewStep(as_strided_rel, (list(view.shape), list(view.stride()), rel))
        chain = (*chain[:i], step)
        bases = [*bases[: i + 1], w.emit.call(as_strided_rel, bases[i], *step.args)]
    result = new
    if chain:
        check_invertible(chain, bases, node)
        new = emit_region_write(w.emit, bases[0], bases[1:], new)
    else:
        new = restride(w.emit, new, s.root_meta)
    w.advance(s, w.autograd.with_history(s, new, bool(hidden)))
    w.autograd.after_write(s, node, bool(hidden), result)
    # (`counted`: False for a write eager's kernel makes without moving the counter, OpFacts.counted)
    if counted and s.kind is StorageKind.GROUP:  # (a caller's own tensor: its write-back moves its counter)
        move_counter(w, v)
    elif counted:
        w.counters.record_move(v)


def _fresh_out(v: Value) -> bool:
    """`v` is a whole tensor with no elements, made inside the program and not seen by the caller, so an
    out= write may resize it as eager does: to the result's shape, with the layout its kernel gives it (linalg
    kernels restride their outputs column-major, as their functional forms return them)."""
    s = v.storage
    return s.kind is StorageKind.INTERMEDIATE and not v.chain and v.meta.numel() == 0 and v.obj == s.root_obj


def _hides_grad(step: ViewStep, base: fx.Node) -> bool:
    """A view autograd does not differentiate through: detach, or a dtype view leaving floating point."""
    if step.op is aten.detach.default:
        return True
    return step.op is aten.view.dtype and not step.args[0].is_floating_point and not step.args[0].is_complex


def _scalar_name(dtype: torch.dtype) -> str:
    """Eager's name of a dtype in its messages: `Float`, `Int`, `ComplexFloat`."""
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")
