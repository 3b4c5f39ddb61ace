"""Run-time checks that keep a failing call from touching the caller's tensors, and eager's own answers to
what its kernels check.

Shapes, dtypes and overlap are checked when tracing; what can still fail at run time is an index out of
range in an indexed write (`index_put_`, `index_copy_`, `scatter_`...). Eager may then have written part of
its input before raising. dealias checks the indices of every indexed write into the caller's memory before
the first such write, and raises eager's error with the inputs left as they were.

Which indices an op accepts and what it raises differ from op to op (`index_fill_` takes -1, `index_copy_`
does not; `scatter_` raises RuntimeError, `index_put_` IndexError). Rather than keep a table, dealias asks
eager when compiling (`probe`): the op runs on zero-filled memory laid out like its traced arguments.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from ..compat import warns
from ..errors import UnsupportedError, mark_refused, node_location, with_location
from .draws import kept_rng
from .opfacts import OpKind, bind_args, facts, has_effect, is_view_node

aten = torch.ops.aten


_PROBE_LIMIT = 1 << 24  # bytes of memory a probe may allocate


class NoProbe(Exception):
    pass


class _Memory:
    """Zero-filled memory laid out like traced (fake) tensors: each storage once, every tensor at its own offset
    and strides, so aliasing between them is kept. Raises NoProbe where nothing can be learned: memory larger
    than _PROBE_LIMIT, or symbolic."""

    def __init__(self, at_hints: bool = False) -> None:
        self.buffers: dict[Any, torch.Tensor] = {}
        # Symbolic sizes at their values in the compiling call: only for questions whose answer does not depend
        # on the sizes (which error an out-of-range index raises), never for how an op treats overlapping memory.
        self.at_hints = at_hints

    def like(self, t: torch.Tensor, sparse: bool = False) -> torch.Tensor:
        """`sparse`: memory over the limit is taken from the allocator unfilled (fresh pages, which the system
        gives only where they are written, read as zeros), for an op that touches only the elements an index
        names (`buf[idx] = v` into a replay buffer of hundreds of MB); whether that op raises must not depend on
        this memory's values (it is none of its index arguments)."""
        storage = t.untyped_storage()
        nbytes, offset = concrete(storage.nbytes(), self.at_hints), concrete(t.storage_offset(), self.at_hints)
        shape, stride = [concrete(n, self.at_hints) for n in t.shape], [concrete(n, self.at_hints) for n in t.stride()]
        if nbytes > _PROBE_LIMIT and not sparse:
            raise NoProbe
        key = StorageWeakRef(storage)
        if key not in self.buffers:
            try:
                fresh = torch.empty(nbytes, dtype=torch.uint8) if nbytes > _PROBE_LIMIT else None
            except RuntimeError:  # (more than the machine has)
                raise NoProbe from None
            self.buffers[key] = torch.zeros(nbytes, dtype=torch.uint8) if fresh is None else fresh
        out = torch.empty(0, dtype=t.dtype)
        return out.set_(self.buffers[key].untyped_storage(), offset, shape, stride)


def concrete(x: Any, at_hints: bool = True) -> Any:
    """`x`, a symbol given its value in the compiling call where `at_hints` (a probe handed the symbol itself would
    specialize it: a guard `pos == 7`, a compile per position); NoProbe for a symbol otherwise, or one without a
    value (data-dependent)."""
    if not isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return x
    hint = x.node.hint if at_hints else None
    if not isinstance(hint, (int, float, bool)):
        raise NoProbe
    return hint


def _run_quietly(node: fx.Node, *calls: tuple[Any, Any]) -> None:
    """Run `node`'s op on each (args, kwargs), without grad, warnings, or moving the program's random generator."""
    with kept_rng(node.graph.owning_module, calls), torch.no_grad(), warns.ignored():
        for args, kwargs in calls:
            node.target(*args, **kwargs)


