"""The TorchDynamo backend: dynamo is the front end, dealias compiles each graph it captures.

Dynamo reads the user's Python bytecode and hands over FX graphs of torch-level ops on graph inputs, with
in-place ops and views intact. It owns everything about Python: guards on Python values, objects and module
state, lifting parameters, buffers, globals and closure tensors to graph inputs, graph breaks (the parts it
cannot capture run eagerly, in-place metadata changes of inputs among them), recompile limits and its compile
lock. dealias owns what dynamo does not check and what its graphs leave to the backend: which inputs share
memory and how, storage offsets, functionalization and exact write-back.

A graph is compiled for the real inputs of a call: only real inputs tell which of them overlap in memory. Where
dynamo's example inputs are the first call's own tensors, in dynamo's backend call, as torch.compile compiles
(`GraphProgram.compile_first`); where they are not (DDP's graph splitter hands over fakes), at the first call.
A `GraphProgram` keeps compiled programs per input layout (storage sharing and overlap, static shapes and strides,
specialized scalars), found by a two-step key (`guards.py`); ints and sizes dynamo made symbolic stay symbols, and
each program's shape guard says which of their values it holds for. A call that matches no program compiles a new
one inside the backend, with the reason recorded, up to `cache_limit` programs per graph; past that, the graph runs
eagerly.
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._dynamo.convert_frame import compile_lock
from torch._subclasses.fake_tensor import UnsupportedFakeTensorException, UnsupportedOperatorException

from .. import compat
from ..compat import header_prefetch, key_prefetch
from ..compat.internals import as_at_the_call, function_modes, with_function_modes_aside
from ..errors import (
    DealiasError,
    EagerSemanticsError,
    InternalError,
    InvariantError,
    NotFusedWarning,
    UnsupportedError,
    fallback_warning,
    node_location,
    refused,
    with_location,
)
from ..ir.draws import kept_rng
from ..ir.plan import Symbolic
from ..ir.sharing import find_groups_or_none, overlapping_pairs
from ..passes.capture import COMPILED_RESTRICTIONS, restriction
from ..passes.pipeline import compile_program
from ..report import records as _report
from ..runtime.program import CompiledProgram
from ..runtime.verify import ULP_TOLERANT, VerificationError, clone_args, first_difference
from .eager_runs import after_refusal, raises_in_eager
from .floats import floats_as_scalars, with_floats
from .graph_inputs import (
    lift_attributes,
    reads_offsets,
    source_name,
    static_tensor,
    statically_guarded,
    symbolic_inputs,
)
from .guards import GuardKey, explain_miss, guard_key, lean_check, lookup_key, tensor_check
from .refusals import refuse_uncorrected
from .segments import grad_mode_at_exit, runs_eagerly, split_around_eager_nodes
from .tiers import Tiered

log = logging.getLogger("dealias")
_EAGER = object()  # cache entry: this layout runs the graph eagerly (see the warning given when it was made)
_EAGER_ONCE = object()  # not cached: this call runs the graph eagerly (eager raises on it), the next compiles
_FAKE_LIMITS = (UnsupportedOperatorException, UnsupportedFakeTensorException)
# Dynamo's settings dealias needs (eager's addcmul_/addcdiv_, guards on module hooks, specialized floats) and its
# corrections to dynamo's tracing are in force only while dynamo traces for a dealias backend: compat/.
compat.install_all()

# make_fx patches nn.Module.__call__ for the whole process while it traces, and dispatch modes keep global
# state: a dealias compile must not overlap with dynamo tracing in another thread. So it takes dynamo's own
# compile lock (re-entrant; dynamo holds it while it calls the backend).
COMPILE_LOCK = compile_lock


EXECUTORS = ("tiered", "exact", "torch", "inductor")
# "auto" was the exact tiers' name before the default fused: a program that asked for it keeps eager's bits
ALIASES = {"auto": "exact"}
TIERS = ("tiered", "exact")  # executors whose programs start on the torch executor and are measured (tiers.py)
EXACT = ("torch", "exact")  # executors whose results are eager's bits


@dataclass(frozen=True)
class Options:
    """What `torch.compile(..., backend="dealias", options={...})` and `dealias.jit(..., **options)` take."""

    # "tiered" (the default): per program the fastest, measured on its calls, of the torch executor, dynamo's graph
    # run as it is and, once the program has run `PROMOTE_AFTER` times (its compile costs seconds), the fused
    # executor (tiers.py); "exact": the same without the fused executor (eager's bits); "torch": eager's kernels,
    # region writes in place; "inductor": the fused executor (fused.py) from the first call
    executor: str = "tiered"
    verify: bool = False  # every call of a graph also runs it eagerly on copies; VerificationError on a difference
    strict: bool = False  # a graph dealias cannot compile raises instead of running eagerly
    cache_limit: int = 8  # compiled layouts per graph before it runs eagerly (with a warning)

    def __post_init__(self) -> None:
        object.__setattr__(self, "executor", ALIASES.get(self.executor, self.executor))
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(map(repr, EXECUTORS))}, not {self.executor!r}")


@dataclass
class Stats:
    """What `cache_info`, `last_traces` and `explain` report: shared by every graph of one compiled function."""

    name: str = "graph"
    graphs: list[GraphProgram] = field(default_factory=list)
    compiles: int = 0  # programs compiled (including layouts that run eagerly)
    last: Any = None  # the CompiledProgram a call ran last
    last_miss_reason: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    # (source line, reason) of graphs executor="inductor" runs on the torch executor, once warned of (a graph dynamo
    # recompiles for another layout, or over symbols, is another graph with the same line: not warned again)
    unfused_told: set[tuple[str | None, str]] = field(default_factory=set)


class GraphProgram:
    """One graph from dynamo, compiled per input layout on first use; called with the graph's flat inputs."""

    def __init__(self, gm: fx.GraphModule, options: Options, stats: Stats) -> None:
        # Tensors the graph holds as attributes (dynamo makes some Python-held state, such as a non-foreach
        # optimizer's parameters and state, `get_attr` constants) become inputs: they are traced as fakes like any
        # input, checked for shared memory, and their mutations written back into them.
        self.gm, self.attributes = lift_attributes(gm)
        self.options = options
        self.stats = stats
        placeholders = self.gm.graph.find_nodes(op="placeholder")
        self.names = [source_name(n) for n in placeholders]
        # Dynamo already guards sizes, strides, dtype, device and requires_grad of the inputs it took from the
        # user's frame when they are static: then dealias's own check is the hashable key alone (sharing,
        # offsets, leaf-ness). Inputs it made itself (DDP's split graphs), attributes and symbolic sizes get the
        # full check.
        # Python ints dynamo left symbolic (a decode position, a step count) stay symbols in the program: one
        # compile serves every value its shape guard accepts, and the values are not part of the key.
        self.symbolic = symbolic_inputs(placeholders)
        self.unkeyed = frozenset((*self.symbolic.scalars, *self.symbolic.sizes))  # values the shape guard checks
        passed = placeholders[: len(placeholders) - len(self.attributes)]
        unguarded = [i for i, n in enumerate(passed) if not (statically_guarded(n) or i in self.symbolic.scalars)]
        self.dynamo_guarded = not self.attributes and not unguarded
        # (a lean lookup, guards.lean_check, checks the attributes itself: dynamo guards only their identity; and the
        # passed tensors of static layout dynamo does not match, an optimizer's gradients)
        self.unguarded = frozenset(unguarded)
        self.lean_possible = all(static_tensor(passed[i]) for i in unguarded)
        # Programs are relative to their inputs' first elements; only an explicit `as_strided` offset (or a read
        # of `storage_offset()`) makes one depend on where an input sits in its storage.
        self.offsets = reads_offsets(self.gm)
        # lookup key -> [(tensor check, shape guard or None, compiled program or _EAGER, (full key, overlaps))]
        self.cache: dict[tuple[Any, ...], list[tuple[Any, Any, Any, tuple[Any, ...]]]] = {}
        self.entries = 0
        self.last_described: tuple[Any, ...] | None = None
        self.lock = threading.Lock()
        # (holds(args), program): the first compiled layout's lookup as one generated expression (guards.lean_check)
        self.lean: tuple[Callable[[tuple[Any, ...]], bool], Any, Callable[[list[Any]], Any]] | None = None
        self.grad_at_exit = grad_mode_at_exit(self.gm)
        with stats.lock:
            stats.graphs.append(self)

    def __call__(self, *args: Any) -> Any:
        if function_modes():  # (dynamo wrote their effect into the graph: run once, as eager's)
            return with_function_modes_aside(self, args)
        lean = self.lean
        try:
            if lean is not None and lean[0](args):
                self.stats.last = lean[1]
                out = lean[2](list(args))
            else:
                out = self._call(args)
        except BaseException as e:
            if not refused(e):
                raise
            out = after_refusal(self.gm, [*args, *self.attributes], e)
        if self.grad_at_exit is not None:
            # The graph left grad mode switched (`torch.set_grad_enabled(False)` called as a function): eager's
            # caller goes on in that mode, and a compiled program restores the mode it was called in.
            torch._C._set_grad_enabled(self.grad_at_exit)
        return out

    def compile_first(self, example_inputs: list[Any]) -> None:
        """In dynamo's backend call, the program of the call dynamo compiled this graph for (`example_inputs`: that
        call's own values, which it is about to pass) and, for executor "tiered", that call's work of its first call
        too (the fused compile, the tiers timed on copies: Tiered.prepare): as torch.compile compiles there, before
        dynamo builds and evaluates the frame's guards, so that the second call finds them, dynamo's frame and the
        call path warm (a 45 us replay-buffer step's worst of calls 2..48: 5.5x eager's median call compiled at the
        call, 3.8x here, torch.compile's 3.9x). Dynamo has set the user's torch function and dispatch modes aside
        there: none sees the compile. Where that cannot be done (example inputs not the call's: fakes, subclasses,
        symbols; inputs dynamo does not guard, or offsets dealias keys; verify=True) or it fails, the call compiles,
        as before, and raises what it raises."""
        if not self.lean_possible or self.offsets or self.options.verify or not _plain(example_inputs):
            return
        leaves = [*example_inputs, *self.attributes] if self.attributes else list(example_inputs)
        try:
            with as_at_the_call() as possible:
                if not possible:
                    return
                key, tensors = lookup_key(leaves, len(leaves), self.offsets, self.unkeyed)
                entry = self._find(key, leaves, tensors) or self._miss(key, leaves, tensors)
                if isinstance(entry, Tiered):
                    entry.prepare(leaves)
        except Exception as e:  # noqa: BLE001 - (an InvariantError too: the call compiles again, and raises it there)
            log.info("dealias: a graph of %s compiles at its call: %s", self.stats.name, e, exc_info=True)

    def _call(self, args: tuple[Any, ...]) -> Any:
        leaves = [*args, *self.attributes] if self.attributes else list(args)
        key, tensors = lookup_key(leaves, len(leaves), self.offsets, self.unkeyed)
        entry = self._find(key, leaves, tensors)
        if entry is None:
            entry = self._miss(key, leaves, tensors)
        if entry is _EAGER or entry is _EAGER_ONCE:
            return self.gm.forward(*leaves)
        self.stats.last = entry
        if self.options.verify:
            return self._verified(entry, leaves)
        return entry(leaves)

    def _find(self, key: tuple[Any, ...], leaves: list[Any], tensors: list[torch.Tensor]) -> Any:
        """The program of this layout whose tensor check and shape guard accept the call, or None."""
        for check, shape_guard, candidate, _ in self.cache.get(key, ()):
            if (self.dynamo_guarded or check(*tensors)) and (shape_guard is None or shape_guard(leaves)):
                return candidate
        return None

    def _miss(self, key: tuple[Any, ...], leaves: list[Any], tensors: list[torch.Tensor]) -> Any:
        with self.lock:
            found = self._find(key, leaves, tensors)  # another thread compiled it meanwhile
            if found is not None:
                return found
            full = guard_key(leaves, len(leaves), self.offsets, self.unkeyed)
            described = self._explain_miss(full, tensors, self._failed_shape_guard(key, leaves))
            if self.entries >= self.options.cache_limit:
                entry = self._fall_back(
                    InternalError(
                        f"{self.options.cache_limit} input layouts compiled for this graph (cache_limit); "
                        f"the latest change: {self.stats.last_miss_reason}"
                    )
                )
            else:
                grad = torch.is_grad_enabled()
                try:
                    with COMPILE_LOCK:
                        entry = self._compile(leaves)
                finally:
                    # Tracing runs the graph's own grad-mode switches; a piece of a split graph may end in another
                    # mode than it began (see segments._Compiled).
                    torch._C._set_grad_enabled(grad)
                if entry is _EAGER_ONCE:
                    return entry
            shape_guard = getattr(entry, "shape_guard", None)
            if self.unkeyed and shape_guard is None and entry is not _EAGER:
                shape_guard = self._same_values(leaves)  # compiled with the values specialized
            layouts = entry.layouts if entry is not _EAGER else None
            self.cache.setdefault(key, []).append((tensor_check(tensors, layouts), shape_guard, entry, described))
            if self.lean is None and self.lean_possible and not self.offsets and entry is not _EAGER:
                if not self.options.verify:
                    writes = getattr(entry, "writes", True)  # (a Tiered entry: its torch program's)
                    held = len(self.attributes)
                    check = lean_check(leaves, self.unkeyed, shape_guard, held, layouts, writes, self.unguarded)
                    run = entry.lean_call if isinstance(entry, CompiledProgram) else entry
                    if isinstance(entry, Tiered) and entry.settled:
                        run = entry.run  # (one tier only: nothing to measure)
                    if self.attributes:
                        run = functools.partial(_with_attributes, run, tuple(self.attributes))
                    self.lean = None if check is None else (check, entry, run)
            if _report.ACTIVE is not None:  # DEALIAS_REPORT: the run's records (report/records.py)
                _report.ACTIVE.compiled(self, leaves, entry)
            self.entries += 1
            self.stats.compiles += 1
            return entry

    def _compile(self, leaves: list[Any]) -> Any:
        hop = next((n for n in self.gm.graph.nodes if _not_compiled(n.target)), None)
        if hop is not None:
            # autograd.Function (its backward), checkpointing, control-flow operators: their subgraphs are not
            # functionalized by dealias; the graph runs as dynamo captured it.
            what = f"{getattr(hop.target, '__name__', None) or hop.target.name()} is not compiled by dealias yet"
            return self._fall_back(UnsupportedError(with_location(what, node_location(hop))))
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        kinds = [restriction(t) for t in tensors]
        restricted = next((i for i, kind in enumerate(kinds) if kind and kind not in COMPILED_RESTRICTIONS), None)
        if restricted is not None:
            # A view eager restricts other than those the passes track (made under no_grad, a split element):
            # made in inference mode, or returned by a custom Function. Left to eager.
            names = [n for n, x in zip(self.names, leaves) if isinstance(x, torch.Tensor)]
            return self._fall_back(
                UnsupportedError(
                    f"input {names[restricted]} is a view whose writes eager restricts ({kinds[restricted]}), and "
                    "requires grad: not compiled yet"
                )
            )
        anything_requires_grad = any(t.requires_grad for t in tensors)
        for group in find_groups_or_none(tensors):
            roots = {i: id(tensors[i] if tensors[i]._base is None else tensors[i]._base) for i in group.members}
            grads = [i for i in group.members if tensors[i].requires_grad]
            differentiable_apart = len(grads) < len(group.members) or len({roots[i] for i in grads}) > 1
            # (Members sharing memory without a common view base, `t` and `t.unsafe_chunk(2)[0]`, none requiring
            # grad: eager's write with grad on through one makes that one require grad, not the others, where the
            # graph has one value for the memory; with a tensor requiring grad around, such a write may come.)
            apart = len(set(roots.values())) > 1
            if grads and differentiable_apart or apart and anything_requires_grad:
                # Gradients reach overlapping inputs through their common view base (AliasGroup.base_of), which
                # is exact when every member is a differentiable view of it. A detached member, or memory shared
                # without a common view base (tensors made with set_), is left to eager.
                names = [n for n, x in zip(self.names, leaves) if isinstance(x, torch.Tensor)]
                members = ", ".join(names[i] for i in group.members)
                return self._fall_back(
                    UnsupportedError(
                        f"inputs {members} share memory, and not all of them are differentiable views of one tensor"
                    )
                )
        executor = "torch" if self.options.executor in TIERS else self.options.executor
        if self.symbolic:
            try:
                return self._entry(compile_program(self.gm, leaves, self.names, executor, self.symbolic), self.symbolic)
            except InvariantError:
                raise  # a bug in dealias (checks on): never hidden by a retry or a fallback
            except Exception as e:  # noqa: BLE001 - any failure: compile again with the values specialized
                log.info(
                    "dealias: %s compiles with its symbolic values specialized: %s", self.stats.name, e, exc_info=True
                )
        try:
            return self._entry(compile_program(self.gm, leaves, self.names, executor), None)
        except (EagerSemanticsError, InvariantError):
            raise
        except (DealiasError, *_FAKE_LIMITS) as e:
            return self._fall_back(e)
        except Exception as e:
            # Where eager raises too, this call runs the graph eagerly, which raises eager's own error after eager's
            # own effects (tracing's error may be another one, from fake tensors); nothing is cached, so a later
            # call compiles (eager on copies of a stale split element raises where eager on it may not: then this
            # call simply runs eagerly). An error only tracing hits (a corner of make_fx or fake tensors) means the
            # graph runs eagerly.
            if raises_in_eager(self.gm, leaves):
                log.info("dealias: a graph of %s raises in eager; this call runs it eagerly: %s", self.stats.name, e)
                return _EAGER_ONCE
            return self._fall_back(InternalError(f"tracing failed where eager does not: {type(e).__name__}: {e}"))

    def _entry(self, program: Any, symbolic: Symbolic | None) -> Any:
        """The cache entry for a torch- or fused-executor program: wrapped to be measured against the other tiers
        (tiers.py), for executors "tiered" and "exact"."""
        if self.options.executor not in TIERS:
            where = program.unfused and next(filter(None, map(node_location, self.gm.graph.nodes)), None)
            if program.unfused and (where, program.unfused) not in self.stats.unfused_told:
                # Asked for the fused executor, this graph runs on the torch executor: said once per graph and reason.
                self.stats.unfused_told.add((where, program.unfused))
                message = f"dealias: a graph of {self.stats.name} runs on the torch executor, not fused: "
                warnings.warn(with_location(message + program.unfused, where), NotFusedWarning, stacklevel=2)
            return program
        return Tiered(self, program, symbolic, fuse=self.options.executor == "tiered")

    def _same_values(self, leaves: list[Any]) -> Callable[[list[Any]], bool]:
        """The shape guard of a program that specialized the symbolic scalars: exactly these values."""
        values = [(p, _leaf_value(leaves[p])) for p in sorted(self.unkeyed)]
        guard = lambda call: all(_leaf_value(call[p]) == v for p, v in values)
        guard.text = " and ".join(f"{self.names[p]} == {leaves[p]!r}" for p in sorted(self.unkeyed))
        return guard

    def _failed_shape_guard(self, key: tuple[Any, ...], leaves: list[Any]) -> str:
        """Why no program of this layout took the call, when its symbolic values were what differed."""
        texts = [g.text for _, g, _, _ in self.cache.get(key, ()) if g is not None and not g(leaves)]
        if not texts:
            return ""
        values = ", ".join(f"{self.names[p]}={leaves[p]!r}" for p in sorted(self.unkeyed))
        return f"{values} outside what the compiled program assumed ({texts[-1]})"

    def _fall_back(self, e: Exception) -> Any:
        if self.options.strict:
            raise e
        if _report.ACTIVE is not None:  # DEALIAS_REPORT (report/records.py)
            _report.ACTIVE.fell_back(self, e)
        warnings.warn(f"dealias: a graph of {self.stats.name} runs eagerly: {e}", fallback_warning(e), stacklevel=2)
        return _EAGER

    def _explain_miss(self, full: GuardKey, tensors: list[torch.Tensor], shape: str = "") -> tuple[Any, ...]:
        """Say why this graph compiles again, against the layout of its previous compile."""
        overlapping = overlapping_pairs(tensors, find_groups_or_none(tensors))
        tensor_names = [n for n, x in zip(self.names, full.leaves) if isinstance(x, tuple) and len(x) > 2]
        if self.last_described is not None:
            last, before = self.last_described
            reasons = explain_miss(last, full, lambda i: _n(self.names, i))
            reasons += [shape] if shape else []
            pair = lambda i, j: f"{_n(tensor_names, i)} and {_n(tensor_names, j)}"
            reasons += [f"{pair(i, j)} now overlap" for i, j in sorted(overlapping - before)]
            reasons += [f"{pair(i, j)} no longer overlap" for i, j in sorted(before - overlapping)]
            if not reasons and full.sharing != last.sharing:
                reasons.append("which inputs share a storage changed")
            self.stats.last_miss_reason = "; ".join(reasons) or "a guard changed"
            log.info("dealias: recompiled a graph of %s: %s", self.stats.name, self.stats.last_miss_reason)
        self.last_described = (full, overlapping)
        return self.last_described

    def _verified(self, entry: Any, leaves: list[Any]) -> Any:
        """Run the graph eagerly on copies of its inputs, then the compiled program on the real ones, and raise
        VerificationError at the first difference. The graph's inputs include the state it reads (parameters,
        buffers, optimizer state), so the eager run touches nothing of the caller's."""
        eager_leaves = clone_args(leaves)
        with kept_rng(self.gm, leaves):
            try:
                expected, eager_error = self.gm.forward(*eager_leaves), None
            except Exception as e:  # noqa: BLE001 - compared with what the compiled call does
                expected, eager_error = None, e
        got = entry(leaves)
        if eager_error is not None:
            raise VerificationError(f"{self.stats.name}: eager raised {eager_error!r}, dealias returned")
        # fused kernels are not bit-equal; the torch executor and dynamo's graph are
        tolerant = ULP_TOLERANT.set(self.options.executor not in EXACT)
        try:
            diff = first_difference(expected, got, eager_leaves, leaves)
        finally:
            ULP_TOLERANT.reset(tolerant)
        if diff is not None:
            raise VerificationError(f"{self.stats.name}: {diff}")
        return got


