"""A correction to how dynamo traces `out=` into a non-contiguous tensor, for dealias's compiles only.

`torch.add(x, 1, out=y.t())` (an `out=` that is a view, a transposed or sliced buffer): dynamo traces the op's
node, then refuses it ("non-contiguous `out=` tensor": AOTAutograd's functionalization gets such strides wrong),
and the rest of the frame runs eagerly. For OpInfo-built programs of the `out=`-into-a-view family that was 515
of 923 programs partly eager.

Where eager only fills `out` (its shape already the result's, its dtype the result's, so nothing is resized or
cast), dealias traces the call as the op without `out=` followed by `out.copy_(result)`, a write into a view that
dealias's functionalization already carries to the base and to every other view, and returns `out` itself, as
eager does. That is eager's behaviour only where eager's `out=` kernel honours the strides it is given, and not
every kernel does: in the OpInfo sweep `narrow_copy(out=)` wrote its result contiguously over the neighbouring
elements, and `gelu(out=)` computed other values. Nothing in the schemas says which kernels do, so each call site
is checked once, by running eager's kernel both ways on small tensors of the call's own sizes, strides and dtypes
(random values, a sentinel around `out`), comparing every byte of out's memory and out's own layout after the call
(`linear(out=)` re-strides out to a contiguous tensor); the rewrite applies only where they agree (the verdict is
kept per op and layout).

`out=` given a tuple (`torch.max(x, 1, out=(v, i))`, `sort`, `frexp`, `split_with_sizes_copy`'s list) is traced
alike, one copy per out tensor, each probed the same way, and the call returns what eager's returns: the same
kind of object (`torch.return_types.max_out`, a plain tuple, or None) holding the out tensors themselves. An op
that draws random numbers (schema tag `nondeterministic_seeded`) is probed from one state of the default
generator both ways, and must leave it alike too: eager fills a non-contiguous `out` in its memory order, and
with another algorithm at larger sizes (`randn(30, 40, out=b[..., 0])`), so only some calls agree (`randn(3, 4,
out=b[..., 0])`). Everything else keeps dynamo's own handling (a graph break, so eager's behaviour, errors
included):
- a random op given a generator, or whose probe disagrees;
- a result of another shape or dtype (eager resizes `out`, or casts into it, or raises);
- an `out` that overlaps itself (an expanded tensor: eager raises); an `out` sharing memory with an argument is
  probed on memory shared alike (`clamp(v, 0, 1, out=v)`, `neg(x[:, 0], out=x[:, 1])`; a partial overlap eager
  raises on, or a kernel reading what it already wrote, `add(x[:3], 1, out=x[::2])`, disagrees), with more fills
  where the elements differ (a read-after-write may give the same bytes by chance), and only under ATen's grain
  size (one thread: the kernel's order fixed), and also on memory of its own (a later call may give it that); a
  kernel reading what it wrote (and an `out` whose elements share memory, an unfold of step 1) is traced as the
  `out=` call itself, which capture runs as an eager island, where one can be exact (dynamo_out_island.py);
- with grad on, a result or `out` that requires grad (eager raises: `out=` functions don't support automatic
  differentiation; under no_grad eager fills such an `out`, as the copy does);
- outs of one tuple that share memory with each other;
- on a later call, an `out` that shares memory with an argument where the traced call's did not (`inv(a, out=o)`
  traced with `o` apart from `a`, called with `o` being `a`): dynamo's guards do not hold storage sharing between
  inputs, so the copy node is marked (`OUT_COPY`) and the backend's program checks, on each call, the inputs `out`
  and the op's arguments were made from (`keep_out_overlaps`); where they now share a storage, that call runs the
  graph eagerly with the call restored to `op(..., out=out)` (eager's kernel, eager's result or error).
- arguments with symbolic sizes or values, too large to check cheaply (more than `CHECK_LIMIT` elements), or
  tensor arguments of an integer dtype (indices, pivots: random ones are not safe to run a kernel on; bool
  masks are probed with random masks) except for a pointwise op (aten's tag), probed with small integers.

Inputs that share memory at a later call exactly as at the traced one (the same storages, the same relative
offsets; dynamo guards sizes and strides) make every view of them as it was when the call was probed: such calls
run the compiled program; only a call that shares memory otherwise runs eagerly (`keep_out_overlaps`).
"""

