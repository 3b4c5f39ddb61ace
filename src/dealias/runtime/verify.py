"""Comparing a compiled call with eager PyTorch: the check behind `jit(fn, verify=True)`, the fuzzer and the
test harness.

What is compared is everything eager makes observable: output structure, values, dtypes, shapes, strides,
requires_grad; every input after the call; and aliasing: which input each output *is*, which input storages
it shares, and which outputs are the same object or share memory.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..errors import DealiasError
from ..ir.draws import kept_rng


class VerificationError(DealiasError):
    """`jit(fn, verify=True)`: the compiled call differs from eager; the message names the first difference."""


def clone_args(tree: Any) -> Any:
    """A deep copy of the tensor leaves that keeps what eager can observe: sizes, strides, offsets, which
    tensors share memory (each storage is copied once and every tensor re-viewed onto the copy), and autograd
    structure: a leaf that requires grad stays a leaf; a computed tensor that requires grad is copied as a
    computed tensor, and tensors viewing it as views of the copy."""
    leaves, spec = pytree.tree_flatten(tree)
    storages = _copy_storages([x for x in leaves if isinstance(x, torch.Tensor)])  # storage -> bytes of its copy
    owners: dict[int, torch.Tensor] = {}  # storage -> the copy of the computed tensor owning it
    for x in leaves:
        if isinstance(x, torch.Tensor) and x.requires_grad and not x.is_leaf and x._base is None:
            owners[x.untyped_storage()._cdata] = x
    copied_owners: dict[int, torch.Tensor] = {}
    out = []
    for x in leaves:
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        key = x.untyped_storage()._cdata
        c = view_on(storages[key], x)
        if x.requires_grad and x.is_leaf:
            c.requires_grad_()
        elif x.requires_grad:
            if key not in copied_owners:
                owner = owners.get(key)
                if owner is not None:  # recompute the owner: a non-view, non-leaf tensor on fresh memory
                    copied_owners[key] = view_on(storages[key], owner).detach().requires_grad_() * 1
                else:  # only views of a tensor we do not have: views of a computed flat copy
                    flat = torch.empty(0, dtype=x.dtype, device=x.device)
                    with torch.no_grad():
                        flat.set_(
                            storages[key].untyped_storage(), 0, (storages[key].numel() // x.element_size(),), (1,)
                        )
                    copied_owners[key] = flat.detach().requires_grad_() * 1
            base = copied_owners[key]
            same = owners.get(key) is x
            c = base if same else base.as_strided(x.shape, x.stride(), x.storage_offset())
        out.append(c)
    return pytree.tree_unflatten(out, spec)


def _copy_storages(tensors: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    """Per storage of `tensors`, a byte tensor over a copy of it. Storages whose memory overlaps (two
    `torch.from_numpy` over one numpy buffer: two storages, one memory) are copied as one block, each copy a
    storage of its own over that block at the same distance: writes through one are seen through the other, as
    in the caller's memory."""
    by_key: dict[int, torch.UntypedStorage] = {}  # storages with memory of their own, by storage
    copies: dict[int, torch.Tensor] = {}
    for t in tensors:
        key, st = t.untyped_storage()._cdata, t.untyped_storage()
        if key in by_key or key in copies:
            continue
        if type(t) in (torch.Tensor, nn.Parameter) and t.device.type != "meta" and st.nbytes():
            by_key[key] = st
        else:  # (meta, fake and subclass tensors: no memory whose address is to be compared)
            copies[key] = torch.empty(0, dtype=torch.uint8, device=t.device).set_(st.clone())
    # Sorted by device and start, a storage overlaps the block before it iff it starts before that block ends
    order = sorted(by_key, key=lambda k: (str(by_key[k].device), by_key[k].data_ptr()))
    blocks: list[list[int]] = []
    for key in order:
        st = by_key[key]
        if blocks and st.device == by_key[blocks[-1][0]].device and st.data_ptr() < _block_end(blocks[-1], by_key):
            blocks[-1].append(key)
        else:
            blocks.append([key])
    for block in blocks:
        first = by_key[block[0]]
        if len(block) == 1:
            copies[block[0]] = torch.empty(0, dtype=torch.uint8, device=first.device).set_(first.clone())
            continue
        start = first.data_ptr()
        memory = torch.empty(_block_end(block, by_key) - start, dtype=torch.uint8, device=first.device)
        for key in block:
            st = by_key[key]
            where = st.data_ptr() - start
            memory[where : where + st.nbytes()].copy_(torch.empty(0, dtype=torch.uint8, device=st.device).set_(st))
        for key in block:
            st = by_key[key]
            where = st.data_ptr() - start
            # A storage object of its own over the block's memory (through DLPack, which wraps memory in a new
            # storage): the copies share memory, not storage objects, as the caller's tensors did.
            copies[key] = torch.from_dlpack(memory[where : where + st.nbytes()])
    return copies


