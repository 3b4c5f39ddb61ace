"""Corrections to how dynamo traces a tensor's methods, for dealias's compiles only.

In-place metadata changes inside a graph (`v = x[1:]; v.unsqueeze_(0)`, `v.t_()`): dynamo records the op in
the graph and runs it on the tensor's fake value, which changes that fake tensor's sizes and strides in place;
but the variable dynamo keeps for `v` caches the sizes, strides and rank it had when it was made. Python code
after the op that reads `v.shape`, `v.dim()` or `v.stride()` then gets the old values, baked into the graph as
constants, with every backend (torch.compile with backend="eager" returns `v.shape[0] == 2` where eager says
1). dealias's passes handle these ops exactly, so after dynamo traces one of them on a tensor, the variable's
cached metadata is refreshed from its fake value, and the graph node is marked as refreshed. The backend
refuses (runs the frame eagerly) any in-place metadata change it finds unmarked, so without this correction the
result is a fallback, never a stale shape. (The same ops on graph inputs and on tensors dynamo reaches from them
are not corrected: dynamo graph-breaks there, and the op runs eagerly: the input's fake value is shared with
dynamo's shape guards.)

`t.storage_offset()` under dynamic shapes: dynamo computes it as an expression of sizes that assumes each input
tensor's storage offset at the first call (0 there), and no guard checks that offset: a later call whose input
starts elsewhere in its storage gets the first call's offset (`v = x[1]; v.as_strided(.., v.storage_offset())`
read the wrong elements, with every backend; fuzz seeds 1290232, 1320641); for dealias's compiles the storage
offset of every tensor the graph takes from the frame is guarded (static there: another placement compiles again)
and dynamo's expression is kept, right for every call the guards admit; where an input's offset is itself a
symbol (after such a recompile, dynamo makes it one) it breaks the graph there. With static shapes dynamo breaks
the graph at the call (it returns an int); for dealias's compiles it is answered with the offset of this call's
tensors, a constant, with the same guards. Without this correction dealias's frames are traced with static shapes
and dynamo's break applies (settings.py).

Where a hook is registered on a graph input (`x.register_hook(h)`): dynamo registers such hooks after the graph
has run, on the tensor as the graph left it; the backend must know whether the graph writes the tensor after the
user's registration (eager hooks the version before that write: refused) or only before it (eager hooks the
written version too: compiled). The graph's nodes at registration are kept in the hooked node's meta
(HOOKED_AFTER); the backend reads the frame's hooks from dynamo's side effects (`hooks_of_frame`). Without the
record any write of a hooked tensor refuses; where the hooks cannot be read at all, the backend refuses any graph
that writes one of its inputs in place. A write after the registration breaks the graph before the write
(hook_write_break), or at the registration where dynamo_hook_split.py can move the break there.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import dynamo_hook_split, dynamo_hooks
from .registry import active, correction, require, require_module
from .settings import applies, for_dealias

REFRESHED = "dealias_refreshed_metadata"  # node meta key: dynamo's variable was refreshed after this op
HOOKED_AFTER = "dealias_hooked_after"  # node meta key: the graph's nodes when a hook was first registered on it
_HOOKS = ("register_hook", "register_post_accumulate_grad_hook")
_CALL_METHOD = ("self", "tx", "name", "args", "kwargs")


@functools.cache
def aten_tags(name: str) -> frozenset[Any] | None:
    """The tags of the overloads of the aten op named `name`, together (None where aten has no such op)."""
    packet = getattr(torch.ops.aten, name, None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return None
    return frozenset(tag for o in packet.overloads() for tag in getattr(packet, o).tags)


def is_inplace_view(name: str) -> bool:
    """Whether the aten op named `name` (`t_`, `unsqueeze_`, `as_strided_`, ...) changes its argument's
    metadata in place (aten's `inplace_view` tag on any overload)."""
    return name.endswith("_") and torch.Tag.inplace_view in (aten_tags(name) or ())


def inplace_view_node(node: torch.fx.Node) -> bool:
    """A dynamo graph node of an op tagged inplace_view (`x.t_()`, `x.unsqueeze_(0)`, `x.as_strided_(..)`): it
    changes `x`'s metadata, not its data."""
    if node.op == "call_method":
        name = node.target
    elif node.op == "call_function" and getattr(node.target, "__self__", None) is None:
        name = getattr(node.target, "__name__", "")
    else:
        return False
    return isinstance(name, str) and is_inplace_view(name)


def _tensor_variable() -> Any:
    return require(require_module("torch._dynamo.variables.tensor"), "TensorVariable")


def _wrap_call_method(name: str, before: Any = None, after: Any = None) -> None:
    """Wrap `TensorVariable.call_method` for correction `name`: `before(self, tx, method)` runs first (it may
    break the graph, or answer the call with a variable), `after(self, tx, method, result)` once dynamo traced the
    call; both only while the correction is in force and dynamo traces for dealias."""
    cls = _tensor_variable()
    original = require(cls, "call_method", *_CALL_METHOD)

    @functools.wraps(original)
    def call_method(self: Any, tx: Any, method: str, args: Any, kwargs: Any) -> Any:
        ours = applies(name, tx)
        if ours and before is not None:
            answer = before(self, tx, method)  # (a variable: the call's result, traced no further)
            if answer is not None:
                return answer
        result = original(self, tx, method, args, kwargs)
        if ours and after is not None:
            after(self, tx, method, result)
        return result

    cls.call_method = call_method


@correction(
    "inplace_view_refresh",
    corrects="after `v.t_()`/`v.unsqueeze_(0)` inside a graph, dynamo's cached shape of v stays the old one",
    without="a frame with an in-place metadata change inside its graph runs eagerly, with a warning",
)
def install_refresh() -> None:
    specialize = require(_tensor_variable(), "specialize", "value")

    def refresh(self: Any, tx: Any, method: str, result: Any) -> None:
        node = getattr(getattr(result, "proxy", None), "node", None)
        if is_inplace_view(method) and node is not None and "example_value" in self.proxy.node.meta:
            props = specialize(self.proxy.node.meta["example_value"])
            for key in ("ndim", "_size", "stride", "is_contiguous"):
                setattr(self, key, props.get(key))
            node.meta[REFRESHED] = True

    _wrap_call_method("inplace_view_refresh", after=refresh)


def _break(gb_type: str, context: str, explanation: str) -> None:
    from torch._dynamo.exc import unimplemented

    unimplemented(gb_type=gb_type, context=context, explanation=explanation, hints=[])


@correction(
    "storage_offset",
    corrects="`t.storage_offset()` breaks the graph (static shapes) or is the first call's offset, unguarded (dynamic)",
    without="dealias's frames are traced with static shapes (dynamo breaks the graph at storage_offset() then)",
)
def install_storage_offset() -> None:
    require(require_module("torch._dynamo.exc"), "unimplemented", "gb_type", "context", "explanation", "hints")
    guards = require_module("torch._dynamo.guards")
    builder = require(guards, "GuardBuilder")
    require(builder, "EQUALS_MATCH", "self", "guard")
    source = require_module("torch._dynamo.source")
    prop = require(source, "TensorPropertySource")
    require(require(source, "TensorProperty"), "STORAGE_OFFSET")
    install_guard = require(require_module("torch._dynamo.guards"), "install_guard")
    constant = require(require_module("torch._dynamo.variables"), "ConstantVariable")

    def offsets_guarded(tx: Any) -> bool:
        """Guard the storage offset of every tensor the graph takes from the frame (the offset of any tensor traced
        from them follows from theirs). False where one has no source or a symbolic offset."""
        wanted = []
        for node in tx.output.graph.find_nodes(op="placeholder"):
            value = node.meta.get("example_value")
            if not isinstance(value, torch.Tensor):
                continue
            src = getattr(node.meta.get("grapharg"), "source", None)
            if src is None or type(value.storage_offset()) is not int:
                return False
            wanted.append(src)
        for src in wanted:
            install_guard(prop(src, source.TensorProperty.STORAGE_OFFSET).make_guard(builder.EQUALS_MATCH))
        return True

    def answer(self: Any, tx: Any, method: str) -> Any:
        if method != "storage_offset":
            return None
        fake = self.proxy.node.meta.get("example_value")
        offset = fake.storage_offset() if isinstance(fake, torch.Tensor) else None
        # With static shapes the offset is a constant of this call's inputs' placements: it is the answer, with
        # guards on those placements (another placement compiles again).
        if isinstance(offset, (int, torch.SymInt)) and offsets_guarded(tx):
            # (Under dynamic shapes dynamo's answer is an expression of sizes from the inputs' offsets, which are
            # now guarded: right for every call the graph runs on.)
            return constant.create(offset) if type(offset) is int else None
        _break(
            "dealias: storage_offset() (dynamo assumes the input's first placement, unguarded)",
            f"{self.proxy.node.name}.storage_offset()",
            "under dynamic shapes dynamo computes it from the input's storage offset at the first call without "
            "guarding that: it runs eagerly",
        )
        return None

    _wrap_call_method("storage_offset", before=answer)


def hooks_of_frame() -> list[torch.fx.Node] | None:
    """The graph nodes of the tensors a hook was registered on in the frame dynamo is tracing (dynamo registers
    them after the graph runs), or None where dynamo's side effects cannot be read."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        hooks = InstructionTranslator.current_tx().output.side_effects.tensor_hooks.values()
        proxies = [getattr(h[0], "proxy", None) for h in hooks]
    except Exception:  # noqa: BLE001 - dynamo's internals moved: the caller refuses what it cannot check
        return None
    return [n for p in proxies if isinstance(n := getattr(p, "node", None), torch.fx.Node)]


@correction(
    "hook_record",
    corrects="(a record) where in the graph the user registered a hook on a tensor dynamo hooks after the graph",
    without="any in-place write of a hooked tensor runs the frame eagerly, with a warning",
)
def install_hook_record() -> None:
    symbolic_convert = require_module("torch._dynamo.symbolic_convert")
    require(require(symbolic_convert, "InstructionTranslator"), "current_tx")

    def record(self: Any, tx: Any, method: str) -> None:
        node = self.proxy.node
        if method in _HOOKS and node.meta.get(dynamo_hooks.EARLY):
            # (Where dynamo breaks at this call and resumes after it, only the registration runs between the graphs:
            # named as a split, not as a part run eagerly.)
            split = active(dynamo_hook_split.NAME) and dynamo_hook_split.splittable(tx)
            _break(
                f"{dynamo_hook_split.SPLIT} (a second hook on a graph input whose first hook is registered before "
                "the graph)"
                if split
                else "dealias: a second hook on a graph input whose first hook is registered before the graph",
                f"{node.name}.{method}",
                "the second registration may come after a write of the tensor: the graph breaks here",
            )
        if method in _HOOKS and HOOKED_AFTER not in node.meta:  # the first registration: the earliest version
            node.meta[HOOKED_AFTER] = frozenset(tx.output.graph.nodes)
        if method in _HOOKS:  # (the latest registration where the graph can split, should a write of it follow)
            dynamo_hook_split.remember(tx, node)

    _wrap_call_method("hook_record", before=record)


def _hooked_before(tracer: Any) -> list[Any]:
    """The graph-input nodes a hook was registered on in the frame traced so far (dynamo registers those after
    the graph has run), when `tracer` is the frame's root tracer in a dealias compile."""
    output = tracer.output_graph
    if tracer.parent is not None or not for_dealias(getattr(output, "compiler_fn", None)):
        return []  # (first: other backends' tracing reads nothing more of dynamo's internals here)
    hooks = output.side_effects.tensor_hooks
    if not hooks:
        return []
    nodes = (getattr(getattr(h[0], "proxy", None), "node", None) for h in hooks.values())
    return [n for n in nodes if isinstance(n, torch.fx.Node) and HOOKED_AFTER in n.meta]


@correction(
    "hook_write_break",
    corrects="a write of a graph input after `x.register_hook(h)`: dynamo hooks the written version",
    without="such a frame runs eagerly, with a warning (the backend finds the write after the registration)",
)
def install_write_break() -> None:
    """Wrap `SubgraphTracer.create_proxy`: a node that may write memory of a hooked graph input breaks the graph
    before it; the graph so far runs, dynamo registers the hook on the tensor as eager would have it, then the
    write runs and the rest compiles as a graph of its own."""
    from ..frontend.segments import may_write, touches

    cls = require(require_module("torch._dynamo.output_graph"), "SubgraphTracer")
    original = require(cls, "create_proxy", "self")
    require(require_module("torch._dynamo.exc"), "unimplemented", "gb_type", "context", "explanation", "hints")

    @functools.wraps(original)
    def create_proxy(self: Any, *args: Any, **kwargs: Any) -> Any:
        proxy = original(self, *args, **kwargs)
        if not active("hook_write_break") or not active("hook_record"):
            return proxy
        hooked = _hooked_before(self)
        node = getattr(proxy, "node", None)
        # (A metadata change of a view, `x.permute(..).squeeze_()`, leaves the input's history, and its hook, alone.)
        if hooked and isinstance(node, torch.fx.Node) and may_write(node) and not inplace_view_node(node):
            tensor = next((h for h in hooked if touches(node, h)), None)
            output = self.output_graph
            if tensor is not None and dynamo_hooks.mark(output, tensor, _written_before(tensor, output)):
                tensor = None  # (its hook is registered before the graph runs, on the version eager hooks)
            if tensor is not None:
                # (Where the registration can split the graph, dynamo's analysis restarts to break there: raises.)
                dynamo_hook_split.split(output, tensor, str(getattr(node.target, "__name__", node.target)))
                self.graph.erase_node(node)  # (dynamo traces the frame again, up to here, for the break)
                _break(
                    "dealias: a write after a hook on a graph input (the hook sees the version before it)",
                    f"{node.target} after {tensor.name}.register_hook",
                    f"the hook registered on {tensor.name} must see the version before this write: the graph "
                    "breaks here, so that the hook is registered before the write runs",
                )
        return proxy

    cls.create_proxy = create_proxy


def _written_before(tensor: torch.fx.Node, output: Any) -> bool:
    """Whether a node of the graph before the (first) hook registration on `tensor` may write its memory with grad
    mode on (under no_grad a write leaves the tensor's grad_fn, which the hook attaches to, as it was; True where
    the grad mode cannot be followed)."""
    from ..frontend.segments import may_write, touches

    before = tensor.meta.get(HOOKED_AFTER, ())
    try:
        enabled = bool(output.tracing_context.global_context.global_state["grad_enabled"][1])
    except Exception:  # noqa: BLE001 - dynamo's record of the frame's entry state moved: any write counts
        enabled = None
    for n in tensor.graph.nodes:
        if n not in before:
            if n.op == "placeholder":
                continue  # (an input first read after the registration: dynamo puts its node ahead of the ops)
            break
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled and enabled is not None:
            enabled = bool(n.args[0])
        elif may_write(n) and not inplace_view_node(n) and touches(n, tensor) and enabled is not False:
            return True
    return False
