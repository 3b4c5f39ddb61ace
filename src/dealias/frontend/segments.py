"""Graphs with higher-order operators: dealias compiles the pieces around them and runs them as eager does.

Dynamo captures `autograd.Function.apply` as `autograd_function_apply(fwd, bwd, *args)` and `t.register_hook(fn)`
as `register_hook(t, fn)`; checkpointing and control flow are higher-order operators too. Their bodies carry
autograd behaviour (a custom backward, a hook on a gradient) that a functional trace of the forward loses, so
dealias does not trace through them. Instead the graph is split around each of them, as a graph break would
split it: the pieces between them are compiled by dealias (each one a graph program of its own, with exact
write-back and output aliasing, so the operator gets the very tensor objects eager would give it), and the
operator runs on real tensors, with eager's own autograd.

A tensor hook applies to every gradient flowing into its tensor's current version, also through uses of it made
before the hook was registered (`z = y * 3; y.register_hook(h)`). So the hook moves up to right after the node
that made that version (the tensor's producer, or the last node that may have written its memory, found from
dynamo's fake values): every use of that version is then in a later piece, which receives the very tensor
object the hook is on. Uses of older versions stay before it, as in eager, where the hook does not see them.

Dynamo's `autograd_function_apply` keeps the tensors the forward saved in a closure, so a saved tensor written
afterwards no longer makes backward raise; it runs here as `autograd_function_apply` below, which saves them with
`ctx.save_for_backward` as the user's forward did.
"""

from __future__ import annotations

import copy
import inspect
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.split_module import split_module

from ..compat.dynamo_autograd import FUNCTION_NAME
from ..compat.dynamo_checkpoint import ARGUMENTS
from . import quiet

quiet.install()  # (installed with the backend, which imports this module)


def runs_eagerly(node: fx.Node) -> bool:
    """A higher-order operator node: dealias leaves it to eager, in a piece of its own."""
    return node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)


def split_around_eager_nodes(gm: fx.GraphModule, compile_piece: Callable[[fx.GraphModule], Any]) -> fx.GraphModule:
    """A graph module calling, in order, the pieces of `gm` between its higher-order operators (each compiled
    by `compile_piece`) and the operators themselves (run eagerly)."""
    gm = fx.GraphModule(gm, copy.deepcopy(gm.graph))  # dynamo's graph stays as it is, should this fail
    gm = _hooks_after_their_tensors(gm)
    for node in list(gm.graph.nodes):  # an operator's results are taken apart in its own piece
        if runs_eagerly(node):
            anchor = node
            for user in [u for u in node.users if _takes_apart(u)]:
                anchor.append(user)
                anchor = user
    part: dict[fx.Node, int] = {}
    current = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if runs_eagerly(node):
            part[node] = current + 1
            current += 2
        elif _takes_apart(node):
            part[node] = part[node.args[0]]  # the operator's piece returns its results one by one
        else:
            part[node] = current
    for node in gm.graph.nodes:  # a subgraph attribute goes with the operator that uses it
        if node.op == "get_attr":
            users = [u for u in node.users if u in part]
            part[node] = part[users[0]] if users else 0
    parent = split_module(gm, gm, lambda n: part[n], keep_original_order=True)
    for node in parent.graph.nodes:
        if node.op != "call_module":
            continue
        piece = getattr(parent, node.target)
        if not any(runs_eagerly(n) for n in piece.graph.nodes):
            setattr(parent, node.target, _Compiled(compile_piece(piece), grad_mode_at_exit(piece)))
            continue
        for n in piece.graph.nodes:
            if runs_eagerly(n) and n.target.name() == "tag_activation_checkpoint":
                n.target = checkpoint_like_eager
            if runs_eagerly(n) and n.target.name() == "autograd_function_apply":
                n.target = autograd_function_apply
                if FUNCTION_NAME in n.meta:  # (split_module copies each node's meta)
                    n.kwargs = {**n.kwargs, "function_name": n.meta[FUNCTION_NAME]}
        piece.recompile()
    parent.recompile()
    return quiet.quiet_calls(parent)  # an error inside (a Function's forward) without fx's print of the code