def _block_end(block: list[int], by_key: dict[int, torch.UntypedStorage]) -> int:
    return max(by_key[k].data_ptr() + by_key[k].nbytes() for k in block)


def view_on(storage: torch.Tensor, like: torch.Tensor, shift: int = 0) -> torch.Tensor:
    """A tensor with `like`'s dtype and layout over `storage`'s memory, `shift` elements further in."""
    t = torch.empty(0, dtype=like.dtype, device=like.device)
    with torch.no_grad():
        t.set_(storage.untyped_storage(), like.storage_offset() + shift, like.shape, like.stride())
    # The bytes are the physical values; a lazily conjugated or negated view says so in a bit of its own.
    if like.is_conj():
        t = t.conj()
    if like.is_neg():
        t = t._neg_view()
    return t


# Set for executors that are not bit-equal to eager (the fused executor): floats compare with a wider
# tolerance, and an integer view of float memory compares as those floats (a fused `sin` may differ from
# ATen's in the last bit).
ULP_TOLERANT: contextvars.ContextVar[bool] = contextvars.ContextVar("ULP_TOLERANT", default=False)


def _close_as_floats(a: torch.Tensor, b: torch.Tensor) -> bool:
    as_float = {4: torch.float32, 8: torch.float64}.get(a.element_size())
    if as_float is None or a.dtype.is_floating_point or a.dtype == torch.bool:
        return False
    fa, fb = a.contiguous().view(as_float), b.contiguous().view(as_float)
    # No absolute tolerance: genuine small integers read as floats are denormals whose relative differences
    # stay large.
    return bool(torch.allclose(fa, fb, rtol=1e-5, atol=0.0, equal_nan=True))


def tensor_difference(a: torch.Tensor, b: Any) -> str | None:
    if not isinstance(b, torch.Tensor):
        return f"eager gave a tensor, dealias {type(b).__name__}"
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} != {tuple(b.shape)}"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} != {b.dtype}"
    strides = [(x, y) for n, x, y in zip(a.shape, a.stride(), b.stride()) if n > 1]
    if any(x != y for x, y in strides):  # the stride of a size-1 dimension is never used
        return f"strides {a.stride()} != {b.stride()}"
    if a.requires_grad != b.requires_grad:
        return f"requires_grad {a.requires_grad} != {b.requires_grad}"
    if _history(a) != _history(b):
        return f"autograd history: {_history(a)} != {_history(b)}"
    if a.device.type == "meta" or b.device.type == "meta":
        return None if a.device == b.device else f"device {a.device} != {b.device}"  # meta tensors have no values
    ad, bd = a.detach(), b.detach()
    if a.is_floating_point() or a.is_complex():
        rtol, atol = (1e-4, 1e-4) if ULP_TOLERANT.get() else (1e-5, 1e-6)  # a fused exp then sin: 1e-5 apart
        if not torch.allclose(ad, bd, rtol=rtol, atol=atol, equal_nan=True):
            return f"values differ (max abs difference {(ad - bd).abs().nan_to_num(0).max().item():.3g})"
    elif not torch.equal(ad, bd):
        if not (ULP_TOLERANT.get() and _close_as_floats(ad, bd)):
            return "values differ"
    return None


