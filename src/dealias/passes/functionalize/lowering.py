"""Op lowering: a mutating op (in-place, out=, mutable, foreach) becomes its functional op, whose results the
timeline then records as writes of the written arguments."""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ...errors import OverlapError, UnsupportedError
from ...ir.draws import draw_like
from ...ir.opfacts import OpKind, bind_args, is_view_node, returned_args
from ...ir.plan import StorageKind
from ...ir.viewops import internal_overlap
from ..alias import Value
from ..writecheck import check_writable, eager_metadata_error
from .counters import move_counter
from .island import lower_island
from .timeline import write

if TYPE_CHECKING:
    from .walk import Functionalizer

aten = torch.ops.aten


def lower_mutation(w: Functionalizer, node: fx.Node, f: Any) -> None:
    """The captured op `node`, which writes its arguments (`f`: its OpFacts), as functional ops and writes."""
    op = node.target
    bound = bind_args(op._schema, node.args, node.kwargs)
    outs = [a.name for a in op._schema.arguments if a.is_out]
    if f.out_only is not None and all(bound.get(m) is None for m in f.mutated if m not in outs):
        # `native_batch_norm(.., out=..)` without running stats: an out= op of native_batch_norm.default.
        f = replace(f, kind=OpKind.OUT, mutated=tuple(outs), functional=f.out_only)
    if f.functional is None:
        raise UnsupportedError(f"{op} has no functional counterpart known to dealias")
    if op is aten.copy_.default and bound["self"] is bound["src"] and not _recorded_self_copy(w, bound["self"]):
        # `x.copy_(x)`: eager returns at once, touching no value; its version counter moves. Autograd records it
        # (the copy's backward): through a view whose elements overlap (`x.unfold(0, 2, 1)`), that gathers the
        # gradient once per alias of an element, which no functional program here reproduces: run eagerly.
        if w.emit.grad and internal_overlap(w.info.value(bound["self"]).meta) != "no":
            if w.autograd.requires_grad(bound["self"]):
                raise UnsupportedError(f"{op} of an overlapping view onto itself, recorded by autograd")
        v = w.info.value(bound["self"])
        s = v.storage
        # The last write of a caller's tensor read later with grad on (autograd_facts.after_write): eager's
        # tensor has the copy's grad_fn from here, and later reads (and a hook registered later) go through it.
        # The write-back of its value now stands for it, moving the version counter once, as eager's copy.
        now = w.autograd.writes_back_at(s, node)
        hidden = w.timeline.through_detached(v) and w.timeline.base[s].meta.get("rg")
        w.autograd.after_write(s, node, bool(hidden))  # (refuses a write of an unsafe_split element too)
        w.counters.record_move(v)  # (with `now`, by the write-back that stands for the copy)
        if s.kind is StorageKind.GROUP or (s.kind is not StorageKind.INTERMEDIATE and not now):
            move_counter(w, v)  # what autograd saved of it is stale
        return
    lists = [n for n, a in bound.items() if isinstance(a, (list, tuple)) and a and isinstance(a[0], fx.Node)]
    foreach = op._schema.name.startswith("aten::_foreach_")  # the i-th result depends on the i-th inputs only
    if foreach and lists and _crosses_indices(w, bound, lists, f.mutated):
        # A foreach op whose i-th write is read at another index (`_foreach_mul_([a, b], [b, a])`): eager
        # applies it tensor by tensor, so the later elements see the earlier writes. Do the same.
        for i in range(len(bound[lists[0]])):
            _mutate(w, node, f, {n: [a[i]] if n in lists else a for n, a in bound.items()})
        return
    _mutate(w, node, f, bound)


def copy_value(w: Functionalizer, dst: fx.Node, src: fx.Node) -> fx.Node:
    """The functional `copy(dst, src)`, differentiable when autograd needs it: src cast to dst's dtype and
    broadcast to its shape, as a tensor of its own. When dst's old value has a history, eager's copy_ sends it
    a zero gradient (a custom Function's backward then runs with zeros, a hook on it sees them, and a leaf
    behind it gets zeros, not None: fuzz seed 1032924); `where` with a false condition keeps that edge and
    takes every element from src, exactly (a NaN or inf in dst stays out of the result). A view's region
    write scatters the value into its base, whose backward already gives the region zeros."""
    d, v = dst.meta["val"], src.meta["val"]
    if v.dtype != d.dtype:
        src = w.emit.call(aten._to_copy.default, src, dtype=d.dtype)
    if dst.meta.get("rg") and not is_view_node(dst):
        never = w.emit.call(aten.zeros.default, [], dtype=torch.bool, device=d.device)
        return w.emit.call(aten.where.self, never, dst, src)
    if tuple(v.shape) != tuple(d.shape):
        src = w.emit.call(aten.expand.default, src, list(d.shape))
    return w.emit.call(aten.clone.default, src)


