"""The runner and its oracle: a program run eagerly and through `dealias.jit` on the same arguments, compared on
everything eager makes observable (`dealias.verify`'s compare_call, then gradients for autograd programs), and
the outcome named (ok, a fallback of some kind, a matched error, a mismatch)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import EagerRaisesFallbackWarning, FallbackWarning, GraphBreakWarning, OverlapFallbackWarning
from ...runtime.verify import compare_call, view_on
from .program import Program


@dataclass
class Outcome:
    # "ok"; "fallback" (dealias ran a graph or the program eagerly); "overlap" (a graph ran eagerly because a write
    # shares memory between elements: eager's result depends on its kernel's order); "graph-break" (dynamo ran a
    # part eagerly, the rest compiled); "split" (compiled as more than one graph, dynamo ran no tensor op eagerly
    # between them: only a hook's registration, api.SPLIT); "error-matched"; "refused" (dynamo's fake tensors
    # raised on an op eager runs, after user code ran: a clear error, not a silent result); "eager-raises" (a graph
    # ran eagerly because eager raises on it later: at backward, or at a view autograd forbids); "mismatch"
    status: str
    detail: str = ""


# Errors dynamo's tracing raised where eager ran the program, after user code had run (so the call could not be
# re-run eagerly): a clear error, not a silent result, counted apart from mismatches.
_DYNAMO_TRACING_ERRORS = ("dealias raised TorchRuntimeError", "dealias raised InternalTorchDynamoError")


def run_program(prog: Program, executor: str = "torch", dynamic: bool = False) -> Outcome:
    import dealias

    try:
        program, make_args = prog.load()
    except Exception as e:  # noqa: BLE001
        return Outcome("ok", f"does not load: {e}")
    from ...runtime.verify import ULP_TOLERANT

    jitted = dealias.jit(program, executor=executor, dynamic=True if dynamic else None)
    tolerant = ULP_TOLERANT.set(executor not in ("torch", "exact", "auto"))  # (both exact tiers give eager's bits)
    try:
        return _run_calls(prog, program, make_args, jitted)
    finally:
        ULP_TOLERANT.reset(tolerant)


def _run_calls(prog: Program, program: Callable[..., Any], make_args: Callable[[], Any], jitted: Any) -> Outcome:
    import dealias

    # Calls 1 and 2 compile and hit the cache; call 3 moves the arguments elsewhere in memory (same sharing, new
    # storage offsets), which a program must not depend on.
    for call in range(2 if prog.autograd else 3):
        args = make_args() if call < 2 else _shifted(make_args(), pad=1 + prog.seed % 7)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FallbackWarning)
            diff = compare_call(program, jitted, args)
            if diff is None and prog.autograd:
                diff = compare_grads(program, jitted, make_args)
        if diff is not None and diff.startswith(_DYNAMO_TRACING_ERRORS):
            return Outcome("refused", f"call {call + 1}: {diff.splitlines()[0]}")
        if diff is not None:
            return Outcome("mismatch", f"call {call + 1}: {diff}")
        # The most serious fallback names the outcome: dealias's own, then an overlap, then dynamo's graph break.
        for category, status in _FALLBACKS:
            told = [w for w in caught if w.category is category]
            if told:
                return Outcome(status, str(told[0].message))
    if dealias.cache_info(jitted).entries == 0:
        return Outcome("error-matched")
    from ...api import SPLIT

    splits = [b for b in dealias.graph_breaks(jitted) if b.startswith(SPLIT)]
    if splits:  # (more than one graph, and only Python calls with no tensor op between them)
        return Outcome("split", splits[0])
    return Outcome("ok")


_FALLBACKS = (
    (FallbackWarning, "fallback"),
    (OverlapFallbackWarning, "overlap"),
    (EagerRaisesFallbackWarning, "eager-raises"),
    (GraphBreakWarning, "graph-break"),
)


def _shifted(args: tuple[Any, ...], pad: int) -> tuple[Any, ...]:
    """`args` copied into storages `pad` elements longer at the front: same values, sizes, strides and sharing,
    every storage offset moved by `pad`."""
    moved: dict[int, torch.Tensor] = {}  # storage -> a byte tensor over its padded copy
    out = []
    for x in args:
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        key = x.untyped_storage()._cdata
        if key not in moved:
            old = torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage())
            moved[key] = torch.cat([torch.zeros(pad * x.element_size(), dtype=torch.uint8), old.detach()])
        out.append(view_on(moved[key], x, shift=pad))
    return tuple(out)


def compare_grads(program: Callable[..., Any], jitted: Callable[..., Any], make_args: Callable[[], Any]) -> str | None:
    """Gradients of a weighted sum of the outputs with respect to the leaves behind the arguments."""
    grads = []
    for f in (program, jitted):
        torch.manual_seed(0)
        args = make_args()
        roots = _grad_leaves(args)  # before the program writes into the arguments
        try:
            out = f(*args)
            outs = [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor)]
            weights = [1 + torch.arange(o.numel()).view(o.shape) % 3 for o in outs]
            weighted = [(o.float() * w).sum() for o, w in zip(outs, weights) if o.requires_grad]
            if not roots:
                return None
            # (No output requiring grad is compared too: one side's alone would be a gradient lost or made up.)
            grads.append(torch.autograd.grad(sum(weighted), roots, allow_unused=True) if weighted else _NO_GRAD)
        except Exception as e:  # noqa: BLE001
            grads.append(e)  # eager's error (e.g. "modified by an inplace operation" at backward) is dealias's
    if any(g is _NO_GRAD for g in grads):
        if grads[0] is grads[1]:
            return None
        side = "eager's" if grads[0] is _NO_GRAD else "dealias's"
        return f"autograd: no output of {side} requires grad, the other's do"
    if any(isinstance(g, Exception) for g in grads):
        kinds = [type(g).__name__ if isinstance(g, Exception) else "gradients" for g in grads]
        # (Eager's error as compare_call takes it: of eager's class or, both RuntimeErrors, dealias's own subclass
        # naming the op, e.g. EagerSemanticsError for an out= whose kernel refused overlapping memory.)
        same = all(isinstance(g, Exception) for g in grads) and (
            isinstance(grads[1], type(grads[0])) or all(isinstance(g, RuntimeError) for g in grads)
        )
        return None if same else f"autograd: eager gave {kinds[0]}, dealias {kinds[1]}"
    for i, (a, b) in enumerate(zip(*grads)):
        # (NaN where eager's gradient has NaN: seed 880352's amax(out=) into its own input leaves NaN in eager's)
        same = a is None or torch.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)
        if (a is None) != (b is None) or not same:
            return f"grad of leaf {i} differs"
    return None


_NO_GRAD = object()  # (a program whose outputs require no grad: nothing to differentiate)


def _grad_leaves(args: tuple[Any, ...]) -> list[torch.Tensor]:
    """The leaves behind the arguments: what `b0 * 1` was computed from, or an argument that is a leaf itself."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_leaf and a.requires_grad:
            if all(a is not o for o in out):
                out.append(a)
            continue
        fn = a.grad_fn
        while fn is not None and fn.next_functions:
            nxt = [f for f, _ in fn.next_functions if f is not None]
            if not nxt:
                break
            fn = nxt[0]
        leaf = getattr(fn, "variable", None)
        if leaf is not None and all(leaf is not o for o in out):
            out.append(leaf)
    return out
