"""Version counters: which of the caller's counters eager's program moves, the moves the graph makes itself
(`bump_version`), and the plan for the counters a write-back would move though eager's writes left them
(FunctionalProgram.unmoved_counters)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...ir.gradops import bump_version, write_back_now
from ...ir.plan import StorageKind
from ..alias import Storage, Value

if TYPE_CHECKING:
    from .walk import Functionalizer


@dataclass
class VersionCounters:
    """What the walk learned of eager's version counters. A caller's memory, or an alias group member (an
    object), is recorded when eager's program moves its counter (`record_move`); the others keep theirs."""

    written: set[Storage] = field(default_factory=set)  # caller memories whose counter eager moves
    members_moved: set[int] = field(default_factory=set)  # alias group members (objects) whose counter it moves
    bumped: set[int] = field(default_factory=set)  # members whose counter the graph moves itself (move_counter)

    def record_move(self, v: Value) -> None:
        """Eager's program moves the version counter `v` shares (a write through `v`, an in-place layout change,
        `x.copy_(x)`), if `v` is of a caller's memory and shares one of the caller's counters."""
        if v.counter is not None and v.storage.kind is not StorageKind.INTERMEDIATE:
            self.written.add(v.storage)
            if v.storage.kind is StorageKind.GROUP:
                self.members_moved.add(v.counter)


def move_counter(w: Functionalizer, v: Value) -> None:
    """Eager's write of a caller's tensor through `v` moves the version counter `v` shares: what autograd
    saved of that tensor before is stale. Members of an alias group need not share one counter (an
    unsafe_chunk element passed with its base: fuzz seed 971090), and the write-back into the group's base
    moves one member's, so the member a write went through is moved here, once per graph; a tensor with a
    counter of its own made in the graph (an unsafe_chunk element of any caller's tensor: its `unsqueeze_`
    moves the element's counter alone, fuzz seed 1760323) moves no caller's."""
    s = v.storage
    if v.counter is None:
        return
    w.counters.record_move(v)
    if s.kind is not StorageKind.GROUP:
        w.emit.call(bump_version, w.timeline.roots[s])
    elif v.counter is not None and v.counter not in w.counters.bumped:
        w.counters.bumped.add(v.counter)
        w.emit.call(bump_version, w.callers.member_ph[v.counter])


def plan_unmoved_counters(w: Functionalizer) -> None:
    """FunctionalProgram.unmoved_counters: the caller's tensors whose memory the graph writes back though
    eager's writes left their version counters (every write went through a tensor with a counter of its own,
    an unsafe_chunk element or `x.data`, or was one a kernel makes without moving it, OpFacts.counted), and,
    when there are any, the tensors whose counters eager moved (they may share a counter with one of the
    former, which is set back first)."""
    counters, objects, callers = w.counters, w.objects, w.callers
    written = w.timeline.written_callers()
    kept = [s for s in written if s.kind is not StorageKind.GROUP and s not in counters.written]
    unmoved = [s.ref() for s in kept]
    for obj in callers.member_ph:  # (the write-back into a group's base moves the counter of one member)
        if objects.first[obj].storage in written and obj not in counters.members_moved:
            unmoved.append(objects.caller_objs[obj])
    if unmoved:
        moved = [s.ref() for s in counters.written if s.kind is not StorageKind.GROUP]
        moved += [objects.caller_objs[obj] for obj in counters.members_moved]
        w.program.unmoved_counters, w.program.moved_counters = unmoved, moved
    # A write-back inside the graph (AutogradFacts._write_back_now: the tensor is read with grad on after its
    # last write) of such memory goes through an alias with a counter of its own: what autograd saves of the
    # tensor after it must not be stale at the end of the call, when the counter is set back.
    moved_groups = {objects.first[obj].storage for obj in counters.members_moved}
    keep = {s.ref() for s in kept}
    keep |= {s.ref() for s in written if s.kind is StorageKind.GROUP and s not in moved_groups}
    for n in w.graph.find_nodes(op="call_function", target=write_back_now):
        if callers.placeholder_ref.get(n.args[0]) in keep:
            n.kwargs = {**n.kwargs, "keep_counter": True}
