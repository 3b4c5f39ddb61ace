"""The user-facing entry points: `jit`, `last_traces`, `cache_info`."""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch._dynamo.convert_frame import compile_lock
from torch._dynamo.eval_frame import OptimizedModule
from torch._dynamo.exc import BackendCompilerFailed, TorchRuntimeError, Unsupported
from torch._dynamo.utils import counters, graph_break_reasons, guard_failures
from torch._guards import CompileContext

from .compat import dynamo_hook_split
from .compat.dynamo_resume import frames_compiled_here
from .errors import (
    DataDependentError,
    DealiasError,
    FallbackWarning,
    GraphBreakWarning,
    InvariantError,
    UnsupportedError,
    is_library_file,
    with_location,
)
from .frontend.backend import _EAGER, Backend, Options, Stats, start_early
from .ir.plan import WriteBackReport
from .ir.traces import Trace
from .report import records as _report
from .runtime.program import CompiledProgram

log = logging.getLogger("dealias")


@dataclass(frozen=True)
class CacheInfo:
    hits: int
    misses: int
    entries: int
    eager_entries: int  # input layouts of a graph that run it eagerly, plus 1 if the whole function runs eagerly
    last_miss_reason: str = ""  # why the latest compile happened ("first call" or what changed)
    dynamic: tuple[str, ...] = ()  # what compiled programs hold symbolic: `pos`, `x.size(1)`
    # per compiled program, what runs it: "torch" (the torch executor), "graph" (dynamo's graph as it is, executors
    # "tiered" and "exact") or "fused", with why the fused executor does not where it was asked for
    tiers: tuple[str, ...] = ()
    # per compiled program, the fastest timed call on each tier it was measured on ({} if none; CPU seconds of the
    # calling thread where torch runs on one thread, wall seconds otherwise)
    timings: tuple[dict[str, float], ...] = ()
    # per compiled program, why it runs where it does: "fastest measured: graph 40.1 us vs torch 55.0 us (...)"
    tier_reasons: tuple[str, ...] = ()


class _Backend(Backend):
    """dealias's backend, also noting which of dynamo's cache entries it compiled: dynamo's recompile reasons are
    process-wide, each prefixed with the id of the entry that failed ("frame/entry"), and cache_info reports this
    function's own (two jitted copies of one function share dynamo's frame, not their entries)."""

    def __init__(self, options: Options, stats: Stats) -> None:
        super().__init__(options, stats)
        self.entries: set[str] = set()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        compile_id = CompileContext.current_compile_id()
        if compile_id is not None:
            self.entries.add(f"{compile_id.frame_id}/{compile_id.frame_compile_id}")
        return super().__call__(gm, example_inputs)


