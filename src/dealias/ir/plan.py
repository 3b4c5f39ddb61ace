"""The plan: the typed contract between the passes, from alias analysis to the per-call epilogue.

Functionalization produces a `FunctionalProgram`: a graph with no mutation plus what a call must do around it.
Its graph's results are positional, and this module is where that order is written down:

    results = (write-back values..., output values...)
               ^ WriteBack.output indexes these; `first_output` = len(writebacks)
                                  ^ OutputSlot.source = Ref(RefKind.RESULT, i) and ResultArg(i) index these

Write-back lowering removes the write-backs it runs inside the graph and renumbers the rest; the epilogue
(program.py) reads the plan to write back, rebuild output views and apply metadata changes.

Placeholders are the tensor inputs in order, then one synthetic base per alias group (inputs that overlap in
memory), marked `meta["alias_group"] = g`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

from .sharing import AliasGroup
from .viewops import ViewStep

# -- capture: the program over one call signature --------------------------------------------------------------

TENSOR_SLOT = object()  # marks an output the graph computes (a tensor or a symbolic scalar) in `out_template`


@dataclass(frozen=True)
class Symbolic:
    """What of a call is traced as symbols of the captured program's own ShapeEnv (from what dynamo left
    symbolic); everything else is specialized. Keys and values are positions among the argument leaves."""

    dims: dict[int, frozenset[int]] = field(default_factory=dict)  # tensor -> its dims with symbolic sizes
    scalars: tuple[int, ...] = ()  # int and float inputs that are free symbols (a position, a step count, an lr)
    sizes: dict[int, tuple[int, int]] = field(default_factory=dict)  # int input -> (tensor, dim) it is the size of

    def __bool__(self) -> bool:
        return bool(self.dims or self.scalars)


@dataclass
class Captured:
    """A traced program over the flat tensor leaves of one call signature."""

    gm: fx.GraphModule
    in_spec: pytree.TreeSpec
    tensor_positions: list[int]  # positions of the tensor leaves among all argument leaves
    out_spec: pytree.TreeSpec | None = None
    out_template: list[Any] = field(default_factory=list)  # output leaves; TENSOR_SLOT marks a tensor
    fake_mode: FakeTensorMode | None = None
    groups: list[AliasGroup] = field(default_factory=list)  # inputs that overlap in memory
    requires_grad: list[bool] = field(default_factory=list)  # per tensor input (fake metas do not keep it)
    views: list[bool] = field(default_factory=list)  # per tensor input: whether it is a view (`_base`, fakes lose it)
    detached: set[int] = field(default_factory=set)  # tensor inputs the program ran detach_() on
    # Tensor inputs eager restricts, by why: a view made under no_grad or a split's element, that requires grad.
    restricted: dict[int, str] = field(default_factory=dict)
    symbols: list[torch.SymInt] = field(default_factory=list)  # the symbolic scalar inputs, as traced
    sym_positions: list[int] = field(default_factory=list)  # their positions among the argument leaves
    fakes: list[torch.Tensor] = field(default_factory=list)  # the tensor inputs as traced (symbolic sizes or not)
    names: list[str] = field(default_factory=list)  # what the user calls each argument leaf


# -- functionalization's plan ------------------------------------------------------------------------------------


class StorageKind(enum.Enum):
    """Who owns a block of memory (alias.Storage)."""

    INPUT = "input"  # a caller's tensor passed as an argument
    GROUP = "group"  # the memory of caller tensors that overlap (an alias group), one synthetic base
    CONSTANT = "constant"  # a caller's tensor the graph reads as an attribute
    INTERMEDIATE = "intermediate"  # made inside the program


class RefKind(enum.Enum):
    """What a `Ref` names: one of the caller's memories, or a result of the graph."""

    INPUT = "input"
    GROUP = "group"
    CONSTANT = "constant"
    RESULT = "result"


@dataclass(frozen=True)
class Ref:
    """A tensor the epilogue works on: the caller's tensor input `key` (INPUT), the tensor constant named `key`
    (CONSTANT), the synthetic base of alias group `key` (GROUP), or graph result `key` (RESULT)."""

    kind: RefKind
    key: int | str

    def __str__(self) -> str:
        return f"{self.kind.value} {self.key}"


