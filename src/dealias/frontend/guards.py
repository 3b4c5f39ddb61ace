"""Guards: everything about a call that changes the meaning of its compiled program.

Per tensor: type, dtype, device, shape, strides (static ones), requires_grad, leaf-ness, conj/neg bits; the
storage offset only where the program reads absolute offsets. Per other leaf: its type and value (specialized
scalars; symbolic ones are left to the program's shape guard). Per call: the argument structure, grad mode,
inference mode, which tensors share a storage and, for those, how they overlap.

A lookup is split in two so that a cache hit stays cheap for many tensors: a hashable key of what Python
reads fast (structure, modes, values, storage sharing, offsets, leaf-ness), then, among that key's entries,
torch's own C++ tensor guard (the one Dynamo uses) for shapes, strides, dtypes, devices, requires_grad,
dispatch keys and Python types. Where that guard is missing, a Python comparison does the same job.
For a graph dynamo guards fully, the first layout's key is also written out as one generated expression
(`lean_check`): a hit of the common call costs a few attribute reads, not a key built and hashed.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..compat.internals import CREATION_META, TensorGuards, creation_meta, storage_id, storage_object
from ..ir.sharing import find_groups_or_none


def _leaf_key(x: Any) -> Any:
    """The guard of one argument leaf. A tensor's fields are in the order of _LEAF_FIELDS."""
    if isinstance(x, torch.Tensor):
        return (
            type(x),
            x.dtype,
            x.device,
            x.shape,
            x.stride(),
            x.storage_offset(),
            x.requires_grad,
            _is_leaf(x),
            x.is_conj(),
            x.is_neg(),
        )
    if type(x) is float:
        return (float, repr(x))  # nan == nan, and 0.0 != -0.0
    try:
        hash(x)
    except TypeError:
        return ("id", type(x), id(x))
    return (type(x), x)


def _is_leaf(x: torch.Tensor) -> Any:
    """`x.is_leaf`; reading it raises for a split element (or a view made under no_grad) whose base was written
    since: such a tensor gets a key of its own ("stale") and eager's error comes where eager raises it."""
    try:
        return x.is_leaf
    except RuntimeError:
        return "stale"


_DEFAULT_VIEW = CREATION_META.get("DEFAULT")
# Tensor types whose methods run torch's own C code, no __torch_function__ of a subclass (a Parameter's is disabled)
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _grad_kind(x: torch.Tensor) -> Any:
    """What autograd makes of an input: no grad (False), a leaf (True), a non-leaf ("stale" if reading its
    grad_fn raises), or a view eager restricts (made under no_grad, a split element: its creation meta)."""
    if not x.requires_grad:
        return False
    if x._base is not None:
        meta = creation_meta(x)
        if meta != _DEFAULT_VIEW:
            return str(meta)
    return _is_leaf(x)


def sharing_pattern(leaves: list[Any]) -> tuple[int, ...]:
    """For each tensor leaf, the position of the first tensor leaf sharing its storage. One dict insert
    per tensor: linear in the number of arguments."""
    if len(leaves) == 1:
        return (0,) if isinstance(leaves[0], torch.Tensor) else ()
    first: dict[int, int] = {}
    pattern = []
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor):
            pattern.append(first.setdefault(x.untyped_storage()._cdata, i))
    return tuple(pattern)