class JitFunction:
    """`fn` compiled through TorchDynamo with dealias as its backend; see `dealias.jit`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        strict: bool = False,
        verify: bool = False,
        executor: str = "tiered",
        cache_limit: int = 8,
        dynamic: bool | None = None,
    ) -> None:
        self.options = Options(executor=executor, verify=verify, strict=strict, cache_limit=cache_limit)
        self.dynamic = dynamic
        if not isinstance(fn, torch.nn.Module):
            functools.update_wrapper(self, fn)
        self.fn = fn
        name = getattr(fn, "__qualname__", None) or type(fn).__name__
        self.stats = Stats(name=name)
        self.backend = _Backend(self.options, self.stats)
        # dynamic=None: dynamo's automatic dynamic. A Python int or a tensor size that changes between calls (a
        # position, a step count, a sequence length) becomes a symbol after its second value, and the backend
        # compiles one program for all values its shape guard accepts. dynamic=True: symbols from the first call.
        self.compiled = torch.compile(
            fn,
            backend=self.backend,
            dynamic=dynamic,
            fullgraph=strict,
            recompile_limit=cache_limit,
            isolate_recompiles=True,
        )
        self.hits = 0
        self.misses = 0
        self.last_miss_reason = ""
        self._breaks_told: set[str] = set()
        # Every graph break of the function, once each, in dynamo's order: the user's, warned about, and those torch's
        # own code asks for with `torch._dynamo.graph_break()` (torch.optim's step, on purpose), listed only.
        self.graph_breaks: list[str] = []
        self._failures_seen = 0  # of this function's own recompile reasons
        self._limits_seen = _limit_hits()
        self._warm = False  # a call has finished (until then calls take turns: __call__)
        self._first_lock = threading.RLock()  # (re-entrant: a first call may call the function again)
        self.eager = False  # dynamo could not trace the function where eager runs it: it runs eagerly

    @property
    def last(self) -> CompiledProgram | None:
        return self.stats.last

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.eager:
            return self.fn(*args, **kwargs)
        if self._warm:
            return self._call(args, kwargs)
        start_early(self.options)  # (from the first call's start: the threads overlap dynamo's tracing too)
        # Until a call has finished, calls take turns. Dynamo looks up its cache before it waits for its compile
        # lock and not again after, so each of the threads that reach a new function together compiled it once
        # more: 8 threads filled the cache limit with copies (with strict=True the next new layout raised). The
        # wait is bounded: a first call that waits for another thread (a barrier) must not hang the program.
        waited = self._first_lock.acquire(timeout=_FIRST_CALL_WAIT_SECONDS)
        try:
            return self._call(args, kwargs)
        finally:
            self._warm = True
            if waited:
                self._first_lock.release()

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        compiles, frames, breaks = self.stats.compiles, _frames_compiled(), len(graph_break_reasons)
        try:
            # (the common call's first try inline: `_call_compiled` is the retry after a refused entry, a frame less)
            try:
                return self.compiled(*args, **kwargs)
            except RuntimeError as e:
                if _FX_TRACING_ELSEWHERE not in str(e) or _user_code_ran(e.__traceback__):
                    raise
            with compile_lock:  # (as _call_compiled: wait for the compile that refused it)
                pass
            return self._call_compiled(args, kwargs)
        except BackendCompilerFailed as e:
            # The backend refused the graph (strict=True, or a FallbackWarning the caller turned into an error):
            # raise that, not dynamo's wrapper.
            if isinstance(getattr(e, "inner_exception", None), (DealiasError, Warning, InvariantError)):
                raise e.inner_exception.with_traceback(None) from None
            raise
        except InvariantError:
            raise  # a bug in dealias (checks on): not a reason to run eagerly
        except Unsupported as e:
            # strict=True (fullgraph): dynamo could not capture the whole program. Say where and why, in one line.
            raise _strict_error(e) from e
        except Exception as e:
            # An error while dynamo traced the program over fake tensors: usually the program's own error (eager
            # raises it too), sometimes a tracing rule stricter than eager. If no user code ran yet in this call
            # (dynamo compiles a frame before running it), running the call eagerly is exact either way: eager
            # raises its own error, or returns what eager returns. Errors from running code propagate.
            if self.options.strict or _user_code_ran(e.__traceback__):
                cause = e.__cause__
                if isinstance(e, TorchRuntimeError) and isinstance(cause, Exception):
                    raise cause.with_traceback(None) from None
                raise
            out = self.fn(*args, **kwargs)  # eager's own error, if the program has one, propagates from here
            if _FX_TRACING_ELSEWHERE in str(e):
                # Another thread was compiling (dealias's capture traces with make_fx, whose "tracing" flag is
                # process-wide) when dynamo entered this call: this call ran eagerly; the next one compiles.
                return out
            # Eager succeeded where dynamo's tracing failed: from now on the function runs eagerly (tracing it again
            # on every call would fail again, at a tracing's cost).
            self.eager = True
            warnings.warn(
                f"dealias: {self.stats.name} runs eagerly: dynamo could not trace it: {_first_line(e.__cause__ or e)}",
                FallbackWarning,
                stacklevel=3,
            )
            return out
        finally:
            if self.stats.compiles == compiles and _frames_compiled() == frames:
                self.hits += 1
            else:
                self._record_miss(compiles, breaks)

    def _call_compiled(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The compiled call. Dynamo refuses to enter a compiled function while any thread traces with FX (the flag
        is process-wide), and dealias's capture traces with make_fx: a call made while another thread compiles
        fails at the entry, before any of its code ran. It waits for that compile (dealias compiles under dynamo's
        compile lock) and calls again; strict=True must not run it eagerly instead."""
        for _ in range(_TRACING_WAITS):
            try:
                return self.compiled(*args, **kwargs)
            except RuntimeError as e:
                if _FX_TRACING_ELSEWHERE not in str(e) or _user_code_ran(e.__traceback__):
                    raise
            with compile_lock:  # (re-entrant: a call made inside one of dealias's compiles passes)
                pass
        # Still refused: FX tracing that is not a compile (the caller's own symbolic_trace of code calling this)
        return self.compiled(*args, **kwargs)

    def _record_miss(self, compiles: int, breaks: int) -> None:
        self.misses += 1
        breaks_told = len(self.graph_breaks)  # (for the report: the breaks this miss adds)
        dynamo_reasons = self._new_guard_failures()
        if self.misses == 1:
            self.last_miss_reason = "first call"
        elif dynamo_reasons:
            self.last_miss_reason = "; ".join(dynamo_reasons)
        elif self.stats.compiles != compiles and self.stats.last_miss_reason:
            self.last_miss_reason = self.stats.last_miss_reason
        for reason in graph_break_reasons[breaks:]:
            described = _describe_break(reason)
            if described in self._breaks_told:  # once per break, not again on each recompile
                continue
            self._breaks_told.add(described)
            if _intended_by_torch(reason):
                self.graph_breaks.append(f"{described} (asked for by torch's own code)")
                continue
            if dynamo_hook_split.is_split(_break_reason(reason)):
                # A break at a hook's registration (compat/dynamo_hook_split.py): only that call runs between the
                # graphs, no tensor op runs eagerly: listed, not warned about.
                self.graph_breaks.append(_describe_split(reason))
                continue
            self.graph_breaks.append(described)
            warnings.warn(f"dealias: {self.stats.name}: {described}", GraphBreakWarning, stacklevel=4)
        limits = _limit_hits()
        if limits != self._limits_seen:  # counted process-wide: read on misses only, off the hot path
            self._limits_seen = limits
            warnings.warn(
                f"dealias: {self.stats.name} compiled {self.options.cache_limit} times (cache_limit); calls that "
                f"match none of those programs now run eagerly. Latest change: {self.last_miss_reason}",
                FallbackWarning,
                stacklevel=4,
            )
        if _report.ACTIVE is not None:  # DEALIAS_REPORT: the run's records (report/records.py)
            _report.ACTIVE.missed(self, breaks_told)

    def _new_guard_failures(self) -> list[str]:
        """Dynamo's recompile reasons for this function's entries recorded since the last miss, one line each."""
        entries = self.backend.entries
        ours = [str(r) for failures in list(guard_failures.values()) for r in failures if _entry_id(r) in entries]
        # (torch._dynamo.reset() clears the record: then all of it is new)
        new = ours[self._failures_seen :] if len(ours) >= self._failures_seen else ours
        self._failures_seen = len(ours)
        if not new:
            return []
        # Dynamo records one failure per cached entry it tried ("frame/entry: reason"); the newest entry's says
        # what changed since the last compile.
        return [_one_line(max(new, key=_entry_number))]

    def programs(self) -> list[Any]:
        """Every compiled program of every graph (the cache entries that do not run eagerly)."""
        graphs = list(self.stats.graphs)
        return [e for g in graphs for bucket in list(g.cache.values()) for *_, e, _ in bucket if e is not _EAGER]

    def cache_info(self) -> CacheInfo:
        graphs = list(self.stats.graphs)
        entries = sum(g.entries for g in graphs)
        eager = sum(1 for g in graphs for bucket in g.cache.values() for *_, e, _ in bucket if e is _EAGER)
        eager += self.eager
        programs = self.programs()
        dynamic = dict.fromkeys(name for p in programs for name in p.symbolic_inputs())
        tiers = tuple(str(p.tier) for p in programs)  # (a tiered program says where it is now)
        timings = tuple(dict(getattr(p, "timings", {})) for p in programs)
        reasons = tuple(getattr(p, "tier_reason", "") or _fixed_tier(self.options.executor, p) for p in programs)
        return CacheInfo(
            self.hits, self.misses, entries, eager, self.last_miss_reason, tuple(dynamic), tiers, timings, reasons
        )