@dataclass(frozen=True)
class WriteBack:
    """At the end of a call, the caller's tensor `target` receives graph result `output`."""

    target: Ref
    output: int
    grad: bool = False  # some write to it happened with grad mode on: autograd must see the write-back


@dataclass(frozen=True)
class MetadataWriteBack:
    """`x.t_()` and friends on a caller's tensor: it ends with these sizes and strides, its storage offset
    moved by `rel`."""

    target: Ref
    size: tuple[int, ...]
    stride: tuple[int, ...]
    rel: int
    detach: bool = False  # x.detach_(): the caller's tensor also leaves autograd
    grad: bool = True  # replayed with grad on (autograd records it, as eager's changes were), or under no_grad


@dataclass(frozen=True)
class ResultArg:
    """In an output's view chain: a symbolic argument (`pos + 1`), computed by the graph as result `index`."""

    index: int

    def __repr__(self) -> str:
        return f"result[{self.index}]"


class MultiOutputStep(NamedTuple):
    """Step `step` of an output's chain replayed as `op(prev, *args)[index]`: the multi-output view (split, unbind)
    eager made."""

    step: int
    op: Any
    args: tuple[Any, ...]
    index: int


class Restride(NamedTuple):
    """A layout set in place (`as_strided_`): sizes, strides, and how far the storage offset moves."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    rel: int


class FromOutput(NamedTuple):
    """Made from output `output`'s tensor by the steps of the chain after its first `after`."""

    output: int
    after: int


@dataclass(frozen=True)
class OutputSlot:
    """One tensor output: `source` itself, or the view `chain` of it."""

    source: Ref
    chain: tuple[ViewStep, ...] = ()
    same_as: int | None = None  # the same tensor object as an earlier output (`return v, v`)
    # Grad mode the view was made in (None: the call's): the chain is replayed in it, as eager made it (a view
    # made under no_grad of a tensor that requires grad is a leaf that requires grad).
    grad: bool | None = None
    grad_from: int = 0  # ...from this step on (the steps before it were made in the call's mode)
    # ...or, not None, in this mode: the graph switched grad mode before making them (a piece of a split graph
    # called with grad off inside a no_grad region, that made them with grad on: `v.reshape(-1)` copying).
    grad_before: bool | None = None
    # ...up to this step, and from it on with grad on: a view made with grad on of a view made under no_grad.
    grad_until: int | None = None
    # Step k of the chain replayed as `op(prev, *args)[index]`, the multi-output view (split, unbind) eager made:
    # eager's element raises when written in place or, after a write of its base, when its grad_fn is read.
    multi_output: MultiOutputStep | None = None
    # ...and an earlier step k replayed as the `unsafe_split` eager made (`x.unsafe_chunk(2)[0].split(1)[0]`): its
    # element is a tensor of its own (no autograd view of x, a version counter of its own), the view's `_base`.
    unsafe_output: MultiOutputStep | None = None
    # An `unsafe_split` element given the history of graph result k (gradops.attach_history): eager's kept the
    # history it had at the split, though other tensors wrote its memory since.
    history: int | None = None
    # Sizes, strides and a storage-offset move set in place (`as_strided_`) once every output is made: a tensor
    # eager made as no view whose layout changed in place (`y = x * 2; y.t_()`), returned as made, re-strided.
    restride: Restride | None = None
    # Made from the caller's tensor before the graph runs: a view eager made before a later write of its memory,
    # so that the call's writes leave it as eager's (reading its grad_fn raises, as for a no_grad view or a
    # split's element whose base was written since).
    early: bool = False
    # Made from output k's tensor by the steps of the chain after its first n: a view of a tensor of its own that
    # the program also returns (`v2 = x.flatten()`, a copy, and `v2.view(-1)`), whose `_base` in eager is it.
    from_output: FromOutput | None = None
    # Made stale, as eager's is: a view made under no_grad whose memory was written after it was made (its grad_fn
    # raises when read, and so does a view made of it with grad on). Its chain is replayed with its version counter
    # one behind the memory's, then set back: the view's recorded version is behind its base's for good (a later
    # write by the caller leaves it stale), as eager's.
    stale: bool = False
    # The last step of the chain, a view, replayed by `reshape` as the user's code made it (opfacts.RESHAPE_KEY):
    # eager's is `_reshape_alias` of a tensor that is not contiguous, which its grad_fn and errors name.
    reshaped: bool = False
    # The step of the chain eager made as `.data` (traced as `detach`, which shares the version counter): replayed
    # as `.data`, a counter of its own, as eager's (a write through it after the call moves the caller's otherwise).
    data_step: int | None = None