def _not_compiled(target: Any) -> bool:
    """Graph nodes dealias leaves to eager: higher-order operators (autograd.Function with its backward, hooks,
    checkpointing, control flow) and inference mode regions (tensors made inside are inference tensors, which
    a traced graph does not reproduce)."""
    if isinstance(target, torch._ops.HigherOrderOperator):
        return True
    return target is torch.autograd.grad_mode._enter_inference_mode


def _leaf_value(x: Any) -> tuple[type, Any]:
    return (float, repr(x)) if type(x) is float else (type(x), x)  # (0.0 and -0.0 differ, nan is nan)


def _with_attributes(run: Callable[[list[Any]], Any], attributes: tuple[Any, ...], args: list[Any]) -> Any:
    return run([*args, *attributes])


def _n(names: list[str], i: int) -> str:
    return names[i] if i < len(names) else f"input {i}"


class Backend:
    """A dynamo backend with its options and its statistics: `torch.compile(fn, backend=Backend(...))`."""

    is_dealias_backend = True  # compat's settings and corrections apply while dynamo traces for it

    def __init__(self, options: Options, stats: Stats | None = None) -> None:
        self.options = options
        self.stats = stats if stats is not None else Stats()

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        start_early(self.options)
        compat.fold_input_aliases(gm)  # (first: whatever runs gm, compiled or eagerly, must change the input itself)
        refuse_uncorrected(gm, self.options, self.stats.name)
        program = graph_program(gm, self.options, self.stats)
        if isinstance(program, GraphProgram):
            program.compile_first(example_inputs)
        return compat.keep_out_overlaps(gm, program, self.stats.name, self.options.strict)