def _history(t: torch.Tensor) -> str:
    """Whether a tensor has a grad_fn, or eager's error on reading it (a view made under no_grad whose base was
    written since)."""
    try:
        return "leaf" if t.grad_fn is None else "grad_fn"
    except RuntimeError as e:
        return f"RuntimeError reading grad_fn: {str(e)[:60]}"


def _value_difference(a: Any, b: Any) -> str | None:
    if isinstance(a, torch.Tensor):
        return tensor_difference(a, b)
    same = a == b or (a != a and b != b)  # nan
    return None if same else f"{a!r} != {b!r}"


def alias_pattern(inputs: list[Any], outputs: list[Any]) -> list[tuple[Any, ...]]:
    """For each output: the inputs it is, the input storages it shares, the outputs it is / shares, and whether it
    is a view (autograd's `_base`: a view's grad_fn, hooks and in-place rules differ from a tensor of its own)."""
    ins = [x for x in inputs if isinstance(x, torch.Tensor)]
    pattern = []
    for o in outputs:
        if not isinstance(o, torch.Tensor):
            pattern.append(("value",))
            continue
        st = o.untyped_storage()._cdata
        pattern.append(
            (
                tuple(i for i, x in enumerate(ins) if x is o),
                tuple(i for i, x in enumerate(ins) if x.untyped_storage()._cdata == st),
                tuple(j for j, p in enumerate(outputs) if p is o),
                tuple(
                    j for j, p in enumerate(outputs) if isinstance(p, torch.Tensor) and p.untyped_storage()._cdata == st
                ),
                o._is_view(),
            )
        )
    return pattern


def first_difference(expected: Any, got: Any, eager_args: Any, jit_args: Any) -> str | None:
    """The first observable difference between an eager call and a compiled one, or None."""
    if pytree.tree_structure(expected) != pytree.tree_structure(got):
        return f"output structure differs: {pytree.tree_structure(expected)} != {pytree.tree_structure(got)}"
    exp_leaves, got_leaves = pytree.tree_leaves(expected), pytree.tree_leaves(got)
    for i, (a, b) in enumerate(zip(exp_leaves, got_leaves)):
        d = _value_difference(a, b)
        if d:
            return f"output {i}: {d}"
    ein, jin = pytree.tree_leaves(eager_args), pytree.tree_leaves(jit_args)
    for i, (a, b) in enumerate(zip(ein, jin)):
        d = _value_difference(a, b)
        if d:
            return f"input {i} after the call: {d}"
    pe, pj = alias_pattern(ein, exp_leaves), alias_pattern(jin, got_leaves)
    if pe != pj:
        return f"output aliasing differs: eager {pe}, dealias {pj}"
    return None


def run_both(
    fn: Callable[..., Any], jitted: Callable[..., Any], args: tuple[Any, ...]
) -> tuple[Any, BaseException | None, Any, BaseException | None, Any, Any, list[Any]]:
    """Run eager and compiled on separate copies of `args` with the same random state; also, per leaf, the version
    counter both copies started from (made the same way, they start alike) and the storage it started on."""
    eager_args, jit_args = clone_args(args), clone_args(args)
    start = [
        (t._version, t.untyped_storage()._cdata) if isinstance(t, torch.Tensor) else None
        for t in pytree.tree_leaves(eager_args)
    ]
    expected = got = eager_err = jit_err = None
    with kept_rng(args):  # (a generator among the arguments is one object both runs draw from)
        try:
            expected = fn(*eager_args)
        except Exception as e:  # noqa: BLE001 - eager's error is part of what is compared
            eager_err = e
    try:
        got = jitted(*jit_args)
    except Exception as e:  # noqa: BLE001
        jit_err = e
    return expected, eager_err, got, jit_err, eager_args, jit_args, start


