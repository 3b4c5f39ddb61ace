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
kept per op and layout). Everything else keeps dynamo's own handling (a graph break, so
eager's behaviour, errors included):
- an op that draws random numbers (schema tag `nondeterministic_seeded`): eager fills a non-contiguous `out` in
  its memory order, not in the result's element order;
- a result of another shape or dtype (eager resizes `out`, or casts into it, or raises);
- an `out` that overlaps itself (an expanded tensor: eager raises) or shares memory with an argument other than
  as the same elements (eager raises for a partial overlap; an argument that is out's very elements,
  `clamp(v, 0, 1, out=v)`, is checked with that aliasing, and rewritten where eager's kernel agrees);
- a result that requires grad (eager raises: `out=` functions don't support automatic differentiation);
- `out=` given a tuple of tensors (left to dynamo);
- on a later call, an `out` that shares memory with an argument where the traced call's did not (`inv(a, out=o)`
  traced with `o` apart from `a`, called with `o` being `a`): dynamo's guards do not hold storage sharing between
  inputs, so the copy node is marked (`OUT_COPY`) and the backend's program checks, on each call, the inputs `out`
  and the op's arguments were made from (`keep_out_overlaps`); where they now share a storage, that call runs the
  graph eagerly with the call restored to `op(..., out=out)` (eager's kernel, eager's result or error).
- arguments with symbolic sizes or values, too large to check cheaply (more than `CHECK_LIMIT` elements), or
  tensor arguments of an integer or bool dtype (indices, pivots: random ones are not safe to run a kernel on).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from .dynamo_tensor import aten_tags
from .registry import correction, replace_method, require, require_module
from .settings import applies

NAME = "out_views"
OUT_COPY = "dealias_out_copy"  # node meta key: the `out.copy_(op(...))` a non-contiguous `out=` call was traced as
CHECK_LIMIT = 1 << 20  # elements of all the call's tensors together, above which no check runs (a graph break)
_verdicts: dict[Any, bool] = {}


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
    """The call's arguments as fake tensors and Python constants (None where one is neither, a symbolic int or a
    list holding tensors: such calls are left to dynamo)."""

    def one(vt: Any) -> Any:
        if vt.is_tensor():
            fake = _fake(vt)
            if not isinstance(fake, torch.Tensor) or not _static(fake):
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


def _static(t: torch.Tensor) -> bool:
    return all(type(x) is int for x in (*t.shape, *t.stride(), t.storage_offset()))


def _real(fake: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A real tensor of `fake`'s sizes, strides, offset and dtype on the CPU, with random values."""
    # (Beyond the tensor's own extent, room for a kernel that ignores the strides and writes `numel` elements on
    # from the first: in the user's program they would land on other memory; here the comparison sees them.)
    extent = fake.storage_offset() + sum((n - 1) * st for n, st in zip(fake.shape, fake.stride())) + 1
    extent += fake.numel() + 64
    flat = torch.empty(extent, dtype=fake.dtype)
    if fake.dtype.is_floating_point or fake.dtype.is_complex:
        flat.copy_(torch.randn(extent, generator=gen, dtype=torch.complex128 if fake.dtype.is_complex else None))
    elif fake.dtype is torch.bool:
        flat.copy_(torch.rand(extent, generator=gen) > 0.5)
    else:
        flat.copy_(torch.randint(-4, 5, (extent,), generator=gen))
    return flat.as_strided(fake.shape, fake.stride(), fake.storage_offset())


def _key(fn: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return (a.dtype, tuple(a.shape), a.stride(), a.storage_offset(), a.device.type)
        return (type(a), repr(a))

    out = kwargs["out"]
    same = tuple(isinstance(a, torch.Tensor) and a is not out and _same_place(a, out) for a in args)
    return (fn, tuple(one(a) for a in args), tuple((k, one(v)) for k, v in sorted(kwargs.items())), same)


def _eager_fills(fn: Any, args: list[Any], kwargs: dict[str, Any], alias: bool = True) -> bool:
    """Whether eager's `fn(*args, **kwargs)` with its `out=` writes exactly what the call without `out=` followed
    by `out.copy_(result)` writes, every byte of out's memory compared, on tensors of the call's layouts (with
    `alias`, an argument that is out's very elements is out's memory, as in the call; else memory of its own)."""
    key = (_key(fn, args, kwargs), alias)
    if key in _verdicts:
        return _verdicts[key]
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    if sum(t.numel() for t in tensors) > CHECK_LIMIT or any(t.device.type != "cpu" for t in tensors):
        return False
    if any(t.is_conj() or t.is_neg() for t in tensors):
        return False  # (lazily conjugated or negated views: the fresh tensors below would not carry those bits)
    # Random values are safe to compute on only in floating point: integer arguments are indices, pivots, counts,
    # which random ones make kernels reject or, in LAPACK's (ldl_solve's pivots), write outside their memory.
    if any(not (t.dtype.is_floating_point or t.dtype.is_complex) for t in tensors if t is not kwargs["out"]):
        return False
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    verdict = False
    with unset_fake_temporarily(), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            gen = torch.Generator().manual_seed(0)
            real = {id(t): _real(t, gen) for t in tensors}
            out_fake = kwargs["out"]
            for t in tensors:  # (an argument that is out's very elements is out's memory here too)
                if alias and t is not out_fake and _same_place(t, out_fake):
                    real[id(t)] = real[id(out_fake)]
            args_r = [real[id(a)] if isinstance(a, torch.Tensor) else a for a in args]
            kwargs_r = {k: real[id(v)] if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            out = kwargs_r["out"]
            whole = torch.empty(0, dtype=out.dtype).set_(out.untyped_storage())
            before = whole.clone()
            layout = (out.shape, out.stride(), out.storage_offset())
            fn(*args_r, **kwargs_r)
            by_kernel = whole.clone()
            kept = (out.shape, out.stride(), out.storage_offset()) == layout  # (linear's kernel re-strides out)
            whole.copy_(before)
            out = whole.as_strided(*layout)
            out.copy_(fn(*args_r, **{k: v for k, v in kwargs_r.items() if k != "out"}))
            verdict = kept and torch.equal(by_kernel.view(torch.uint8), whole.view(torch.uint8))
        except Exception:  # noqa: BLE001 - either way raising: dynamo's own handling (a graph break) decides
            verdict = False
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
    require(require_module("torch._dynamo.variables"), "ConstantVariable")
    require(require_module("torch._dynamo.variables"), "SymNodeVariable")

    def rewritten(self: Any, tx: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """The call as op + copy_, or None where dynamo's own handling applies (module docstring)."""
        out_vt = kwargs.get("out")
        if out_vt is None or not out_vt.is_tensor() or not applies(NAME, tx):
            return None
        out = _fake(out_vt)
        if not isinstance(out, torch.Tensor) or torch._prims_common.is_contiguous_or_false(out):
            return None  # (contiguous: dynamo's own handling is right)
        found = _arguments(args, kwargs)
        if found is None or out.requires_grad or _draws_random(self.value):
            return None
        others = [
            a for a in (*found[0], *(v for k, v in found[1].items() if k != "out")) if isinstance(a, torch.Tensor)
        ]
        if _overlaps(out, others) or not _eager_fills(self.value, *found):
            return None
        # An argument that is out's very elements: also checked on memory of its own, which a later call may give it
        # where it came from another input (keep_out_overlaps then runs the call eagerly only if they share memory).
        if any(_same_place(a, out) for a in others) and not _eager_fills(self.value, *found, alias=False):
            return None
        rest = {k: v for k, v in kwargs.items() if k != "out"}
        result = call(self, tx, args, rest)
        value = _fake(result) if result.is_tensor() else None
        if (
            not isinstance(value, torch.Tensor)
            or value.shape != out.shape
            or value.dtype != out.dtype
            or value.device != out.device
            or value.requires_grad
        ):
            return None  # (the node traced above is unused: dynamo's own call below breaks the graph before it)
        copied = out_vt.call_method(tx, "copy_", [result], {})
        copied.as_proxy().node.meta[OUT_COPY] = True
        return out_vt

    @functools.wraps(call)
    def call_function(self: Any, tx: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        result = rewritten(self, tx, args, kwargs) if type(self) is cls else None
        return call(self, tx, args, kwargs) if result is None else result

    replace_method(cls, "call_function", call, call_function)


def _storage(node: Any) -> Any:
    value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return value.untyped_storage()._cdata if isinstance(value, torch.Tensor) else None


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
            op, out = node.args[1], node.args[0]
            outs = roots(out)
            # An argument that was out's very elements, made from the same inputs, stays so on every call (the same
            # view ops of the same inputs: dynamo guards their layouts); the check was made for it (_eager_fills).
            # (One input only: inputs sharing memory at the traced call may share it otherwise at a later one.)
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


def _restored(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of `gm` with each marked copy turned back into the call dynamo traced: `op(..., out=out)`."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node in list(graph.find_nodes(op="call_method", target="copy_")):
        if node.meta.get(OUT_COPY):
            op = node.args[1]
            with graph.inserting_before(node):
                call = graph.call_function(op.target, op.args, {**op.kwargs, "out": node.args[0]})
            node.replace_all_uses_with(call)
            graph.erase_node(node)
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
    from ..errors import OverlapFallbackWarning, UnsupportedError

    eager: list[fx.GraphModule] = []

    def checked(*args: Any) -> Any:
        ids = lambda ps: {args[i].untyped_storage()._cdata for i in ps if isinstance(args[i], torch.Tensor)}
        if not any(ids(outs) & ids(ins) for outs, ins in pairs):
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
