"""A compiled program: the functional graph plus the run-time epilogue that writes mutations back into
the caller's tensors and rebuilds outputs that alias inputs or each other, one generated Python function
(generated_call.py) whose source the execution trace prints.

The epilogue runs only after the whole graph has run, so a call that fails inside the graph leaves every
input as it was.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from ..ir.plan import Captured, FunctionalProgram
from .generated_call import generate_call


class _StrEnum(str, enum.Enum):
    """A kind that is also its string (enum.StrEnum is 3.11+): options given as strings and comparisons with
    strings keep working, and it prints as its value, in a repr too (`cache_info(f).tiers` shows `('fused',)`)."""

    __str__ = str.__str__
    __format__ = str.__format__
    __repr__ = str.__repr__


class Executor(_StrEnum):
    """What runs a compiled program (`dealias.jit(executor=...)`)."""

    TORCH = "torch"  # eager's kernels op by op, region writes in place
    INDUCTOR = "inductor"  # the fused executor (fused.py, fused_autograd.py)
    TIERED = "tiered"  # torch first, fused once a program has run often (frontend)


class Tier(_StrEnum):
    """The executor a compiled program ended up on (the inductor executor falls back to torch's for a graph it
    cannot fuse)."""

    TORCH = "torch"
    FUSED = "fused"


@dataclass
class CompiledProgram:
    captured: Captured
    functional: FunctionalProgram
    run_graph: Callable[..., Any]  # the executor's callable for `functional.gm`
    traces: list[Any]
    functional_gm: fx.GraphModule  # the functional graph before write-back lowering (for inspection)
    reports: list[Any]  # WriteBackReport per caller tensor written
    shape_guard: Callable[[list[Any]], bool] | None = None  # the calls its symbolic sizes and scalars hold for
    layouts: list[tuple[list[Any], list[Any]]] | None = None  # per tensor input: static sizes, strides (or None)
    tier: Tier = Tier.TORCH  # the executor running it
    grad: bool | None = None  # the grad mode calls come in (keyed): None, the mode at construction
    unfused: str = ""  # executor="inductor": why this program runs on the torch executor instead ("" if fused)
    # Whether a call changes any caller tensor (plan.writes_caller); True unless the plan says none (the safe side:
    # the lean lookup then checks that the inputs' storages are distinct)
    writes: bool = True

    def __post_init__(self) -> None:
        # Everything a call does beyond running the graph is generated here once, as Python (generated_call.py): a
        # cache hit runs that function, and the execution trace prints its source.
        if self.grad is None:
            self.grad = torch.is_grad_enabled()
        self.source, self.lean_call = generate_call(self.captured, self.functional, self.run_graph, self.grad)

    def __call__(self, leaves: list[Any]) -> Any:
        return self.lean_call(leaves)

    def symbolic_inputs(self) -> list[str]:
        """What this program holds symbolic, in the user's names: `pos`, `x.size(1)`."""
        cap = self.captured
        if cap.fake_mode is None or cap.fake_mode.shape_env is None:
            return []
        out = [cap.names[p] for p in cap.sym_positions]
        for p, fake in zip(cap.tensor_positions, cap.fakes):
            out += [f"{cap.names[p]}.size({d})" for d, s in enumerate(fake.shape) if isinstance(s, torch.SymInt)]
        return out
