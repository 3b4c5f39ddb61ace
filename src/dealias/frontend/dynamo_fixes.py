"""Where dynamo's capture is wrong on its own and dealias corrects it, for dealias's compiles only.

In-place metadata changes inside a graph (`v = x[1:]; v.unsqueeze_(0)`, `v.t_()`): dynamo records the op in
the graph and runs it on the tensor's fake value, which changes that fake tensor's sizes and strides in place;
but the variable dynamo keeps for `v` caches the sizes, strides and rank it had when it was made. Python code
after the op that reads `v.shape`, `v.dim()` or `v.stride()` then gets the old values, baked into the graph as
constants, with every backend (torch.compile with backend="eager" returns `v.shape[0] == 2` where eager says
1). dealias's passes handle these ops exactly, so after dynamo traces one of them on a tensor, the variable's
cached metadata is refreshed from its fake value, and the graph node is marked as refreshed. The backend still
refuses (runs the frame eagerly) any in-place metadata change it finds unmarked, so if these dynamo internals
move in a later torch, the result is a fallback, never a stale shape.

Not corrected: the same ops on graph inputs and on tensors dynamo reaches from them (module attributes).
Dynamo graph-breaks there, and the op runs eagerly: the input's fake value is shared with dynamo's shape
guards, and changing its rank breaks their production.

A record for the backend: where in the graph a hook was registered on a graph input (`x.register_hook(h)`).
Dynamo registers such hooks after the graph has run, on the tensor as the graph left it; the backend must know
whether the graph writes the tensor after the user's registration (eager hooks the version before that write:
refused) or only before it (eager hooks the written version too: compiled). The graph's nodes at registration
are kept in the hooked node's meta (HOOKED_AFTER). And when the graph is about to write such a tensor after
the registration (`x.register_hook(h); x.sin_()`), dynamo is made to break the graph before that write: the
graph so far runs, dynamo registers the hook on the tensor as eager would have it, then the write runs and the
rest compiles as a graph of its own. (Otherwise the hook would land on the written version, with every
backend; the backend refuses that case should this correction not apply.)

Dynamo traces the code after a graph break as a function of its own (a resume function) when it is first
reached. If that tracing raises (a fake-tensor rule stricter than eager, dynamo's own error, or the user's
error raised at a later line than eager's), none of that code has run: it runs eagerly instead, with a
warning, where dynamo would raise (eager then raises its own error at its own line, or returns).

Indexing with a symbolic int inside a tuple (`cache[:, :, pos] = k`, `x[..., pos]` with `pos` an int dynamo made
dynamic): dynamo runs the indexing on fake tensors, and torch's C++ indexing converts each tuple element with
`__index__`, which specializes the symbol (`pos == 7`). Every new position then compiles again, and past the
cache limit the decode loop runs eagerly. Dynamo rewrites only a lone symbol (`x[pos]`) into `select`. For
dealias's compiles, a tuple of slices, ints, None, one Ellipsis and symbolic ints is traced as the same
indexing with each symbol replaced by a full slice, followed by a `select` per symbol (the same view: select
takes negative positions and raises IndexError out of range, as indexing does); an assignment writes
`view[...] = value` into that view, so eager's assignment rules (a scalar fills, leading 1-dims of the value
are dropped, then it broadcasts) still apply.

An unused read at an index tensor or list (`x.add_(1); x[idx]`, `x[[9]]`): dynamo's clean-up of its graph drops
every unused `operator.getitem` node, so the read's IndexError (an index out of range) was lost, with every
backend. For dealias's compiles such a read calls a function of its own, which the clean-up keeps.

Autograd facts of a view after a write into its base (`v = t.diagonal()`, then `t.mul_(w)` with w requiring
grad): the write runs on fake values, so v's fake value requires grad, as eager's v does; but dynamo keeps a
variable's `requires_grad` and `has_grad_fn` as they were when it was made, and re-reads them after a write only
on the variable written (t). Code reading `v.requires_grad` then takes the other branch, and `F.apply(v)` of an
autograd.Function is traced as its forward alone, without its backward: a wrong gradient, with every backend
(fuzz seed 1220114). For dealias's compiles the two facts are re-read from the fake value where dynamo consults
them: reads of a tensor's `requires_grad`, `grad_fn` and `grad`, and the arguments of `Function.apply`.

`t.storage_offset()` under dynamic shapes: dynamo computes it as an expression of sizes that assumes each input
tensor's storage offset at the first call (0 there), and no guard checks that offset: a later call whose input
starts elsewhere in its storage gets the first call's offset (`v = x[1]; v.as_strided(.., v.storage_offset())`
read the wrong elements, with every backend; fuzz seeds 1290232, 1320641). With static shapes dynamo breaks the
graph there (the call returns an int); for dealias's compiles it breaks there with dynamic shapes too.

The corrections are installed on import of the backend and apply only while dynamo traces for a dealias
backend; other backends see dynamo unchanged.
"""

