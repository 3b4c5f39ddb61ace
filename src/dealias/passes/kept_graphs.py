"""How the program cache (program_cache.py) keeps graphs and plans on disk: pickles in which a graph module is its
nodes (name, op, target, arguments by node name, meta; torch's provenance meta dropped), an op its name, a fake tensor
its metadata (dtype, sizes, strides, offset, requires_grad, leaf or not, which storage and its size), made again over
meta storages in one fresh fake mode by its converter (tensors of one storage on one storage again; one object read
back for one written), a graph's tensor constants (what make_fx lifts of a tensor the traced code makes from Python
values: determined by the code, which the keys hold) by value, and TENSOR_SLOT itself. What cannot be kept so (any
other real tensor, a symbolic size, a fake off the CPU, a higher-order op, an op outside aten/prims/dealias, a
closure) raises `Uncacheable`. Reading loads classes
of torch, dealias and a few of Python's own modules only, never eval, exec, import or open; a file that does not
read back as written is None to the caller."""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from ..compat import warns
from ..compat.fx_lazy import graph_module
from ..compat.internals import fake_maker
from ..ir.plan import TENSOR_SLOT

MAGIC = b"dealias-program\n"
# Node meta torch keeps for its own provenance and logs, which dealias does not read: not kept (they hold classes
# and functions of the user's, and the nodes they came from).
_DROPPED_META = frozenset({"from_node", "nn_module_stack", "source_fn_stack", "fwd_nn_module_stack", "torch_fn"})
_CPU = torch.device("cpu")
_CONSTANT_BYTES = 1 << 16  # tensor constants kept by value up to this size (each storage)
OP_NAMESPACES = frozenset({"aten", "prims", "dealias"})
_MODULES = ("torch", "dealias", "collections", "copyreg", "operator", "_operator", "math", "enum")
# (of Python's builtins, the containers and values an entry holds, and getattr for a class's member: no eval, exec,
# import or open)
_BUILTINS = frozenset({"getattr", "set", "frozenset", "slice", "tuple", "list", "dict", "bool", "int", "float", "str"})


class Uncacheable(Exception):
    """What a front holds cannot be kept whole: it is not kept."""


def namespace(op: Any) -> str:
    """An op's or an op packet's namespace (a packet's attributes are its overloads: `packet.namespace` raises)."""
    return (
        op._schema.name.split("::")[0]
        if isinstance(op, torch._ops.OpOverload)
        else op._qualified_op_name.split("::")[0]
    )


