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
ShapeEnv), a graph reading tensor constants or calling a module, a function outside torch, an op outside aten and
prims, a leaf that is a tensor subclass or no plain value, a fake tensor off the CPU or with conj/neg bits, a meta
value or target that does not pickle. An entry is verified when written (it is read back, and its graphs must
generate the same code) and when read (its key, its fakes against the call's leaves, its graphs linted); a file that
cannot be read, is damaged, stale or of another key is ignored and the program compiled again, never used. A
directory that cannot be written keeps nothing. The unpickler loads classes of torch, dealias and Python's own
modules only.

`DEALIAS_PROGRAM_CACHE=0` (read at import; the test suite's setting) turns it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from ..compat.fx_lazy import graph_module
from ..compat.graph_cache import source_hash
from ..compat.internals import fake_maker
from ..ir.plan import TENSOR_SLOT, Captured, FunctionalProgram
from ..runtime.keep_aten import _host_key, cache_dir, source_key
from .capture import restriction

ENABLED = os.environ.get("DEALIAS_PROGRAM_CACHE", "1") != "0"
VERSION = 1
MAGIC = b"dealias-program\n"
# Entries read and written in this process (tests: a second process loads the first's, tracing nothing).
counts = {"read": 0, "written": 0}
# Node meta torch keeps for its own provenance and logs, which dealias does not read: not kept (they hold classes
# and functions of the user's, and the nodes they came from).
_DROPPED_META = frozenset({"from_node", "nn_module_stack", "source_fn_stack", "fwd_nn_module_stack", "torch_fn"})
_PLAIN = (type(None), bool, int, float, str)
_CPU = torch.device("cpu")
_OP_NAMESPACES = frozenset({"aten", "prims", "dealias"})
_MODULES = ("torch", "dealias", "collections", "copyreg", "operator", "_operator", "math", "enum")
# (of Python's builtins, the containers and values an entry holds, and getattr for a class's member: no eval, exec,
# import or open)
_BUILTINS = frozenset({"getattr", "set", "frozenset", "slice", "tuple", "list", "dict", "bool", "int", "float", "str"})


class Uncacheable(Exception):
    """What a front holds cannot be kept whole: it is not kept."""


def key(gm: fx.GraphModule, leaves: list[Any], names: list[str]) -> str | None:
    """The entry's key for dynamo's graph `gm` called with `leaves` named `names`; None where the program is not
    kept (see the module's text)."""
    if not ENABLED:
        return None
    build = source_key((), source_hash(), _host_key())
    if build is None:
        return None
    for n in gm.graph.nodes:
        if n.op in ("get_attr", "call_module") or (n.op == "call_function" and not _torch_target(n.target)):
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
    """A target of dynamo's graph whose code is torch's (or Python's): one of the user's could change between
    processes under the same name in the graph's code."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return target.namespace in _OP_NAMESPACES
    bound = getattr(target, "__self__", None)
    if bound is not None and not isinstance(bound, types.ModuleType):
        # (a bound method, `MyFunction.apply`: its object's class's code, torch's module for the method or not)
        owner = bound if isinstance(bound, type) else type(bound)
        return (getattr(owner, "__module__", None) or "").split(".")[0] == "torch"
    module = getattr(target, "__module__", None) or ""
    if module.split(".")[0] in ("torch", "dealias", "_operator", "operator", "math", "builtins"):
        return True  # (dealias's own helpers in dynamo's graph: its source is in the key)
    # (a method descriptor of torch.Tensor, a builtin of torch._C: no module of their own)
    owner = getattr(target, "__objclass__", None) or getattr(target, "__self__", None)
    return owner is not None and (getattr(owner, "__module__", None) or getattr(owner, "__name__", "")).startswith(
        "torch"
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


# -- writing ------------------------------------------------------------------------------------------------------


class _Graph:
    """A graph module as plain data: its nodes in order, each (name, op, target, args, kwargs, type, meta), node
    arguments as `_Ref`s by name; its codegen (pytree specs)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        if dict(gm.named_buffers()) or dict(gm.named_parameters()) or dict(gm.named_children()):
            raise Uncacheable("a graph module with attributes")
        self.codegen = gm.graph._codegen
        # (what the graph module takes from its graph and keeps, which inductor's cache key pickles with its code)
        self.tracer = (gm.graph._tracer_cls, gm.graph._tracer_extras)
        self.meta = dict(gm.meta)
        self.nodes = []
        for n in gm.graph.nodes:
            if n.op in ("get_attr", "call_module"):
                raise Uncacheable(f"a {n.op} node")
            to_ref = lambda a: _Ref(a.name)  # noqa: E731
            args, kwargs = fx.node.map_arg(n.args, to_ref), fx.node.map_arg(n.kwargs, to_ref)
            meta = {k: v for k, v in n.meta.items() if k not in _DROPPED_META}
            self.nodes.append((n.name, n.op, n.target, args, kwargs, n.type, meta))

    def build(self) -> fx.GraphModule:
        graph = fx.Graph()
        graph._codegen = self.codegen
        graph._tracer_cls, graph._tracer_extras = self.tracer
        made: dict[str, fx.Node] = {}
        for name, op, target, args, kwargs, type_, meta in self.nodes:
            from_ref = lambda a: made[a.name] if isinstance(a, _Ref) else a  # noqa: E731
            args, kwargs = _map_refs(args, from_ref), _map_refs(kwargs, from_ref)
            node = graph.create_node(op, target, args, kwargs, name=name, type_expr=type_)
            if node.name != name:
                raise Uncacheable(f"node {name} named {node.name}")
            node.meta = meta
            made[name] = node
        graph.lint()
        gm = graph_module(torch.nn.Module(), graph)
        gm.meta.update(self.meta)
        return gm


class _Ref:
    """A node argument, by the node's name."""

    def __init__(self, name: str) -> None:
        self.name = name


def _map_refs(value: Any, f: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_map_refs(v, f) for v in value)
    if isinstance(value, list):
        return [_map_refs(v, f) for v in value]
    if isinstance(value, dict):
        return {k: _map_refs(v, f) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(_map_refs(value.start, f), _map_refs(value.stop, f), _map_refs(value.step, f))
    return f(value)


class _Pickler(pickle.Pickler):
    """Fake tensors as their metadata (each by its index: one object read back for one written), the fake mode as
    one mark, ops by name, graph modules as `_Graph`s."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.fakes: dict[int, tuple[int, Any]] = {}  # id -> (index, the fake: kept alive while pickling)
        self.storages: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, FakeTensor):
            if id(obj) not in self.fakes:
                self.fakes[id(obj)] = (len(self.fakes), obj)
                return ("fake", self.fakes[id(obj)][0], self._describe(obj))
            return ("fake", self.fakes[id(obj)][0], None)
        if isinstance(obj, torch.Tensor):
            raise Uncacheable("a real tensor")
        if isinstance(obj, FakeTensorMode):
            return ("mode",)
        if obj is TENSOR_SLOT:
            return ("slot",)
        if isinstance(obj, torch._ops.OpOverload):
            if obj.namespace not in _OP_NAMESPACES:
                raise Uncacheable(f"op {obj}")
            return ("op", obj.namespace, obj._schema.name.split("::")[1], obj._overloadname)
        if isinstance(obj, torch._ops.OpOverloadPacket):
            if obj.namespace not in _OP_NAMESPACES:
                raise Uncacheable(f"op {obj}")
            return ("packet", obj.namespace, obj._qualified_op_name.split("::")[1])
        if isinstance(obj, (torch._ops.HigherOrderOperator, torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise Uncacheable(f"{type(obj).__name__}")
        if isinstance(obj, fx.Node):
            raise Uncacheable("a node outside a graph's arguments")
        return None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, fx.GraphModule):
            return _Graph.build, (_Graph(obj),)
        return NotImplemented

    def _describe(self, t: FakeTensor) -> tuple[Any, ...]:
        if t.device.type != "cpu" or t.layout is not torch.strided or t.is_conj() or t.is_neg():
            raise Uncacheable("a fake tensor off the CPU, not strided, or with a conj/neg bit")
        if t.is_inference() or t._is_zerotensor() or type(t) is not FakeTensor:
            raise Uncacheable("an inference or zero fake tensor")
        storage = t.untyped_storage()
        index = self.storages.setdefault(storage._cdata, len(self.storages))
        meta = (t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())
        if not all(type(d) is int for d in (*meta[1], *meta[2], meta[3])):
            raise Uncacheable("a symbolic size")
        return (index, storage.nbytes(), *meta, t.requires_grad, t.is_leaf)


def save(k: str | None, captured: Captured, fp: FunctionalProgram, writes: bool) -> None:
    """Keep the front `captured`, `fp` (the functional plan before lowering) and `writes` under `k`, where it can be
    kept whole and reads back as the same graphs; else nothing."""
    if k is None or not ENABLED:
        return
    if captured.symbols or captured.fake_mode is None or captured.fake_mode.shape_env is not None or fp.constants:
        return
    if not all(o is TENSOR_SLOT or type(o) in _PLAIN for o in captured.out_template):
        return  # (a constant object the program returns would come back a copy of it)
    data = _dumps({"key": k, "captured": captured, "fp": fp, "writes": writes})
    loaded = _front(_loads(data, k)) if data is not None else None  # (read back: the same graphs and plan)
    if loaded is None or not _same(loaded, captured, fp):
        return
    if _write(_path("programs", k), data):
        counts["written"] += 1


def _same(loaded: tuple[Captured, FunctionalProgram, bool], captured: Captured, fp: FunctionalProgram) -> bool:
    got_captured, got_fp, _ = loaded
    return (
        got_captured.gm.code == captured.gm.code
        and got_fp.gm.code == fp.gm.code
        and got_fp.outputs == fp.outputs
        and got_fp.writebacks == fp.writebacks
        and got_captured.groups == captured.groups
    )


def _path(kind: str, k: str) -> Path:
    return cache_dir() / kind / f"{k}.pkl"


def _dumps(payload: dict[str, Any]) -> bytes | None:
    """`payload` pickled (fakes, ops and graphs as `_Pickler` keeps them); None where it cannot be kept whole."""
    buf = io.BytesIO()
    buf.write(MAGIC)
    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(max(limit, 20000))  # (a graph's nodes nest in its pickle)
        _Pickler(buf).dump(payload)
    except Exception:  # noqa: BLE001 - anything that does not pickle: not kept
        return None
    finally:
        sys.setrecursionlimit(limit)
    return buf.getvalue()


def _write(path: Path, data: bytes) -> bool:
    """`data` to `path` in one piece through a file of the writer's own; False where the directory cannot be
    written (nothing kept)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        return False
    return True


# -- reading ------------------------------------------------------------------------------------------------------


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.mode = FakeTensorMode(allow_non_fake_inputs=False)
        self.make = fake_maker(self.mode)
        self.fakes: dict[int, torch.Tensor] = {}
        self.storages: dict[int, torch.UntypedStorage] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] not in _MODULES and not (module == "builtins" and name in _BUILTINS):
            raise pickle.UnpicklingError(f"{module}.{name} is not a class an entry holds")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0]
        if kind == "fake":
            _, index, description = pid
            if description is None:
                return self.fakes[index]
            self.fakes[index] = self._fake(*description)
            return self.fakes[index]
        if kind == "mode":
            return self.mode
        if kind == "slot":
            return TENSOR_SLOT
        if kind == "op":
            _, namespace, name, overload = pid
            return getattr(getattr(getattr(torch.ops, namespace), name), overload)
        if kind == "packet":
            _, namespace, name = pid
            return getattr(getattr(torch.ops, namespace), name)
        raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")

    def _fake(
        self, index: int, nbytes: int, dtype: Any, shape: Any, stride: Any, offset: int, rg: bool, leaf: bool
    ) -> torch.Tensor:
        with torch.no_grad():
            if index not in self.storages:
                self.storages[index] = torch.empty(nbytes, dtype=torch.uint8, device="meta").untyped_storage()
            meta = torch.empty(0, dtype=dtype, device="meta").set_(self.storages[index], offset, shape, stride)
        if self.make is None:
            raise pickle.UnpicklingError("no fake tensor over a meta tensor in this torch")
        t = self.make(meta, _CPU)
        if rg:
            with self.mode, torch.enable_grad():
                t = t.requires_grad_() if leaf else t.requires_grad_().view_as(t)
        if (t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.requires_grad, t.is_leaf) != (
            dtype,
            tuple(shape),
            tuple(stride),
            offset,
            rg,
            leaf,
        ):
            raise pickle.UnpicklingError("a fake tensor made again differs")
        return t


def _loads(data: bytes, k: str) -> dict[str, Any] | None:
    """The payload pickled in `data` under key `k`; None where it is not one (damaged, another key's, a class from
    elsewhere)."""
    if not data.startswith(MAGIC):
        return None
    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(max(limit, 20000))
        payload = _Unpickler(io.BytesIO(data[len(MAGIC) :])).load()
    except Exception:  # noqa: BLE001 - damaged, or of another build: compiled again
        return None
    finally:
        sys.setrecursionlimit(limit)
    return payload if isinstance(payload, dict) and payload.get("key") == k else None


def _read(kind: str, k: str) -> dict[str, Any] | None:
    try:
        data = _path(kind, k).read_bytes()
    except OSError:
        return None
    return _loads(data, k)


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
    loaded = _front(_read("programs", k))
    if loaded is None or not _fits(loaded[0], leaves):
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
        for n in gm.graph.nodes:
            if n.op in ("get_attr", "call_module", "call_method") or not _named(n):
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
        data = _dumps({"key": k, "traced": traced, "floats": set(floats), "written": tuple(written)})
        loaded = _loads(data, k) if data is not None else None
        if loaded is None or loaded.get("traced") is None or loaded["traced"].code != traced.code:
            return
        if _write(_path("retraces", k), data):
            counts["written"] += 1


_ARGUMENT_TYPES = (
    fx.Node,
    type(None),
    bool,
    int,
    float,
    str,
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
    leaves = []
    fx.node.map_aggregate((n.args, n.kwargs), lambda a: leaves.append(a) or a)
    return all(isinstance(a, _ARGUMENT_TYPES) for a in leaves)