def probe(
    node: fx.Node, replace: dict[fx.Node, torch.Tensor] | None = None, at_hints: bool = False, sparse: bool = False
) -> Exception | None:
    """Run `node`'s op eagerly on zero-filled memory laid out like its traced arguments (`_Memory`; symbolic sizes
    at their values in the compiling call where `at_hints`; memory over the limit unfilled where `sparse`, for an
    op taking positions from its index arguments, which stay zero-filled), with the arguments in `replace` given
    real values; return what it raises (None if it returns). Raises NoProbe where nothing can be learned."""
    memory = _Memory(at_hints)
    replace = replace or {}
    indices = {i for i, _, _ in index_args(node)} if sparse else set()

    def value(n: fx.Node) -> Any:
        if n in replace:
            return replace[n]
        t = n.meta.get("val")
        return memory.like(t, sparse and n not in indices) if isinstance(t, torch.Tensor) else concrete(t, at_hints)

    call = pytree.tree_map_only(fx.Node, value, (node.args, node.kwargs))
    try:
        _run_quietly(node, call)
    except Exception as e:  # noqa: BLE001 - eager's answer, whatever it is
        return e
    return None


def metadata_error(node: fx.Node, at_hints: bool = False) -> Exception | None:
    """What `node`'s op raises whatever its arguments' values (their dtypes, sizes, devices and the op's constants
    decide it), asked of eager: `probe` on zeros, and, if that raises, again on each of `_FILLS` (ones; large
    integers and random floats; integers rising through memory), where it must raise alike; None if it does not.
    Zeros are values too: an integer division by zero, a singular matrix, pivots `lu_unpack` refuses (ones are
    valid pivots); kernels check metadata before they read a value. An op taking positions from an index may run
    on memory over the probe's limit (`_Memory.like`'s `sparse`), left unfilled on every run. Raises NoProbe."""
    indices = {i for i, _, _ in index_args(node)}
    sparse = bool(indices)
    error = probe(node, at_hints=at_hints, sparse=sparse)
    if error is None:
        return None
    for fill in _FILLS:
        memory, gen = _Memory(at_hints), torch.Generator().manual_seed(0)
        others: dict[fx.Node, torch.Tensor] = {}
        for a in pytree.tree_leaves((node.args, node.kwargs)):
            t = a.meta.get("val") if isinstance(a, fx.Node) else None
            if not isinstance(t, torch.Tensor) or a in others:
                continue
            real = memory.like(t, sparse and a not in indices)  # (aliasing between the arguments kept)
            if real.untyped_storage().nbytes() <= _PROBE_LIMIT:  # (over it: unfilled, or every page is allocated)
                real.copy_(fill(real, gen))
            others[a] = real
        again = probe(node, replace=others, at_hints=at_hints, sparse=sparse)
        if type(again) is not type(error) or str(again) != str(error):
            return None
    return error