def compare_call(fn: Callable[..., Any], jitted: Callable[..., Any], args: tuple[Any, ...]) -> str | None:
    """One differential call; the first difference (values, inputs, aliasing, errors), or None."""
    rng = torch.get_rng_state()
    expected, eager_err, got, jit_err, eager_args, jit_args, start = run_both(fn, jitted, args)
    if eager_err is not None:
        if jit_err is None:
            return f"eager raised {type(eager_err).__name__}: {eager_err}; dealias did not"
        if not isinstance(jit_err, type(eager_err)) and not (
            isinstance(jit_err, RuntimeError) and isinstance(eager_err, RuntimeError)
        ):
            return f"eager raised {eager_err!r}, dealias {jit_err!r}"
        # A failed call leaves the inputs as eager had them after some prefix of its ops: as they were (a graph
        # dealias compiled raises before writing anything), as eager leaves them (a graph run eagerly), or as eager
        # had them where the failing graph began (the graphs before a graph break, and the code at the break, ran).
        untouched, eager_after = pytree.tree_leaves(clone_args(args)), pytree.tree_leaves(eager_args)
        jit_leaves = pytree.tree_leaves(jit_args)
        for i, (a, b, e) in enumerate(zip(jit_leaves, untouched, eager_after)):
            d = _value_difference(b, a)
            if d and _value_difference(e, a):
                if _state(jit_leaves) in _eager_states(fn, args, rng):
                    return None
                return f"input {i} changed by a failed call: {d}"
        return None
    if jit_err is not None:
        return f"dealias raised {type(jit_err).__name__}: {jit_err}; eager returned"
    return first_difference(expected, got, eager_args, jit_args) or _counter_difference(start, eager_args, jit_args)


def _state(leaves: list[Any]) -> tuple[Any, ...]:
    """What a failed call left of each tensor leaf: its layout and the bytes of its whole storage."""
    out: list[Any] = []
    for t in leaves:
        if isinstance(t, torch.Tensor) and not t.is_meta:
            memory = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
            out.append((tuple(t.shape), t.stride(), t.storage_offset(), memory.cpu().numpy().tobytes()))
    return tuple(out)


def _eager_states(fn: Callable[..., Any], args: Any, rng: torch.Tensor) -> list[tuple[Any, ...]]:
    """The states eager leaves the inputs in after each op of `fn` (run again on fresh copies, from the random
    state the compared calls started from), the first before any."""
    from torch.utils._python_dispatch import TorchDispatchMode

    copies = clone_args(args)
    leaves = pytree.tree_leaves(copies)
    states = [_state(leaves)]

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            states.append(_state(leaves))
            return out

    after = torch.get_rng_state()
    torch.set_rng_state(rng)
    try:
        with Record():
            fn(*copies)
    except Exception:  # noqa: BLE001, S110 - the failure both calls had
        pass
    finally:
        torch.set_rng_state(after)
    return states


def _counter_difference(start: list[Any], eager_args: Any, jit_args: Any) -> str | None:
    """Memory eager wrote (a version counter of it moved) whose counters the compiled call all left where they
    were (`start`: the counters both copies began with): what autograd saved of it before the call would be read
    at backward as if unchanged, where eager's backward raises; or the other way round, memory whose counters
    eager left (it wrote through an `unsafe_chunk` element, or not at all) and the compiled call moved: backward
    through what was saved before raises where eager's runs. Tensors sharing memory are taken together:
    `clone_args` gives each its own counter where the caller's views share one, and a write-back through one of
    them moves that one. (A counter moved by fewer or more steps than eager's is not a difference here.)"""
    groups: dict[int, list[tuple[int, int, int, int]]] = {}  # storage -> (input, start, eager, jit) counters
    for i, (begun, e, j) in enumerate(zip(start, pytree.tree_leaves(eager_args), pytree.tree_leaves(jit_args))):
        if begun is not None and not e.is_inference():
            f, storage = begun
            groups.setdefault(storage, []).append((i, f, e._version, j._version))
    for group in groups.values():
        if any(e != f for _, f, e, _ in group) and all(j == f for _, f, _, j in group):
            i = next(i for i, f, e, _ in group if e != f)
            return f"input {i}: eager moved its version counter (it wrote it), dealias did not"
        if all(e == f for _, f, e, _ in group) and any(j != f for _, f, _, j in group):
            i = next(i for i, f, _, j in group if j != f)
            return f"input {i}: dealias moved its version counter, eager did not"
    return None