def _recorded_self_copy(w: Functionalizer, a: fx.Node) -> bool:
    """`x.copy_(x)` with grad on, of a caller's tensor that requires grad, through no view whose elements
    overlap: autograd records it, and eager's x has the copy's grad_fn from here (a hook registered later
    hooks it; what was computed from x before does not go through it). It is written as any write is: the
    caller's tensor receives its own value, with that history, and its version counter moves."""
    v = w.info.value(a)
    s = v.storage
    if not w.emit.grad or s.kind is StorageKind.INTERMEDIATE or s in w.autograd.unsafe_split_rg:
        return False
    return bool(w.caller_placeholder(s).meta.get("rg")) and internal_overlap(v.meta) == "no"


def _crosses_indices(w: Functionalizer, bound: dict[str, Any], lists: list[str], mutated: tuple[str, ...]) -> bool:
    written = [w.info.value(a).storage for n in lists if n in mutated for a in bound[n]]
    for n in lists:
        for j, a in enumerate(bound[n]):
            s = w.info.value(a).storage
            if any(x is s for i, x in enumerate(written) if i != j):
                return True
    return False


def _mutate(w: Functionalizer, node: fx.Node, f: Any, bound: dict[str, Any]) -> None:
    op = node.target
    schema = op._schema
    targets: list[Value] = []  # every written tensor, list arguments (foreach ops) flattened
    counted: list[bool] = []  # ...and whether eager moves its version counter (OpFacts.counted)
    for name in f.mutated:
        arg = bound.get(name)
        if isinstance(arg, fx.Node):
            targets.append(w.info.value(arg))
            counted.append(name in f.counted)
        elif isinstance(arg, (list, tuple)):
            targets.extend(w.info.value(a) for a in arg)
            counted += [name in f.counted] * len(arg)
    others = [
        w.info.values[a]
        for name, arg in bound.items()
        if name not in f.mutated
        for a in (arg if isinstance(arg, (list, tuple)) else [arg])
        if isinstance(a, fx.Node) and isinstance(w.info.values.get(a), Value)
    ]
    try:
        check_writable(node, targets, others)
    except OverlapError:
        # Eager's result is its kernel's visiting order: where exact, that kernel runs on a copy of the memory
        # laid out as the caller's (an island); else the graph runs eagerly.
        if lower_island(w, node, f, bound, targets, counted):
            return
        raise
    if f.kind is OpKind.INPLACE and len(targets) == 1 and w.autograd.saves_caller_result(node, targets[0]):
        w.autograd.run_in_place_on_caller(node, targets[0], bound)
        w.counters.record_move(targets[0])  # (in place on the caller's tensor itself)
        return
    # out= arguments are dropped; the functional schema lists the rest in the same order.
    kept = [a.name for a in schema.arguments if not (a.is_out and a.name in f.mutated)]
    defaults = bind_args(schema, (), {}, defaults=True)
    args, kwargs = _to_call(f.functional._schema, kept, {n: w.read(a) for n, a in bound.items()}, defaults)
    factory = "dtype" in {a.name for a in f.functional._schema.arguments} and "dtype" not in kept
    if f.kind is OpKind.OUT and factory:
        out_meta = targets[0].meta  # a factory: makes a tensor of the out= tensor's dtype, on its device
        kwargs.update(dtype=out_meta.dtype, device=out_meta.device)
    elif f.computes_in_out_dtype and kwargs.get("dtype") is None:
        args, kwargs = _in_out_dtype(w, f, args, kwargs, targets[0].meta.dtype)
    if f.functional is aten.copy.default and any(isinstance(a, fx.Node) and a.meta.get("rg") for a in args[:2]):
        out = copy_value(w, args[0], args[1])  # aten.copy has no derivative
    elif f.nondeterministic and f.kind in (OpKind.INPLACE, OpKind.MUTABLE) and _draws_into_tensors(f, bound):
        # (ir.draws) Every argument given, so that all go by position where the schema allows (a name may be a
        # Python keyword: `uniform_(self, from, to)`).
        full = {n: w.read(a) for n, a in bind_args(schema, node.args, node.kwargs, defaults=True).items()}
        draw_args, draw_kwargs = _to_call(schema, list(full), full, {})
        out = w.emit.call(draw_like, op, *draw_args, **draw_kwargs)
    elif f.functional is aten.zero.default:  # (aten.zero has no derivative for complex results; fill has)
        out = w.emit.call(aten.fill.Scalar, *args, 0)
    else:
        out = w.emit.call(f.functional, *args, **kwargs)
        if f.kind is OpKind.INPLACE and len(targets) == 1 or f.kind is OpKind.MUTABLE:
            # Eager ran the in-place op here (`y.relu_()`, a training batch norm's running statistics): write-back
            # lowering may run it so again under autograd (writeback_autograd.py): eager's op itself, which moves
            # the version counters eager's did.
            out.meta["eager_in_place"] = op
        out = w.raise_at_backward(node, out)
    if f.kind is OpKind.MUTABLE:
        # The functional form returns the op's own results, then the new value of each written argument that
        # is not an out= argument; an out= argument's new value is the result returned as it.
        n = len(schema.returns)
        returns = returned_args(schema)
        rest = [m for m in f.mutated if m not in returns]
        results = [w.emit.call(operator.getitem, out, i) for i in range(n + len(rest))]
        returned = w.info.values[node]
        for rv, res, arg in zip(returned if isinstance(returned, tuple) else (returned,), results, returns):
            if isinstance(rv, Value) and arg is None:
                # (behind the node raising eager's error at backward, where the program then writes what eager's
                # node saved: `y = F.batch_norm(x, rm, rv, training=True); rm.zero_()`)
                w.bind_fresh(rv, w.raise_at_backward(node, res))
        new_values = [
            results[returns.index(name)] if name in returns else results[n + rest.index(name)]
            for name in f.mutated
            if isinstance(bound.get(name), fx.Node)
        ]
    elif isinstance(out.meta["val"], (list, tuple)):
        new_values = [w.emit.call(operator.getitem, out, k) for k in range(len(targets))]
    else:
        new_values = [out]
    if f.kind is OpKind.OUT and any(n.meta["val"].dtype != t.meta.dtype for t, n in zip(targets, new_values)):
        error = eager_metadata_error(node)  # (a cast would write it; some kernels refuse instead)
        if error is not None:
            raise error
    for target, new, moves in zip(targets, new_values, counted, strict=True):
        write(w, target, new, node, moves)