from __future__ import annotations

import functools
import operator
import warnings
from typing import Any

import torch

REFRESHED = "dealias_refreshed_metadata"  # node meta key: dynamo's variable was refreshed after this op
HOOKED_AFTER = "dealias_hooked_after"  # node meta key: the graph's nodes when a hook was first registered on it
_HOOKS = ("register_hook", "register_post_accumulate_grad_hook")


@functools.cache
def is_inplace_view(name: str) -> bool:
    """Whether the aten op named `name` (`t_`, `unsqueeze_`, `as_strided_`, ...) changes its argument's
    metadata in place (aten's `inplace_view` tag on any overload)."""
    packet = getattr(torch.ops.aten, name, None) if name.endswith("_") else None
    if packet is None or not hasattr(packet, "overloads"):
        return False
    return any(torch.Tag.inplace_view in getattr(packet, o).tags for o in packet.overloads())


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


def for_dealias(compiler_fn: Any) -> bool:
    """Whether dynamo's compiler function is a dealias backend, under the wrappers dynamo puts around it
    (`WrapBackendDebug`, `functools.partial` for options)."""
    for _ in range(8):
        if getattr(compiler_fn, "is_dealias_backend", False):
            return True
        inner = getattr(compiler_fn, "compiler_fn", None) or getattr(compiler_fn, "func", None)
        if inner is None:
            return False
        compiler_fn = inner
    return False


def _refresh(var: Any) -> None:
    """Re-read a TensorVariable's cached metadata from its fake value (symbolic layouts cache none)."""
    from torch._dynamo.variables.tensor import TensorVariable

    props = TensorVariable.specialize(var.proxy.node.meta["example_value"])
    for key in ("ndim", "_size", "stride", "is_contiguous"):
        setattr(var, key, props.get(key))


def install() -> None:
    """Wrap `TensorVariable.call_method` once (idempotent)."""
    try:
        from torch._dynamo.variables.tensor import TensorVariable
    except ImportError:  # dynamo's internals moved: nothing is refreshed, and the backend refuses instead
        return
    original = TensorVariable.call_method
    if getattr(original, "dealias_wrapped", False):
        return

    @functools.wraps(original)
    def call_method(self: Any, tx: Any, name: str, args: Any, kwargs: Any) -> Any:
        if name == "storage_offset" and for_dealias(getattr(tx.output, "compiler_fn", None)):
            from torch._dynamo.exc import unimplemented

            unimplemented(
                gb_type="dealias: storage_offset() (dynamo assumes the input's first placement, unguarded)",
                context=f"{self.proxy.node.name}.storage_offset()",
                explanation="under dynamic shapes dynamo computes it from the input's storage offset at the first "
                "call without guarding that: it runs eagerly, as dynamo runs it with static shapes",
                hints=[],
            )
        if name in _HOOKS and for_dealias(getattr(tx.output, "compiler_fn", None)):
            node = self.proxy.node
            if HOOKED_AFTER not in node.meta:  # the first registration: the earliest version hooked
                node.meta[HOOKED_AFTER] = frozenset(tx.output.graph.nodes)
            return original(self, tx, name, args, kwargs)
        result = original(self, tx, name, args, kwargs)
        if is_inplace_view(name) and for_dealias(getattr(tx.output, "compiler_fn", None)):
            node = getattr(getattr(result, "proxy", None), "node", None)
            if node is not None and "example_value" in self.proxy.node.meta:
                _refresh(self)
                node.meta[REFRESHED] = True
        return result

    call_method.dealias_wrapped = True  # type: ignore[attr-defined]
    TensorVariable.call_method = call_method
    _install_write_break()
    _install_resume_fallback()
    _install_symbolic_indexing()
    _install_autograd_facts()
    _install_kept_reads()


