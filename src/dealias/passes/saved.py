"""Tensors saved for backward, then written in place: eager's backward refuses them.

When a differentiable op saves a tensor for its backward (mul saves its factors, relu its result) and the
program then writes that tensor's memory in place, eager's backward raises "one of the variables needed for
gradient computation has been modified by an inplace operation". dealias's functional program never modifies a
saved value, so its backward would return a gradient where eager raises: code developed under dealias would
break without it. This pass finds such programs when compiling; the op's result is then compiled behind a node
raising eager's own error (its message asked of eager's run of the graph: stale.py) where a backward reaches it,
or, where that message cannot be asked, the graph runs eagerly.

Which arguments (or result) an op saves is asked of eager: the op runs once on zero-filled tensors of the traced
sizes and strides (meta tensors where real ones cannot be used), and its grad_fn's saved tensors are matched to
them. Only ops that read a storage the program later writes are asked, so programs without such writes cost
nothing. Where eager cannot be asked, the graph runs eagerly.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree

from ..compat import saved_hooks
from ..errors import EagerRaisesError, UnsupportedError, node_location, with_location
from ..ir.checks import NoProbe, concrete
from ..ir.draws import kept_rng
from ..ir.emitter import differentiable
from ..ir.opfacts import OWN_COUNTER_KEY, OpKind, bind_args, facts, is_view_node
from ..ir.plan import StorageKind
from .alias import AliasInfo, Storage, Value
from .stale import eager_messages

# node meta: (eager's message at backward, the EagerRaisesError to fall back on, (a caller's storage the saved
# tensor is of, its version at this compile) or None)
STALE_KEY = "dealias_stale_saved"

_PROBE_LIMIT = 1 << 24  # bytes of zero-filled arguments a probe may allocate


def refuse_saved_then_written(
    gm: fx.GraphModule, info: AliasInfo, requires_grad: list[bool], tensors: list[Any] | None = None
) -> None:
    """Find the ops whose tensor saved for backward is written in place afterwards, or by the op itself
    (`x.mul_(x)` saves `x` as its other factor): eager's backward raises if it reaches their node. Each is marked
    to raise eager's error there (_raise_at_backward, asked of eager's run of `gm` on copies of the call's
    `tensors`); where that cannot be asked, raise EagerRaisesError (the graph runs eagerly)."""
    if not any(requires_grad) or not torch.is_grad_enabled() and not _switches_grad_on(gm):
        return
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]
    writes = {n: written_storages(n, info) for n in nodes}
    written_later: set[Storage] = set()
    later: dict[fx.Node, set[Storage]] = {}
    for n in reversed(nodes):  # which storages are written after each node
        later[n] = set(written_later)
        written_later |= writes[n]
    if not written_later:
        return
    rg = _requires_grad(gm, info, requires_grad)
    stale: dict[fx.Node, EagerRaisesError] = {}
    stale_storage: dict[fx.Node, Storage] = {}  # the memory of the tensor each saved
    for i, n in enumerate(nodes):
        if not n.meta.get("grad", True) or not rg.get(n):
            continue
        args = [x for x in pytree.tree_leaves((n.args, n.kwargs)) if isinstance(x, fx.Node)]
        candidates = [x for x in args if isinstance(v := info.values.get(x), Value) and v.storage in later[n]]
        result = info.values.get(n)
        if isinstance(result, Value) and result.storage in later[n]:
            candidates.append(n)
        for u in n.users:  # the results of a multi-output op (`vals, idx = x.topk(k)`, then `idx += 1`)
            if u.target is operator.getitem and isinstance(v := info.values.get(u), Value) and v.storage in later[n]:
                candidates.append(u)
        if not candidates and not _saves_what_it_writes(n, writes[n], args, info):
            continue
        try:
            saved, own = _saved(n, rg, candidates, bool(writes[n]))
        except UnknownSaved as e:
            raise UnknownSaved(
                with_location(f"{e}, and the program writes what it reads later", node_location(n))
            ) from None
        if own:
            writer = n
        elif saved:
            v = info.values[saved[0]]
            writer = next(w for w in nodes[i + 1 :] if v.storage in writes[w])
        else:
            continue
        if not own and _through_own_counter(writer, info.values[saved[0]].storage, info):
            raise UnsupportedError(
                with_location(
                    f"{n.target} saves a tensor for backward that {writer.target} then modifies in place through "
                    "an alias with a version counter of its own, as `x.data` "
                    f"(at {node_location(writer) or writer.target}): "
                    "eager's backward does not raise and reads the modified values, which dealias's graph does "
                    "not keep",
                    node_location(n),
                )
            )
        stale_storage[n] = info.values[n.args[0] if own else saved[0]].storage
        stale[n] = EagerRaisesError(
            with_location(
                f"{n.target} saves a tensor for backward that {writer.target} "
                f"{'itself modifies' if own else 'then modifies'} in place (at "
                f"{node_location(writer) or writer.target}); eager's backward raises: one of the variables "
                "needed for gradient computation has been modified by an inplace operation",
                node_location(n),
            )
        )
    if stale and saved_hooks.in_force():
        n = next(iter(stale))
        raise UnsupportedError(
            with_location(
                f"{n.target} saves a tensor for backward that the program then modifies in place, under "
                "saved_tensors_hooks: eager's backward does not raise and reads what the unpack hook gives, which "
                "dealias's graph does not keep",
                node_location(n),
            )
        )
    if stale:
        _raise_at_backward(gm, info, stale, stale_storage, tensors)


def _raise_at_backward(
    gm: fx.GraphModule,
    info: AliasInfo,
    stale: dict[fx.Node, EagerRaisesError],
    storages: dict[fx.Node, Storage],
    tensors: list[Any] | None,
) -> None:
    """Compile the ops whose saved tensors go stale as if they saved nothing stale, their results behind a node
    raising eager's error at backward (meta STALE_KEY, read by the functionalizer: gradops.stale_saved), with
    the message eager's run of the graph raises (stale.eager_messages). An op whose message eager's run does not
    give raises here: the graph runs eagerly."""
    messages = eager_messages(gm, tensors, list(stale)) if tensors is not None else {}
    for n, error in stale.items():
        if n not in messages:
            raise error
    for n, error in stale.items():
        s = storages[n]
        # Of a caller's tensor, eager's versions count from its counter at the call: the message is for the
        # version it had at this compile, and the compiled graph adds the difference (gradops.stale_saved).
        version = _callers_version(gm, info, s, tensors)
        caller = (s, version) if version is not None else None
        n.meta[STALE_KEY] = (messages[n], error, caller)


def _callers_version(gm: fx.GraphModule, info: AliasInfo, s: Storage, tensors: list[Any] | None) -> int | None:
    """The version at this call of caller's memory `s`: a tensor input's, or an alias group's (its members are
    views of one tensor, the eager run made sure: one counter, which the group's base placeholder shares)."""
    if tensors is None:
        return None
    if s.kind is StorageKind.INPUT:
        return tensors[s.index]._version
    if s.kind is StorageKind.GROUP:
        for ph in gm.graph.find_nodes(op="placeholder"):
            v = info.values.get(ph)
            if isinstance(v, Value) and v.storage is s:
                return tensors[info.input_index[ph]]._version
    return None


