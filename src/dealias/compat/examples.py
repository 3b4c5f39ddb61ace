"""For each correction, a small program showing the upstream behaviour it corrects, and a probe that runs it.

`probe(name, backend)` runs the example eagerly and compiled with `backend` ("eager" shows dynamo's own behaviour,
a dealias backend shows the correction's, or its fall-back's where it is not in force) and returns the first
difference from eager, or None. `dealias doctor --probe` runs each example both ways: where dynamo's own run no
longer differs from eager, this torch fixed the bug upstream and the correction can go. The test suite runs each
example under dealias with the correction in force and out of force (tests/test_compat.py): exact both ways.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from . import warns


@dataclass(frozen=True)
class Example:
    program: Callable[..., Any]
    calls: Callable[[], list[tuple[Any, ...]]]  # fresh arguments for each call, in order
    dynamic: bool | None = None
    backward: bool = False  # also compare the gradients of the arguments (sum of the results, backward)


def _half(x: torch.Tensor) -> torch.Tensor:
    return x * 0.5


class _Half(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return _half(g)


def stale_shape(a: torch.Tensor) -> Any:
    v = a[0]
    v.unsqueeze_(0)  # dynamo's variable for v kept the shape (3,)
    v.add_(1)
    return a, v.shape[0], v.sum(0)


def first_placement(x: torch.Tensor) -> torch.Tensor:
    v = x[1]
    return v.as_strided((2,), (1,), v.storage_offset()) * 1  # dynamo: the first call's offset, unguarded


def _placed(offset: int) -> tuple[torch.Tensor]:
    return (torch.arange(16.0)[offset : offset + 12].view(3, 4),)


def hook_then_write(x: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    x.register_hook(lambda g: g + 1)  # eager hooks x's version before the write (x = leaf * 1)
    x.mul_(0.25)
    return x * 1


def written_hooked_written(x: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    x.mul_(2.0)  # (the version eager hooks exists only inside the graph)
    x.register_hook(lambda g: g + 1)
    x.add_(1.0)
    return x * 1


def _hooked() -> tuple[torch.Tensor, torch.Tensor]:
    leaf = torch.linspace(-1, 1, 3, requires_grad=True)
    return leaf * 1, leaf


def symbolic_position(cache: torch.Tensor, k: torch.Tensor, pos: int) -> torch.Tensor:
    cache[:, pos] = k  # dynamo specializes pos: a compile per position
    return cache.sum(0)


def view_made_before_grad(x: torch.Tensor) -> Any:
    t = torch.linspace(-1, 1, 24).view(2, 3, 4)
    v = t.diagonal()  # made before t requires grad: dynamo kept v.requires_grad False after the write below
    t.mul_(x)
    return _Half.apply(v) * (2 if v.requires_grad else 3)


def later_error(x: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    torch._dynamo.graph_break()
    c = torch.linalg.cholesky(x)  # eager raises here, on the values
    return c[:, :, 0]  # dynamo's tracing of the code after the break raises here first (IndexError)


def addcdiv_with_module_hook(m: torch.nn.Module, p: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    p.addcdiv_(a, a + 2, value=0.3)  # dynamo's decomposition: prims.fma, other bits than eager's kernel
    return m(p)


def scaled_by_a_tensor(p: torch.Tensor, g: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    p.addcdiv_(g, g + 2, value=t)  # eager: value.item(), then the kernel; dynamo: prims.fma or a graph break
    p.add_(g, alpha=t)
    return p * 1


def unused_read(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    x[idx]  # eager raises IndexError (idx out of range); dynamo's clean-up drops the unused read
    return x * 2


def divided(x: torch.Tensor, s: float) -> torch.Tensor:
    return x / s  # 1 / 0.0 is inf, 1 / -0.0 is -inf


def checkpoint_closing_over(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    def body(x: torch.Tensor) -> torch.Tensor:
        c.add_(1)  # (as BatchNorm's num_batches_tracked: state the checkpointed function reads from outside)
        return x * c

    return torch.utils.checkpoint.checkpoint(body, x, use_reentrant=False)


def add_into_transpose(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    torch.add(x, 1, out=y.t())  # dynamo: a graph break at any non-contiguous out=
    return y * 2


def transpose_input(x: torch.Tensor) -> Any:
    x.t_()  # dynamo: a graph break at an in-place metadata change of a graph input
    return x * 2, x.shape


def replayed_draws(x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(7)  # dynamo: a graph break at each of the state calls and at random_
    s = torch.get_rng_state()
    a = torch.randn(3)
    torch.set_rng_state(s)
    return a - torch.randn(3) + x.random_(0, 10)


def resize_within(x: torch.Tensor) -> Any:
    x.resize_(3, 2)  # dynamo: a graph break at any resize_
    return x * 2, x.shape


_MODULE = torch.nn.Linear(3, 3)


def leaf_branch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * 2 + w if w.is_leaf else x * 3 + w  # (dynamo's answer is not guarded: a leaf's program, a non-leaf)


def _leaf_then_not() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.ones(2), torch.ones(2, requires_grad=True)), (torch.ones(2), torch.ones(2, requires_grad=True) * 1)]


def _hooked_module_calls() -> list[tuple[Any, ...]]:
    """A module called once, then again with a forward hook registered in between (dynamo does not guard
    module hooks by default: the second call would skip the hook)."""
    args = (torch.randn(4, 3, generator=torch.Generator().manual_seed(0)),)
    return [(_MODULE, *(a.clone() for a in args), torch.full((4, 3), 0.7)) for _ in range(2)]


EXAMPLES: dict[str, Example] = {
    "inplace_view_refresh": Example(stale_shape, lambda: [(torch.zeros(2, 3),), (torch.zeros(2, 3),)]),
    "storage_offset": Example(first_placement, lambda: [_placed(0), _placed(1), _placed(2)], dynamic=True),
    "hook_record": Example(hook_then_write, lambda: [_hooked(), _hooked()], backward=True),
    "hook_write_break": Example(hook_then_write, lambda: [_hooked(), _hooked()], backward=True),
    "hook_split": Example(written_hooked_written, lambda: [_hooked(), _hooked()], backward=True),
    "symbolic_indexing": Example(
        symbolic_position, lambda: [(torch.zeros(2, 9), torch.ones(2), p) for p in (2, 5, 7)], dynamic=True
    ),
    "autograd_facts": Example(
        view_made_before_grad,
        lambda: [(torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(1)).requires_grad_(),)],
        backward=True,
    ),
    "resume_fallback": Example(later_error, lambda: [(-torch.eye(3),)]),
    "dynamo_settings": Example(addcdiv_with_module_hook, _hooked_module_calls),
    "tensor_scalars": Example(
        scaled_by_a_tensor,
        lambda: [(torch.linspace(-1, 1, 7), torch.linspace(0.1, 2.3, 7), torch.tensor(0.3 + k)) for k in range(2)],
    ),
    "kept_index_reads": Example(unused_read, lambda: [(torch.zeros(3), torch.tensor([9]))]),
    "input_metadata": Example(transpose_input, lambda: [(torch.linspace(-1, 1, 6).view(2, 3),) for _ in range(2)]),
    "out_views": Example(add_into_transpose, lambda: [(torch.linspace(-1, 1, 9).view(3, 3), torch.zeros(3, 3))]),
    "rng": Example(replayed_draws, lambda: [(torch.zeros(3),), (torch.zeros(3),)]),
    "resize_within_memory": Example(resize_within, lambda: [(torch.linspace(-1, 1, 6).view(2, 3),) for _ in range(2)]),
    "checkpoint_arguments": Example(
        checkpoint_closing_over, lambda: [(torch.linspace(-1, 1, 3).requires_grad_(), torch.zeros(3))], backward=True
    ),
    "signed_zero_guards": Example(divided, lambda: [(torch.ones(2), 0.0), (torch.ones(2), -0.0)], dynamic=False),
    "leaf_guards": Example(leaf_branch, _leaf_then_not),
}


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...], backward: bool) -> Any:
    """What a call shows: its results and arguments after it (or its error type), and the arguments' grads."""
    try:
        out = fn(*args)
    except Exception as e:  # noqa: BLE001 - the error is the outcome
        return ("raises", type(e).__name__)
    grads = None
    if backward:
        results = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        try:
            if results:
                sum(t.sum() for t in results).backward()
        except RuntimeError as e:  # (the error is the outcome)
            return out, args, ("backward raises", type(e).__name__)
        leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad and a.is_leaf]
        grads = [None if a.grad is None else a.grad.clone() for a in leaves]
    return out, args, grads