def _fixed_tier(executor: str, program: CompiledProgram) -> str:
    if executor == "inductor" and program.tier != "fused":
        return f"not fused: {program.unfused or 'see the execution trace (last_traces)'}"
    return f'executor="{executor}"'


_FIRST_CALL_WAIT_SECONDS = 60.0
_TRACING_WAITS = 16  # waits for other threads' compiles before a call gives up on compiling
_FX_TRACING_ELSEWHERE = "Detected that you are using FX to symbolically trace a dynamo-optimized function"


def _frames_compiled() -> int:
    """Frames dynamo compiled on this thread (compat/dynamo_resume.py), or its process-wide count where that is not
    kept."""
    here = frames_compiled_here()
    return counters["frames"].get("total", 0) if here is None else here


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _user_code_ran(tb: Any) -> bool:
    """Whether a traceback passes through user code (a frame that is neither torch's nor dealias's)."""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not is_library_file(name, dealias_too=True):
            return True
        tb = tb.tb_next
    return False


def _limit_hits() -> int:
    """How many times dynamo refused to compile a frame again because its recompile limit was reached."""
    return sum(n for k, n in list(counters["unimplemented"].items()) if k.startswith("Dynamo recompile limit"))


def _entry_id(reason: str) -> str:
    found = re.match(r"\d+/\d+", reason)
    return found.group(0) if found else ""