def _through_own_counter(writer: fx.Node, storage: Storage, info: AliasInfo) -> bool:
    """Whether `writer` writes `storage` only through aliases with version counters of their own (`x.data`, an
    `unsafe_chunk` element): eager's write then leaves the counter autograd checks saved tensors against."""
    bound = bind_args(writer.target._schema, writer.args, writer.kwargs)
    written = [
        x
        for name in facts(writer.target).mutated
        for x in pytree.tree_leaves(bound.get(name))
        if isinstance(x, fx.Node) and isinstance(v := info.values.get(x), Value) and v.storage == storage
    ]
    return bool(written) and all(_own_counter_chain(x) for x in written)


def _own_counter_chain(x: fx.Node) -> bool:
    while is_view_node(x):
        if x.meta.get(OWN_COUNTER_KEY) or isinstance(x.target, torch._ops.OpOverload) and facts(x.target).own_counter:
            return True
        x = x.args[0]
    return False


def _saves_what_it_writes(n: fx.Node, written: set[Storage], args: list[fx.Node], info: AliasInfo) -> bool:
    """Whether an op writing `written` also reads one of those storages through another argument (`x.mul_(x)`,
    `v.mul_(v)` on a view): then its own write may invalidate what it saved. Asked of eager (see _saved)."""
    if not written:
        return False
    seen = [info.values[x].storage for x in args if isinstance(info.values.get(x), Value)]
    return any(seen.count(s) > 1 for s in written)


def saves_its_result(node: fx.Node) -> bool:
    """Whether eager's backward of in-place op `node`, run on tensors that require grad, saves its result."""
    args = [x for x in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(x, fx.Node)]
    found, _ = _saved(node, dict.fromkeys(args, True), [node], False)
    return node in found


def _switches_grad_on(gm: fx.GraphModule) -> bool:
    return any(n.meta.get("grad") for n in gm.graph.nodes if n.op == "call_function")