def lookup_key(
    leaves: list[Any], structure: Any, offsets: bool = True, symbolic: frozenset[int] = frozenset()
) -> tuple[tuple[Any, ...], list[torch.Tensor]]:
    """The hashable part of the guard, and the tensors for the tensor check. One pass over the leaves.

    Storage offsets are in the key only when `offsets` (the program reads absolute offsets: `as_strided` with
    an offset). Otherwise a program is the same wherever its inputs sit in memory (`f(buf[i])` for every row
    i); only inputs that share a storage add their overlap structure, from which the program's alias groups
    come (computed only then). Leaves at the positions `symbolic` are Python scalars the program takes as
    symbols: their values are checked by the program's shape guards, not keyed."""
    tensors: list[torch.Tensor] = []
    values: list[Any] = []
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor):
            tensors.append(x)
        elif i not in symbolic:
            values.append(_leaf_key(x))
    # Per tensor (the first tensor sharing its storage, its offset, its grad kind), one comprehension per field: an
    # optimizer step passes 200 tensors (its state lifted from the graph), and this runs on every call.
    first: dict[int, int] = {}
    sharers = [first.setdefault(t.untyped_storage()._cdata, k) for k, t in enumerate(tensors)]
    shared = len(first) != len(tensors)
    places = [t.storage_offset() for t in tensors] if offsets else itertools.repeat(None)
    kinds = [t.requires_grad and _grad_kind(t) for t in tensors]
    layout = tuple(zip(sharers, places, kinds))
    key = (structure, torch.is_grad_enabled(), torch.is_inference_mode_enabled(), layout, *values)
    if shared and not offsets:
        key += (overlap_structure(tensors),)
    if shared:
        # Which members of an alias group are views (`_base`), where dynamo guards it only for tensors requiring
        # grad: a layout change of a member requiring no grad is replayed after the write-backs only of a view
        # (passes/functionalize/walk.py `_a_view`).
        key += (tuple(t._base is None for t in tensors),)
    return key, tensors


