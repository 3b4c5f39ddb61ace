"""Functionalize: turn a captured graph (in-place ops, views, out= ops) into a graph with no mutation, plus
a write-back plan for the caller's tensors and an alias plan for the outputs.

Per op, in program order (docs/architecture.md has the long version):
- a view records nothing: its value is regenerated from its storage's current base when read;
- a write to a value computes the functional op, pushes the result down the value's view chain with the
  view inverses to get the storage's new base, and bumps the storage's version;
- a read of a value whose version is behind replays its view chain on the current base.
Intermediate storages need no copy at all: their final contents are just the last SSA value.

By responsibility: walk.py (the walk and reading values), inputs.py (the caller's tensors as placeholders and
constants), timeline.py (each storage's base and version; a write recorded), lowering.py (a mutating op as its
functional op), counters.py (eager's version counters), outputs.py (write-backs and output slots).
"""

from __future__ import annotations

from ...ir.plan import Captured, FunctionalProgram
from ..alias import AliasInfo
from .walk import Functionalizer

__all__ = ["Functionalizer", "functionalize"]


def functionalize(captured: Captured, info: AliasInfo) -> FunctionalProgram:
    return Functionalizer(captured, info).run()