def written_storages(node: fx.Node, info: AliasInfo, metadata: bool = True) -> set[Storage]:
    """The storages `node` writes; with `metadata`, an in-place metadata change (`e.t_()`) counts too: it writes no
    data but moves eager's version counter, which invalidates what autograd saved of the tensor, as a write does."""
    f = facts(node.target)
    if f.kind not in (OpKind.INPLACE, OpKind.OUT, OpKind.MUTABLE, OpKind.INPLACE_VIEW):
        return set()
    if f.kind is OpKind.INPLACE_VIEW and (not metadata or node.target is torch.ops.aten.detach_.default):
        return set()  # (detach_ leaves the version counter alone)
    bound = bind_args(node.target._schema, node.args, node.kwargs)
    out = set()
    for name in f.mutated:
        for x in pytree.tree_leaves(bound.get(name)):
            v = info.values.get(x) if isinstance(x, fx.Node) else None
            if isinstance(v, Value):
                out.add(v.storage)
    return out


def tensor_values(node: fx.Node, info: AliasInfo) -> list[Value]:
    return [
        v
        for x in pytree.tree_leaves((node.args, node.kwargs))
        if isinstance(x, fx.Node) and isinstance(v := info.values.get(x), Value)
    ]


def _requires_grad(gm: fx.GraphModule, info: AliasInfo, requires_grad: list[bool]) -> dict[fx.Node, bool]:
    """Whether each node's result requires grad in eager (per storage: a write with grad on from a tensor that
    requires grad makes the written tensor require it; a factory like `zeros_like(p)` or an integer result never
    does)."""
    storage_rg: dict[Storage, bool] = {}
    out: dict[fx.Node, bool] = {}
    for n in gm.graph.nodes:
        v = info.values.get(n)
        if n.op == "placeholder" and isinstance(v, Value):
            storage_rg[v.storage] = storage_rg.get(v.storage, False) or requires_grad[info.input_index[n]]
            out[n] = storage_rg[v.storage]
        elif n.op == "call_function":
            src = n.args[0] if n.target is operator.getitem and n.args else None
            if isinstance(src, fx.Node) and not isinstance(info.values.get(src), Value):
                # A result of a multi-output op (`x.sort(2).values`): the op's results have no storage of their own
                # here, so it requires grad where the op's result does (and autograd differentiates that result).
                # Taken from its arguments' storages, it was never taken to require grad, and its write after an
                # op saved it (`v.addcdiv_(v, ...)`) went unseen where eager's backward raises (fuzz seed 2474062).
                ins = [out.get(src, False)]
            else:
                ins = [storage_rg.get(x.storage, False) for x in tensor_values(n, info)]
            rg = (
                bool(n.meta.get("grad", True))
                and any(ins)
                and differentiable(n, lambda a: _storage_rg(a, info, storage_rg))
            )
            for s in written_storages(n, info) if isinstance(n.target, torch._ops.OpOverload) else ():
                storage_rg[s] = storage_rg.get(s, False) or rg
            if isinstance(v, Value):
                storage_rg[v.storage] = storage_rg.get(v.storage, False) or rg
                # An in-place op's result, or a view (even one made under no_grad), requires grad if its storage
                # does; a detached view does not.
                rg = storage_rg[v.storage] and n.target is not torch.ops.aten.detach.default
            out[n] = rg
    return out


def _storage_rg(a: fx.Node, info: AliasInfo, storage_rg: dict[Storage, bool]) -> bool:
    v = info.values.get(a)
    return isinstance(v, Value) and storage_rg.get(v.storage, False)


def _saved(
    node: fx.Node, rg: dict[fx.Node, bool], candidates: list[fx.Node], writes: bool
) -> tuple[list[fx.Node], bool]:
    """The nodes among `candidates` (arguments of `node`, `node` itself for its result, or the `getitem`s of its
    results) whose tensors eager's grad_fn for `node` saves; and, for an op that `writes`, whether its own write
    invalidates what it saved (eager's backward of the probe raises). Asked of eager on zero-filled CPU tensors
    of the traced sizes (symbolic ones at their values in this call: what an op saves does not depend on them);
    where that cannot run (over `_PROBE_LIMIT` bytes, another device, an op refusing zeros such as a Cholesky
    factorization), on meta tensors of those sizes, whose autograd saves and checks as eager's does. Raises
    UnknownSaved if neither runs."""
    if facts(node.target).kind is OpKind.OUT:
        # An op writing `out=` records no autograd graph (eager raises if an argument requires grad), so it saves
        # nothing; its probe would raise on the arguments made to require grad.
        return [], False
    for device in ("cpu", "meta"):
        try:
            with saved_hooks.set_aside():  # (the user's pack hooks are not called, eager's version check kept)
                return _probe(node, rg, candidates, writes, device)
        except Exception:  # noqa: BLE001 - this probe cannot run: the next one, or nothing learned
            continue
    raise UnknownSaved(f"eager cannot be asked what {node.target} saves for backward")