class _Graph:
    """A graph module as plain data: its nodes in order, each (name, op, target, args, kwargs, type, meta), node
    arguments as `_Ref`s by name; its codegen (pytree specs)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        if dict(gm.named_parameters()) or dict(gm.named_children()):
            raise Uncacheable("a graph module with parameters or submodules")
        # Its tensor constants (make_fx lifts a tensor the traced code makes from Python values, `torch.tensor([])`,
        # as an attribute): kept by value, which dynamo's graph's code, in the entry's key, determines.
        buffers = dict(gm.named_buffers())
        self.attributes: dict[str, tuple[torch.Tensor, bool]] = {}
        for n in gm.graph.find_nodes(op="get_attr"):
            value = getattr(gm, n.target, None)
            if "." in n.target or type(value) is not torch.Tensor:
                raise Uncacheable(f"attribute {n.target}: not a plain tensor constant")
            self.attributes[n.target] = (value, n.target in buffers)
        if not set(buffers) <= set(self.attributes):
            raise Uncacheable("a buffer the graph does not read")
        self.codegen = gm.graph._codegen
        # (what the graph module takes from its graph and keeps, which inductor's cache key pickles with its code)
        self.tracer = (gm.graph._tracer_cls, gm.graph._tracer_extras)
        self.meta = dict(gm.meta)
        self.nodes = []
        for n in gm.graph.nodes:
            if n.op == "call_module":
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
        root = torch.nn.Module()
        for name, (value, buffer) in self.attributes.items():
            if buffer:
                root.register_buffer(name, value)
            else:
                setattr(root, name, value)
        gm = graph_module(root, graph)
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

    def __init__(self, file: io.BytesIO, constants: tuple[torch.Tensor, ...] = ()) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.fakes: dict[int, tuple[int, Any]] = {}  # id -> (index, the fake: kept alive while pickling)
        self.storages: dict[int, int] = {}
        # Real tensors kept by value: the graphs' tensor constants and `constants`, no other (a caller's tensor
        # must never come back a copy); id -> (index, the tensor: kept alive while pickling)
        self.allowed = {id(t): t for t in constants}
        self.reals: dict[int, tuple[int, torch.Tensor]] = {}
        self.real_storages: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, FakeTensor):
            if id(obj) not in self.fakes:
                self.fakes[id(obj)] = (len(self.fakes), obj)
                return ("fake", self.fakes[id(obj)][0], self._describe(obj))
            return ("fake", self.fakes[id(obj)][0], None)
        if isinstance(obj, torch.Tensor):
            if id(obj) not in self.allowed:
                raise Uncacheable("a real tensor")
            if id(obj) not in self.reals:
                self.reals[id(obj)] = (len(self.reals), obj)
                return ("real", self.reals[id(obj)][0], self._constant(obj))
            return ("real", self.reals[id(obj)][0], None)
        if isinstance(obj, FakeTensorMode):
            return ("mode",)
        if obj is TENSOR_SLOT:
            return ("slot",)
        if isinstance(obj, torch._ops.OpOverload):
            if obj.namespace not in OP_NAMESPACES:
                raise Uncacheable(f"op {obj}")
            return ("op", obj.namespace, obj._schema.name.split("::")[1], obj._overloadname)
        if isinstance(obj, torch._ops.OpOverloadPacket):
            if namespace(obj) not in OP_NAMESPACES:
                raise Uncacheable(f"op {obj}")
            return ("packet", namespace(obj), obj._qualified_op_name.split("::")[1])
        if isinstance(obj, (torch._ops.HigherOrderOperator, torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise Uncacheable(f"{type(obj).__name__}")
        if isinstance(obj, fx.Node):
            raise Uncacheable("a node outside a graph's arguments")
        return None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, fx.GraphModule):
            graph = _Graph(obj)
            self.allowed.update((id(t), t) for t, _ in graph.attributes.values())
            return _Graph.build, (graph,)
        return NotImplemented

    def _constant(self, t: torch.Tensor) -> tuple[Any, ...]:
        """A tensor constant's metadata, and its storage's bytes where that storage comes first."""
        if type(t) is not torch.Tensor or t.device.type != "cpu" or t.layout is not torch.strided:
            raise Uncacheable("a constant that is no plain CPU tensor")
        if t.requires_grad or t.is_conj() or t.is_neg() or t.is_inference():
            raise Uncacheable("a constant that requires grad, is inference, or has a conj/neg bit")
        storage = t.untyped_storage()
        if storage.nbytes() > _CONSTANT_BYTES:
            raise Uncacheable("a large tensor constant")
        first = storage._cdata not in self.real_storages
        index = self.real_storages.setdefault(storage._cdata, len(self.real_storages))
        data = bytes(storage.tolist()) if first else None
        return (index, data, t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())

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


def dumps(payload: dict[str, Any], constants: tuple[torch.Tensor, ...] = ()) -> bytes | None:
    """`payload` pickled (fakes, ops and graphs as `_Pickler` keeps them, the graphs' tensor constants and
    `constants` by value); None where it cannot be kept whole."""
    buf = io.BytesIO()
    buf.write(MAGIC)
    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(max(limit, 20000))  # (a graph's nodes nest in its pickle)
        _Pickler(buf, constants).dump(payload)
    except Exception:  # noqa: BLE001 - anything that does not pickle: not kept
        return None
    finally:
        sys.setrecursionlimit(limit)
    return buf.getvalue()


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.mode = FakeTensorMode(allow_non_fake_inputs=False)
        self.make = fake_maker(self.mode)
        self.fakes: dict[int, torch.Tensor] = {}
        self.storages: dict[int, torch.UntypedStorage] = {}
        self.reals: dict[int, torch.Tensor] = {}
        self.real_storages: dict[int, torch.UntypedStorage] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] not in _MODULES and not (module == "builtins" and name in _BUILTINS):
            raise pickle.UnpicklingError(f"{module}.{name} is not a class an entry holds")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0]
        if kind in ("fake", "real"):  # (made at its first appearance, the same object after)
            _, index, description = pid
            table = self.fakes if kind == "fake" else self.reals
            if description is None:
                return table[index]
            table[index] = (self._fake if kind == "fake" else self._real)(*description)
            return table[index]
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

    def _real(self, index: int, data: bytes | None, dtype: Any, shape: Any, stride: Any, offset: int) -> torch.Tensor:
        if data is not None:
            if index in self.real_storages or not isinstance(data, bytes) or len(data) > _CONSTANT_BYTES:
                raise pickle.UnpicklingError("a tensor constant's storage read twice, or too large")
            self.real_storages[index] = torch.tensor(list(data), dtype=torch.uint8).untyped_storage()
        storage = self.real_storages[index]
        if any(n < 0 for n in shape) or any(d < 0 for d in stride) or offset < 0:
            raise pickle.UnpicklingError("a tensor constant of negative sizes, strides or offset")
        extent = offset + sum((n - 1) * d for n, d in zip(shape, stride)) + 1 if all(shape) else 0
        if extent * dtype.itemsize > storage.nbytes():  # (`set_` would grow the storage: memory never written)
            raise pickle.UnpicklingError("a tensor constant beyond its storage's bytes")
        with torch.no_grad():
            t = torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
        if (t.dtype, tuple(t.shape), t.stride(), t.storage_offset()) != (dtype, tuple(shape), tuple(stride), offset):
            raise pickle.UnpicklingError("a tensor constant made again differs")
        return t

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


def loads(data: bytes, k: str) -> dict[str, Any] | None:
    """The payload pickled in `data` under key `k`; None where it is not one (damaged, another key's, a class from
    elsewhere)."""
    if not data.startswith(MAGIC):
        return None
    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(max(limit, 20000))
        # (warnings ignored: torch 2.13 deprecates constructing pytree's LeafSpec, which the graphs' codegen holds,
        # and unpickling it gave the user a FutureWarning from here, or under `-W error` no program loaded)
        with warns.ignored():
            payload = _Unpickler(io.BytesIO(data[len(MAGIC) :])).load()
    except Exception:  # noqa: BLE001 - damaged, or of another build: compiled again
        return None
    finally:
        sys.setrecursionlimit(limit)
    return payload if isinstance(payload, dict) and payload.get("key") == k else None
