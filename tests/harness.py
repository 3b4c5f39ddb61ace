"""Differential harness: run a program eagerly and through `dealias.jit` on identical copies of its inputs
and compare everything eager makes observable."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

import dealias


def clone_args(tree: Any) -> Any:
    """A deep copy of the tensor leaves that keeps their sizes, strides, offsets, and which of them share
    memory (each storage is copied once, every tensor re-viewed onto the copy)."""
    leaves, spec = pytree.tree_flatten(tree)
    copies: dict[int, torch.UntypedStorage] = {}
    out = []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            st = x.untyped_storage()
            if st._cdata not in copies:
                copies[st._cdata] = st.clone()
            c = torch.empty(0, dtype=x.dtype, device=x.device)
            with torch.no_grad():
                c.set_(copies[st._cdata], x.storage_offset(), x.shape, x.stride())
            if x.requires_grad:
                c.requires_grad_()
                if not x.is_leaf:
                    c = c.view_as(c)  # a non-leaf that requires grad, on the same memory
            out.append(c)
        else:
            out.append(x)
    return pytree.tree_unflatten(out, spec)


def _same(a: Any, b: Any, what: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{what}: eager gave a tensor, dealias {type(b)}"
        assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
        assert a.stride() == b.stride() or a.numel() <= 1, f"{what}: strides {a.stride()} != {b.stride()}"
        assert a.requires_grad == b.requires_grad, f"{what}: requires_grad {a.requires_grad} != {b.requires_grad}"
        ad, bd = a.detach(), b.detach()
        if a.is_floating_point() or a.is_complex():
            torch.testing.assert_close(bd, ad, equal_nan=True, rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: {m}")
        else:
            assert torch.equal(ad, bd), f"{what}: values differ\n eager {ad}\n dealias {bd}"
    else:
        assert a == b or (a != a and b != b), f"{what}: {a!r} != {b!r}"


def _alias_pattern(inputs: list[Any], outputs: list[Any]) -> list[tuple[Any, ...]]:
    """For each output: which input it *is*, which input storages it shares, which outputs it is / shares."""
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
            )
        )
    return pattern


def _run(fn: Callable[..., Any], args: Any) -> tuple[Any, BaseException | None]:
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 - the exception itself is what is compared
        return None, e


def check(fn: Callable[..., Any], *args: Any, calls: int = 2, allow_fallback: bool = False, **jit_kw: Any) -> Any:
    """Compare `fn` eager vs jitted on `calls` successive calls with fresh copies of `args`. Returns the
    jitted function (for structural checks). Fails on any difference, and on a silent eager fallback
    unless `allow_fallback`."""
    jf = dealias.jit(fn, **jit_kw)
    raised = False
    for call in range(calls):
        eager_args, jit_args = clone_args(args), clone_args(args)
        rng = torch.get_rng_state()
        expected, eager_err = _run(fn, eager_args)
        torch.set_rng_state(rng)
        with warnings.catch_warnings():
            warnings.simplefilter("error" if not allow_fallback else "ignore", dealias.FallbackWarning)
            got, jit_err = _run(jf, jit_args)
        where = f"call {call + 1}"
        if eager_err is not None:
            assert jit_err is not None, f"{where}: eager raised {eager_err!r}, dealias did not"
            assert (
                isinstance(jit_err, type(eager_err))
                or isinstance(jit_err, RuntimeError)
                and isinstance(eager_err, RuntimeError)
            ), f"{where}: eager raised {eager_err!r}, dealias {jit_err!r}"
            raised = True
            # Inputs are left as they were when dealias raises.
            for i, (a, b) in enumerate(zip(pytree.tree_leaves(jit_args), pytree.tree_leaves(clone_args(args)))):
                _same(b, a, f"{where}: input {i} after a failed call")
            continue
        if jit_err is not None:
            raise AssertionError(f"{where}: dealias raised {jit_err!r}, eager returned") from jit_err
        exp_leaves = pytree.tree_leaves(expected)
        got_leaves = pytree.tree_leaves(got)
        assert pytree.tree_structure(expected) == pytree.tree_structure(got), f"{where}: output structure differs"
        for i, (a, b) in enumerate(zip(exp_leaves, got_leaves)):
            _same(a, b, f"{where}: output {i}")
        ein, jin = pytree.tree_leaves(eager_args), pytree.tree_leaves(jit_args)
        for i, (a, b) in enumerate(zip(ein, jin)):
            _same(a, b, f"{where}: input {i} after the call")
        assert _alias_pattern(ein, exp_leaves) == _alias_pattern(jin, got_leaves), (
            f"{where}: output aliasing differs\n eager   {_alias_pattern(ein, exp_leaves)}\n"
            f" dealias {_alias_pattern(jin, got_leaves)}"
        )
    info = dealias.cache_info(jf)
    assert raised or info.misses == 1 and info.hits == calls - 1, (
        f"expected one compile and {calls - 1} hits, got {info}"
    )
    return jf


def functional_ops(jf: Any) -> list[str]:
    """The targets of the functional trace of the last program `jf` ran."""
    gm = jf.last.functional_gm
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