def _entry_number(reason: str) -> int:
    found = re.match(r"\d+/(\d+)", reason)
    return int(found.group(1)) if found else -1


def _one_line(reason: Any) -> str:
    """`2/0: n == 2   # def g(x, n): ...  # file:12 in g` -> `n == 2 (file:12 in g)`."""
    first = str(reason).splitlines()[0]
    first = re.sub(r"^\d+/\d+: ", "", first)
    parts = [p.strip() for p in first.split("#")]
    return f"{parts[0]} ({parts[-1]})" if len(parts) > 2 else parts[0]


def _strict_error(e: Exception) -> Exception:
    """dealias's error for a program dynamo cannot capture whole: DataDependentError when it reads tensor data
    into Python (a branch, `.item()`, a data-dependent shape), UnsupportedError otherwise."""
    text = str(e)
    why = text.strip().splitlines()[0]
    where = re.findall(r'File "([^"]+)", line (\d+)', text)
    location = f"{where[-1][0]}:{where[-1][1]}" if where else None
    data = re.search(r"(?i)data-dependent|item\(\)|dynamic shape|nonzero|_local_scalar_dense", text)
    kind = DataDependentError if data else UnsupportedError
    return kind(with_location(f"cannot compile the whole program (strict=True): {why}", location))


def _intended_by_torch(reason: Any) -> bool:
    """A break torch's own code asks for (`torch._dynamo.graph_break()` in torch.optim's step): its innermost frame
    is torch's, and its reason an explicit graph_break() call. Not the user's problem: not warned about."""
    stack = list(reason.user_stack)
    inner = stack[-1].filename if stack else ""
    explicit = "torch._dynamo.graph_break()" in str(reason.reason)
    return explicit and is_library_file(inner)