def _hooked_before(tracer: Any) -> list[Any]:
    """The graph-input nodes a hook was registered on in the frame traced so far (dynamo registers those after
    the graph has run), when `tracer` is the frame's root tracer in a dealias compile."""
    output = tracer.output_graph
    hooks = output.side_effects.tensor_hooks
    if not hooks or tracer.parent is not None or not for_dealias(getattr(output, "compiler_fn", None)):
        return []
    nodes = (getattr(getattr(h[0], "proxy", None), "node", None) for h in hooks.values())
    return [n for n in nodes if isinstance(n, torch.fx.Node) and HOOKED_AFTER in n.meta]


def _install_write_break() -> None:
    """Wrap `SubgraphTracer.create_proxy`: a node that may write memory of a hooked graph input breaks the graph
    before it (module docstring)."""
    try:
        from torch._dynamo.exc import unimplemented
        from torch._dynamo.output_graph import SubgraphTracer
    except ImportError:  # dynamo's internals moved: the backend refuses these frames instead
        return
    from .segments import may_write, touches

    original = SubgraphTracer.create_proxy

    @functools.wraps(original)
    def create_proxy(self: Any, *args: Any, **kwargs: Any) -> Any:
        proxy = original(self, *args, **kwargs)
        hooked = _hooked_before(self)
        node = getattr(proxy, "node", None)
        # (A metadata change of a view, `x.permute(..).squeeze_()`, leaves the input's history, and its hook, alone.)
        if hooked and isinstance(node, torch.fx.Node) and may_write(node) and not inplace_view_node(node):
            tensor = next((h for h in hooked if touches(node, h)), None)
            if tensor is not None:
                self.graph.erase_node(node)  # (dynamo traces the frame again, up to here, for the break)
                unimplemented(
                    gb_type="dealias: a write after a hook on a graph input (the hook sees the version before it)",
                    context=f"{node.target} after {tensor.name}.register_hook",
                    explanation=f"the hook registered on {tensor.name} must see the version before this write: "
                    "the graph breaks here, so that the hook is registered before the write runs",
                    hints=[],
                )
        return proxy

    create_proxy.dealias_wrapped = True  # type: ignore[attr-defined]
    SubgraphTracer.create_proxy = create_proxy


def _install_resume_fallback() -> None:
    """Wrap `ConvertFrame.__call__`: a resume function whose tracing for a dealias backend raises runs eagerly
    (module docstring); dynamo's default result of a frame it does not compile skips that code from then on."""
    try:
        from torch._dynamo.convert_frame import ConvertFrame
        from torch._dynamo.exc import ResumePrologueTracingError
        from torch._dynamo.resume_execution import TORCH_DYNAMO_RESUME_IN_PREFIX as resumed
        from torch._dynamo.types import ConvertFrameReturn
    except ImportError:  # dynamo's internals moved: its error propagates, as before
        return
    original = ConvertFrame.__call__
    if getattr(original, "dealias_wrapped", False):
        return

    @functools.wraps(original)
    def call(self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, frame, *args, **kwargs)
        except Exception as e:
            code = frame.f_code
            if not code.co_name.startswith(resumed) or not for_dealias(self._torchdynamo_orig_backend):
                raise
            if isinstance(e, ResumePrologueTracingError) or self._inner_convert._box.error_on_graph_break:
                raise  # (dynamo's own rules: strict compiles raise)
            from ..errors import GraphBreakWarning

            cause = e.__cause__ or e
            where = f"{code.co_filename}:{code.co_firstlineno}"
            first = (str(cause).strip().splitlines() or [""])[0][:200]
            warnings.warn(
                f"dealias: the code after a graph break in {where} runs eagerly: dynamo could not trace it: "
                f"{type(cause).__name__}: {first}",
                GraphBreakWarning,
                stacklevel=2,
            )
            return ConvertFrameReturn(skip_reason="dealias: tracing the code after a graph break raised")

    call.dealias_wrapped = True  # type: ignore[attr-defined]
    ConvertFrame.__call__ = call