def lean_check(
    leaves: list[Any],
    symbolic: frozenset[int],
    shape_guard: Any,
    held: int = 0,
    layouts: list[tuple[list[Any], list[Any]]] | None = None,
    writes: bool = True,
    unguarded: frozenset[int] = frozenset(),
) -> Callable[[tuple[Any, ...]], bool] | None:
    """A generated `holds(args)`: whether `lookup_key(args)` equals the key of `leaves` and the shape guard, if
    any, holds. The cache lookup of the common call as one expression. Only for graphs dynamo fully guards
    (types, shapes, strides, dtypes, devices, requires_grad of every input; the values of specialized
    scalars), so the tensor check is dynamo's; and only for a layout whose tensors all have storages of their
    own and whose program ignores offsets, so that the sharing part of the key is "all storages distinct".
    None for other layouts (the general lookup serves them).

    The last `held` leaves are tensors the graph holds (its lifted attributes: an optimizer's parameters and
    state), the same objects at every call, which dynamo guards by identity only: their sizes, strides, dtypes
    and requires_grad are checked here by a tensor check (`layouts`: the program's, per tensor of `leaves`).

    `unguarded`: positions of passed tensors dynamo does not match (an optimizer's gradients, guarded as not None
    only), each of static layout: checked here by a tensor check too.

    A program that changes no caller tensor (`writes` False: ir/plan.writes_caller) gets no check of the storages:
    it only reads its inputs, a read gives eager's value whether or not the memory is shared (the graph tier's ops
    and the torch executor's read the caller's tensors themselves, inductor's kernels read them in place; autograd
    sends each input's gradient through that input's own history, as eager's), and the program of a layout where
    inputs share memory would be this one again with alias groups that nothing writes. Its `sid` per tensor and the
    set were ~0.1 us a tensor of every call (a 17-tensor DQN loss: 2 us)."""
    tensors = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    if len({leaves[i].untyped_storage()._cdata for i in tensors}) != len(tensors):
        return None
    passed = len(leaves) - held
    env: dict[str, Any] = {
        "grad": torch.is_grad_enabled,
        "inference": torch.is_inference_mode_enabled,
        "kind": _grad_kind,
        "leaf": _leaf_key,
        "guard": shape_guard,
        # The StorageImpl's address, as `untyped_storage()._cdata` is, without making a storage object (~0.1 us a
        # tensor less: the check runs on every call).
        "sid": storage_id,
    }
    conds = [f"grad() is {torch.is_grad_enabled()}"]
    conds.append(f"inference() is {torch.is_inference_mode_enabled()}")
    if held:
        attributes = leaves[passed:]
        if not all(isinstance(x, torch.Tensor) for x in attributes):
            return None
        env.update({f"a{i}": x for i, x in enumerate(attributes, start=passed)})
        env["held"] = tuple(attributes)
        env["held_check"] = functools.partial(
            tensor_check(attributes, layouts[-held:] if layouts else None), *attributes
        )
        conds.append("held_check()")
    if unguarded:
        checked = sorted(unguarded)
        if not all(isinstance(leaves[i], torch.Tensor) for i in checked):
            return None
        at = {i: k for k, i in enumerate(tensors)}  # (a leaf's position among the tensors: its layout)
        env["passed_check"] = tensor_check(
            [leaves[i] for i in checked], [layouts[at[i]] for i in checked] if layouts else None
        )
        conds.append(f"passed_check({', '.join(f'a{i}' for i in checked)})")
    if len(tensors) > 1 and writes:
        # The storages' Python objects where every tensor is a plain one (its type checked before this: dynamo's
        # tensor match, held_check), whose untyped_storage no __torch_function__ answers: one object per storage,
        # ~25 ns a tensor less than its id (an optimizer step's 30 tensors: ~0.8 us a call).
        plain = storage_object is not None and all(type(leaves[i]) in _PLAIN_TENSORS for i in tensors)
        env["storage"] = storage_object
        key = "storage" if plain else "sid"
        # Where every passed leaf is a tensor, the keys of `args` (and of the held tensors) are taken in one C loop,
        # `map` into the set, not one call written out per tensor: the same key of the same tensors, ~4 ns a tensor
        # less (a mobilenet's 142 inputs: ~0.5 us; after the kernels the reads of the tensors' memory cost the rest,
        # the same for every key torch offers: storage object, id, address, data_ptr).
        if passed and set(range(passed)) <= set(tensors):
            storages = [f"*map({key}, args)"]
        else:
            storages = [f"{key}(a{i})" for i in tensors if i < passed]
        if held:
            storages.append(f"*map({key}, held)")
        conds.append(f"len({{{', '.join(storages)}}}) == {len(tensors)}")
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor):
            if x.requires_grad:  # without it, dynamo's requires_grad guard says the kind is False
                env[f"k{i}"] = kind = _grad_kind(x)
                if kind is True and i >= passed and x._base is None:
                    # A held parameter (an optimizer's): the same tensor object at every call, which stays no view
                    # (`x.data = ..`, `x.set_(..)` change its memory, not its `_base`) and requires grad (held_check,
                    # before this): its kind is its leaf-ness alone (10 parameters: ~0.4 us a call less).
                    conds.append(f"a{i}.is_leaf")
                    continue
                # (a parameter: a leaf that is no view, read off the tensor without a call of _grad_kind)
                fast = f"a{i}._base is None and a{i}.is_leaf or " if kind is True else ""
                conds.append(f"({fast}kind(a{i}) == k{i})")
        elif i not in symbolic:
            env[f"v{i}"] = _leaf_key(x)
            conds.append(f"leaf(a{i}) == v{i}")
    if shape_guard is not None and not getattr(shape_guard, "always", False):
        conds.append("guard([*args, *held])" if held else "guard(list(args))")
    unpack = f"    {''.join(f'a{i}, ' for i in range(passed))}= args\n" if passed else ""
    src = (
        f"def holds(args):\n    if len(args) != {passed}:\n        return False\n"
        + unpack
        + f"    return {' and '.join(conds)}\n"
    )
    exec(compile(src, "<dealias lean check>", "exec"), env)  # noqa: S102 - generated from the names above only
    holds = env["holds"]
    holds.source = src  # (for tests and inspection)
    return holds


def overlap_structure(tensors: list[torch.Tensor]) -> tuple[Any, ...]:
    """Which inputs overlap in memory, and each member's offset within its group's extent: everything about
    the placement of inputs that share a storage that a program depends on."""
    return tuple(
        (g.members, g.extent, tuple(tensors[m].storage_offset() - g.start for m in g.members))
        for g in find_groups_or_none(tensors)
    )


