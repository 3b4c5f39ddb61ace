"""Executors: run the execution graph.

The torch executor runs the graph's generated Python code op by op, so autograd works through it. An aten
op called as `torch.ops.aten.add.Tensor(x, 1)` goes through a slower argument parser than the Tensor method
`x.add(1)`; where the method dispatches to exactly the same aten overload (checked on the fake inputs, so
no overload is ever guessed), the node is emitted as a method call.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, disable_fake_tensor_cache
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..compat.fx_lazy import generated_forward
from ..errors import quiet_fake_tensor_log
from ..ir.opfacts import OpKind, bind_args, facts, has_effect, is_view_node, op_name
from . import bindings

aten = torch.ops.aten


class _Calls(TorchDispatchMode):
    """Records the aten calls made below it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace != "prim":  # prim.device and friends: metadata queries of the fake machinery
            self.calls.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _binding_for(node: fx.Node) -> tuple[str, Any] | None:
    """A faster Python binding that dispatches to exactly `node.target` with exactly these arguments:
    ("method", name) for `x.name(...)`, ("function", f) for `torch.name(...)`; None to keep the aten call."""
    fargs, fkwargs = pytree.tree_map_only(fx.Node, lambda n: n.meta.get("val"), (node.args, node.kwargs))
    return binding_for_call(node.target, fargs, fkwargs)


def binding_for_call(op: Any, fargs: Any, fkwargs: dict[str, Any]) -> tuple[str, Any] | None:
    """`_binding_for` of a call of `op` on these fake arguments (the generated call's view replays ask it too).
    Probed once per op and argument kinds (`_probe_key`; bindings.py keeps the answers, also for the next process)."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return None
    key = _probe_key(op, fargs, fkwargs)
    if key is None:
        return probe_binding(op, fargs, fkwargs)
    found, binding = bindings.lookup(key)
    if not found:
        binding = probe_binding(op, fargs, fkwargs)
        bindings.remember(key, binding)
    return binding


def _probe_key(op: Any, fargs: Any, fkwargs: dict[str, Any]) -> Any:
    """What the probe's answer can depend on: the overload, the grad mode, and every argument as the Python
    binding sees it (a tensor's dtype, device, layout, sizes, strides, offset, requires_grad and type; any other
    value itself, with its type: `1`, `1.0` and `True` bind to other overloads). None (probe, do not cache) where
    a value is symbolic (a SymInt's meaning is its ShapeEnv's), a real tensor, or of another type. The key also
    names the bindings the probe calls (`_bound`): a library that replaces `torch.Tensor.clamp` or `torch.clamp`
    (in this process after a probe, or only in the next process) makes another answer. Inference mode is keyed
    apart from no_grad (composite ops such as `matmul` and `softmax` reach other aten calls in it); under autocast
    or a torch function mode the bindings reach what those make of them: probed each time."""
    if torch._C._is_any_autocast_enabled() or torch._C._is_torch_function_mode_enabled():
        return None
    try:
        grad = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        return (op, grad, _bound(op_name(op)), _kind(fargs), _kind(fkwargs))
    except _Uncached:
        return None


class _Uncached(Exception):
    pass


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


# values keyed as themselves: immutable, equal only where the Python binding cannot tell them apart
_PLAIN = (
    int,
    float,
    bool,
    complex,
    str,
    type(None),
    type(...),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


def _bound(name: str) -> tuple[Any, ...]:
    """What `torch.Tensor.<name>` and `torch.<name>` are, in terms the next process spells alike (a key on disk
    holds its repr: no addresses): a Python function by where its code is (a `functools.wraps` wrapper copies the
    name, not the code), a built-in by its type and name."""
    return tuple(_where(getattr(owner, name, None)) for owner in (torch.Tensor, torch))


def _where(obj: Any) -> Any:
    code = getattr(obj, "__code__", None)
    if code is not None:
        return (code.co_filename, code.co_firstlineno, code.co_name)
    return (type(obj).__name__, getattr(obj, "__module__", None), getattr(obj, "__qualname__", None))


def _kind(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        if not isinstance(v, FakeTensor) or v.layout is not torch.strided:
            raise _Uncached  # a real tensor among fakes: the answer is the fake mode's (allow_non_fake_inputs)
        meta = (tuple(v.shape), v.stride(), v.storage_offset())
        if any(isinstance(x, _SYMBOLIC) for part in meta[:2] for x in part) or isinstance(meta[2], _SYMBOLIC):
            raise _Uncached
        bits = (v.requires_grad, v.is_leaf, v.is_conj(), v.is_neg(), v._is_zerotensor(), v.is_inference())
        return (type(v), v.dtype, v.device, *meta, *bits)
    if isinstance(v, _SYMBOLIC):
        raise _Uncached
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_kind(x) for x in v))
    if isinstance(v, dict):
        return (dict, tuple((k, _kind(x)) for k, x in v.items()))
    if type(v) in _PLAIN:
        return (type(v), v)
    raise _Uncached  # anything else (an object hashed by identity would also be kept alive by the cache)


def probe_binding(op: Any, fargs: Any, fkwargs: dict[str, Any]) -> tuple[str, Any] | None:
    """`binding_for_call` without its cache: the probes themselves."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return None
    name = op_name(op)
    fakes = [v for v in pytree.tree_leaves((fargs, fkwargs)) if isinstance(v, FakeTensor)]
    mode = fakes[0].fake_mode if fakes else None
    if mode is None:
        return None
    if fargs and isinstance(fargs[0], torch.Tensor) and hasattr(torch.Tensor, name):
        if _dispatches_exactly(op, lambda a, k: getattr(a[0], name)(*a[1:], **k), fargs, fkwargs, mode):
            return "method", name
    fn = getattr(torch, name, None)
    if callable(fn) and _dispatches_exactly(op, lambda a, k: fn(*a, **k), fargs, fkwargs, mode):
        return "function", fn
    return None


