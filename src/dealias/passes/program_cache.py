"""A compile's front (capture, alias analysis, functionalize, optimize: the `Captured` program and its functional
plan before write-back lowering) kept on disk, so that a later process's first call of the same graph with the same
inputs' metadata loads it instead of tracing again (issue 38: the warm first call; torch.compile loads its whole
compile from AOTAutograd's cache there).

What is kept is what pipeline.Front holds: the captured aten graph and the functional graph (each node's name, op,
target, arguments and meta, fake values included), the plan (write-backs, output slots, counters) and the captured
program's other fields. Fake tensors are kept as their metadata (dtype, sizes, strides, offset, requires_grad, leaf
or not, which storage and its size) and made again in one fresh fake mode, tensors of one storage on one storage
again; ops as their names. The front depends only on dynamo's graph and the call's leaves (it is the same for every
executor), so it is keyed on dealias's source, the torch build, the host, dynamo's graph code, every leaf's metadata
(type, dtype, sizes, strides, offset, requires_grad, leaf or not, view or not and of which leaf, eager's
restriction, storage sharing, plain values), the inputs' names and the global state the trace reads (grad and
inference mode, default dtype, deterministic mode, autocast, torch function modes, dealias's settings).

Only what can be kept whole is kept; anything else is compiled as before, each process: a program over symbols (its
ShapeEnv), a graph reading an attribute of dynamo's graph (a tensor constant the trace makes from the code's Python
values is kept, by value: kept_graphs.py) or calling a module, a function outside torch, an op outside aten and
prims, a leaf that is a tensor subclass or no plain value, a fake tensor off the CPU or with conj/neg bits, a meta
value or target that does not pickle. An entry is verified when written (it is read back, and its graphs must
generate the same code) and when read (its key, its fakes against the call's leaves, its graphs linted); a file that
cannot be read, is damaged, stale or of another key is ignored and the program compiled again, never used. A
directory that cannot be written keeps nothing. The unpickler loads classes of torch, dealias and Python's own
modules only.

`DEALIAS_PROGRAM_CACHE=0` (read at import; the test suite's setting) turns it off.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from ..compat.graph_cache import source_hash
from ..ir.plan import TENSOR_SLOT, Captured, FunctionalProgram
from ..runtime.keep_aten import _host_key, cache_dir, source_key, write_whole
from .capture import restriction
from .kept_graphs import OP_NAMESPACES, dumps, loads, namespace

ENABLED = os.environ.get("DEALIAS_PROGRAM_CACHE", "1") != "0"
VERSION = 1
# Entries read and written in this process (tests: a second process loads the first's, tracing nothing).
counts = {"read": 0, "written": 0}
_PLAIN = (type(None), bool, int, float, str)


def key(gm: fx.GraphModule, leaves: list[Any], names: list[str]) -> str | None:
    """The entry's key for dynamo's graph `gm` called with `leaves` named `names`; None where the program is not
    kept (see the module's text), or anything in naming it fails (the compile goes on as without the cache)."""
    if not ENABLED:
        return None
    try:
        return _key(gm, leaves, names)
    except Exception:  # noqa: BLE001 - a graph or leaf the key cannot read: not kept
        return None


def _key(gm: fx.GraphModule, leaves: list[Any], names: list[str]) -> str | None:
    build = source_key((), source_hash(), _host_key())
    if build is None:
        return None
    for n in gm.graph.nodes:
        if n.op in ("get_attr", "call_module") or (n.op == "call_function" and not _torch_target(n.target)):
            return None
        if n.op == "call_method" and not _torch_target(getattr(torch.Tensor, n.target, None)):
            return None
        if not _plain_arguments(n):  # (an object in the graph's code by a name, not its value)
            return None
    try:
        code = gm.code
    except Exception:  # noqa: BLE001 - no code: not kept
        return None
    metas = _leaf_metas(leaves)
    if metas is None:
        return None
    state = [
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        str(torch.get_default_dtype()),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.is_autocast_enabled("cpu"),
        str(torch.get_autocast_dtype("cpu")),
        torch._C._len_torch_function_stack(),
        sorted((k, v) for k, v in os.environ.items() if k.startswith("DEALIAS_") and k != "DEALIAS_CACHE_DIR"),
    ]
    parts = [f"v{VERSION}", build, repr(state), repr(list(names)), code, repr(metas)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _torch_target(target: Any) -> bool:
    """Whether `target` (a call_function's, or the torch.Tensor method a call_method's name finds) is torch's own
    code (or Python's, or dealias's: its source is in the key). The graph's code names it only: the user's function,
    or a library's wrapper put in torch's place (`torch.Tensor.clamp = wrapper`, which dynamo's graph still calls as
    `x.clamp(..)`), could differ between processes under the same name."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return namespace(target) in OP_NAMESPACES
    bound = getattr(target, "__self__", None)
    if bound is not None and not isinstance(bound, types.ModuleType):
        # (a bound method, `MyFunction.apply`: its object's class's code, torch's module for the method or not)
        owner = bound if isinstance(bound, type) else type(bound)
        if (getattr(owner, "__module__", None) or "").split(".")[0] != "torch":
            return False
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    if code is not None:  # (Python: the file it is written in, whatever module it claims)
        return code.co_filename.startswith(_OWN_FILES)
    module = getattr(target, "__module__", None) or ""
    if module.split(".")[0] in ("torch", "_operator", "operator", "math", "builtins"):
        return True
    # (a method descriptor of torch.Tensor, a builtin of torch._C: no module of their own)
    owner = getattr(target, "__objclass__", None) or getattr(target, "__self__", None)
    name = getattr(owner, "__module__", None) or getattr(owner, "__name__", "")
    return owner is not None and name.split(".")[0] == "torch"


_OWN_FILES = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)


def _leaf_metas(leaves: list[Any]) -> list[Any] | None:
    """Every leaf's metadata the capture and the passes read (None where a leaf is not kept: a tensor subclass, an
    object other than a plain value)."""
    storages: dict[int, int] = {}  # (which leaves share a storage, by first appearance: not the addresses)
    ids = {id(x): i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)}
    metas: list[Any] = []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            if type(x) not in (torch.Tensor, torch.nn.Parameter) or x.layout is not torch.strided:
                return None
            try:
                storage = storages.setdefault(x.untyped_storage()._cdata, len(storages))
                nbytes = x.untyped_storage().nbytes()
            except Exception:  # noqa: BLE001 - a tensor without storage: not kept
                return None
            base = x._base
            metas.append(
                (
                    type(x).__qualname__,
                    str(x.dtype),
                    tuple(x.shape),
                    tuple(x.stride()),
                    x.storage_offset(),
                    str(x.device),
                    x.requires_grad,
                    x.is_leaf,
                    storage,
                    nbytes,
                    x.is_inference(),
                    x.is_conj(),
                    x.is_neg(),
                    None if base is None else ids.get(id(base), -1),
                    restriction(x) if x.requires_grad and base is not None else None,
                )
            )
        elif type(x) in _PLAIN:
            metas.append((type(x).__qualname__, repr(x)))
        else:
            return None
    return metas


def save(k: str | None, captured: Captured, fp: FunctionalProgram, writes: bool) -> None:
    """Keep the front `captured`, `fp` (the functional plan before lowering) and `writes` under `k`, where it can be
    kept whole and reads back as the same graphs; else nothing (whatever fails here: the compile goes on)."""
    if k is None or not ENABLED:
        return
    try:
        _save(k, captured, fp, writes)
    except Exception:  # noqa: BLE001 - not kept
        return


def _save(k: str, captured: Captured, fp: FunctionalProgram, writes: bool) -> None:
    if captured.symbols or captured.fake_mode is None or captured.fake_mode.shape_env is not None:
        return
    if not all(o is TENSOR_SLOT or type(o) in _PLAIN for o in captured.out_template):
        return  # (a constant object the program returns would come back a copy of it)
    # (the graph's tensor constants, made by its code from Python values: kept by value; a generator is not kept)
    constants = tuple(fp.constants.values())
    if not all(type(t) is torch.Tensor for t in constants):
        return
    data = dumps({"key": k, "captured": captured, "fp": fp, "writes": writes}, constants)
    loaded = _front(loads(data, k)) if data is not None else None  # (read back: the same graphs and plan)
    if loaded is None or not _same(loaded, captured, fp):
        return
    if write_whole(_path("programs", k), data):
        counts["written"] += 1


def _same(loaded: tuple[Captured, FunctionalProgram, bool], captured: Captured, fp: FunctionalProgram) -> bool:
    got_captured, got_fp, _ = loaded
    return (
        got_captured.gm.code == captured.gm.code
        and got_fp.gm.code == fp.gm.code
        and got_fp.outputs == fp.outputs
        and got_fp.writebacks == fp.writebacks
        and got_captured.groups == captured.groups
        and _same_constants(got_fp.constants, fp.constants)
    )


def _same_constants(got: dict[str, Any], want: dict[str, Any]) -> bool:
    """Whether tensor constants read back are the ones kept: names, layouts and bits."""
    if list(got) != list(want):
        return False
    for name, t in want.items():
        g = got[name]
        meta = lambda x: (x.dtype, tuple(x.shape), x.stride(), x.storage_offset())  # noqa: E731
        if not isinstance(g, torch.Tensor) or meta(g) != meta(t):
            return False
        if t.numel() and not torch.equal(g.view(torch.uint8) if g.dim() else g, t.view(torch.uint8) if t.dim() else t):
            return False
    return True


def _path(kind: str, k: str) -> Path:
    return cache_dir() / kind / f"{k}.pkl"


def _read(kind: str, k: str) -> dict[str, Any] | None:
    try:
        data = _path(kind, k).read_bytes()
    except OSError:
        return None
    return loads(data, k)


def _front(payload: dict[str, Any] | None) -> tuple[Captured, FunctionalProgram, bool] | None:
    if payload is None:
        return None
    captured, fp, writes = payload.get("captured"), payload.get("fp"), payload.get("writes")
    if not isinstance(captured, Captured) or not isinstance(fp, FunctionalProgram) or not isinstance(writes, bool):
        return None
    return captured, fp, writes


def load(k: str | None, leaves: list[Any]) -> tuple[Captured, FunctionalProgram, bool, float] | None:
    """The front kept under `k` for a call with `leaves`: (captured, functional plan, writes, seconds taken to
    load); None where there is none usable."""
    if k is None or not ENABLED:
        return None
    start = time.perf_counter()
    try:
        loaded = _front(_read("programs", k))
        if loaded is None or not _fits(loaded[0], leaves):
            return None
    except Exception:  # noqa: BLE001 - an entry that does not read as a front of this call: compiled again
        return None
    counts["read"] += 1
    return (*loaded, time.perf_counter() - start)


def _fits(captured: Captured, leaves: list[Any]) -> bool:
    """Whether the kept capture is of a call like this one: its tensor positions, and its fakes' layouts the
    leaves' (the key says so already; a damaged entry with the key's name must not pass)."""
    positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    if captured.tensor_positions != positions or len(captured.fakes) != len(positions) or captured.symbols:
        return False
    for p, f in zip(positions, captured.fakes):
        t = leaves[p]
        if (f.dtype, tuple(f.shape), f.stride(), f.storage_offset()) != (
            t.dtype,
            tuple(t.shape),
            t.stride(),
            t.storage_offset(),
        ):
            return False
    return len(captured.requires_grad) == len(positions) and captured.requires_grad == [
        leaves[p].requires_grad for p in positions
    ]


# -- the fused executor's retrace ---------------------------------------------------------------------------------


class Retraces:
    """The fused executor's retrace of a lowered graph (runtime/fused.py: inductor's decompositions, float inputs as
    tensors, snapshots and merged writes) kept beside the front keyed `front`: keyed also on the lowered graph's code,
    which variance the decomposition table computes and inductor's configuration. Kept only where the graph's code
    names what it runs: every target an op or a function importable by its name, every argument a plain value."""

    def __init__(self, front: str | None) -> None:
        self.front = front if ENABLED else None

    def key(self, gm: fx.GraphModule, float64_passes: bool) -> str | None:
        if self.front is None:
            return None
        try:
            return self._key(gm, float64_passes)
        except Exception:  # noqa: BLE001 - not kept
            return None

    def _key(self, gm: fx.GraphModule, float64_passes: bool) -> str | None:
        for n in gm.graph.nodes:
            if n.op in ("call_module", "call_method") or not _named(n):
                return None
            # (a tensor constant of the front's, by value in the front's entry, whose key this one holds)
            if n.op == "get_attr" and type(getattr(gm, n.target, None)) is not torch.Tensor:
                return None
        try:
            code = gm.code
            config = torch._inductor.config.save_config_portable()
        except Exception:  # noqa: BLE001 - no code or configuration: not kept
            return None
        parts = [f"v{VERSION}", self.front, code, str(float64_passes), repr(sorted(config.items()))]
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]

    def load(self, k: str | None) -> tuple[fx.GraphModule, set[int], tuple[int, ...]] | None:
        """(the traced graph, its float inputs, the inputs it writes) kept under `k`, or None."""
        if k is None:
            return None
        try:
            return self._load(k)
        except Exception:  # noqa: BLE001 - traced again
            return None

    def _load(self, k: str) -> tuple[fx.GraphModule, set[int], tuple[int, ...]] | None:
        payload = _read("retraces", k)
        if payload is None:
            return None
        traced, floats, written = payload.get("traced"), payload.get("floats"), payload.get("written")
        if not isinstance(traced, fx.GraphModule) or not isinstance(floats, set) or not isinstance(written, tuple):
            return None
        counts["read"] += 1
        return traced, floats, written

    def save(self, k: str | None, traced: fx.GraphModule, floats: set[int], written: tuple[int, ...]) -> None:
        if k is None:
            return
        try:
            self._save(k, traced, floats, written)
        except Exception:  # noqa: BLE001 - not kept
            return

    def _save(self, k: str, traced: fx.GraphModule, floats: set[int], written: tuple[int, ...]) -> None:
        data = dumps({"key": k, "traced": traced, "floats": set(floats), "written": tuple(written)})
        loaded = loads(data, k) if data is not None else None
        got = loaded.get("traced") if loaded is not None else None
        if (
            not isinstance(got, fx.GraphModule)
            or got.code != traced.code
            or not _same_constants(_attributes(got), _attributes(traced))
        ):
            return
        if write_whole(_path("retraces", k), data):
            counts["written"] += 1


def _attributes(gm: fx.GraphModule) -> dict[str, Any]:
    return {n.target: getattr(gm, n.target, None) for n in gm.graph.find_nodes(op="get_attr")}


_ARGUMENT_TYPES = (
    fx.Node,
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    type(Ellipsis),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


def _named(n: fx.Node) -> bool:
    """Whether node `n`'s code names all it runs: its target an op or a function importable by its name (not a
    closure, whose code would read the same for another), its arguments plain values."""
    if n.op == "call_function":
        target = n.target
        if not isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            module = sys.modules.get(getattr(target, "__module__", None) or "")
            found = module
            for part in (getattr(target, "__qualname__", None) or "<>").split("."):
                found = getattr(found, part, None)
            if found is not target:
                return False
    return _plain_arguments(n)


def _plain_arguments(n: fx.Node) -> bool:
    """Whether every argument of node `n` is a node or a plain value, which the graph's code prints as it is."""
    leaves: list[Any] = []
    fx.node.map_aggregate((n.args, n.kwargs), lambda a: leaves.append(a) or a)
    return all(isinstance(a, _ARGUMENT_TYPES) for a in leaves)
