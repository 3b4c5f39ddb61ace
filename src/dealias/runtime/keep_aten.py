"""Which ops the fused executor leaves to ATen's kernel inside its fused graphs, measured on this host.

Inductor generates its own code for transcendental ops (Sleef's vector math on CPU); ATen runs its own kernels,
MKL's vector math where torch was built with it. Which is faster depends on the host, by large factors both ways
(`python bench/keep_aten.py`): on one AVX-512 host ATen's tanh was 3.5x faster than inductor's and exp 1.5x; on
the next, inductor's tanh was 2x faster than ATen's and exp 3x, and only gelu and digamma were faster in ATen. A
table written on one machine is wrong on the next, so each candidate op is timed here, on the first graph that
uses it: ATen's kernel against inductor's code for it alone, on a 1M-element tensor of the node's dtype, with the
node's own other arguments, at the current thread count. An op inductor runs at least THRESHOLD times slower is
handed to inductor as an opaque twin that calls ATen's op (bit-equal to eager), and inductor fuses the ops
around it. Verdicts are kept on disk per host (CPU, torch build) so that only the first process measures (each
measurement compiles one small inductor kernel: about a second).

`DEALIAS_KEEP_ATEN` overrides the measurement: `none`, or op names (`tanh,gelu`) kept wherever they occur, for
reproducible graphs (the test suite pins it). `DEALIAS_CACHE_DIR` moves the verdicts (default
`~/.cache/dealias`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils import _pytree as pytree

from ..ir.opfacts import op_name
from ..ir.viewops import surely

aten = torch.ops.aten

# The ops worth asking about: those whose code is vector math that differs between libraries (and the row
# reductions around exp). Cheap arithmetic is always inductor's, fused into its neighbours.
CANDIDATES = frozenset(
    getattr(aten, name).default
    for name in (
        "tanh exp exp2 expm1 log log1p log2 log10 sigmoid erf erfc sin cos tan asin acos atan sinh cosh asinh "
        "acosh atanh gelu silu mish lgamma digamma _softmax _log_softmax"
    ).split()
)
THRESHOLD = 1.15  # inductor/ATen time from which ATen's kernel is kept: below it, fusing wins on memory traffic
MIN_NUMEL = 1 << 16
# ...only on tensors this large or larger: on small ones a kernel of its own costs more than it saves (the
# decoder_step workload, MLP width 1024: 0.99x eager with ATen's gelu, 0.71x with inductor's).
_NUMEL = 1 << 20  # the measured tensor's size

_LIB = torch.library.Library("dealias", "FRAGMENT")
_lock = threading.Lock()


def twin_for(node: fx.Node) -> torch._ops.OpOverload | None:
    """`dealias::aten_<name>` if `node` runs faster as ATen's kernel than as inductor's code here, else None."""
    op = node.target
    if node.op != "call_function" or op not in CANDIDATES:
        return None
    val, x = node.meta.get("val"), node.args[0] if node.args else None
    if (
        not isinstance(val, torch.Tensor)
        or not isinstance(x, fx.Node)
        or not isinstance(x.meta.get("val"), torch.Tensor)
    ):
        return None
    if val.device.type != "cpu" or not surely(val.numel() >= MIN_NUMEL):
        return None
    rest = (node.args[1:], dict(node.kwargs))
    if any(isinstance(a, (fx.Node, torch.SymInt, torch.SymFloat, torch.SymBool)) for a in pytree.tree_leaves(rest)):
        return None  # (measured with the node's own other arguments: they must be constants)
    pinned = _pinned()
    if pinned is not None:
        keep = op_name(op) in pinned
    else:
        # An op over a `dim` (softmax) is measured at the node's rank, so that its dimension means the same; a
        # pointwise one at rank 1.
        rank = x.meta["val"].dim() if any(a.name == "dim" for a in op._schema.arguments) else 1
        keep = _verdict(op, x.meta["val"].dtype, rank, rest)
    return _twin(op) if keep else None


def _pinned() -> frozenset[str] | None:
    setting = os.environ.get("DEALIAS_KEEP_ATEN", "measure").strip()
    if setting == "measure":
        return None
    return frozenset() if setting == "none" else frozenset(s.strip() for s in setting.split(",") if s.strip())


def _twin(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    """`dealias::aten_<name>`, with `op`'s schema and `op` as its kernel (for fake tensors too): opaque to
    inductor, which calls it as an extern kernel. Defined once per process (compiles may run in threads)."""
    with _lock:
        if op not in _twins:
            name = f"aten_{op_name(op)}"
            _LIB.define(f"{name}{str(op._schema)[len(op._schema.name) :]}")
            _LIB.impl(name, op, "CompositeExplicitAutograd")
            _twins[op] = getattr(torch.ops.dealias, name).default
        return _twins[op]


_twins: dict[torch._ops.OpOverload, torch._ops.OpOverload] = {}


def _verdict(op: torch._ops.OpOverload, dtype: torch.dtype, rank: int, rest: tuple[Any, ...]) -> bool:
    key = f"{op}|{dtype}|rank={rank}|{rest!r}|threads={torch.get_num_threads()}"
    aten_s, inductor_s = measured(key, lambda: measure(op, dtype, rank, rest))
    return inductor_s >= THRESHOLD * aten_s


def measured(key: str, measure: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    """(ATen's seconds, inductor's seconds) for the comparison `key` on this host: from disk, or `measure()`d
    once and saved. One that cannot be measured counts as a tie."""
    with _lock:
        verdicts = _load()
        if key not in verdicts:
            try:
                aten_s, inductor_s = measure()
            except Exception:  # noqa: BLE001 - a tie: each caller's default choice stands
                aten_s, inductor_s = 1.0, 1.0
            verdicts[key] = [aten_s, inductor_s]
            _save(verdicts)
        aten_s, inductor_s = verdicts[key]
    return aten_s, inductor_s


def measure(
    op: torch._ops.OpOverload, dtype: torch.dtype, rank: int = 1, rest: tuple[Any, ...] = ((), {})
) -> tuple[float, float]:
    """Seconds per call of `op(x, *args, **kwargs)` (`rest`) on a 1M-element `x` (rows of 1,024 for rank >= 2):
    ATen's kernel, and inductor's code for it alone. Best of interleaved rounds."""
    args, kwargs = rest
    shape = (_NUMEL,) if rank < 2 else (1,) * (rank - 2) + (1024, _NUMEL // 1024)

    def inputs() -> tuple[torch.Tensor, ...]:
        return ((torch.rand(shape, device="cpu") * 0.9 + 0.05).to(dtype),)  # inside every candidate's domain

    def call(t: torch.Tensor) -> Any:
        return op(t, *args, **kwargs)

    return aten_against_inductor(inputs, call, call)


def aten_against_inductor(
    inputs: Callable[[], tuple[torch.Tensor, ...]], aten_fn: Callable[..., Any], traced_fn: Callable[..., Any]
) -> tuple[float, float]:
    """Seconds per call of `aten_fn` (ATen's kernels) and of inductor's code for `traced_fn` (a tensor or a list of
    them), on the tensors `inputs()` draws. Best of interleaved rounds."""
    with measuring():
        xs = inputs()
        compiled = inductor_code(traced_fn, xs)
        return best_of(lambda: aten_fn(*xs), lambda: compiled(list(xs)))


@contextlib.contextmanager
def measuring() -> Iterator[None]:
    """Real tensors in a clean context: a measurement may run inside dynamo's backend call, whose fake mode and
    tracing context would claim them. (Inputs are drawn on a generator of their own: measuring must not move the
    caller's random numbers.)"""
    with unset_fake_temporarily(), torch._guards.tracing(None), torch.no_grad(), torch.random.fork_rng(devices=[]):
        yield


def inductor_code(fn: Callable[..., Any], xs: tuple[torch.Tensor, ...]) -> Callable[[list[torch.Tensor]], Any]:
    """Inductor's compiled code for `fn` (a tensor or a list of them) over tensors like `xs`, as a fused graph of
    dealias's is compiled (its decompositions, corrections and lowerings); called with a list of the tensors."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..compat.inductor import dealias_compile
    from ..compat.vec_isa import vec_isa_config

    gm = make_fx(lambda *a: tuple(pytree.tree_leaves(fn(*a))), decomposition_table=select_decomp_table())(*xs)
    # (inductor's vector-ISA probes, run by the process's first C++ compile, under dealias's record of them
    # (compat/vec_isa.py): a measurement is often that first compile, and probes it ran unrecorded were run
    # again by every later process's fused compile, ~0.3 s of a warm first call)
    with inductor_config.patch(vec_isa_config()), dealias_compile():
        return compile_fx_inner(gm, list(xs))


def best_of(
    *fns: Callable[[], Any],
    rounds: int = 7,
    seconds: float = 0.01,
    warm_timed: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, ...]:
    """Seconds per call of each of `fns` on `clock`: the best of `rounds` interleaved rounds of about `seconds`
    each. The calls per round are set from the fastest of `warm_timed` warm calls: on a shared machine one call may
    stall for a scheduler's time slice (8-16 ms here), which would leave a round of two calls."""
    iters = []
    for fn in fns:
        fn()  # (warm)
        fastest = float("inf")
        for _ in range(warm_timed):
            start = clock()
            fn()
            fastest = min(fastest, clock() - start)
        iters.append(max(2, int(seconds / max(fastest, 1e-7))))
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, (fn, n) in enumerate(zip(fns, iters)):
            start = clock()
            for _ in range(n):
                fn()
            best[i] = min(best[i], (clock() - start) / n)
    return tuple(best)


def cache_dir() -> Path:
    """Where dealias keeps what it measured or probed on this host (also compat/vec_isa.py's verdict)."""
    return Path(os.environ.get("DEALIAS_CACHE_DIR") or Path.home() / ".cache" / "dealias")


def write_whole(path: Path, text: str | bytes) -> bool:
    """Write `text` (or bytes) to `path` in one piece (another process may write the same file); a read-only
    directory is left as it is (the next process measures again): False, nothing kept."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # (a file of its own per writer: threads of one process share its pid, and one thread's replace must not
        # move another's half-written file into place)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        return False
    return True


def read_json(path: Path | None) -> Any:
    """The JSON value in `path`; None where there is no file, it cannot be read or is damaged (a file of nested
    brackets: json recurses)."""
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None


class DiskDict:
    """A dict of JSON values kept in one file for the next process (bindings.py's probes, dependence_record.py's
    traces): read at its first use in a process, written back by `flush` merged with what another process wrote
    meanwhile, at most `limit` entries. `path()` None: kept in the process only."""

    def __init__(self, path: Callable[[], Path | None], limit: int) -> None:
        self.path, self.limit = path, limit
        self._lock = threading.Lock()
        self._entries: dict[str, Any] | None = None
        self._unsaved = False

    def get(self, key: str, default: Any = None) -> Any:
        return self._read().get(key, default)

    def put(self, key: str, value: Any) -> None:
        entries = self._read()
        if key in entries and entries[key] == value or key not in entries and len(entries) >= self.limit:
            return
        entries[key] = value
        self._unsaved = True

    def flush(self) -> bool:
        """Write what this process added; whether a file was written."""
        if not self._unsaved:
            return False
        with self._lock:
            self._unsaved = False
            path = self.path()
            if path is None:
                return False
            merged = {**self._load(), **self._read()}
            return write_whole(path, json.dumps(dict(list(merged.items())[: self.limit]), sort_keys=True))

    def clear(self) -> None:
        """Forget what was read or added in this process (tests: the next `get` reads the file again)."""
        self._entries, self._unsaved = None, False

    def _read(self) -> dict[str, Any]:
        if self._entries is None:
            self._entries = self._load()
        return self._entries

    def _load(self) -> dict[str, Any]:
        data = read_json(self.path())
        return data if isinstance(data, dict) else {}


def source_key(files: tuple[Path, ...], *build: str) -> str | None:
    """A key of the torch build (its version and git revision, a dev build's version staying while its revision
    moves; and `build`) and of the sources `files` of what a disk cache remembers; None where a source cannot be
    read (an install of compiled files only, a zip): its answers are then kept in the process only, as another
    version's file must not answer for this one."""
    parts = [torch.__version__, str(getattr(torch.version, "git_version", "")), *build]
    try:
        parts += [f.read_text() for f in files]
    except (OSError, UnicodeDecodeError):
        return None
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _path() -> Path:
    return cache_dir() / f"keep_aten-{_host_key()}.json"


@functools.cache
def _host_key() -> str:
    """The host's CPU and torch build: what the verdicts depend on besides the op."""
    try:
        cpu = next(
            (line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), ""
        )
    except OSError:
        cpu = ""
    parts = [torch.__version__, platform.machine(), platform.processor(), cpu, torch.backends.cpu.get_cpu_capability()]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


_memory: dict[str, dict[str, list[float]]] = {}  # path -> verdicts, read once per process


def _load() -> dict[str, list[float]]:
    path = str(_path())
    if path not in _memory:
        try:
            _memory[path] = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            _memory[path] = {}
    return _memory[path]


def _save(verdicts: dict[str, list[float]]) -> None:
    # (another process may have saved verdicts since this one read the file: kept, not overwritten by a stale copy)
    on_disk = read_json(_path())
    if isinstance(on_disk, dict):
        for key, value in on_disk.items():
            verdicts.setdefault(key, value)
    write_whole(_path(), json.dumps(verdicts, indent=1, sort_keys=True))
