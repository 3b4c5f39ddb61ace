"""Op facts derived from aten schemas: is an overload a view, an in-place op, an out= op, a metadata
mutation, and what is its functional counterpart.

Everything here is computed from `OpOverload._schema` alias annotations and `torch.Tag`s; the only hand
tables are the few exceptions the schemas do not express (see `_VIEW_WITHOUT_ANNOTATION`,
`_MULTI_VIEW_WITHOUT_ANNOTATION`, `_FUNCTIONAL_BY_NAME`).
"""

from __future__ import annotations

import enum
import functools
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._library.utils import zip_schema
from torch._ops import OpOverload


class OpKind(enum.Enum):
    FUNCTIONAL = "functional"  # no argument is aliased or written
    VIEW = "view"  # some return aliases an argument, nothing is written
    INPLACE = "inplace"  # writes `self` (data) and returns it
    OUT = "out"  # writes its out= arguments and returns them
    MUTABLE = "mutable"  # writes other arguments (e.g. BatchNorm running stats)
    INPLACE_VIEW = "inplace_view"  # changes the metadata of `self`, not its data


@dataclass(frozen=True)
class OpFacts:
    op: OpOverload
    kind: OpKind
    mutated: tuple[str, ...]  # names of the written arguments, in schema order
    functional: OpOverload | None  # the out-of-place counterpart for the mutating kinds
    multi_output_view: bool = False  # split/unbind: `Tensor(a -> *) self` returning `Tensor(a)[]`
    autograd_view: bool = True  # autograd tracks the returns as views of the input (not unsafe_split's)
    own_counter: bool = False  # the returns have version counters of their own (unsafe_split's, `_unsafe_view`'s)
    nondeterministic: bool = False  # random ops: never merged by CSE
    # A mutable op with out= arguments (`native_batch_norm.out`), called with its other written arguments absent
    # (no running stats): the out= op this makes it, and its functional form (the packet's overload without out=).
    out_only: OpOverload | None = None
    # The written arguments whose version counters eager moves: autograd's in-place/out= wrapper moves those the
    # op returns; a mutable op (`native_batch_norm`'s running statistics, `rrelu_with_noise_`'s noise) moves none.
    counted: tuple[str, ...] = ()
    # An out= op computing in the out= tensor's dtype when its `dtype` argument is not given (COMPUTES_IN_OUT_DTYPE).
    computes_in_out_dtype: bool = False


# `_unsafe_view` has no alias annotation, but it reinterprets its input's memory (it follows a clone in
# `reshape`'s decomposition); functionalization must treat it as a view.
_VIEW_WITHOUT_ANNOTATION = {"aten::_unsafe_view"}

# Node meta key: a view node whose result has a version counter of its own though its op's results share their
# input's (`x.data` traces to aten.detach; capture tags it).
OWN_COUNTER_KEY = "dealias_own_counter"

# Node meta key: an aten.view node traced from a user's `reshape` (or `flatten`, `reshape_as`, which call it). Of a
# tensor that is not contiguous, eager's reshape makes `_reshape_alias` where fake tensors' makes `view`: a
# returned view made so is replayed by reshape itself, so that its grad_fn and the errors naming it are eager's
# (fuzz seed 2030276: "Output 0 of ReshapeAlias is a view and its base ... modified inplace"; capture tags it).
RESHAPE_KEY = "dealias_reshape"

# `unsafe_split` returns tensors sharing its input's memory without an alias annotation: autograd does not
# track them as views (eager lets them be written in place freely), but a write through one is a write of the
# input's memory.
_MULTI_VIEW_WITHOUT_ANNOTATION = {"aten::unsafe_split", "aten::unsafe_split_with_sizes"}

# Ops that write arguments their schema does not annotate. `native_batch_norm` updates its running
# statistics in training mode, yet its schema declares no alias; make_fx records it for nn.BatchNorm.
_MUTATES_WITHOUT_ANNOTATION = {"aten::native_batch_norm": ("running_mean", "running_var")}