def _plain(values: list[Any]) -> bool:
    """Whether dynamo's example inputs are plain tensors and Python numbers, the call's own values (not fake tensors or
    subclasses, not the symbols of ints dynamo made dynamic, nor another object dynamo passes)."""
    return all(type(x) in (torch.Tensor, torch.nn.Parameter, int, float, bool) for x in values)


def start_early(options: Options) -> None:
    """At a compiled function's first call, where it may fuse: the work its first fused compile waits for that needs
    no program, started now in threads of their own (compat/background.py), so that it runs on the other core while
    dynamo and dealias trace instead of on the compile's path. Nothing at import.
    - inductor's first probe of the host's vector ISAs (compat/vec_isa.py; only where nothing is known on disk: six
      child processes here, most of a cold first call's children's CPU), for "tiered" and "inductor";
    - inductor's per-process cache keys (compat/key_prefetch.py; off unless DEALIAS_KEY_PREFETCH=1: measured, the
      thread slowed warm first calls by holding the GIL), only where the first call fuses ("inductor", or "tiered"
      with FUSE_FIRST): where a fused compile may never come (FUSE_FIRST off: at a program's 16th call) they would
      import inductor's cache and hash for nothing;
    - inductor's precompiled header named (compat/header_prefetch.py: two child processes, 0.7-0.9 s wall of a
      loaded warm 2.14 first call), under the same condition, where an earlier process recorded its arguments."""
    from . import tiers

    if options.executor in ("tiered", "inductor"):
        from ..compat.vec_isa import start_probe

        start_probe()
    if options.executor == "inductor" or (options.executor == "tiered" and tiers.FUSE_FIRST):
        key_prefetch.start()
        header_prefetch.start()