def _in_out_dtype(
    w: Functionalizer, f: Any, args: list[Any], kwargs: dict[str, Any], dtype: torch.dtype
) -> tuple[list[Any], dict[str, Any]]:
    """The functional call of an out= reduction computing in its out= tensor's `dtype`
    (opfacts.COMPUTES_IN_OUT_DTYPE): given that `dtype`, or, for an op without the argument (`std`), its input
    cast to it first (what the argument does). Unchanged where the op cannot compute in that dtype (`mean`
    into an integer tensor): eager raises the cast error the write then raises too."""
    if not args or not isinstance(args[0], fx.Node) or args[0].meta["val"].dtype == dtype:
        return args, kwargs
    if "dtype" in {a.name for a in f.functional._schema.arguments}:
        new_args, new_kwargs = args, {**kwargs, "dtype": dtype}
    else:
        new_args, new_kwargs = [w.emit.call(aten._to_copy.default, args[0], dtype=dtype), *args[1:]], kwargs
    fargs, fkwargs = pytree.tree_map_only(fx.Node, lambda n: n.meta["val"], (new_args, new_kwargs))
    try:
        with w.emit.fake_mode:
            f.functional(*fargs, **fkwargs)
    except RuntimeError:
        return args, kwargs  # (a cast node left unused is dropped by dead-code elimination)
    return new_args, new_kwargs


def _draws_into_tensors(f: Any, bound: dict[str, Any]) -> bool:
    """A random op whose written arguments are all given, single tensors, and positional (what draw_like runs)."""
    args = {a.name: a for a in f.op._schema.arguments}
    return all(isinstance(bound.get(m), fx.Node) and not args[m].kwarg_only for m in f.mutated)


def _to_call(
    schema: torch.FunctionSchema, names: list[str], values: dict[str, Any], defaults: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Arguments for `schema` from the mutating op's arguments `names` (in its schema order, matched to the
    functional schema by position: their types match even where names differ), their `values`, and the
    mutating op's `defaults` for those not given (`bernoulli_(p=0.5)` -> `bernoulli.p(p)` needs it)."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    positional = True
    if sorted(names) == sorted(a.name for a in schema.arguments) and names != [a.name for a in schema.arguments]:
        names = [a.name for a in schema.arguments]  # the same arguments in the functional schema's order
    for name, a in zip(names, schema.arguments):
        if name in values:
            value = values[name]
        elif name in defaults and not a.has_default_value():
            value = defaults[name]
        else:
            positional = False  # a default is used: name everything after it
            continue
        if positional and not a.kwarg_only:
            args.append(value)
        else:
            kwargs[a.name] = value
    return args, kwargs