def _ones(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.ones_like(t)


def _large(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random floats; large integers (an index out of range, if it is one: an op checking values first shows)."""
    if t.is_floating_point() or t.is_complex():
        return torch.randn(t.shape, generator=gen, dtype=t.dtype)
    return torch.full_like(t, True if t.dtype == torch.bool else min(1 << 20, torch.iinfo(t.dtype).max))


def _rising(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Distinct values rising through the tensor (a permutation, sorted offsets), True and False in turn."""
    values = torch.arange(t.numel()).reshape(t.shape)
    return (values % 2).bool() if t.dtype == torch.bool else values.to(t.dtype)


_FILLS = (_ones, _large, _rising)


def aliasing_is_benign(node: fx.Node, written: list[fx.Node]) -> bool:
    """Whether eager computes `node`'s op on its aliased arguments (a written tensor also read through another
    argument) exactly as on separate copies of them, which is what the functional program computes. Asked of
    eager on values laid out like the traced arguments (`_Memory`): the op runs once on shared memory and once on
    copies (one per argument), and the written tensors must come out bit-equal, for several fills: random ones
    (masks of several densities: `masked_scatter_(m, x)` on x itself agrees with copies for some masks only), and
    values rising and falling through memory, so that an order-dependent reduction shows (`amax(v, 0,
    out=v[:1])` starts from its identity in v[0]: it agrees with copies on random values whenever v[0] is not
    the largest). False where nothing can be learned."""
    if index_args(node):
        # Which elements it writes, and in which order, are the index's values, which the probe leaves at 0 (valid
        # positions): `x[idx] = x[0:6:2]` writes only x[0] there, agreeing with copies, but with idx = [2, 4, 0]
        # eager reads x[2] after writing it. Not asked: refused.
        return False
    fills = [(seed, density, None) for seed, density in enumerate((0.5, 0.2, 0.8, 0.5))] + [
        (0, 0.5, "rising"),
        (0, 0.5, "falling"),
        (0, 0.5, "special"),
    ]
    return all(_benign_once(node, written, seed, density, order) for seed, density, order in fills)


def with_specials(flat: torch.Tensor) -> torch.Tensor:
    """`flat` (1-D, floating) with infinities and NaNs among its values, in place: a read-after-write multiplied
    by zero (`add(y, x, alpha=0)`, `lerp(.., weight=0)`) agrees with copies on finite values only."""
    flat[1::5], flat[3::7], flat[2::11] = float("inf"), float("nan"), float("-inf")
    return flat


def _benign_once(node: fx.Node, written: list[fx.Node], seed: int, density: float, order: str | None) -> bool:
    memory = _Memory()
    gen = torch.Generator().manual_seed(seed)
    shared: list[tuple[fx.Node, Any]] = []  # per argument, in order: its node and the value it was given
    count = [0]  # values given so far, in an ordered fill: each is distinct

    indices = {i for i, _, _ in index_args(node)}

    def real(n: fx.Node) -> Any:
        t = n.meta.get("val")
        out = memory.like(t) if isinstance(t, torch.Tensor) else t
        if isinstance(t, torch.Tensor) and t.dtype == torch.bool:  # masks: any value is valid
            out.copy_(torch.rand(t.shape, generator=gen) < density)
        elif isinstance(t, torch.Tensor) and n not in indices:  # (index arguments stay 0: valid positions)
            # Integers and complex numbers too: on zeros a cascade (`x.add_(x[:, 3:4])` on int64 reads the
            # doubled column) computes the zeros copies compute, and the op would be wrongly called benign.
            if order in (None, "special") and (t.is_floating_point() or t.is_complex()):
                values = torch.randn(t.shape, generator=gen, dtype=t.dtype)
            elif order in (None, "special"):  # (from 1, below every integer type's maximum: no division by zero)
                values = torch.randint(1, 100, t.shape, generator=gen).to(t.dtype)
            else:
                values = torch.arange(count[0] + 1, count[0] + 1 + t.numel()).reshape(t.shape)
                values = (values if order == "rising" else -values).to(t.dtype)
                count[0] += t.numel()
            out.copy_(values)
        shared.append((n, out))
        return out

    def written_of(call: tuple[Any, Any]) -> list[torch.Tensor]:
        # (By the written argument's position: a node given twice, `cumsum(x, 0, out=x)`, is read through one
        # position and written through the other, and only the latter's copy is written in the run on copies.)
        bound = bind_args(node.target._schema, *call)
        leaves = [a for name in facts(node.target).mutated for a in pytree.tree_leaves(bound.get(name))]
        return [a for a in leaves if isinstance(a, torch.Tensor)]

    try:
        call = pytree.tree_map_only(fx.Node, real, (node.args, node.kwargs))
        if order == "special":  # (in the written tensors' memory only: elsewhere they would mask what is read there)
            for n in written:
                t = n.meta.get("val")
                if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
                    with_specials(torch.empty(0, dtype=t.dtype).set_(memory.like(t).untyped_storage()))
        copied = [v.clone() if isinstance(v, torch.Tensor) else v for _, v in shared]  # after every fill
        it = iter(copied)
        copies = pytree.tree_map_only(fx.Node, lambda n: next(it), (node.args, node.kwargs))
        _run_quietly(node, call, copies)
        pairs = list(zip(written_of(call), written_of(copies)))
        return bool(pairs) and all(
            torch.equal(a, b) or torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)  # bit-equal, NaN too
            for a, b in pairs
        )
    except Exception:  # noqa: BLE001 - nothing learned: not benign
        return False


@dataclass(frozen=True)
class IndexPolicy:
    """What eager does with an out-of-range index of one indexed write: whether negative indices address from
    the end, and the error it raises (`{bad}` in the message stands for the index)."""

    allow_negative: bool
    error: type[Exception] = IndexError
    message: str = "index {bad} is out of bounds for dimension {dim} with size {size}"
    ignored: int | None = None  # a value eager skips wherever it is (nll_loss's ignore_index)


def index_policy(node: fx.Node, index: fx.Node, allow_negative: bool) -> IndexPolicy:
    """Eager's policy for `index` of the write `node`, learned by probing it with -1 and with an index past the
    end; where it cannot be probed, `allow_negative` and IndexError."""
    val = index.meta.get("val")
    try:
        # (What an op raises on an index out of range does not depend on the sizes: symbols at their values.)
        others = {
            a: torch.zeros([concrete(n) for n in a.meta["val"].shape], dtype=a.meta["val"].dtype)
            for a in _index_nodes(node)
            if a is not index
        }
        if not isinstance(val, torch.Tensor) or concrete(val.numel()) == 0:
            raise NoProbe
        shape = [concrete(n) for n in val.shape]
        negative = probe(node, {**others, index: torch.full(shape, -1, dtype=val.dtype)}, at_hints=True)
        bad = 1_000_003  # past any traced size, and a number no message contains otherwise
        past = probe(node, {**others, index: torch.full(shape, bad, dtype=val.dtype)}, at_hints=True)
    except NoProbe:
        return IndexPolicy(allow_negative)
    if past is None or not isinstance(past, (IndexError, RuntimeError)):
        return IndexPolicy(allow_negative)
    message = (
        (str(past).strip().splitlines() or [""])[0]
        .replace(str(bad), "{bad}")
        .replace("{", "{{")
        .replace("}", "}}")
        .replace("{{bad}}", "{bad}")
    )
    # The size eager names is the checked dimension's, which differs between calls where it is symbolic.
    message = re.sub(r"with size \d+", "with size {size}", message)
    ignored = bind_args(node.target._schema, node.args, node.kwargs, defaults=True).get("ignore_index")
    return IndexPolicy(negative is None, type(past), message, ignored if isinstance(ignored, int) else None)


def _check(index: torch.Tensor, size: int, dim: int, policy: IndexPolicy, where: str) -> None:
    """Raise eager's error for this write if an entry of `index` does not address dimension `dim` of size
    `size`; `where` names the op and the user's line."""
    n = index.numel()
    if n == 0:
        return
    lo = -size if policy.allow_negative else 0
    if n == 1:  # one position (a decode step): `.item()` is the cheapest read
        small = large = index.item()
    elif n <= 64:  # a few positions: a host list is cheaper than two reductions
        # (`tolist()` of the index as it is, its rows joined in Python: a `reshape(-1)` first made a tensor and cost
        # more than the read, ~6 us of a GPT-2 call between its kernels)
        values = index.tolist()
        for _ in range(index.dim() - 1):
            values = [v for row in values for v in row]
        small, large = min(values), max(values)
    else:
        small, large = (int(v) for v in torch.aminmax(index))
    if small < lo or large >= size:
        flat = index.reshape(-1)  # (eager's kernels name the first entry out of range, in order)
        out = (flat < lo) | (flat >= size)
        if policy.ignored is not None:
            out &= flat != policy.ignored
        if out.any():
            bad = int(flat[out][0])
            raise policy.error(policy.message.format(bad=bad, dim=dim, size=size) + where)


def bounds_check(policy: IndexPolicy, where: str, refuses: bool = False) -> Any:
    """`check(index, size, dim)` for one write: a function of its own (the graph calls it by name), carrying
    that write's policy and location. `refuses`: nothing observable precedes it in its graph, so its error is
    marked (`mark_refused`)."""

    def check_index_bounds(index: torch.Tensor, size: int, dim: int) -> None:
        try:
            _check(index, size, dim, policy, where)
        except BaseException as e:
            if refuses:
                mark_refused(e)
            raise

    check_index_bounds.policy = policy  # type: ignore[attr-defined]  # (the prologue's inline reads: prologue.py)
    check_index_bounds._dealias_effect = True  # type: ignore[attr-defined]
    check_index_bounds._dealias_bounds_check = True  # type: ignore[attr-defined]
    return check_index_bounds


def is_bounds_check(target: Any) -> bool:
    """Whether a graph target is a bounds check made by `bounds_check`."""
    return bool(getattr(target, "_dealias_bounds_check", False))


_INDEXED = ("aten::index_put_", "aten::_index_put_impl_", "aten::index_copy_", "aten::index_add_", "aten::index_fill_")


def indexed_write(op: Any) -> bool:
    """An in-place op writing at positions an index tensor gives (bounds-checked by `guard_index_writes`)."""
    name = op._schema.name if isinstance(op, torch._ops.OpOverload) else ""
    return name in (*_INDEXED, "aten::index_reduce_") or (name.startswith("aten::scatter") and name.endswith("_"))


def index_args(node: fx.Node) -> list[tuple[fx.Node, int, bool]]:
    """(index tensor, dimension of the first argument it addresses, negative allowed) of an op that takes
    positions from an index tensor: the indexed writes (in place, and functional into a tensor the graph made), and
    the reads `embedding`, `index_select`, `gather` and `x[idx]` (aten.index). Empty for other ops, and for boolean
    masks (their shape was checked when tracing)."""
    name = node.target._schema.name if isinstance(node.target, torch._ops.OpOverload) else ""
    args = node.args
    if name in ("aten::index_put_", "aten::_index_put_impl_", "aten::index_put", "aten::index"):
        indices = args[1]
        if any(isinstance(i, fx.Node) and i.meta["val"].dtype in (torch.bool, torch.uint8) for i in indices):
            return []
        return [(i, d, True) for d, i in enumerate(indices) if isinstance(i, fx.Node)]
    if name.removesuffix("_") in ("aten::index_copy", "aten::index_add", "aten::index_fill", "aten::index_reduce"):
        return [(args[2], args[1], False)]
    if name.startswith(("aten::scatter", "aten::scatter_add_", "aten::scatter_reduce_")):
        return [(args[2], args[1], False)]
    if name in ("aten::index_select", "aten::gather") and isinstance(args[2], fx.Node):
        return [(args[2], args[1], False)]
    if name == "aten::embedding":
        return [(args[1], 0, False)]
    if name in ("aten::nll_loss_forward", "aten::nll_loss2d_forward"):  # a class per target (ignore_index aside)
        return [(args[1], 1 if args[0].meta["val"].dim() >= 2 else 0, False)]
    return []


def _index_nodes(node: fx.Node) -> list[fx.Node]:
    return [i for i, _, _ in index_args(node)]


def _root(node: Any) -> Any:
    while isinstance(node, fx.Node) and node.op == "call_function" and node.args:
        node = node.args[0]
    return node


def guard_index_writes(graph: fx.Graph, roots: list[fx.Node | None]) -> None:
    """Insert bounds checks for the indexed writes into caller memory (`roots`) before the first write into
    caller memory, or, for indices known only after it, right before their own write. Known before it: an index
    computed before the first write whose memory no write from the first on touches (not `c` in `c.add_(1);
    cache.index_copy_(0, c, v)`, whose check before the write read c's old value: eager's error where eager wrote
    and passed, and none where it raised), or views of one (their nodes copied before it). A read that raises on its
    index (`index_args`: `cache[pos]`, `gather`) between the first write and such a moved check has its check moved
    too, in graph order: eager raises the read's error first (HF's static cache writes its count before the
    positions computed from it are used)."""
    roots = {r for r in roots if r is not None}
    writes = [n for n in graph.nodes if n.op == "call_function" and _is_write(n) and _root(n.args[0]) in roots]
    if not writes:
        return
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    first = writes[0]
    written = [n for n in nodes[order[first] :] if n.op == "call_function" and _is_write(n)]

    def early(index: fx.Node, op: fx.Node) -> fx.Node | None:
        """`index` as a node before `first` with the value it has at `op`, or None."""
        base = index
        while is_view_node(base) and order[base] > order[first]:
            if any(isinstance(a, fx.Node) for a in pytree.tree_leaves((base.args[1:], base.kwargs))):
                return None
            base = base.args[0]
        memory = _view_base(base)
        if order[base] > order[first] or any(_view_base(w.args[0]) is memory for w in written if order[w] < order[op]):
            return None
        if base is index:
            return index
        chain = []
        while index is not base:
            chain.append(index)
            index = index.args[0]
        copied = base
        with graph.inserting_before(first):
            for n in reversed(chain):  # (views: no data read, so the same view before the write)
                copied = graph.node_copy(n, lambda a, src=n.args[0], new=copied: new if a is src else a)
        return copied

    # Checks before `first` whose graph has done nothing observable before it (no write, draw, island, custom op):
    # their error is marked, and the graph runs eagerly instead, for eager's writes before the failing op.
    quiet = all(_quiet(n) for n in nodes[: order[first]])
    moved = [w for w in writes if any(order[index] < order[first] for index, _, _ in index_args(w))]
    last = order[moved[-1]] if moved else -1
    done: set[tuple[Any, ...]] = set()
    stands_for: dict[fx.Node, int] = {}  # a check moved before `first` -> the graph position of its op
    for n in nodes[order[first] : last + 1]:
        if n.op != "call_function" or _is_write(n) or not index_args(n):
            continue
        read = n.args[0].meta["val"]
        for index, dim, neg in index_args(n):
            size = read.shape[dim] if read.dim() > 0 else 1
            if isinstance(size, torch.SymInt) and order[n.args[0]] > order[first]:
                continue  # (known only after the first write: checked where it is)
            at = early(index, n)
            if at is not None:
                stands_for[_insert_check(graph, first, n, index, at, size, dim, neg, quiet)] = order[n]
    for w in writes:
        for index, dim, neg in index_args(w):
            size = w.args[0].meta["val"].shape[dim] if w.args[0].meta["val"].dim() > 0 else 1  # (0-d: one element)
            if (index, str(size), dim, neg) in done:
                continue
            done.add((index, str(size), dim, neg))
            at = early(index, w) if order[index] < order[first] else None
            anchor = first if at is not None else w
            if isinstance(size, torch.SymInt) and order[w.args[0]] > order[anchor]:
                raise UnsupportedError("an index bound of symbolic size known only after the first write")
            refuses = quiet and anchor is first
            check = _insert_check(graph, anchor, w, index, at if at is not None else index, size, dim, neg, refuses)
            stands_for[check] = order[w]
    if last >= 0:  # (moved read checks and write checks interleave in graph order: sort those before `first`)
        _order_moved_checks(first, stands_for)


def _quiet(n: fx.Node) -> bool:
    """Whether `n` has done nothing a caller can see once the call raised: no call, an aten op without effect
    (no write, no draw), an aten op writing in place only memory the graph made (the torch executor's `arange.add_(c)`),
    a bounds check, or a getitem / size arithmetic. Anything else (an island, a custom op, a helper) is not."""
    if n.op in ("placeholder", "get_attr", "output"):
        return True
    target = n.target
    if n.op != "call_function":  # (a method or module call: not known to be without effect)
        return False
    if isinstance(target, torch._ops.OpOverload):
        if target.namespace != "aten" or facts(target).nondeterministic:
            return False
        if facts(target).kind is OpKind.INPLACE and isinstance(n.args[0], fx.Node):
            return _made_here(_view_base(n.args[0]))
        return not has_effect(target)
    return is_bounds_check(target) or target is operator.getitem or target in _SIZE_ARITHMETIC


def _made_here(base: fx.Node) -> bool:
    """Whether `base` is memory a functional aten op of the graph allocated (not a caller's tensor, which a helper
    such as `caller_tensor` may stand for)."""
    target = base.target
    return (
        base.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and target.namespace == "aten"
        and facts(target).kind is OpKind.FUNCTIONAL
    )


_SIZE_ARITHMETIC = frozenset(
    (operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg, torch.sym_int)
)


def _view_base(n: Any) -> Any:
    """The tensor whose memory `n` views (itself if not a view)."""
    while is_view_node(n):
        n = n.args[0]
    return n


def _insert_check(
    graph: fx.Graph,
    anchor: fx.Node,
    op: fx.Node,
    index: fx.Node,
    at: fx.Node,
    size: Any,
    dim: int,
    neg: bool,
    refuses: bool = False,
) -> fx.Node:
    """A bounds check of `op`'s argument `index` (eager's error for it), of its value `at`, inserted before
    `anchor`; a symbolic size read from the tensor `op` indexes. `refuses`: see bounds_check."""
    with graph.inserting_before(anchor):
        if isinstance(size, torch.SymInt):  # read from the indexed tensor when it is symbolic
            val = size
            size = graph.call_function(torch.ops.aten.sym_size.int, (op.args[0], dim))
            size.meta["val"] = val
        policy = index_policy(op, index, neg)
        where = with_location(f" ({op.target})", node_location(op))
        check = graph.call_function(bounds_check(policy, where, refuses), (at, size, dim))
        # The op's own line (the check stands for it in traces), and its value: it returns nothing.
        check.meta.update(val=None, stack_trace=op.meta.get("stack_trace"))
    return check


def _order_moved_checks(first: fx.Node, stands_for: dict[fx.Node, int]) -> None:
    """The checks inserted before `first` (reads' and writes'), each after its symbolic size's read, put in the graph
    order of the ops they stand for."""
    groups: list[list[fx.Node]] = []
    n = first.prev
    while n in stands_for or (n.target is torch.ops.aten.sym_size.int and groups and n.users.keys() <= {groups[-1][0]}):
        if n in stands_for:
            groups.append([n])
        else:
            groups[-1].insert(0, n)
        n = n.prev
    for group in sorted(groups, key=lambda g: stands_for[g[-1]]):
        for m in group:
            first.prepend(m)


def _is_write(n: fx.Node) -> bool:
    t = n.target
    return isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable


def inplace_layout(func: Any, args: tuple[Any, ...]) -> tuple[list[int], list[int]] | None:
    """`self`'s sizes and strides before the in-place op `func` runs on it (not a metadata change: `t_`,
    `squeeze_`), for `empty_inplace_error` after it; None for other ops, or sizes that are not all ints."""
    if not isinstance(func, torch._ops.OpOverload) or torch.Tag.inplace_view in func.tags:
        return None
    if facts(func).kind is not OpKind.INPLACE or not args or not isinstance(args[0], torch.Tensor):
        return None
    sizes, strides = list(args[0].shape), list(args[0].stride())
    return (sizes, strides) if all(type(n) is int for n in (*sizes, *strides)) else None


def empty_inplace_error(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], layout: Any) -> Exception | None:
    """Eager's error for the in-place op `func` on an empty `self` (of `layout`, `inplace_layout`), which fake
    tensors just ran: meta kernels resize an empty output to the operands' broadcast shape (`x` of [0, 1, 3],
    `x.atan2_(y)` with `y` of [0, 10, 3]; their cache of results gives that shape without resizing), where eager's
    kernels raise "output with shape [0, 1, 3] doesn't match the broadcast shape [0, 10, 3]". Asked of eager on
    zeros of the same layouts, `self`'s as it was (empty: cheap); None if eager accepts, `self` is not empty, or
    nothing can be learned."""
    if layout is None or 0 not in layout[0]:
        return None
    self_t = args[0]

    def real(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if t.device.type != "cpu" or any(type(n) is not int for n in (*t.shape, *t.stride())):
            raise NoProbe
        sizes, strides = layout if t is self_t else (list(t.shape), list(t.stride()))
        if sum((n - 1) * s for n, s in zip(sizes, strides) if n) * t.element_size() > _PROBE_LIMIT:
            raise NoProbe
        return torch.empty_strided(sizes, strides, dtype=t.dtype).zero_()

    # (Called from inside a dispatch mode while fake tensors trace: the modes are set aside so that this runs
    # eager's kernels on real tensors.)
    with _disable_current_modes(), torch.no_grad(), warns.ignored(), kept_rng(args, kwargs):
        try:
            call = pytree.tree_map(real, (args, kwargs))
            func(*call[0], **call[1])
        except NoProbe:
            return None
        except Exception as e:  # noqa: BLE001 - eager's answer
            return e
    return None