def dealias_backend(gm: fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None) -> Any:
    """`torch.compile(fn, backend="dealias", options={...})`: registered through the `torch_dynamo_backends`
    entry point. `options` are those of `Options` (executor, verify, strict, cache_limit)."""
    opts = Options(**(options or {}))
    start_early(opts)
    compat.fold_input_aliases(gm)
    refuse_uncorrected(gm, opts, "a compiled function")
    program = graph_program(gm, opts, Stats(name="a compiled function"))
    if isinstance(program, GraphProgram):
        program.compile_first(example_inputs)
    return compat.keep_out_overlaps(gm, program, "a compiled function", opts.strict)


dealias_backend.is_dealias_backend = True  # type: ignore[attr-defined]


def graph_program(gm: fx.GraphModule, options: Options, stats: Stats) -> Callable[..., Any]:
    """A graph from dynamo, compiled; one with higher-order operators (autograd.Function, hooks) as compiled
    pieces around them, the operators run eagerly (see segments.py). Floats dynamo passes as 0-d tensors are taken as
    Python floats (floats.py)."""
    gm, floats = floats_as_scalars(gm)
    program = _graph_program(gm, options, stats)
    return with_floats(program, floats) if floats else program


def _graph_program(gm: fx.GraphModule, options: Options, stats: Stats) -> Callable[..., Any]:
    if not any(runs_eagerly(n) for n in gm.graph.nodes):
        return GraphProgram(gm, options, stats)
    try:
        return split_around_eager_nodes(gm, lambda piece: GraphProgram(piece, options, stats))
    except Exception as e:  # noqa: BLE001 - split_module refuses some graphs (grad-mode regions it cannot order)
        if options.strict:
            raise UnsupportedError(f"the graph cannot be split around its higher-order operators: {e}") from e
        warnings.warn(f"dealias: a graph of {stats.name} runs eagerly: {e}", fallback_warning(e), stacklevel=3)
        return gm.forward