def _dispatches_exactly(op: Any, call: Callable[..., Any], fargs: Any, fkwargs: Any, mode: Any) -> bool:
    # The probe must leave the program's ShapeEnv as it was: a binding runs a C++ kernel that reads concrete
    # sizes (`torch.constant_pad_nd` after two lengths were unified: a fake-cache miss), which would pin a length
    # symbol to the compiling call's value and drop its clauses from the shape guard (inductor, compiling over
    # the same ShapeEnv after, then assumed that length). No guard is recorded and no result is cached under
    # the symbolic key.
    shape_env = getattr(mode, "shape_env", None)
    quiet = shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()
    with quiet, disable_fake_tensor_cache(mode):
        with mode:  # a binding that writes must not touch the nodes' own fake values
            fargs, fkwargs = pytree.tree_map_only(FakeTensor, lambda t: t.clone(), (fargs, fkwargs))
        rec = _Calls()
        try:
            with quiet_fake_tensor_log(), mode, rec:  # a binding rejecting these arguments is expected here
                call(fargs, fkwargs)
        except Exception:  # noqa: BLE001 - the binding does not take these arguments
            return False
    if len(rec.calls) != 1 or rec.calls[0][0] is not op:
        return False
    # The same overload is not enough: the binding must also pass the same arguments in the same places
    # (`cond.where(x, y)` reaches aten.where.self with its arguments moved).
    _, args, kwargs = rec.calls[0]
    want = bind_args(op._schema, fargs, fkwargs, defaults=True)
    got = bind_args(op._schema, args, kwargs, defaults=True)
    return want.keys() == got.keys() and all(_same(want[name], got[name]) for name in want)