def tensor_check(tensors: list[torch.Tensor], layouts: list[tuple[list[Any], list[Any]]] | None = None) -> Any:
    """A callable `check(*tensors) -> bool` accepting exactly tensors like these (see the module doc). With
    `layouts` (per tensor: sizes and strides, None where a program holds them symbolic), sizes and strides are
    checked only where static; the program's shape guard checks the rest."""
    if layouts is None:
        layouts = [(list(t.shape), list(t.stride())) for t in tensors]
    if TensorGuards is not None:
        # TensorGuards refuses the same tensor twice (`f(y, y)`, as a graph split around a hook passes it): check
        # each tensor once, and that the repeats are that very tensor again.
        first = [next(j for j in range(i + 1) if tensors[j] is t) for i, t in enumerate(tensors)]
        unique = [i for i, j in enumerate(first) if i == j]
        guard = TensorGuards(
            *(tensors[i] for i in unique),
            dynamic_dims_sizes=[layouts[i][0] for i in unique],
            dynamic_dims_strides=[layouts[i][1] for i in unique],
        )
        if len(unique) == len(tensors):
            return guard.check
        repeats = [(i, j) for i, j in enumerate(first) if i != j]
        return lambda *ts: all(ts[i] is ts[j] for i, j in repeats) and guard.check(*(ts[i] for i in unique))

    def layout_key(t: torch.Tensor, layout: tuple[list[Any], list[Any]]) -> tuple[Any, ...]:
        k = _leaf_key(t)  # (the storage offset is the lookup key's business)
        sizes, strides = _masked(k[_SIZES], layout[0]), _masked(k[_STRIDES], layout[1])
        return (*k[:_SIZES], sizes, strides, *k[_OFFSET + 1 :])

    keys = [layout_key(t, layout) for t, layout in zip(tensors, layouts)]
    return lambda *ts: all(layout_key(t, layout) == k for t, layout, k in zip(ts, layouts, keys))


def _masked(values: Any, layout: list[Any]) -> tuple[Any, ...]:
    return tuple(None if want is None else v for v, want in zip(values, layout))


class GuardKey(NamedTuple):
    """Everything a compiled program was specialized to, for explaining a recompile (not the hot path)."""

    structure: Any  # the arguments' pytree structure
    grad: bool  # grad mode
    inference: bool  # inference mode
    sharing: Any  # which tensor leaves share a storage (sharing_pattern)
    leaves: tuple[tuple[Any, ...], ...]  # per argument leaf: its _leaf_key (fields named by _LEAF_FIELDS)


def guard_key(
    leaves: list[Any], structure: Any, offsets: bool = True, symbolic: frozenset[int] = frozenset()
) -> GuardKey:
    """Everything in one key (offsets and symbolic scalars only where `lookup_key` keys them): used to
    explain a recompile, not on the hot path."""
    keys = []
    for i, x in enumerate(leaves):
        k = _leaf_key(x)
        if isinstance(x, torch.Tensor) and not offsets:
            k = (*k[:_OFFSET], None, *k[_OFFSET + 1 :])
        elif i in symbolic:
            k = (type(x), "symbolic")
        keys.append(k)
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    return GuardKey(structure, grad, inference, sharing_pattern(leaves), tuple(keys))


_LEAF_FIELDS = (
    "type",
    "dtype",
    "device",
    "shape",
    "strides",
    "storage offset",
    "requires_grad",
    "is_leaf",
    "conj",
    "neg",
)
_SIZES, _STRIDES, _OFFSET = (_LEAF_FIELDS.index(f) for f in ("shape", "strides", "storage offset"))


def explain_miss(old: GuardKey, new: GuardKey, named: Any = lambda i: f"input {i}") -> list[str]:
    """What changed between two guard keys, in words (sharing changes are explained by the caller); `named`
    names the i-th argument leaf."""
    if old.structure != new.structure:
        return ["the argument structure changed"]
    reasons = []
    if old.grad != new.grad:
        reasons.append(f"grad mode {'on' if old.grad else 'off'} -> {'on' if new.grad else 'off'}")
    if old.inference != new.inference:
        reasons.append("inference mode changed")
    for i, (a, b) in enumerate(zip(old.leaves, new.leaves)):
        if a == b:
            continue
        if a[0] is not b[0] or len(a) != len(b) or len(a) != len(_LEAF_FIELDS):
            reasons.append(f"{named(i)}: {a[-1]!r} -> {b[-1]!r}" if len(a) == len(b) == 2 else f"{named(i)} changed")
            continue
        for name, x, y in zip(_LEAF_FIELDS, a, b):
            if x != y:
                reasons.append(f"{named(i)}: {name} {x} -> {y}")
    return reasons