def _describe_break(reason: Any) -> str:
    """One line for a graph break: where it is and why that part runs eagerly."""
    why = str(reason.reason).strip().splitlines()[0] if reason.reason else "graph break"
    if why.startswith("generic_jump"):
        why = "a Python branch on a tensor's value (data-dependent control flow)"
    frames = [f for f in reason.user_stack if not is_library_file(f.filename)]
    where = f" at {frames[-1].filename}:{frames[-1].lineno} ({(frames[-1].line or '').strip()})" if frames else ""
    return f"part of the program runs eagerly{where}: {why}"


SPLIT = "graph split"  # (the start of a listed break at which no tensor op runs eagerly: fuzz's "split")


def _describe_split(reason: Any) -> str:
    """One line for a break at which only a Python call with no tensor op runs between two graphs."""
    frames = [f for f in reason.user_stack if not is_library_file(f.filename)]
    where = f" at {frames[-1].filename}:{frames[-1].lineno} ({(frames[-1].line or '').strip()})" if frames else ""
    return f"{SPLIT}{where}: only that call runs between the graphs, no tensor op eagerly: {_break_reason(reason)}"


def _break_reason(reason: Any) -> str:
    return str(reason.reason).strip().splitlines()[0] if reason.reason else ""


def jit(
    fn: Callable[..., Any] | None = None,
    *,
    strict: bool = False,
    verify: bool = False,
    executor: str = "tiered",
    cache_limit: int = 8,
    dynamic: bool | None = None,
) -> Any:
    """Compile `fn` (a function or an nn.Module) with exact in-place and alias semantics. A module gets a module
    back (`JitModule`, a torch.compile `OptimizedModule`), a function a `JitFunction`.

    The result behaves like `fn` in eager PyTorch (values, mutations of its arguments and of module state,
    outputs that alias arguments or each other). Programs dealias cannot compile exactly run eagerly with a
    FallbackWarning; with `strict=True` they raise instead. With `verify=True` every call also runs `fn`
    eagerly on copies and raises VerificationError at the first difference. `executor="tiered"` (the default)
    runs each program on whichever is fastest, measured on its own calls, of the torch executor (op by op with
    eager's kernels), dynamo's graph run as it is (as `backend="eager"` runs it, where that is exact) and, once the
    program has run 16 times (an inductor compile costs seconds), the fused executor: inductor's kernels, the
    graph's writes into the caller's memory included, within a few ulps of eager's results. `executor="exact"`
    chooses between the first two only: eager's bits ("auto" is its former name). `executor="torch"` keeps the
    torch executor, `executor="inductor"` the fused executor from the first call. `cache_info(f).tiers`,
    `.timings` and `.tier_reasons` say where each program runs and why; `wait_compiles(f)` waits for the fused
    compiles running in the background (their calls run the exact tiers meanwhile). `dynamic` is torch.compile's:
    None holds an int or a size symbolic once it has changed between calls, True from the first call, False
    never."""
    options = dict(strict=strict, verify=verify, executor=executor, cache_limit=cache_limit, dynamic=dynamic)
    if fn is None:
        return functools.partial(jit, **options)
    jf = JitFunction(fn, **options)
    # A module gets a module back, as from torch.compile: parameters, state_dict, train/eval, attributes.
    return JitModule(fn, jf) if isinstance(fn, torch.nn.Module) else jf