def _index(node: fx.Node) -> tuple[Any, ...] | None:
    """`select`/`slice` as a basic Python index (`x[:, 3]`, `x[2:5]`): the same view through the fast
    indexing path eager uses."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node) or node.kwargs:
        return None
    if node.target is aten.select.int:
        _, dim, index = node.args
        return (slice(None),) * dim + (index,) if dim >= 0 else None
    if node.target is aten.slice.Tensor:
        bound = bind_args(node.target._schema, node.args, {}, defaults=True)
        dim, start, end, step = bound["dim"], bound["start"], bound["end"], bound["step"]
        return (slice(None),) * dim + (slice(start, end, step),) if dim >= 0 else None
    return None


def _use_python_indexing(gm: fx.GraphModule) -> None:
    """select/slice -> `x[idx]`; `x[idx].copy_(v)` -> `x[idx] = v` (eager's own setitem path)."""
    graph = gm.graph
    for node in list(graph.nodes):
        idx = _index(node)
        if idx is None:
            continue
        users = list(node.users)
        if len(users) == 1 and users[0].target is aten.copy_.default and users[0].args[0] is node:
            copy = users[0]
            if not copy.users and len(copy.args) == 2 and isinstance(copy.args[1], fx.Node):
                with graph.inserting_before(copy):
                    setitem = graph.call_function(operator.setitem, (node.args[0], idx, copy.args[1]))
                # The write's source line and grad mode stay (traces show the line); setitem returns nothing.
                setitem.meta.update({k: copy.meta[k] for k in ("stack_trace", "grad") if k in copy.meta}, val=None)
                graph.erase_node(copy)
                graph.erase_node(node)
                continue
        node.target, node.args = operator.getitem, (node.args[0], idx)


def _grad_regions(gm: fx.GraphModule, grad: bool) -> None:
    """Switch grad mode around the ops the program ran under `torch.no_grad()` (or `enable_grad()`).
    The caller restores the mode if the graph raises."""
    graph = gm.graph
    current = grad
    for node in list(graph.nodes):
        if node.op == "output":
            if current != grad:
                with graph.inserting_before(node):
                    graph.call_function(torch._C._set_grad_enabled, (grad,))
            break
        want = node.meta.get("grad")
        if node.op != "call_function" or want is None or want == current:
            continue
        with graph.inserting_before(node):
            graph.call_function(torch._C._set_grad_enabled, (want,))
        current = want


_FOLD_LIMIT = 4096  # elements: constants folded into the program stay small


def _fold_constants(gm: fx.GraphModule) -> None:
    """Compute small tensors that depend on no input (`scalar_tensor(-inf)` from SDPA's mask conversion,
    `arange(n)`) once, at compile time. Only where eager's fresh tensor cannot be observed: nothing writes
    it or a view of it, and it is not returned."""
    graph = gm.graph
    for node in list(graph.nodes):
        op = node.target
        if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload) or node.all_input_nodes:
            continue
        f = facts(op)
        val = node.meta.get("val")
        if f.kind is not OpKind.FUNCTIONAL or f.nondeterministic or not isinstance(val, torch.Tensor):
            continue
        if val.numel() > _FOLD_LIMIT or val.device.type != "cpu" or node.meta.get("rg") or not _only_read(node):
            continue
        name = f"_folded_{node.name}"
        gm.register_buffer(name, op(*node.args, **node.kwargs))
        with graph.inserting_before(node):
            attr = graph.get_attr(name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        graph.erase_node(node)


def _only_read(node: fx.Node) -> bool:
    for user in node.users:
        if user.op == "output" or user.target in (operator.setitem,) or has_effect(user.target):
            return False
        if is_view_node(user) and not _only_read(user):
            return False
    return True


def torch_executor(gm: fx.GraphModule, grad: bool) -> Callable[..., Any]:
    _fold_constants(gm)
    _grad_regions(gm, grad)
    _use_python_indexing(gm)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            binding = _binding_for(node)
            if binding is not None and binding[0] == "method":
                node.op, node.target = "call_method", binding[1]
            elif binding is not None:
                node.target = binding[1]
    bindings.flush()
    gm.recompile()
    return generated_forward(gm)  # (its code generated now: a lazy module's forward would call the module each call)