from __future__ import annotations

import functools
import operator
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from . import dynamo_out_island, dynamo_out_resize, warns
from .dynamo_out_resize import _resize_warning, inside
from .dynamo_tensor import aten_tags
from .registry import correction, replace_method, require, require_module
from .settings import applies

NAME = "out_views"
OUT_COPY = "dealias_out_copy"  # node meta key: the `out.copy_(op(...))` a non-contiguous `out=` call was traced as
SINGLE_THREAD_ELEMENTS = 32768  # ATen's grain size: a pointwise kernel's elements run in one thread under it
CHECK_LIMIT = 1 << 20  # elements of all the call's tensors together, above which no check runs (a graph break)
_verdicts: dict[Any, type | None] = {}
_lists: Any = None  # dynamo's modules and classes the rewrite builds its return value with (install)
_udt: Any = None
_side_effects: Any = None
_constant: Any = None
_tracker: Any = None


def _fake(vt: Any) -> Any:
    return vt.as_proxy().node.meta.get("example_value")


def _draws_random(fn: Any) -> bool:
    """Whether any overload of the aten op behind torch function `fn` is tagged as drawing random numbers (or
    no aten op of that name exists: unknown, so treated as drawing)."""
    tags = aten_tags(getattr(fn, "__name__", ""))
    return tags is None or torch.Tag.nondeterministic_seeded in tags


def _same_place(a: torch.Tensor, b: torch.Tensor) -> bool:
    """`a` and `b` are the same elements of one memory (`clamp(v, 0, 1, out=v)` with v strided): eager's
    TensorIterator allows that overlap, where it refuses a partial one."""
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata and (
        a.shape,
        a.stride(),
        a.storage_offset(),
        a.dtype,
    ) == (b.shape, b.stride(), b.storage_offset(), b.dtype)


def _overlaps(t: torch.Tensor, others: list[torch.Tensor]) -> bool:
    """Whether `t` repeats its memory, or shares memory with one of `others` other than as the same elements."""
    if any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride())):
        return True  # (memory repeated: eager refuses to write it)
    mine = t.untyped_storage()
    return any(o.untyped_storage()._cdata == mine._cdata and not _same_place(o, t) for o in others)


def _arguments(args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]] | None:
    """The call's arguments as fake tensors, lists of them (`cat`'s) and Python constants (None where one is
    neither, a symbolic int: such calls are left to dynamo)."""

    def one(vt: Any) -> Any:
        if isinstance(vt, (_lists.TupleVariable, _lists.ListVariable)) and (items := _tensor_items(vt)):
            return vt.python_type()(one(v) for v in items)
        if vt.is_tensor():
            fake = _fake(vt)
            if not isinstance(fake, torch.Tensor) or not static_layout(fake):
                raise LookupError
            return fake
        if vt.is_python_constant():
            return vt.as_python_constant()
        raise LookupError

    try:
        return [one(a) for a in args], {k: one(v) for k, v in kwargs.items()}
    except (LookupError, NotImplementedError):
        return None
    except Exception as e:  # noqa: BLE001 - dynamo's own errors for an unconvertible constant
        if type(e).__name__ == "Unsupported":
            return None
        raise