class JitModule(OptimizedModule):
    """`dealias.jit(module)`: torch.compile's module wrapper (`OptimizedModule`) whose calls run through a
    JitFunction. As torch.compile's: the module is registered as `_orig_mod` (parameters and state_dict keys are
    prefixed `_orig_mod.`), attributes, `train()/eval()`, `.to()` and `len()` reach it, copies and pickles rebuild
    the wrapper over a copy of the module with the same options (a fresh cache). Beyond torch.compile's: indexing
    and iteration reach the module (`model[0]` of a Sequential)."""

    _dealias: JitFunction | None = None  # (a class attribute: OptimizedModule's __setattr__ keeps such names here)

    def __init__(self, mod: torch.nn.Module, jf: JitFunction) -> None:
        object.__setattr__(self, "_dealias", jf)  # before OptimizedModule's __init__, which calls _initialize
        super().__init__(mod, jf.compiled.dynamo_ctx)

    def _initialize(self) -> None:
        # forward is the JitFunction: Module.__call__ runs the wrapper's own hooks around it, as torch.compile's
        self.forward = self._dealias

    def __reduce__(self) -> tuple[Any, ...]:
        jf = self._dealias
        options = dict(
            strict=jf.options.strict,
            verify=jf.options.verify,
            executor=jf.options.executor,
            cache_limit=jf.options.cache_limit,
            dynamic=jf.dynamic,
        )
        return (_rebuild_jit_module, (self._orig_mod, options))

    def __getattr__(self, name: str) -> Any:
        # The module's attributes first (a user's `model.last` stays theirs), then the JitFunction's few that
        # tests and tools read (`jm.last`, `jm.stats`).
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in _HANDLE_ATTRIBUTES:
                return getattr(self.__dict__["_dealias"], name)
            raise

    def __getitem__(self, index: Any) -> Any:
        return self._orig_mod[index]

    def __iter__(self) -> Any:
        return iter(self._orig_mod)


_HANDLE_ATTRIBUTES = frozenset(("last", "stats", "options", "hits", "misses", "last_miss_reason", "cache_info"))


def _rebuild_jit_module(mod: torch.nn.Module, options: dict[str, Any]) -> JitModule:
    return jit(mod, **options)


def _handle(jf: JitFunction | JitModule) -> JitFunction:
    return jf._dealias if isinstance(jf, JitModule) else jf


def graph_breaks(jf: JitFunction | JitModule) -> list[str]:
    """Where and why the function's graphs break (the parts dynamo runs eagerly), its own and those torch's code
    asks for (marked; not warned about), once each."""
    return list(_handle(jf).graph_breaks)


class Explanation(list[WriteBackReport]):
    """`explain`'s list of WriteBackReport, and where the program runs: `tier` ("torch", "graph", "fused"; "graph"
    runs dynamo's graph, whose in-place ops write the caller's tensors themselves), `tier_reason` (why, with the
    measured times) and `timings` (the fastest timed call per tier)."""

    tier: str = ""
    tier_reason: str = ""
    timings: dict[str, float] = {}  # noqa: RUF012 - replaced per instance


def explain(jf: JitFunction | JitModule) -> Explanation:
    """Per caller tensor, what the program `jf` ran last writes back, how, and how many bytes; and on which tier it
    runs, why (`.tier`, `.tier_reason`, `.timings`)."""
    handle = _handle(jf)
    last = handle.last
    out = Explanation(last.reports if last is not None else [])
    if last is not None:
        out.tier = str(last.tier)
        out.tier_reason = getattr(last, "tier_reason", "") or _fixed_tier(handle.options.executor, last)
        out.timings = dict(getattr(last, "timings", {}))
    return out


def last_traces(jf: JitFunction | JitModule) -> list[Trace]:
    """The traces of the program `jf` ran last: dynamo's graph, captured (aten), functional, execution."""
    last = _handle(jf).last
    return list(last.traces) if last is not None else []


def cache_info(jf: JitFunction | JitModule) -> CacheInfo:
    return _handle(jf).cache_info()


def wait_compiles(jf: JitFunction | JitModule, timeout: float | None = None) -> bool:
    """Wait until no fused program of `jf` is being compiled in the background (executor "tiered"), e.g. before
    timing it; True when none is left (False: `timeout` seconds passed). Each waits for the next call to adopt it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for program in _handle(jf).programs():
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if hasattr(program, "wait") and not program.wait(left):
            return False
    return True