def _symbolic_selects(tensor: Any, key: Any) -> tuple[list[Any], list[tuple[int, Any]]] | None:
    """For a tuple index holding symbolic ints (and otherwise only slices, ints, None and one Ellipsis): the
    index with each symbol replaced by a full slice, and per symbol the dim it stands at in that indexing's
    result. None for any other index (dynamo's own handling applies)."""
    from torch._dynamo.variables import ConstantVariable, SliceVariable, SymNodeVariable, TupleVariable

    if not isinstance(key, TupleVariable) or not any(isinstance(i, SymNodeVariable) for i in key.items):
        return None
    full = SliceVariable([ConstantVariable.create(None)] * 3)
    items, symbols, consumed, ellipses = [], [], 0, 0
    for item in key.items:
        if isinstance(item, SymNodeVariable) and item.python_type() is int:
            items.append(full)
            consumed += 1
        elif isinstance(item, SliceVariable):
            items.append(item)
            consumed += 1
        elif isinstance(item, ConstantVariable) and (item.value is None or item.value is Ellipsis):
            items.append(item)
            ellipses += item.value is Ellipsis
        elif isinstance(item, ConstantVariable) and type(item.value) is int:
            items.append(item)
            consumed += 1
        else:
            return None  # (a tensor, a list, a bool: advanced indexing, left to dynamo)
    rank = tensor.proxy.node.meta["example_value"].dim()
    if ellipses > 1 or consumed > rank:
        return None  # (eager raises: dynamo's own path raises the same error)
    dim = 0
    for item, original in zip(items, key.items):
        if isinstance(original, SymNodeVariable):
            symbols.append((dim, original))
        if isinstance(item, ConstantVariable) and item.value is Ellipsis:
            dim += rank - consumed
        elif not (isinstance(item, ConstantVariable) and type(item.value) is int):
            dim += 1  # (a slice, a symbol's full slice or a None each leave one dim in the result)
    return items, symbols