def _tensor_leaves(args: list[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    return [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]


def static_layout(t: torch.Tensor, offset: bool = True) -> bool:
    """Whether `t`'s sizes, strides and (with `offset`) storage offset are ints, none a symbol."""
    return all(type(x) is int for x in (*t.shape, *t.stride(), *([t.storage_offset()] if offset else ())))


def _real(
    fake: torch.Tensor, gen: torch.Generator, members: list[torch.Tensor] | None = None, fill: Any = 0
) -> torch.Tensor:
    """A real tensor of `fake`'s sizes, strides, offset and dtype on the CPU, with random values (memory for all of
    `members`, fakes of fake's storage and dtype, each then taken at its own place: `_reals`)."""
    # (Beyond the tensors' own extent, room for a kernel that ignores the strides and writes `numel` elements on
    # from the first: in the user's program they would land on other memory; here the comparison sees them.)
    members = members or [fake]
    last = lambda t: t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1
    extent = max(map(last, members)) + max(t.numel() for t in members) + 64
    flat = torch.empty(extent, dtype=fake.dtype)
    if fill in ("rising", "falling") and fake.dtype.is_floating_point:
        flat.copy_(torch.arange(extent, dtype=torch.float64) * (1 if fill == "rising" else -1))
    elif fake.dtype.is_floating_point or fake.dtype.is_complex:
        flat.copy_(torch.randn(extent, generator=gen, dtype=torch.complex128 if fake.dtype.is_complex else None))
    elif fake.dtype is torch.bool:
        flat.copy_(torch.rand(extent, generator=gen) > 0.5)
    else:
        flat.copy_(torch.randint(-4, 5, (extent,), generator=gen))
    return flat.as_strided(fake.shape, fake.stride(), fake.storage_offset())


def _reals(tensors: list[torch.Tensor], gen: torch.Generator, alias: bool, fill: Any = 0) -> dict[int, torch.Tensor]:
    """Real tensors laid out like the fakes `tensors`, by id: with `alias`, those of one fake storage on one memory
    at their own offsets (the call's aliasing kept; KeyError where they differ in dtype), else each on its own."""
    if not alias:
        return {id(t): _real(t, gen) for t in tensors}
    groups: dict[int, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.untyped_storage()._cdata, []).append(t)
    real = {}
    for members in groups.values():
        if len({t.dtype for t in members}) > 1:
            raise KeyError("one memory viewed with several dtypes")
        flat = _real(members[0], gen, members, fill)
        base = flat.as_strided((flat.untyped_storage().nbytes() // flat.element_size(),), (1,), 0)
        for t in members:
            real[id(t)] = base.as_strided(t.shape, t.stride(), t.storage_offset())
    return real


def _key(fn: Any, args: list[Any], kwargs: dict[str, Any], outs: list[torch.Tensor]) -> Any:
    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return (a.dtype, tuple(a.shape), a.stride(), a.storage_offset(), a.device.type)
        if isinstance(a, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in a):
            return (type(a), tuple(one(e) for e in a))
        return (type(a), repr(a))

    same = tuple(tuple(_same_place(a, o) for o in outs) for a in _tensor_leaves(args, kwargs))
    # Which tensors share a storage (each tensor's first with its storage; with the offsets above, where): the
    # verdict was learned on memory shared so, and another call with the same layouts may share it otherwise
    # (`lerp(z, x, 0.0, out=x[..])` agrees with copies whatever x holds, `lerp(x, z, 0.0, out=x[..])` does not).
    every = [*_tensor_leaves(args, kwargs), *outs]
    firsts: dict[int, int] = {}
    shared = tuple(firsts.setdefault(_storage_of(t), i) for i, t in enumerate(every))
    keyed = (tuple(one(a) for a in args), tuple((k, one(v)) for k, v in sorted(kwargs.items())))
    return (fn, keyed, tuple(one(o) for o in outs), same, shared)


def _eager_fills(
    fn: Any,
    args: list[Any],
    kwargs: dict[str, Any],
    outs: list[torch.Tensor],
    single: bool,
    alias: bool = True,
    seeded: bool = False,
    fill: Any = 0,
    resize: bool = False,
) -> Any:
    """Whether eager's `fn(*args, **kwargs, out=..)` (`out=outs[0]` where `single`, else `out=tuple(outs)`) writes
    exactly what the call without `out=` followed by `outs[i].copy_(result[i])` writes, every byte of each out's
    memory compared, on tensors of the call's layouts (with `alias`, an argument that is an out's very elements is
    that out's memory, as in the call; else memory of its own). Where it does: the type of eager's return value,
    which for a tuple of outs must hold the out tensors themselves (`torch.return_types.max_out`); else None."""
    key = (_key(fn, args, kwargs, outs), single, alias, seeded, fill, resize)
    if key in _verdicts:
        return _verdicts[key]
    tensors = _tensor_leaves(args, kwargs)
    every = [*tensors, *outs]
    if sum(t.numel() for t in every) > CHECK_LIMIT or any(t.device.type != "cpu" for t in every):
        return None
    if any(t.is_conj() or t.is_neg() for t in every):
        return None  # (lazily conjugated or negated views: the fresh tensors below would not carry those bits)
    # Random values are safe to compute on only in floating point and as masks: integer arguments are indices,
    # pivots, counts, which random ones make kernels reject or, in LAPACK's (ldl_solve's pivots), write outside
    # their memory. A pointwise op (aten's tag) only computes on its elements' values: any integers are safe there.
    pointwise = torch.Tag.pointwise in (aten_tags(getattr(fn, "__name__", "")) or ())
    if not pointwise and any(
        not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype is torch.bool) for t in tensors
    ):
        return None
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    verdict = None
    rng = torch.get_rng_state() if seeded else None
    afresh = warns.at_its_own_lines(fn)  # (torch.tensordot's warning: see there)
    with unset_fake_temporarily(), torch.no_grad(), warns.recorded(afresh) as caught:
        try:
            gen = torch.Generator().manual_seed(fill if isinstance(fill, int) else 0)
            real = _reals(every, gen, alias, fill)  # (an argument sharing an out's memory shares it here too)
            args_r, kwargs_r = pytree.tree_map_only(torch.Tensor, lambda t: real[id(t)], (args, kwargs))
            outs_r = [real[id(o)] for o in outs]
            if fill == "special":  # (in the outs' memory only: elsewhere they would mask what is read there)
                for o in outs_r:
                    if o.dtype.is_floating_point or o.dtype.is_complex:
                        flat = torch.empty(0, dtype=o.dtype).set_(o.untyped_storage())
                        flat[1::5], flat[3::7], flat[2::11] = float("inf"), float("nan"), float("-inf")
            wholes = [torch.empty(0, dtype=o.dtype).set_(o.untyped_storage()) for o in outs_r]
            befores = [w.clone() for w in wholes]
            layouts = [(o.shape, o.stride(), o.storage_offset()) for o in outs_r]
            # (An op drawing random numbers runs both ways from the same state of the default generator, which
            # must be left alike too: the same draws, in the same order, as many of them.)
            start = torch.get_rng_state() if seeded else None
            versions = [o._version for o in outs_r]
            returned = fn(*args_r, **kwargs_r, out=outs_r[0] if single else tuple(outs_r))
            # (the rewrite's copy moves each out's version counter; `kron(out=)` into a strided out writes it through
            # a tensor of its own counter and leaves out's where it was: OpInfo sweep, second sample)
            counted = all(o._version != v for o, v in zip(outs_r, versions))
            warned = any(_resize_warning(w.message) for w in caught)
            drawn = torch.get_rng_state() if seeded else None
            by_kernel = [w.clone() for w in wholes]
            after = [(o.shape, o.stride(), o.storage_offset()) for o in outs_r]
            if resize:  # (eager resized out: only within the memory it spans, on the memory it had)
                kept = all(inside(a, b) for a, b in zip(after, layouts)) and all(
                    o.untyped_storage().data_ptr() == w.untyped_storage().data_ptr() for o, w in zip(outs_r, wholes)
                )
                layouts = after
            else:
                # (linear's kernel re-strides out; a tuple's return value holds the outs themselves, as the rewrite's)
                kept = after == layouts
            if single:
                kept = kept and returned is outs_r[0]
            else:
                # (or None: `split_with_sizes_copy(out=)` returns nothing)
                held = isinstance(returned, tuple) and len(returned) == len(outs_r)
                kept = kept and (returned is None or (held and all(r is o for r, o in zip(returned, outs_r))))
            for w, b in zip(wholes, befores):
                w.copy_(b)
            if seeded:
                torch.set_rng_state(start)
            result = fn(*args_r, **kwargs_r)
            kept = kept and (not seeded or torch.equal(drawn, torch.get_rng_state()))
            for w, layout, r in zip(wholes, layouts, [result] if single else result):
                w.as_strided(*layout).copy_(r)
            same = all(torch.equal(k.view(torch.uint8), w.view(torch.uint8)) for k, w in zip(by_kernel, wholes))
            verdict = type(returned) if kept and same and counted else None
            if resize and verdict is not None:
                verdict = (verdict, tuple((tuple(a[0]), tuple(a[1])) for a in after), warned)
        except Exception:  # noqa: BLE001 - either way raising: dynamo's own handling (a graph break) decides
            verdict = None
        finally:
            if seeded:
                torch.set_rng_state(rng)  # (the program's own random state, as it was)
    _verdicts[key] = verdict
    return verdict


@correction(
    NAME,
    corrects="`torch.add(x, 1, out=y.t())`: dynamo refuses an `out=` that is not contiguous (a graph break)",
    without="such a call breaks the graph, as with every backend (exact; the rest of the frame runs eagerly)",
)
def install() -> None:
    """Wrap `TorchInGraphFunctionVariable.call_function`: for dealias's frames, a torch function called with a
    non-contiguous `out=` tensor it only fills traces as the call without `out=` and a copy into `out`."""
    module = require_module("torch._dynamo.variables.torch")
    cls = require(module, "TorchInGraphFunctionVariable")
    call = require(cls, "call_function", "self", "tx", "args", "kwargs")
    global _constant
    _constant = require(require_module("torch._dynamo.variables"), "ConstantVariable")
    require(_constant, "create")
    require(require_module("torch._dynamo.variables"), "SymNodeVariable")
    global _lists, _udt, _side_effects, _tracker
    _tracker = require(require_module("torch._dynamo.variables.base"), "VariableTracker")
    require(_tracker, "build")
    _lists = require_module("torch._dynamo.variables.lists")
    require(_lists, "TupleVariable"), require(_lists, "ListVariable")
    _udt = require(require_module("torch._dynamo.variables.user_defined"), "UserDefinedTupleVariable")
    require(_udt, "get_vt_cls"), require(_udt, "items")
    _side_effects = require_module("torch._dynamo.variables.base")
    require(_side_effects, "ValueMutationNew")
    dynamo_out_island.install()

    def rewritten(self: Any, tx: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """The call as op + copy_ (one per out tensor), or None where dynamo's own handling applies (module
        docstring)."""
        out_vt = kwargs.get("out")
        if out_vt is None or not applies(NAME, tx):
            return None
        single = out_vt.is_tensor()
        out_vts = [out_vt] if single else _tensor_items(out_vt)
        outs = [_fake(v) for v in out_vts]
        if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
            return None
        rest = {k: v for k, v in kwargs.items() if k != "out"}
        # (A resize of a non-contiguous `out` (`x[::2]`) would be a write through `as_strided` of a non-contiguous
        # tensor, which dealias's capture refuses (the whole graph then runs eagerly): dynamo's break, narrower.)
        resize = (
            single
            and torch._prims_common.is_contiguous_or_false(outs[0])
            and _resizes(self.value, tx, args, rest, outs[0])
        )
        if not resize and all(torch._prims_common.is_contiguous_or_false(o) for o in outs):
            return None  # (contiguous: dynamo's own handling is right)
        found = _arguments(args, rest)
        # (Under no_grad eager fills an `out` that requires grad as any tensor, a write autograd does not record,
        # which the copy into `out` is too; dynamo traces the grad mode, so it is the traced call's here. Outs of
        # symbolic sizes are left to dynamo as the arguments are (_arguments): their layouts key the probe's
        # verdicts; the OpInfo sweep's shared `_call` frame, made dynamic by its recompiles, raised hashing one.)
        graded = torch.is_grad_enabled() and any(o.requires_grad for o in outs)
        if found is None or graded or not all(static_layout(o) for o in outs):
            return None
        seeded = _draws_random(self.value)
        others = _tensor_leaves(*found)
        # (outs sharing memory with each other: eager's kernel decides which write lands last; left to dynamo)
        if any(_overlaps(o, [*outs[:i], *outs[i + 1 :]]) for i, o in enumerate(outs)):
            return None
        # An argument sharing an out's memory otherwise than as its very elements (`torch.add(x, 1, out=x[::2])`):
        # eager's kernel may read what it already wrote, in its order; the probe runs it on memory shared alike,
        # where one thread runs it (over ATen's grain size, the order may change from run to run).
        shared = [a for a in others for o in outs if _storage_of(a) == _storage_of(o) and not _same_place(a, o)]
        if shared and sum(t.numel() for t in (*others, *outs)) >= SINGLE_THREAD_ELEMENTS:
            return None
        returned = _eager_fills(self.value, *found, outs, single, seeded=seeded, resize=resize)
        aliased = any(_storage_of(a) == _storage_of(o) for a in others for o in outs)
        again = lambda **kw: _eager_fills(self.value, *found, outs, single, seeded=seeded, resize=resize, **kw)
        island = lambda: dynamo_out_island.applies(
            self.value, others, outs, single and not resize, seeded, SINGLE_THREAD_ELEMENTS
        )
        islanded = lambda: dynamo_out_island.trace_or_break(tx, self.value, args, kwargs, out_vt, island())
        # (An `out` whose elements share memory, an `unfold` of step 1: eager's kernel reads what it wrote there.)
        if returned is None and dynamo_out_island.repeats(outs[0]) and island():
            return islanded()
        if returned is None and aliased and again(alias=False) is not None:
            return islanded()
        if returned is None:
            return None
        # (Read-after-write through shared memory can give the same bytes by chance, `maximum` rewriting a value
        # that already was the larger: more fills, values rising and falling through memory, and infinities and
        # NaNs (`add(y, x[..], alpha=0, out=x[..])` reads 0 * x: the same on finite values only), as
        # checks.aliasing_is_benign asks of in-place ops.)
        fills = (1, 2, 3, "rising", "falling", "special") if shared else ()
        if any(again(fill=f) != returned for f in fills):
            return islanded()
        # An argument sharing an out's memory: also checked on memory of its own, which a later call may give it
        # where it came from another input (keep_out_overlaps runs the call eagerly where they share it otherwise).
        if aliased and again(alias=False) != returned:
            return None
        if resize:
            traced = dynamo_out_resize.trace(
                tx, lambda: call(self, tx, args, rest), out_vt, outs[0], returned, _tracker.build, _constant
            )
            if traced is None:
                return None
            out_vt.call_method(tx, "copy_", [traced], {}).as_proxy().node.meta[OUT_COPY] = True
            return out_vt
        result = call(self, tx, args, rest)
        results = [result] if single else _tensor_items(result)
        values = [_fake(r) for r in results]
        if len(values) != len(outs) or not all(
            isinstance(v, torch.Tensor)
            and (v.shape, v.dtype, v.device) == (o.shape, o.dtype, o.device)
            and not v.requires_grad
            for v, o in zip(values, outs)
        ):
            return None  # (the node traced above is unused: dynamo's own call below breaks the graph before it)
        for i, (o_vt, r) in enumerate(zip(out_vts, results)):
            copied = o_vt.call_method(tx, "copy_", [r], {})
            copied.as_proxy().node.meta[OUT_COPY] = True if single else (i, len(outs))
        return out_vt if single else _returned(returned, out_vts, outs)

    @functools.wraps(call)
    def call_function(self: Any, tx: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        result = rewritten(self, tx, args, kwargs) if type(self) is cls else None
        return call(self, tx, args, kwargs) if result is None else result

    replace_method(cls, "call_function", call, call_function)


def _resizes(fn: Any, tx: Any, args: list[Any], kwargs: dict[str, Any], out: torch.Tensor) -> bool:
    """Whether the call's result has another shape than `out` (eager resizes `out`): the call run on the fake
    values, in dynamo's fake mode (False where it cannot run so)."""
    found = _arguments(args, kwargs)
    if found is None:
        return False
    try:
        with tx.fake_mode, warns.ignored():
            result = fn(*found[0], **found[1])
    except Exception:  # noqa: BLE001 - eager raises, or fake tensors cannot run it: dynamo's own handling
        return False
    return isinstance(result, torch.Tensor) and tuple(result.shape) != tuple(out.shape)


def _storage_of(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _tensor_items(vt: Any) -> list[Any]:
    """The elements of a tuple or list variable (a structseq's too) when all are tensors, else []."""
    items = getattr(vt, "items", None) if isinstance(vt, (_lists.TupleVariable, _lists.ListVariable, _udt)) else None
    return list(items) if items and all(v.is_tensor() for v in items) else []


def _returned(kind: type, out_vts: list[Any], outs: list[torch.Tensor]) -> Any:
    """Eager's return value of an `out=` tuple call, as dynamo's variable: `kind` (a structseq such as
    `torch.return_types.max_out`, or a plain tuple) holding the out tensors themselves."""
    if kind is type(None):
        return _constant.create(None)
    items = _lists.TupleVariable(list(out_vts), mutation_type=_side_effects.ValueMutationNew())
    if kind is tuple:
        return items
    return _udt.get_vt_cls(kind)(kind(outs), tuple_vt=items)


def _storage(node: Any) -> Any:
    value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return value.untyped_storage()._cdata if isinstance(value, torch.Tensor) else None


def _copied_op(node: fx.Node) -> fx.Node:
    """The op node a marked copy copies the result of (for an `out=` tuple, the op behind the element's getitem)."""
    source = node.args[1]
    if node.meta.get(OUT_COPY) is not True and source.target is operator.getitem:
        return source.args[0]
    return source


def _rewrites(gm: fx.GraphModule) -> list[tuple[set[int], set[int]]]:
    """For each marked copy (module docstring): the input positions `out` was made from, and those the op's tensor
    arguments were made from (the placeholders whose fake value shares the tensor's fake storage)."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    roots = lambda node: {
        i for i, p in enumerate(placeholders) if (s := _storage(node)) is not None and _storage(p) == s
    }
    found = []
    for node in gm.graph.find_nodes(op="call_method", target="copy_"):
        if node.meta.get(OUT_COPY):
            op, out = _copied_op(node), node.args[0]
            outs = roots(out)
            # An argument that was out's very elements, made from the same inputs, stays so on every call (the same
            # view ops of the same inputs: dynamo guards their layouts); the check was made for it (_eager_fills).
            # (One input only: inputs sharing memory at the traced call may share it otherwise at a later one;
            # keep_out_overlaps compares such sharing with the traced call's.)
            leaves = [
                a
                for a in pytree.tree_leaves((op.args, op.kwargs))
                if not (_same_node_place(a, out) and len(outs) == 1 and roots(a) == outs)
            ]
            found.append((outs, set().union(*map(roots, leaves))))
    return [(outs, ins) for outs, ins in found if outs and ins]


def _same_node_place(a: Any, b: Any) -> bool:
    va = a.meta.get("example_value") if isinstance(a, fx.Node) else None
    vb = b.meta.get("example_value") if isinstance(b, fx.Node) else None
    return isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and _same_place(va, vb)


def _sharing(tensors: list[Any], absolute: bool) -> tuple[Any, ...]:
    """How `tensors` share memory: per tensor, the first of them with its storage and its byte offset in it, relative
    to that first one's (absolute where the graph makes views at absolute offsets: `as_strided`)."""
    firsts: dict[int, int] = {}
    shape = []
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            shape.append(None)
            continue
        first = firsts.setdefault(t.untyped_storage()._cdata, i)
        at = lambda x: x.storage_offset() * x.element_size()
        shape.append((first, at(t) - (0 if absolute else at(tensors[first]))))
    return tuple(shape)


def _absolute_views(gm: fx.GraphModule) -> bool:
    """Whether the graph makes a view at an absolute storage offset (so that moving memory moves no view of it)."""
    # (`as_strided` without a storage offset keeps its tensor's: relative, as the `as_strided_` a resizing `out=`
    # is traced as)
    offset = lambda n: len(n.args) > 3 or n.kwargs.get("storage_offset") is not None
    return any(
        (name := getattr(n.target, "__name__", n.target)) == "set_"
        or (name in ("as_strided", "as_strided_") and offset(n))
        for n in gm.graph.nodes
        if n.op in ("call_function", "call_method")
    )


def _restored(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of `gm` with each marked copy turned back into the call dynamo traced: `op(..., out=out)` (for a tuple
    of outs, one `op(..., out=(o0, o1, ..))` in place of their copies)."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    copies: dict[fx.Node, list[fx.Node]] = {}
    for node in graph.find_nodes(op="call_method", target="copy_"):
        if node.meta.get(OUT_COPY):
            copies.setdefault(_copied_op(node), []).append(node)
    for op, nodes in copies.items():
        single = len(nodes) == 1 and nodes[0].meta[OUT_COPY] is True
        outs = [n.args[0] for n in sorted(nodes, key=lambda n: n.meta[OUT_COPY] if not single else 0)]
        with graph.inserting_before(nodes[0]):
            call = graph.call_function(op.target, op.args, {**op.kwargs, "out": outs[0] if single else tuple(outs)})
        for node in nodes:
            node.replace_all_uses_with(node.args[0] if not single else call)
            source = node.args[1]
            graph.erase_node(node)
            if source is not op and not source.users:
                graph.erase_node(source)
        if not op.users:
            graph.erase_node(op)
    return fx.GraphModule(gm, graph)


def keep_out_overlaps(
    gm: fx.GraphModule, program: Callable[..., Any], name: str, strict: bool = False
) -> Callable[..., Any]:
    """`program` (compiled from `gm`), or where `gm` has marked copies whose `out` and arguments come from graph
    inputs, a program that runs `gm` restored eagerly on a call where those inputs share a storage (`strict`:
    raises UnsupportedError there instead)."""
    pairs = _rewrites(gm)
    if not pairs:
        return program
    # Inputs sharing memory as they did at the traced call (same storages, same relative offsets; dynamo guards
    # their sizes and strides) make every view of them as it was there, where the rewrite was checked (_eager_fills
    # with that aliasing): such calls run the program.
    involved = sorted(set().union(*(outs | ins for outs, ins in pairs)))
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    absolute = _absolute_views(gm)
    traced = _sharing([placeholders[i].meta.get("example_value") for i in involved], absolute)
    from ..errors import OverlapFallbackWarning, UnsupportedError

    eager: list[fx.GraphModule] = []

    def checked(*args: Any) -> Any:
        ids = lambda ps: {args[i].untyped_storage()._cdata for i in ps if isinstance(args[i], torch.Tensor)}
        if not any(ids(outs) & ids(ins) for outs, ins in pairs):
            return program(*args)
        if _sharing([args[i] for i in involved], absolute) == traced:
            return program(*args)
        if not eager:
            message = (
                f"dealias: a graph of {name} runs eagerly on calls where an `out=` tensor shares memory with the "
                "op's arguments (eager's kernel decides what it writes)"
            )
            if strict:
                raise UnsupportedError(message)
            eager.append(_restored(gm))
            warnings.warn(message, OverlapFallbackWarning, stacklevel=2)
        return eager[0].forward(*args)

    return checked