# out= reductions whose structured kernels take the dtype they compute in from the out= tensor when `dtype` is
# not given (ATen's `infer_dtype_from_optional(self, dtype, out)`), and `std`/`var`, which have no `dtype` but
# compute as on their input cast to it: `torch.sum(half, 1, out=f32)` sums in float32, `torch.cumsum(f32, 0,
# out=i64)` casts the input first. No schema says so; the other out= ops with a `dtype`
# (`sum.out`, `prod.out`, `linalg_vector_norm.out`) raise on an out= of another dtype instead. Measured against
# eager in tests/test_exactness_audit.py (test_reductions_into_an_out_of_another_dtype).
COMPUTES_IN_OUT_DTYPE = {
    "sum.IntList_out",
    "prod.int_out",
    "mean.out",
    "nansum.out",
    "cumsum.out",
    "cumprod.out",
    "std.out",
    "std.correction_out",
    "var.out",
    "var.correction_out",
}

# In-place and mutable ops whose functional form is not found by stripping `_` / out= arguments.
_FUNCTIONAL_BY_NAME = {
    "aten::__iand__": "aten::bitwise_and",
    "aten::__ior__": "aten::bitwise_or",
    "aten::__ixor__": "aten::bitwise_xor",
    "aten::__ilshift__": "aten::__lshift__",
    "aten::__irshift__": "aten::__rshift__",
    "aten::normal_": "aten::normal_functional",
    "aten::bernoulli_": "aten::bernoulli",
    "aten::copy_": "aten::copy",
    "aten::_native_batch_norm_legit": "aten::_native_batch_norm_legit_functional",
    "aten::native_batch_norm": "aten::_native_batch_norm_legit_functional",
}