@dataclass
class FunctionalProgram:
    """A graph with no mutation (placeholders: tensor inputs, then group bases; results: write-back values, then
    output values, see the module's docstring), and what a call does around it."""

    gm: fx.GraphModule
    writebacks: list[WriteBack] = field(default_factory=list)
    metadata_writebacks: list[MetadataWriteBack] = field(default_factory=list)
    outputs: list[OutputSlot] = field(default_factory=list)
    constants: dict[str, torch.Tensor] = field(default_factory=dict)  # constant name -> the caller's tensor
    # Caller's tensors whose memory is written only through tensors with version counters of their own
    # (unsafe_chunk elements, `x.data`): eager's writes leave their counters where they were, the write-back's copy
    # would move them. When there are any, also the caller's tensors whose counters eager moved: they may share a
    # counter with one of the former (`x[:2]` and `x[2:]` passed apart), and keep what the call moved it to.
    unmoved_counters: list[Ref] = field(default_factory=list)
    moved_counters: list[Ref] = field(default_factory=list)

    @property
    def first_output(self) -> int:
        """The position of the first output value among the graph's results."""
        return len(self.writebacks)


def writes_caller(fp: FunctionalProgram, captured: Captured) -> bool:
    """Whether a call of the program, planned as `fp` (before write-back lowering moves writes into the graph),
    changes any caller tensor: its data (a write-back), its sizes and strides, its version counter, or its autograd
    history (`detach_()`). A program that changes none reads its inputs only, and reads give eager's values whether
    or not two inputs share memory (frontend/guards.lean_check leaves their storages out for it)."""
    return bool(
        fp.writebacks or fp.metadata_writebacks or fp.unmoved_counters or fp.moved_counters or captured.detached
    )


def group_placeholder(graph: fx.Graph, g: int) -> fx.Node:
    """The placeholder of alias group `g`'s synthetic base."""
    node = graph.placeholder(f"alias_group{g}")
    node.meta["alias_group"] = g
    return node


def alias_group_of(node: fx.Node) -> int | None:
    """The alias group whose base placeholder `node` is, or None."""
    return node.meta.get("alias_group") if node.op == "placeholder" else None


def root_node(gm: fx.GraphModule, ref: Ref) -> fx.Node | None:
    """The node of the graph holding the caller's memory `ref` on entry: its placeholder, or its attribute."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if ref.kind is RefKind.INPUT:
        return placeholders[ref.key]
    if ref.kind is RefKind.GROUP:
        return next((p for p in placeholders if alias_group_of(p) == ref.key), None)
    if ref.kind is RefKind.CONSTANT:
        return next((n for n in gm.graph.find_nodes(op="get_attr") if n.target == ref.key), None)
    return None


@dataclass
class WriteBackReport:
    """What one caller tensor receives per call, for `dealias.explain`."""

    ref: Ref  # the caller's tensor
    mode: str  # "in place" (only the written regions move) or "whole copy"
    regions: list[str] = field(default_factory=list)
    nbytes: int = 0
    target: str = ""  # its name in the user's program (given by the pipeline)
    # per region, its view chain from the caller's tensor (() for all of it): the report's write-back map
    # (report/storage_map.py) draws which bytes of the caller's storage each write covers
    chains: list[tuple[Any, ...]] = field(default_factory=list, repr=False, compare=False)