def _probe(
    node: fx.Node, rg: dict[fx.Node, bool], candidates: list[fx.Node], writes: bool, device: str
) -> tuple[list[fx.Node], bool]:
    """`_saved`, asked with tensors on `device`; raises where that probe cannot run."""
    real: dict[fx.Node, torch.Tensor] = {}
    leaves: list[torch.Tensor] = []
    bases: dict[Any, torch.Tensor] = {}  # fake storage -> one flat non-leaf tensor standing for it
    # Storages two arguments of a writing op share (only there: an in-place op on a view hides its grad_fn).
    args = dict.fromkeys(x for x in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(x, fx.Node))
    metas = [x.meta.get("val") for x in args]
    keys = [StorageWeakRef(m.untyped_storage()) for m in metas if isinstance(m, torch.Tensor)]
    shared = {k for k in keys if keys.count(k) > 1} if writes else set()

    def make(x: fx.Node) -> Any:
        if x in real:  # the same tensor twice (`x.mul_(x)`)
            return real[x]
        meta = x.meta.get("val")
        if not isinstance(meta, torch.Tensor):
            return concrete(meta)
        shape, stride = [concrete(n) for n in meta.shape], [concrete(n) for n in meta.stride()]
        if device == "cpu" and (meta.device.type != "cpu" or concrete(meta.untyped_storage().nbytes()) > _PROBE_LIMIT):
            raise NoProbe
        floating = meta.dtype.is_floating_point or meta.dtype.is_complex
        if StorageWeakRef(meta.untyped_storage()) in shared and floating:
            # Arguments sharing memory (`x.mul_(x.detach())`) are views of one tensor, as in eager: they share
            # its version counter, so a write through one invalidates what was saved of another.
            t = _view_of_shared(meta, shape, stride, bases, leaves, device)
            if t is not None:
                real[x] = t if rg.get(x) else t.detach()
                return real[x]
        t = torch.empty_strided(shape, stride, dtype=meta.dtype, device=device).zero_()
        if rg.get(x) and floating:
            leaves.append(t.requires_grad_())
            t = t.clone()  # a non-leaf, so in-place ops may write it
        real[x] = t
        return t

    # (a random op probed must not move the program's generators)
    with kept_rng(node.graph.owning_module), torch.enable_grad():  # (records autograd whatever the caller's mode)
        args, kwargs = pytree.tree_map_only(fx.Node, make, (node.args, node.kwargs))
        out = node.target(*args, **kwargs)
    result = out[0] if isinstance(out, (list, tuple)) and out else out
    grad_fn = getattr(result, "grad_fn", None)
    if grad_fn is None:
        return [], False
    # Saved tensors are matched to the probe's by storage (a meta tensor has no data pointer to compare).
    saved_storages = set()
    for name in dir(grad_fn):
        if name.startswith("_saved_"):
            try:
                value = getattr(grad_fn, name)
            except RuntimeError:  # a saved tensor already freed, not saved for this input, or written
                continue
            for t in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(t, torch.Tensor) and t.numel():
                    saved_storages.add(t.untyped_storage()._cdata)
    found = []
    for x in candidates:
        if x is node:
            t = result
        elif x.target is operator.getitem and x.args[0] is node:
            t = out[x.args[1]]
        else:
            t = real.get(x)
        if isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage()._cdata in saved_storages:
            found.append(x)
    return found, writes and _backward_raises(out, leaves)


def _backward_raises(out: Any, leaves: list[torch.Tensor]) -> bool:
    """Whether eager's backward through the probe raises "modified by an inplace operation"."""
    outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.grad_fn is not None]
    if not outs or not leaves:
        return False
    try:
        with torch.enable_grad():
            torch.autograd.grad([o.float().sum() for o in outs], leaves, allow_unused=True)
    except RuntimeError as e:
        return "modified by an inplace operation" in str(e)
    return False


def _view_of_shared(
    meta: torch.Tensor,
    shape: list[int],
    stride: list[int],
    bases: dict[Any, torch.Tensor],
    leaves: list[torch.Tensor],
    device: str,
) -> Any:
    """`meta` (laid out as `shape`, `stride`) as a view of the one flat tensor (requiring grad, a non-leaf)
    standing for its fake storage; None when that storage already stands for another dtype."""
    key = StorageWeakRef(meta.untyped_storage())
    size = concrete(meta.untyped_storage().nbytes()) // meta.element_size()
    if key not in bases:
        leaf = torch.zeros(size, dtype=meta.dtype, device=device).requires_grad_()
        leaves.append(leaf)
        bases[key] = leaf.clone()
    base = bases[key]
    if base.dtype != meta.dtype:
        return None
    return base.as_strided(shape, stride, concrete(meta.storage_offset()))


class UnknownSaved(UnsupportedError):
    """Eager cannot be asked what an op saves for backward: the graph runs eagerly (exact) rather than guess."""