def _written(schema: torch.FunctionSchema) -> list[torch.Argument]:
    return [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def _arg_signature(args: list[torch.Argument]) -> tuple[tuple[str, str], ...]:
    # Alias annotations are part of `str(type)` only through `alias_info`, so the type string compares
    # `Tensor(a!) self` equal to `Tensor self`.
    return tuple((a.name, str(a.type)) for a in args)


def _strip_optional(t: str) -> str:
    return t[len("Optional[") : -1] if t.startswith("Optional[") else t


def _packet(qualname: str) -> torch._ops.OpOverloadPacket | None:
    ns, name = qualname.split("::")
    return getattr(getattr(torch.ops, ns, None), name, None)


def _find_functional(op: OpOverload, kind: OpKind) -> OpOverload | None:
    """The out-of-place overload computing what `op` writes: same packet minus the trailing `_`, or that name
    plus `_functional` (in-place), the same packet (out=), `<name>_functional` (mutable), or a hand-mapped name;
    matched on argument names and types first, then on types alone (names differ in e.g. bernoulli_.float/.p)."""
    schema = op._schema
    names: list[str] = []
    if schema.name in _FUNCTIONAL_BY_NAME:
        names.append(_FUNCTIONAL_BY_NAME[schema.name])
    if kind is OpKind.INPLACE and schema.name.endswith("_"):
        names.append(schema.name[:-1])
        names.append(schema.name[:-1] + "_functional")  # (writing another argument too: `rrelu_with_noise_`)
    elif kind is OpKind.OUT:
        names.append(schema.name)
    elif kind is OpKind.MUTABLE:
        names.append(schema.name + "_functional")
    wanted = _arg_signature([a for a in schema.arguments if not a.is_out])
    # Optional-ness may differ (native_batch_norm takes `Tensor?` stats, its functional form `Tensor`).
    wanted_types = [_strip_optional(t) for _, t in wanted]
    for name in names:
        packet = _packet(name)
        if packet is None:
            continue
        overloads = [getattr(packet, o) for o in packet.overloads()]
        overloads = [o for o in overloads if not _written(o._schema)]
        for ov in overloads:
            if _arg_signature(list(ov._schema.arguments)) == wanted:
                return ov
        for ov in overloads:
            if [_strip_optional(str(a.type)) for a in ov._schema.arguments] == wanted_types:
                return ov
        for ov in overloads:  # the same arguments in another order (`polygamma_(self, n)`, `polygamma(n, self)`)
            if sorted(_arg_signature(list(ov._schema.arguments))) == sorted(wanted):
                return ov
        if kind is OpKind.OUT:
            for ov in overloads:  # a factory: `arange.out(end, *, out)` is `arange(end, *, dtype, layout, device..)`
                own = _arg_signature(list(ov._schema.arguments))
                rest = {a.name for a in ov._schema.arguments[len(wanted) :]}
                if own[: len(wanted)] == wanted and rest and rest <= _FACTORY_ARGS:
                    return ov
    return None


def _without_out(op: OpOverload) -> OpOverload | None:
    """The overload of `op`'s packet taking the same arguments but the out= ones, by name and type, that writes
    nothing (given no running stats, `native_batch_norm.out` is `native_batch_norm.default` with out=)."""
    wanted = _arg_signature([a for a in op._schema.arguments if not a.is_out])
    packet = _packet(op._schema.name)
    overloads = [getattr(packet, o) for o in packet.overloads()] if packet is not None else []
    return next((o for o in overloads if _arg_signature(list(o._schema.arguments)) == wanted), None)


# What a factory's out= tensor stands for in its functional form (taken from the out= tensor).
_FACTORY_ARGS = {"dtype", "layout", "device", "pin_memory"}


@functools.cache
def facts(op: OpOverload) -> OpFacts:
    """Classify one aten overload from its schema and tags."""
    schema = op._schema
    tags = set(op.tags)
    written = _written(schema)
    if schema.name in _MUTATES_WITHOUT_ANNOTATION:
        names = _MUTATES_WITHOUT_ANNOTATION[schema.name] + tuple(a.name for a in written)  # (its .out's out=)
        out_only = _without_out(op) if written else None
        functional = _find_functional(op, OpKind.MUTABLE)
        return OpFacts(op, OpKind.MUTABLE, names, functional, out_only=out_only, counted=_counted(schema))
    nondet = torch.Tag.nondeterministic_seeded in tags
    if schema.name in _MULTI_VIEW_WITHOUT_ANNOTATION:
        return OpFacts(op, OpKind.VIEW, (), None, multi_output_view=True, autograd_view=False, own_counter=True)
    if not written:
        aliased = [a for a in schema.arguments if a.alias_info is not None]
        if aliased or schema.name in _VIEW_WITHOUT_ANNOTATION:
            multi = any("*" in a.alias_info.after_set for a in aliased)
            own = schema.name in _VIEW_WITHOUT_ANNOTATION
            return OpFacts(op, OpKind.VIEW, (), None, multi_output_view=multi, own_counter=own)
        return OpFacts(op, OpKind.FUNCTIONAL, (), None, nondeterministic=nondet)
    names = tuple(a.name for a in written)
    if torch.Tag.inplace_view in tags:
        return OpFacts(op, OpKind.INPLACE_VIEW, names, None, counted=names)
    if all(a.is_out for a in written):
        kind = OpKind.OUT
    elif torch.Tag.inplace in tags or (names == ("self",) and schema.arguments[0].name == "self"):
        kind = OpKind.INPLACE
    else:
        kind = OpKind.MUTABLE
    out_only = _without_out(op) if kind is OpKind.MUTABLE and any(a.is_out for a in written) else None
    functional = _find_functional(op, kind)
    in_out_dtype = op.namespace == "aten" and op.__name__ in COMPUTES_IN_OUT_DTYPE
    return OpFacts(
        op,
        kind,
        names,
        functional,
        nondeterministic=nondet,
        out_only=out_only,
        counted=_counted(schema),
        computes_in_out_dtype=in_out_dtype,
    )


def _counted(schema: torch.FunctionSchema) -> tuple[str, ...]:
    """The written arguments whose version counters eager moves. torchgen gives in-place (`name_`, `__iname__`) and
    out= ops that return something an ADInplaceOrView kernel moving the counter of each returned argument; other
    written arguments move only if the kernel writes them through an op that does. Of ops returning nothing, the foreach
    ops' kernels write tensor by tensor through such ops and the out= ones copy into their outputs (measured);
    the fused optimizer steps and AMP's unscale write memory directly."""
    written = [a.name for a in _written(schema)]
    base = schema.name.split("::")[-1]
    out_kind = any(a.is_out for a in schema.arguments)
    if not schema.returns:
        return tuple(written) if out_kind or base.startswith("_foreach_") else ()
    inplace = base.endswith("_") and not base.endswith("__") or base.startswith("__i")  # (`__ilshift__` too)
    if not (out_kind or inplace):
        return ()
    returned = set(returned_args(schema))
    return tuple(n for n in written if n in returned)


def returned_args(schema: torch.FunctionSchema) -> list[str | None]:
    """For each result of `schema`, the argument it returns (the same write alias set: `Tensor(a!) out` returned
    as `Tensor(a!)`), or None for a fresh result."""
    by_set = {
        frozenset(a.alias_info.before_set): a.name
        for a in schema.arguments
        if a.alias_info is not None and a.alias_info.is_write
    }
    return [
        by_set.get(frozenset(r.alias_info.before_set)) if r.alias_info is not None and r.alias_info.is_write else None
        for r in schema.returns
    ]


def bind_args(
    schema: torch.FunctionSchema, args: tuple[Any, ...], kwargs: dict[str, Any], defaults: bool = False
) -> dict[str, Any]:
    """A call's arguments by schema name, in schema order: those given (and, with `defaults`, the defaults of
    those not given). The one place dealias binds a call to its schema, through torch's `zip_schema`; torch's
    `fill_defaults` does not fit: it ignores a positional argument passed by name, and gives None for an
    argument without a default, where callers must tell "not given" from None."""
    given = {a.name: value for a, value in zip_schema(schema, args, kwargs)}
    if not defaults:
        return given
    return {
        a.name: given[a.name] if a.name in given else a.default_value
        for a in schema.arguments
        if a.name in given or a.has_default_value()
    }


def writes_nothing(op: OpOverload, args: tuple, kwargs: dict, mutated: tuple[str, ...]) -> bool:
    """A mutating op called so that it writes nothing: every written argument is an omitted optional
    (BatchNorm without running stats), or BatchNorm outside training mode."""
    given = bind_args(op._schema, args, kwargs)
    if all(given.get(name) is None for name in mutated):
        return True
    if op._schema.name in ("aten::native_batch_norm", "aten::_native_batch_norm_legit"):
        return not given.get("training")
    return False


def op_name(op: Any) -> str:
    """`add_`, `select`, `as_strided_rel`...: a graph target's name without namespace and overload (an aten op's
    from its schema, any other callable's `__name__`). The one spelling of an op's short name, in traces, node
    names and name-based decisions."""
    schema = getattr(op, "_schema", None)
    return schema.name.split("::")[1] if schema is not None else getattr(op, "__name__", str(op))


@functools.cache
def inplace_variant(op: OpOverload) -> OpOverload | None:
    """The in-place overload computing `op` into its first argument (`add.Tensor` -> `add_.Tensor`,
    `copy` -> `copy_`, `index_copy` -> `index_copy_`), found the way functional counterparts are: the
    in-place overload whose functional counterpart is `op`."""
    packet = getattr(getattr(torch.ops, op.namespace), op_name(op) + "_", None)
    if packet is None:
        return None
    for ov_name in packet.overloads():
        ov = getattr(packet, ov_name)
        f = facts(ov)
        if f.kind is OpKind.INPLACE and f.functional is op and f.mutated == ("self",):
            return ov
    return None


def has_effect(target: object) -> bool:
    """A graph target that must run even when its result is unused, and never be merged with another:
    a write, a random draw, or a dealias check (a function marked `_dealias_effect`)."""
    if isinstance(target, OpOverload):
        f = facts(target)
        return f.nondeterministic or f.kind not in (OpKind.FUNCTIONAL, OpKind.VIEW)
    return bool(getattr(target, "_dealias_effect", False))


def may_raise(target: object) -> bool:
    """An op whose error depends on the values of its inputs, not only on their shapes: an index out of range
    (a Tensor argument named index, indices or target), counts that must be non-negative and add up to a given
    size (`repeat_interleave`'s repeats with output_size: every fill of kernel_checks' probe, zeros, ones, large
    and rising values, missed the size alike, and the fused program raised where the call's counts add up), or an
    op that exists for its check (no results: `_linalg_check_errors`, `_assert_async`). Its result unused, it is
    still not dead: eager raises there."""
    if not isinstance(target, OpOverload):
        return False
    schema = target._schema
    if not schema.returns:
        return True
    if schema.name in _RAISES_ON_VALUES:
        return True
    names = ("index", "indices", "target", "repeats")
    return any(a.name in names and "Tensor" in str(a.type) for a in schema.arguments)


# Ops whose kernels raise on their inputs' values with nothing in their schema to say so (linalg's `_ex` ops return
# their errors, and `_linalg_check_errors` raises them). The deprecated `torch.cholesky` raises on a matrix that is
# not positive-definite: fused, a write the program makes after it was stored before it raised.
_RAISES_ON_VALUES = frozenset({"aten::cholesky"})


def removable_if_unused(target: object) -> bool:
    """What dead-code elimination may drop: no effect (write, random draw, check) and no error of its own."""
    return not has_effect(target) and not may_raise(target)


def is_view_target(target: object) -> bool:
    """Whether calling `target` returns a view of its first argument's memory: an aten view op (from its schema)
    or a view helper of dealias's own graphs (`as_strided_rel`, marked `dealias_view`)."""
    if isinstance(target, OpOverload):
        return facts(target).kind is OpKind.VIEW
    return bool(getattr(target, "dealias_view", False))


def data_node(node: Any) -> fx.Node | None:
    """The `x.data` node (aten.detach tagged OWN_COUNTER_KEY by capture) that view node `node` is, or is a view of
    through other view nodes; None where there is none: where its writes move `.data`'s own counter, not x's."""
    while is_view_node(node):
        if node.meta.get(OWN_COUNTER_KEY) and node.target is torch.ops.aten.detach.default:
            return node
        node = node.args[0]
    return None


def is_view_node(node: Any) -> bool:
    """Whether a graph node's result is a view of its first argument's memory: a call of a view target
    (`is_view_target`), or an element of a multi-output view (`split(..)[i]`). The one answer every pass uses: a
    write through any view counts as a write of its base."""
    if getattr(node, "op", None) != "call_function":
        return False
    if node.target is operator.getitem:
        return is_view_node(node.args[0])
    return is_view_target(node.target)


def written_nodes(node: fx.Node) -> list[fx.Node]:
    """The captured tensors `node` writes."""
    op = node.target
    if not isinstance(op, torch._ops.OpOverload) or not facts(op).mutated:
        return []
    bound = bind_args(op._schema, node.args, node.kwargs)
    args = [bound.get(name) for name in facts(op).mutated]
    return [a for arg in args for a in (arg if isinstance(arg, (list, tuple)) else [arg]) if isinstance(a, fx.Node)]


def fact_per_signature(
    memo: dict[Any, Any], op: Any, flat: list[Any], spec: Any, tensor_key: Any, compute: Any, bound: int = 4096
) -> Any:
    """An op fact read off a run of `op` on meta tensors, kept in `memo` per signature of the call (`flat`, `spec`:
    its arguments flattened): the op, the argument structure, `tensor_key(node)` of each argument node (its layout,
    and whatever else the fact depends on) and the other arguments' values (floats by repr: 0.0 and -0.0 apart), so
    that a net's batch norms of one size run once. `compute(parts)` computes it (`parts`: each argument's key or
    value, in order); an unhashable signature is computed every time."""
    parts = tuple(
        tensor_key(a) if isinstance(a, fx.Node) else (type(a), repr(a) if isinstance(a, float) else a) for a in flat
    )
    key: Any = (op, spec, tuple(isinstance(a, fx.Node) for a in flat), parts)
    try:
        hash(key)
    except TypeError:
        return compute(parts)
    if key in memo:
        return memo[key]
    fact = compute(parts)
    if len(memo) < bound:
        memo[key] = fact
    return fact