def checkpoint_like_eager(body: fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
    """`torch.utils.checkpoint.checkpoint(body, *args, ...)` with the user's own arguments, as eager calls it. Dynamo's
    operator, run eagerly, recomputes with `preserve_rng_state=False` (it leaves the random state to inductor's RNG
    functionalization): a draw inside the checkpointed code drew other numbers in backward than in forward, so the
    gradients were not eager's, and backward moved the default generator, which eager's does not. Only the tensors
    the user passed are its arguments (compat/dynamo_checkpoint.py): the rest, what the function read from outside
    (a module's buffers), are closed over as in the user's code, so eager's checkpoint does not save them (a training
    BatchNorm's `num_batches_tracked.add_(1)` inside made backward raise)."""
    from torch.utils.checkpoint import checkpoint

    own = {*inspect.signature(checkpoint).parameters, "preserve_rng_state"} - {"function", "args", "kwargs"}
    options = {k: v for k, v in kwargs.items() if k in own}
    context_fn = body.meta.get("_checkpoint_context_fn")  # (the user's `context_fn`, which dynamo keeps there)
    if context_fn is not None:
        options["context_fn"] = context_fn
    rest = {k: v for k, v in kwargs.items() if k not in own}
    given = body.meta.get(ARGUMENTS)
    if given is None or len(given) != len(args) or all(given):
        return checkpoint(body, *args, **options, **rest)

    def function(*passed: Any, **kw: Any) -> Any:
        it = iter(passed)
        return body(*(next(it) if g else a for a, g in zip(args, given)), **kw)

    return checkpoint(function, *(a for a, g in zip(args, given) if g), **options, **rest)


def autograd_function_apply(fwd: fx.GraphModule, bwd: fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
    """Dynamo's `autograd_function_apply`, with the tensors the user's forward passed to `ctx.save_for_backward`
    saved by `ctx.save_for_backward` again: dynamo's operator keeps them in a closure, so a tensor saved and then
    written in place no longer makes backward raise "modified by an inplace operation" as eager's does."""
    name = kwargs.get("function_name")
    checked = set(kwargs["saved_for_backward_idx"])
    dirty = kwargs.get("dirty_idx", [])
    non_differentiable = kwargs["non_differentiable_idx"]

    class Apply(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *inputs: Any) -> Any:
            output, saved = fwd(*inputs)
            ctx.positions = [i in checked and isinstance(t, torch.Tensor) for i, t in enumerate(saved)]
            ctx.save_for_backward(*(t for t, c in zip(saved, ctx.positions) if c))
            ctx.unchecked = [None if c else t for t, c in zip(saved, ctx.positions)]
            outs = output if isinstance(output, (tuple, list)) else (output,)
            if dirty:
                ctx.mark_dirty(*(outs[i] for i in dirty))
            if non_differentiable:
                ctx.mark_non_differentiable(*(outs[i] for i in non_differentiable))
            return output

        @staticmethod
        @torch._dynamo.disable
        def backward(ctx: Any, *grads: Any) -> Any:
            # (A backward the program runs inside a jitted function would be traced by dynamo, guarded on this
            # call's own class: a recompile at every call. The user's backward `bwd` is dynamo's graph already.)
            checked_values = iter(ctx.saved_tensors)
            saved = [next(checked_values) if c else t for t, c in zip(ctx.unchecked, ctx.positions)]
            return bwd(*grads, *saved)

    # Eager names the backward node after the user's class (`MyFnBackward`), and autograd's errors quote it:
    # a subclass of that name gets it (autograd.Function makes the backward class when a class is made).
    function = type(name, (Apply,), {}) if name else Apply
    return function.apply(*args)


def _takes_apart(node: fx.Node) -> bool:
    """`result[i]` of an operator returning a tuple (`autograd_function_apply`), not an indexing of a tensor."""
    return (
        node.target is operator.getitem
        and runs_eagerly(node.args[0])
        and isinstance(node.args[1], int)
        and isinstance(node.args[0].meta.get("example_value"), (tuple, list))
    )


class _Compiled(torch.nn.Module):
    """A compiled piece. A piece may end inside a `no_grad` region that the next piece leaves (split_module
    enters a region at the start of each piece it spans, and leaves it only where the graph did); a compiled
    program restores its caller's grad mode, so the mode the piece ends in is set after it."""

    def __init__(self, program: Callable[..., Any], grad_at_exit: bool | None) -> None:
        super().__init__()
        self.program = program
        self.grad_at_exit = grad_at_exit

    def forward(self, *args: Any) -> Any:
        out = self.program(*args)
        if self.grad_at_exit is not None:
            torch._C._set_grad_enabled(self.grad_at_exit)
        return out


def grad_mode_at_exit(piece: fx.GraphModule) -> bool | None:
    """The grad mode a graph leaves set (its last `_set_grad_enabled`), None if it switches none."""
    switches = [n.args[0] for n in piece.graph.nodes if n.target is torch._C._set_grad_enabled]
    return switches[-1] if switches else None


def _hooks_after_their_tensors(gm: fx.GraphModule) -> fx.GraphModule:
    """Move each `register_hook` up to right after the last node that made or wrote its tensor."""
    hooks = [n for n in gm.graph.nodes if runs_eagerly(n) and n.target.name() == "register_hook"]
    for hook in hooks:
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        tensor = hook.args[0]
        between = [n for n in gm.graph.nodes if order[tensor] < order[n] < order[hook]]
        writes = [n for n in between if may_write(n) and touches(n, tensor)]
        # After its tensor's last write, and after whatever else the hook takes (tensors its body closes over).
        inputs = [a for a in hook.all_input_nodes if a.op != "get_attr"]
        anchor = max([*writes, *inputs], key=order.__getitem__)
        if anchor.op == "placeholder":
            anchor = max(gm.graph.find_nodes(op="placeholder"), key=order.__getitem__)
        for node in [*(a for a in hook.all_input_nodes if a.op == "get_attr"), hook]:
            anchor.append(node)
            anchor = node
    gm.graph.lint()
    gm.recompile()
    return gm


def touches(node: fx.Node, tensor: fx.Node) -> bool:
    """Whether `node` has an argument sharing memory with `tensor` (dynamo's fake values keep views' storage),
    or may, when it is not known."""
    target = _storage(tensor)
    if target is None:
        return True
    return any(_storage(a) in (target, None) for a in node.all_input_nodes)


def _storage(node: fx.Node) -> Any:
    value = node.meta.get("example_value")
    if isinstance(value, torch.Tensor):
        return value.untyped_storage()._cdata
    return None if value is None else "not a tensor"


def may_write(node: fx.Node) -> bool:
    """A dynamo graph node that may write a tensor in place: an in-place method or function (`add_`,
    `operator.iadd`, `setitem`, an aten op whose schema writes), an out= argument, `inplace=True`
    (`F.relu(y, inplace=True)`), a module call, or an operator of its own."""
    if node.op == "call_module":
        return True
    if node.op not in ("call_function", "call_method"):
        return False
    if runs_eagerly(node) or "out" in node.kwargs or node.target in _INPLACE_OPERATORS:
        return True
    if node.kwargs.get("inplace") is True or any(a is True for a in node.args):  # `F.relu(y, True)` too
        return True
    if isinstance(node.target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        op = node.target if isinstance(node.target, torch._ops.OpOverload) else node.target.default
        return any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


_INPLACE_OPERATORS = {operator.setitem, operator.delitem} | {
    getattr(operator, f"i{name}")
    for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift")
    + ("matmul", "concat")
}
