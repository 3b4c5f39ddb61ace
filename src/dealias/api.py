"""The user-facing entry points: `jit`, `last_traces`, `cache_info`."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import UnsupportedFakeTensorException, UnsupportedOperatorException

from .alias import analyze
from .capture import capture
from .errors import DataDependentError, DealiasError, EagerSemanticsError, FallbackWarning, InternalError
from .executor import inductor_executor, torch_executor, uniform_grad_mode, verify_functional
from .functionalize import FunctionalProgram, Ref, functionalize
from .guards import explain_miss, flatten_call, guard_key, lookup_key, tensor_check
from .lifting import Lifted
from .optimize import optimize
from .program import CompiledProgram
from .sharing import find_groups_or_none, overlapping_pairs
from .traces import Trace, format_graph
from .verify import VerificationError, clone_args, first_difference
from .viewops import chain_text
from .writeback import WriteBackReport, lower, whole_report

log = logging.getLogger("dealias")
_EAGER = object()  # cache entry: this signature runs eagerly (see the warning given when it was made)
_FAKE_LIMITS = (UnsupportedOperatorException, UnsupportedFakeTensorException)


@dataclass(frozen=True)
class CacheInfo:
    hits: int
    misses: int
    entries: int
    eager_entries: int  # signatures that fell back to eager
    last_miss_reason: str = ""  # why the latest compile happened ("first call" or what changed)


def _execution_trace(fp: FunctionalProgram, reports: list[WriteBackReport], header: str) -> Trace:
    params = [n.name for n in fp.gm.graph.nodes if n.op == "placeholder"]
    out_node = next(n for n in fp.gm.graph.nodes if n.op == "output")
    results = [a.name for a in out_node.args[0]]
    groups = [p for p in params if p.startswith("alias_group")]

    def name(ref: Ref) -> str:
        if ref.kind == "input":
            return params[ref.key]
        if ref.kind == "group":
            return groups[ref.key]
        return f"self.{ref.key}" if ref.kind == "constant" else results[ref.key]

    for r in reports:
        header += f"\n# write-back to {r.target}: {r.mode}, {r.nbytes} bytes: {', '.join(r.regions)}"
    epilogue = ["# write-back into the caller's tensors"] if fp.writebacks or fp.metadata_writebacks else []
    for wb in fp.writebacks:
        epilogue.append(f"{name(wb.target)}.copy_({results[wb.output]})")
    outs = []
    for slot in fp.outputs:
        outs.append(outs[slot.same_as] if slot.same_as is not None else chain_text(name(slot.source), slot.chain))
    for mw in fp.metadata_writebacks:
        t = name(mw.target)
        epilogue.append(f"{t}.as_strided_({list(mw.size)}, {list(mw.stride)}, {t}.storage_offset() + {mw.rel})")
        if mw.detach:
            epilogue.append(f"{t}.detach_()")
    returns = f"({outs[0]},)" if len(outs) == 1 else f"({', '.join(outs)})"
    text = format_graph(fp.gm, "execute", header, epilogue, returns)
    return Trace("execution", text)


def _copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {}, return_output_node=True)
    graph.output(out[1].args[0] if isinstance(out, tuple) else out)
    return fx.GraphModule(gm, graph)


def _alias_placeholders(gm: fx.GraphModule, captured: Any) -> dict[fx.Node, list[fx.Node]]:
    """Each alias group's base placeholder -> the member placeholders that alias its memory."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = {}
    for g, group in enumerate(captured.groups):
        base = next(p for p in placeholders if p.name == f"alias_group{g}")
        out[base] = [placeholders[m] for m in group.members]
    return out


def compile_program(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    anchor: Callable[..., Any] | None = None,
    names: list[str] = (),
    executor: str = "torch",
) -> CompiledProgram:
    """capture -> alias analysis -> functionalize -> optimize -> write-back lowering -> executor."""
    captured = capture(fn, args, kwargs, anchor, names)
    info = analyze(captured.gm, captured.groups)
    fp = functionalize(captured, info)
    fp.gm = optimize(fp.gm, first_output=len(fp.writebacks))
    functional_gm = _copy_graph_module(fp.gm)
    functional = Trace("functional", format_graph(fp.gm, "functional", "functional trace (no mutation)"))
    grad = torch.is_grad_enabled()
    if executor == "inductor" and uniform_grad_mode(fp.gm, grad):
        # The fusing executor gets the pure functional graph: its only writes are the write-backs after it,
        # so a fused kernel can never read a buffer the program already overwrote (checked, not assumed).
        verify_functional(fp.gm)
        run, reports = inductor_executor(fp.gm), [_whole_report(fp, wb) for wb in fp.writebacks]
        name = "execution trace (inductor: the functional graph, compiled; write-backs after it)"
    else:
        fp, reports = lower(fp, _alias_placeholders(fp.gm, captured))
        run, name = torch_executor(fp.gm, grad), "execution trace (torch executor)"
    traces = [
        Trace("captured", format_graph(captured.gm, "captured", "captured trace (aten, mutations and views kept)")),
        functional,
        _execution_trace(fp, reports, name),
    ]
    return CompiledProgram(captured, fp, run, traces, functional_gm, reports)