def _install_symbolic_indexing() -> None:
    """Wrap the three places dynamo traces tensor indexing (`operator.getitem` inserted in the graph by
    `BuiltinVariable`, `TensorVariable.method___getitem__` and `method___setitem__`): indexing with symbolic ints
    in a tuple traces as full slices and `select`s, for dealias's compiles (module docstring)."""
    try:
        import operator

        from torch._dynamo.variables import BuiltinVariable, ConstantVariable, TupleVariable
        from torch._dynamo.variables.tensor import TensorVariable
    except ImportError:  # dynamo's internals moved: such indexing specializes, as before
        return
    get, put = TensorVariable.method___getitem__, TensorVariable.method___setitem__
    insert = BuiltinVariable._handle_insert_op_in_graph
    if getattr(get, "dealias_wrapped", False) or not hasattr(TensorVariable, "_sync_if_inplace_mutation"):
        return  # (already installed; or dynamo's internals moved, and such indexing specializes, as before)

    def view(self: Any, tx: Any, key: Any) -> Any:
        """The view `self[key]` as full slices and selects, or None where dynamo's own indexing applies."""
        if type(self) is not TensorVariable or not for_dealias(getattr(tx.output, "compiler_fn", None)):
            return None
        found = _symbolic_selects(self, key)
        if found is None:
            return None
        items, symbols = found
        result = get(self, tx, TupleVariable(items))
        for dim, symbol in reversed(symbols):  # (the last first: a select leaves the dims before it in place)
            result = result.call_method(tx, "select", [ConstantVariable.create(dim), symbol], {})
        return result

    @functools.wraps(get)
    def getitem(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
        result = view(self, tx, args[0]) if len(args) == 1 and not kwargs else None
        return get(self, tx, *args, **kwargs) if result is None else result

    @functools.wraps(put)
    def setitem(self: Any, tx: Any, key: Any, value: Any) -> Any:
        target = view(self, tx, key)
        if target is None:
            return put(self, tx, key, value)
        # Dynamo re-reads a written variable's attributes (requires_grad: `x[:, p] = v` with v requiring grad
        # makes x require grad) only on the variable it wrote, here the view: the tensor indexed is re-read too.
        version = self._get_fake_version()
        put(target, tx, ConstantVariable.create(Ellipsis), value)
        self._sync_if_inplace_mutation(tx, version, value.is_tensor())
        return ConstantVariable.create(None)

    @functools.wraps(insert)
    def insert_op(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        if self.fn is operator.getitem and len(args) == 2 and not kwargs:
            result = view(args[0], tx, args[1])
            if result is not None:
                return result
        return insert(self, tx, args, kwargs)

    getitem.dealias_wrapped = True  # type: ignore[attr-defined]
    TensorVariable.method___getitem__ = getitem
    TensorVariable.method___setitem__ = setitem
    BuiltinVariable._handle_insert_op_in_graph = insert_op


def _reread_autograd_facts(var: Any) -> None:
    """A TensorVariable's `requires_grad` and `has_grad_fn` as its fake value has them now (other variables, and
    tensors without a fake value, are left alone)."""
    from torch._dynamo.variables.tensor import TensorVariable

    if not isinstance(var, TensorVariable):
        return
    value = var.proxy.node.meta.get("example_value")
    if isinstance(value, torch.Tensor):
        var.requires_grad = value.requires_grad
        var.has_grad_fn = value.grad_fn is not None


def _install_autograd_facts() -> None:
    """Wrap `TensorVariable.var_getattr` and `AutogradFunctionVariable.call_apply` to re-read the autograd facts
    they consult (the module's docstring)."""
    try:
        from torch._dynamo.variables import VariableTracker
        from torch._dynamo.variables.misc import AutogradFunctionVariable
        from torch._dynamo.variables.tensor import TensorVariable
    except ImportError:  # dynamo's internals moved: its cached facts are read, as before
        return
    get, apply = TensorVariable.var_getattr, AutogradFunctionVariable.call_apply

    @functools.wraps(get)
    def var_getattr(self: Any, tx: Any, name: str) -> Any:
        if name in ("requires_grad", "grad_fn", "grad") and for_dealias(getattr(tx.output, "compiler_fn", None)):
            _reread_autograd_facts(self)
        return get(self, tx, name)

    @functools.wraps(apply)
    def call_apply(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        if for_dealias(getattr(tx.output, "compiler_fn", None)):
            VariableTracker.visit(_reread_autograd_facts, (args, kwargs))
        return apply(self, tx, args, kwargs)

    TensorVariable.var_getattr = var_getattr
    AutogradFunctionVariable.call_apply = call_apply


def tensor_getitem(x: Any, index: Any) -> Any:
    """`x[index]`, called by a dealias graph in place of `operator.getitem` for an unused read at an index tensor
    (`_install_kept_reads`)."""
    return x[index]


def _install_kept_reads() -> None:
    """Wrap `OutputGraph.remove_unused_graphargs`, whose clean-up drops every unused `operator.getitem` node (meant
    for tuple elements), tensor indexing included: `x[idx]` with an index out of range raises IndexError in eager,
    and returned with every backend (`x.add_(1); x[idx]`). For dealias's compiles such a read whose index holds a
    tensor or a list (values no trace checks) calls `tensor_getitem` instead, which the clean-up keeps, and
    dealias's own dead-code elimination keeps the read too (opfacts.may_raise): its index is checked as the program
    runs."""
    try:
        from torch._dynamo.output_graph import OutputGraph
    except ImportError:  # dynamo's internals moved: such reads are dropped, as with every backend
        return
    original = OutputGraph.remove_unused_graphargs

    @functools.wraps(original)
    def remove_unused_graphargs(self: Any) -> None:
        if for_dealias(getattr(self, "compiler_fn", None)):
            for node in self.graph.find_nodes(op="call_function", target=operator.getitem):
                if not node.users and _indexes_by_tensor(node):
                    node.target = tensor_getitem
        return original(self)

    OutputGraph.remove_unused_graphargs = remove_unused_graphargs


def _indexes_by_tensor(node: torch.fx.Node) -> bool:
    """A dynamo graph's `operator.getitem` node indexing a tensor with an index that holds a tensor or a list
    (`x[[9]]`: indexing makes it an index tensor)."""

    def tensor(a: Any) -> bool:
        return isinstance(a, torch.fx.Node) and isinstance(a.meta.get("example_value"), torch.Tensor)

    index = node.args[1] if len(node.args) == 2 else None
    parts = index if isinstance(index, tuple) else (index,)
    advanced = any(isinstance(p, list) for p in parts) or any(tensor(a) for a in torch.utils._pytree.tree_leaves(index))
    return tensor(node.args[0]) and advanced