def _same(a: Any, b: Any) -> bool:
    la, ta = pytree.tree_flatten(a)
    lb, tb = pytree.tree_flatten(b)
    if ta != tb or len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x.detach(), y.detach()):
                return False
        elif isinstance(x, torch.nn.Module) or isinstance(y, torch.nn.Module):
            continue
        elif x != y:
            return False
    return True


def probe(name: str, backend: Any) -> str | None:
    """Run correction `name`'s example eagerly and compiled with `backend` (on a code object of its own, so no
    other compile's cache entries are reached), call by call: the first difference from eager, or None."""
    example = EXAMPLES[name]
    fn = example.program
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    compiled = torch.compile(copy, backend=backend, dynamic=example.dynamic)
    hooks: list[Any] = []
    try:
        for i, (expected_args, got_args) in enumerate(zip(example.calls(), example.calls())):
            if i == 1 and name == "dynamo_settings":  # a hook registered after the first call, on both runs
                hooks.append(_MODULE.register_forward_hook(lambda m, inp, out: out * 2))
            expected = _outcome(fn, expected_args, example.backward)
            with warns.ignored():
                got = _outcome(compiled, got_args, example.backward)
            if not _same(expected, got):
                return f"call {i + 1}: eager gives {expected!r:.200}, compiled gives {got!r:.200}"
    finally:
        for h in hooks:
            h.remove()
    return None