def _whole_report(fp: FunctionalProgram, wb: Any) -> WriteBackReport:
    out = next(n for n in fp.gm.graph.nodes if n.op == "output").args[0][wb.output]
    return whole_report(wb.target, out)


class JitFunction:
    """`fn` compiled per guard key; see `dealias.jit`."""

    def __init__(
        self, fn: Callable[..., Any], strict: bool = False, verify: bool = False, executor: str = "torch"
    ) -> None:
        if executor not in ("torch", "inductor"):
            raise ValueError(f"executor must be 'torch' or 'inductor', not {executor!r}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.executor = executor
        self.strict = strict
        self.verify = verify
        self.lifted = Lifted(fn)
        self.has_lifted = bool(self.lifted)
        # lookup key -> [(tensor check, compiled program or _EAGER, full guard key)]
        self.cache: dict[tuple[Any, ...], list[tuple[Any, Any, tuple[Any, ...]]]] = {}
        self.hits = 0
        self.misses = 0
        self.last: CompiledProgram | None = None
        self.ran_eagerly = False  # the latest call fell back to eager (its effects are eager's own)
        self.last_described: tuple[Any, ...] | None = None  # (full guard key, overlapping pairs) of the last call
        self.last_miss_reason = ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, structure = flatten_call(args, kwargs)
        fast = isinstance(structure, (int, tuple))  # only tensors and scalars: no module among the leaves
        arg_modules = [] if fast else [x for x in leaves if isinstance(x, torch.nn.Module)]
        state: list[torch.Tensor] = []
        if self.has_lifted or arg_modules:
            state = self.lifted.fetch(arg_modules)
            leaves = state + leaves
            structure = (structure, len(state), self.lifted.key(arg_modules))
        key, tensors = lookup_key(leaves, structure)
        entry = None
        for check, candidate, described in self.cache.get(key, ()):
            if check(*tensors):
                entry, self.last_described = candidate, described
                break
        if entry is None:
            self.misses += 1
            described = self._explain_miss(guard_key(leaves, structure), tensors)
            entry = self._compile(args, kwargs, arg_modules)
            self.cache.setdefault(key, []).append((tensor_check(tensors), entry, described))
        else:
            self.hits += 1
        self.ran_eagerly = entry is _EAGER
        if entry is _EAGER:
            return self.fn(*args, **kwargs)
        self.last = entry
        if self.verify:
            return self._verified(entry, leaves, state, args, kwargs, arg_modules)
        return entry(leaves)

    def _verified(
        self, entry: Any, leaves: list[Any], state: list[torch.Tensor], args: Any, kwargs: Any, arg_modules: list[Any]
    ) -> Any:
        """Run `fn` eagerly on copies (lifted `state` saved and restored around it), then the compiled program
        on the real arguments, and raise VerificationError at the first difference."""
        saved = [t.detach().clone() for t in state]
        eager_args = clone_args((args, kwargs))
        rng = torch.get_rng_state()
        try:
            expected, eager_error = self.fn(*eager_args[0], **eager_args[1]), None
        except Exception as e:  # noqa: BLE001 - compared with what the compiled call does
            expected, eager_error = None, e
        eager_state = [t.detach().clone() for t in state]
        with torch.no_grad():
            for t, s in zip(state, saved):
                t.copy_(s)
        torch.set_rng_state(rng)
        got = entry(leaves)
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        if eager_error is not None:
            raise VerificationError(f"{name}: eager raised {eager_error!r}, dealias returned")
        diff = first_difference(expected, got, eager_args, (args, kwargs))
        for i, (e, t) in enumerate(zip(eager_state, state)):
            if diff is None and not torch.equal(e, t.detach()):
                diff = f"lifted state {self.lifted.names(arg_modules)[i]} differs after the call"
        if diff is not None:
            raise VerificationError(f"{name}: {diff}")
        return got

    def _explain_miss(self, full: tuple[Any, ...], tensors: list[torch.Tensor]) -> tuple[Any, ...]:
        """Say why this call compiles, against the signature of the previous call; return this call's
        signature (full guard key, overlapping input pairs) for the next explanation."""
        overlapping = overlapping_pairs(tensors, find_groups_or_none(tensors))
        if self.last_described is None:
            reasons = ["first call"]
        else:
            last, before = self.last_described
            reasons = explain_miss(last, full)
            reasons += [f"inputs {i} and {j} now overlap" for i, j in sorted(overlapping - before)]
            reasons += [f"inputs {i} and {j} no longer overlap" for i, j in sorted(before - overlapping)]
            if not reasons and full[3] != last[3]:
                reasons.append("which inputs share a storage changed")
        self.last_miss_reason = "; ".join(reasons) or "a guard changed"
        if self.last_described is not None:
            log.info("dealias: recompiled %s: %s", getattr(self.fn, "__name__", self.fn), self.last_miss_reason)
        self.last_described = (full, overlapping)
        return self.last_described

    def _compile(self, args: tuple[Any, ...], kwargs: dict[str, Any], arg_modules: list[Any]) -> Any:
        def traced(state: list[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
            with self.lifted.installed(state, arg_modules):
                return self.fn(*args, **kwargs)

        lifted = self.has_lifted or bool(arg_modules)
        try:
            if lifted:
                state = self.lifted.fetch(arg_modules)
                names = self.lifted.names(arg_modules)
                return compile_program(traced, (state, *args), kwargs, self.fn, names, self.executor)
            return compile_program(self.fn, args, kwargs, executor=self.executor)
        except EagerSemanticsError:
            raise
        except (DealiasError, *_FAKE_LIMITS) as e:
            return self._fall_back(e)
        except Exception as e:
            # The program's own error (eager raises it too) propagates; an error only tracing hits (a corner of
            # make_fx or fake tensors) means eager must run the program instead.
            if _raises(
                traced if lifted else self.fn, (self.lifted.fetch(arg_modules), *args) if lifted else args, kwargs
            ):
                raise
            return self._fall_back(InternalError(f"tracing failed where eager does not: {type(e).__name__}: {e}"))

    def _fall_back(self, e: Exception) -> Any:
        if self.strict:
            raise e
        kind = "data-dependent program" if isinstance(e, DataDependentError) else "unsupported program"
        warnings.warn(
            f"dealias: running {getattr(self.fn, '__name__', self.fn)} eagerly ({kind}): {e}",
            FallbackWarning,
            stacklevel=4,
        )
        return _EAGER

    def cache_info(self) -> CacheInfo:
        entries = [e for bucket in self.cache.values() for _, e, _ in bucket]
        eager = sum(1 for e in entries if e is _EAGER)
        return CacheInfo(self.hits, self.misses, len(entries), eager, self.last_miss_reason)


def _raises(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether eager raises for this call, run on copies of the arguments (lifted state included: it is the
    first argument of a lifted program) and with the random state restored."""
    rng = torch.get_rng_state()
    copies = clone_args((args, kwargs))
    try:
        fn(*copies[0], **copies[1])
    except Exception:  # noqa: BLE001 - any error: the program's own
        return True
    finally:
        torch.set_rng_state(rng)
    return False


def jit(
    fn: Callable[..., Any] | None = None, *, strict: bool = False, verify: bool = False, executor: str = "torch"
) -> Any:
    """Compile `fn` (a function or an nn.Module) with exact in-place and alias semantics.

    The result behaves like `fn` in eager PyTorch (values, mutations of its arguments and of module state,
    outputs that alias arguments or each other). Programs dealias cannot compile exactly run eagerly with a
    FallbackWarning; with `strict=True` they raise instead. With `verify=True` every call also runs `fn`
    eagerly on copies and raises VerificationError at the first difference. `executor="inductor"` compiles
    the functional graph with inductor (fusion; write-backs copy whole tensors after it) instead of running
    it op by op with in-place region writes."""
    if fn is None:
        return functools.partial(jit, strict=strict, verify=verify, executor=executor)
    return JitFunction(fn, strict=strict, verify=verify, executor=executor)


def explain(jf: JitFunction) -> list[WriteBackReport]:
    """Per caller tensor, what the program `jf` ran last writes back, how, and how many bytes."""
    return list(jf.last.reports) if jf.last is not None else []


def last_traces(jf: JitFunction) -> list[Trace]:
    """The captured, functional and execution traces of the program `jf` ran last."""
    return list(jf.last.traces) if jf.last is not None else []


def cache_info(jf: JitFunction) -> CacheInfo:
    return jf.cache_info()
