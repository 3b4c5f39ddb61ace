"""Capture: lower a graph from dynamo (torch-level ops on graph inputs) to aten ops with `make_fx` over fake
tensors, keeping the ops exactly as dispatched, in-place and view ops included (no PyTorch functionalization).

Dynamo has already run the user's Python; this runs only the graph, so no user object is touched and no op runs
on a real tensor. Python scalars among the graph's inputs are specialized (baked into the trace, part of the
backend's cache key, see `guards.py`), except the ints, floats and sizes dynamo made symbolic, which are traced
as symbols (`Symbolic`). Each traced op keeps the user's source line.
"""

from __future__ import annotations

import contextlib
import copy
import math
import operator
import re
from typing import Any

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
from torch._dynamo.source import ConstantSource, LocalSource
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    GuardOnDataDependentSymNode,
    ShapeEnv,
    StatelessSymbolicContext,
    free_unbacked_symbols,
)
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..compat import saved_hooks, warns
from ..compat.dynamo_out import static_layout
from ..compat.internals import CREATION_META, DATA_ATTR, checked_dispatch, creation_meta, eager_dispatch
from ..errors import (
    DataDependentError,
    EagerRaisesError,
    UnsupportedError,
    eager_error,
    node_location,
    quiet_fake_tensor_log,
    with_location,
)
from ..ir.checks import empty_inplace_error, inplace_layout
from ..ir.draws import kept_rng
from ..ir.opfacts import OWN_COUNTER_KEY, RESHAPE_KEY
from ..ir.plan import TENSOR_SLOT, Captured, Symbolic
from ..ir.sharing import find_groups

_DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode)


# The torch functions (and Tensor methods) of dynamo's graphs that reach ops whose Python decompositions differ
# from eager's kernels (compat/internals.py `eager_dispatch`): dropout, batch norm, the recurrent ops, matmul.
_EAGER_DISPATCH = frozenset(
    {
        torch.nn.functional.dropout,
        torch.dropout,
        torch.nn.functional.batch_norm,
        torch.batch_norm,
        torch.native_batch_norm,
        torch.nn.functional.instance_norm,
        torch.instance_norm,
        # (their Python decompositions draw the dropout between layers otherwise than eager's kernels: in training
        # with symbolic sizes, other random numbers, a silent wrong result)
        torch.rnn_tanh,
        torch.rnn_relu,
        torch.lstm,
        torch.gru,
        # (a batched product's result: eager's `_unsafe_view` of the bmm, a tensor of its own; the decomposition's
        # `view`, whose `_base` differs and which, made under no_grad, raised at an in-place op with grad on)
        torch.matmul,
        operator.matmul,
        torch.Tensor.matmul,
    }
)
_EAGER_DISPATCH_METHODS = frozenset({"matmul", "__matmul__", "__rmatmul__"})

# The calls whose views eager makes by `reshape` (opfacts.RESHAPE_KEY). (`ravel` is `contiguous().view(-1)`, and
# `view_as`, `unflatten` call view: traced as eager makes them.)
_RESHAPES = frozenset(
    {torch.reshape, torch.flatten, torch.Tensor.reshape, torch.Tensor.flatten, torch.Tensor.reshape_as}
)
_RESHAPE_METHODS = frozenset({"reshape", "flatten", "reshape_as"})


# Functions whose C++ composite checks values eager has and fake tensors have not (`F.one_hot(x, 4)` with a class 5:
# eager raises, the trace computed rows of zeros), traced through torch's Python decomposition, which asserts them.
_CHECKED_DISPATCH = frozenset({torch.nn.functional.one_hot, torch._C._nn.one_hot})


class _Replay(fx.Interpreter):
    """Runs a dynamo graph node by node under make_fx. Each aten op it dispatches is recorded with the meta of
    the node that made it (`preserve_node_meta`): the user's source line stays on the captured op."""

    current: fx.Node | None = None
    symbolic = False  # (a symbolic trace: make_fx runs it with torch's Python dispatcher on)

    def run_node(self, n: fx.Node) -> Any:
        self.current = n
        if n.target is _ENTER_AUTOCAST and torch._C._is_any_autocast_enabled():
            # An autocast region inside a call made under the caller's autocast (review12): the trace records the
            # casts of both, and the program runs under the caller's autocast again (its guards hold it), which
            # casts the region's ops once more: `x @ w` under `autocast(enabled=False)` came back bf16 where eager's
            # is fp32. Left to eager (a FallbackWarning), as `backend="eager"` runs the graph.
            raise UnsupportedError(with_location("an autocast region in a call made under autocast", node_location(n)))
        if _user_op_with_grad(n, self):
            # A user's op (torch.library.custom_op) dispatches its autograd kernel above make_fx: the trace records
            # the op it calls below autograd, run under no_grad, and the compiled result had no gradient (a
            # silent None where eager's `register_autograd` formula gives one).
            raise UnsupportedError(f"{n.target} is a user's op called with grad on an input that requires grad")
        if n.target is DATA_ATTR:
            # `x.data` shares x's memory but not its version counter (writes through it are hidden from
            # autograd); it traces to aten.detach, which shares both. Its node is tagged (see _GradModes).
            n.meta["custom"] = {**(n.meta.get("custom") or {}), OWN_COUNTER_KEY: True}
        if n.target in _RESHAPES or (n.op == "call_method" and n.target in _RESHAPE_METHODS):
            n.meta["custom"] = {**(n.meta.get("custom") or {}), RESHAPE_KEY: True}  # (opfacts.RESHAPE_KEY)
        if self.symbolic and (
            n.target in _EAGER_DISPATCH or (n.op == "call_method" and n.target in _EAGER_DISPATCH_METHODS)
        ):
            # (traced as eager dispatches it: the Python dispatcher of a symbolic trace decomposes these
            # otherwise, compat/internals.py `eager_dispatch`; only there, so that a torch without the switch
            # refuses only symbolic traces of these, not every matmul)
            with eager_dispatch():
                return self._run_checking_out(n)
        if n.target in _CHECKED_DISPATCH:
            return self._one_hot(n)
        return self._run_checking_out(n)

    def _one_hot(self, n: fx.Node) -> Any:
        """`F.one_hot`: traced through torch's Python decomposition, which asserts eager's checks of the values
        in the graph, where the C++ composite skips them on fake tensors (compat/internals.py `checked_dispatch`).
        The decomposition checks neither the dtype (eager's takes int64 only: an int32 or float index tensor gave
        classes where eager raises) nor an empty tensor without a number of classes: those are the C++ composite's,
        which checks the dtype on fakes too, or eager's."""
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        x = args[0] if args else kwargs.get("tensor", kwargs.get("input"))
        classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
        if not isinstance(x, torch.Tensor) or x.dtype != torch.int64:
            with eager_dispatch() if self.symbolic else contextlib.nullcontext():
                return self._run_checking_out(n)  # (eager's dtype error, raised on the fake)
        if isinstance(classes, int) and classes <= 0 and isinstance(x.numel(), int) and x.numel() == 0:
            why = "one_hot of an empty tensor without a number of classes: eager raises"
            raise EagerRaisesError(with_location(why, node_location(n)))
        if self.symbolic:  # (the Python dispatcher already on)
            return self._run_checking_out(n)
        with checked_dispatch():
            return self._run_checking_out(n)

    def _run_checking_out(self, n: fx.Node) -> Any:
        out = n.kwargs.get("out")
        outs = [out] if isinstance(out, fx.Node) else [o for o in out if isinstance(o, fx.Node)] if out else []
        if not outs:
            return super().run_node(n)
        tensors = [t for t in (self.env.get(o) for o in outs) if isinstance(t, torch.Tensor)]
        before = [t._version for t in tensors]
        result = super().run_node(n)
        # (sizes that are symbols are never 0: dynamo specializes 0 and 1; asking would add a guard)
        # (only sizes and strides: the probe lays the tensors out on memory of their own, at no offset)
        empty = any(static_layout(t, offset=False) and t.numel() == 0 for t in tensors)
        if empty and not _empty_outs_like_eager(n, self, tensors):
            raise UnsupportedError(
                with_location(f"{n.target}: eager lays out its out= tensor of no elements otherwise", node_location(n))
            )
        # A single out= tensor (several may be an aten TensorList, whose writes do not bump version counters).
        if isinstance(out, fx.Node) and tensors and all(t._version == v for t, v in zip(tensors, before)):
            # A composite op (linalg.matrix_rank) can trace to ops that compute the result and never write
            # `out=`: the traced program would return the tensor unchanged where eager fills it.
            raise UnsupportedError(
                with_location(f"{n.target} with out= traces without writing its out= tensor", node_location(n))
            )
        return result


def _empty_outs_like_eager(n: fx.Node, replay: _Replay, outs: list[torch.Tensor]) -> bool:
    """Whether out= tensors of no elements are left by the traced call as eager's kernel leaves them. Over an empty
    batch eager's linalg kernels re-stride their out= tensors column-major (linalg.eig, triangular_solve, geqrf)
    where the fake kernels keep the given strides (aot_eager returns those too): checked by running eager's
    kernel on real tensors of the call's layouts, zeros (the other arguments are small: `linspace(a, b, 0, out=o)`
    over 0-d tensors; an argument over `_PROBE_NUMEL` elements, or eager raising there, is not checked: False)."""
    args, kwargs = replay.fetch_args_kwargs_from_env(n)
    fakes = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if any(not static_layout(t, offset=False) or t.numel() > _PROBE_NUMEL or t.device.type != "cpu" for t in fakes):
        return False
    from torch.utils._python_dispatch import _disable_current_modes

    # (make_fx's and fake tensors' modes set aside: eager's kernel on real tensors, recorded nowhere)
    # (a random op draws nothing into no elements; the random state is kept all the same)
    with _disable_current_modes(), torch.no_grad(), warns.ignored(), kept_rng(args, kwargs):
        try:
            real = {id(t): _zeros_like_layout(t) for t in fakes}
            args_r, kwargs_r = pytree.tree_map_only(torch.Tensor, lambda t: real[id(t)], (args, kwargs))
            n.target(*args_r, **kwargs_r)
        except Exception:  # noqa: BLE001 - eager raises where the fake kernel did not: not eager's behaviour
            return False
        return all((real[id(o)].shape, real[id(o)].stride()) == (o.shape, o.stride()) for o in outs)


_PROBE_NUMEL = 4096


def _zeros_like_layout(t: torch.Tensor) -> torch.Tensor:
    """Zeros of `t`'s sizes, strides and dtype (on memory of their own, as much as those strides span)."""
    span = 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) if t.numel() else 0
    return torch.zeros(max(span, 1), dtype=t.dtype).as_strided(t.shape, t.stride())


_RESTRICTION_NAMES = {
    "NO_GRAD_MODE": "made under no_grad",
    "MULTI_OUTPUT_NODE": "made by split",
    "INFERENCE_MODE": "made in inference mode",
    "IN_CUSTOM_FUNCTION": "returned by a custom Function",
}
_RESTRICTIONS = {CREATION_META[name]: what for name, what in _RESTRICTION_NAMES.items() if name in CREATION_META}
_DEFAULT_VIEW = CREATION_META.get("DEFAULT")
COMPILED_RESTRICTIONS = frozenset({"made under no_grad", "made by split"})


def restriction(x: torch.Tensor) -> str | None:
    """How eager restricts the input `x`, a view that requires grad (the creation meta autograd keeps: made under
    no_grad, by split/unbind, in inference mode, by a custom Function), or None. The passes compile the first two
    (`COMPILED_RESTRICTIONS`: autograd_facts tracks them as fragile views); the backend leaves the others to
    eager."""
    if not x.requires_grad or x._base is None:
        return None
    try:
        x.is_leaf  # noqa: B018 - raises for one whose base was written since it was made (reading it is eager's)
    except RuntimeError:
        return None
    meta = creation_meta(x)
    # (one this torch's CreationMeta has and dealias does not know, or cannot tell: left to eager)
    return None if meta == _DEFAULT_VIEW else _RESTRICTIONS.get(meta, f"of creation {meta}")


_ENTER_AUTOCAST = getattr(getattr(torch.amp, "autocast_mode", None), "_enter_autocast", None)


def capture(gm: fx.GraphModule, leaves: list[Any], names: list[str], symbolic: Symbolic | None = None) -> Captured:
    """Trace dynamo's graph `gm` at the aten level on fake copies of the call's inputs `leaves` (tensors and
    Python scalars); raise DataDependentError if the program depends on tensor data. `names` name the inputs
    (`cache`, `self.lin.weight`). What `symbolic` names is traced as symbols (free int inputs become
    placeholders after the tensors; an int that is a tensor's size is read from that tensor); the other sizes
    and scalars are specialized."""
    args = tuple(leaves)
    leaves, in_spec = pytree.tree_flatten((args, {}))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    symbolic = symbolic or Symbolic()
    sym_positions = list(symbolic.scalars)
    captured = Captured(fx.GraphModule({}, fx.Graph()), in_spec, positions)
    captured.groups = find_groups([leaves[p] for p in positions])
    captured.requires_grad = [leaves[p].requires_grad for p in positions]
    captured.views = [leaves[p]._base is not None for p in positions]
    captured.restricted = {
        i: why for i, p in enumerate(positions) if (why := restriction(leaves[p])) in COMPILED_RESTRICTIONS
    }
    replay = _Replay(gm)
    replay.symbolic = bool(symbolic)

    def flat_fn(*inputs: Any) -> list[torch.Tensor]:
        call_leaves = list(leaves)
        for pos, t in zip(positions + sym_positions, inputs):
            call_leaves[pos] = t
        tensors = inputs[: len(positions)]
        for pos, (tensor, dim) in symbolic.sizes.items():
            call_leaves[pos] = call_leaves[tensor].size(dim)
        # (the caller's saved-tensor hooks are not called on the trace's fake tensors: a Python side effect eager
        # does not have, and a hook such as save_on_cpu's does not take a fake tensor)
        with grad_modes, _AutogradMetadata(tensors, captured.detached), saved_hooks.set_aside():
            out = replay.run(*call_leaves)
        out_leaves, captured.out_spec = pytree.tree_flatten(out)
        # Tensors and symbolic scalars (`cache.length + 1`, which dynamo returns to update an attribute) are
        # computed by the graph; other leaves are constants of the program.
        computed = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)
        captured.out_template = [TENSOR_SLOT if isinstance(o, computed) else o for o in out_leaves]
        results = [o for o in out_leaves if isinstance(o, computed)]
        by_id = {id(t): i for i, t in enumerate(tensors)}
        returned_inputs[:] = [by_id.get(id(o)) for o in results]
        return results

    grad_modes = _GradModes()
    returned_inputs: list[int | None] = []  # per result: the input tensor object it is, if any
    # No real tensor may reach an op while tracing (it would run for real: a write would touch user memory);
    # the backend lifted the graph's tensor attributes to inputs, so every tensor here is a fake.
    shape_env = ShapeEnv() if symbolic else None
    mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=shape_env)
    inputs = [leaves[p] for p in positions]
    fakes = [_fake(mode, t, symbolic.dims.get(p), names[p], inputs) for p, t in zip(positions, inputs)]
    syms = [_symbol(shape_env, leaves[p], names[p]) for p in sym_positions]
    try:
        # make_fx finds the fake mode through the inputs' tensors; with symbols and no tensor input (`f(n)`), only
        # the active mode tells it which ShapeEnv the symbols belong to.
        with quiet_fake_tensor_log(), fx_traceback.preserve_node_meta(), mode if syms else contextlib.nullcontext():
            # (An explicit table, even empty: without one, torch 2.14's make_fx records `detach` as `alias`, which
            # the passes would take for a differentiable view.)
            tracing = "symbolic" if symbolic else "fake"
            traced = make_fx(flat_fn, decomposition_table={}, tracing_mode=tracing)(*fakes, *syms)
    except Exception as e:
        if hasattr(e, _EXACT):  # (fx's interpreter appended the dynamo node it was running to the message)
            e.args = getattr(e, _EXACT)
        if not isinstance(e, _DATA_DEPENDENT):
            raise
        if isinstance(e, DataDependentOutputException):
            what = "reads a tensor's value into Python"
        elif isinstance(e, DynamicOutputShapeException):
            what = "makes a tensor whose shape depends on data (a data-dependent shape)"
        else:
            what = "branches in Python on a tensor's value"
        where = node_location(replay.current) if replay.current is not None else None
        raise DataDependentError(with_location(f"the program {what}", where)) from e
    _check_static(traced)
    _return_inputs_as_themselves(traced, returned_inputs)
    grad_modes.annotate(traced)
    _drop_unused(traced)  # (after the annotation: it counts the traced nodes)
    _rename_inputs(traced, [names[p] for p in positions + sym_positions])
    captured.gm = traced
    captured.fake_mode = mode
    captured.symbols = syms
    captured.sym_positions = sym_positions
    captured.fakes = fakes
    captured.names = list(names)
    return captured


def _symbol(shape_env: ShapeEnv, value: Any, name: str) -> Any:
    """A symbol of the capture's ShapeEnv for a scalar input dynamo made symbolic: a SymInt, or a SymFloat for a
    float (frontend/floats.py). A float symbol only for a finite value other than zero: sympy's guards cannot tell
    0.0 from -0.0 (a guard `s == 0` would let a program specialized at 0.0 serve -0.0) nor compare a nan; the
    backend then compiles with the value specialized, guarded by its bits."""
    source = ConstantSource(name)
    if type(value) is not float:
        return shape_env.create_unspecified_symint_and_symbol(value, source, DimDynamic.DYNAMIC)
    if value == 0.0 or not math.isfinite(value):
        raise UnsupportedError(f"{name} = {value!r} is traced specialized (a zero's sign, a nan or inf)")
    symbol = shape_env.create_unspecified_symbol(value, source, DimDynamic.DYNAMIC)
    return shape_env.create_symfloatnode(symbol, hint=value, source=source)


def _drop_unused(gm: fx.GraphModule) -> None:
    """Remove unused views, clones and attribute reads. Autograd's in-place bookkeeping on a view of
    a tensor that requires grad leaves such nodes in the trace (a clone of the view, an `as_strided` replay of
    it on a lifted tensor constant whose fake shares the input's memory), which alias analysis would otherwise
    have to place."""
    from ..ir.opfacts import is_view_node

    # Only views, clones and attribute reads: some aten schemas do not declare all they write (batch norm's
    # running statistics), so an unused op in general may still have an effect.
    gm.graph.eliminate_dead_code(
        is_impure_node=lambda n: not (n.op == "get_attr" or is_view_node(n) or n.target is torch.ops.aten.clone.default)
    )
    gm.recompile()


def _fake(
    mode: FakeTensorMode, t: torch.Tensor, dims: frozenset[int] | None, name: str, inputs: list[torch.Tensor]
) -> torch.Tensor:
    """A fake of `t` with the sizes of `dims` as symbols (their strides follow), the rest static."""
    if not dims:
        return mode.from_tensor(t, static_shapes=True)
    dynamic = [DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(t.dim())]
    base = None
    if t._is_view() and not any(t._base is x for x in inputs):
        # The fake of a view comes with a fake of its base, by default with every size a symbol. A base that is
        # no input of the graph has no name the shape guard could read it by (`L['x']._base`), so its sizes are
        # the compile's: the guard then bounds the view by that storage, and a larger one recompiles.
        base = StatelessSymbolicContext([DimDynamic.STATIC] * t._base.dim())
    context = StatelessSymbolicContext(dynamic, view_base_context=base)
    return mode.from_tensor(t, source=LocalSource(name), symbolic_context=context)


_OWN_NAMESPACES = frozenset({"aten", "prims", "dealias"})  # ops whose autograd the trace records


def _user_op_with_grad(n: fx.Node, replay: fx.Interpreter) -> bool:
    """Whether `n` calls an operator of a user's library with grad on and an argument requiring grad."""
    op = n.target
    if n.op != "call_function" or not isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return False
    namespace = op.namespace if isinstance(op, torch._ops.OpOverload) else op._qualified_op_name.split("::")[0]
    if namespace in _OWN_NAMESPACES or not torch.is_grad_enabled():
        return False
    args, kwargs = replay.fetch_args_kwargs_from_env(n)
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in pytree.tree_leaves((args, kwargs)))


class _AutogradMetadata(TorchFunctionMode):
    """`x.detach_()`, `x.requires_grad_()` and attribute assignments (`x.data = y`) change a tensor without any
    aten op, so make_fx does not see them. Record detach_() of an input (written back to the caller's
    tensor), let detach_() of a tensor with no history pass (it changes nothing); refuse the rest (the program
    then runs eagerly)."""

    def __init__(self, inputs: tuple[torch.Tensor, ...], detached: set[int]) -> None:
        super().__init__()
        self.inputs = {id(t): i for i, t in enumerate(inputs)}
        self.detached = detached

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.detach_:
            t = args[0]
            if id(t) in self.inputs:
                self.detached.add(self.inputs[id(t)])
            elif t.requires_grad or t.grad_fn is not None or t._is_view():
                raise UnsupportedError("detach_() of a tensor that is not an argument is not supported")
            # (else a no-op: a fresh tensor without history, as dynamo's `torch.tensor([pos])` of a symbolic pos)
        elif func is torch.Tensor.requires_grad_:
            raise UnsupportedError("requires_grad_() inside a compiled function is not supported")
        elif getattr(func, "__name__", "") == "__set__":  # `x.data = y`, `x.grad = None`: no aten op records it
            attr = getattr(getattr(func, "__self__", None), "__name__", "an attribute")
            raise UnsupportedError(f"assigning a tensor's .{attr} inside a compiled function is not supported")
        return func(*args, **(kwargs or {}))


class _GradModes(TorchDispatchMode):
    """Tags each aten call with whether grad mode was on (`with torch.no_grad():` inside the function) as make_fx
    creates its node: through fx's current node meta (`custom` is copied onto every node created while it is
    set), so the mode is the one the call ran in, not matched up afterwards. `annotate` moves it to
    meta["grad"]; a node make_fx adds on its own (a constant, a size) keeps the mode of the call before it."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        meta = fx_traceback.get_current_meta()
        had, custom = "custom" in meta, meta.get("custom")
        meta["custom"] = {**(custom or {}), _GRAD_KEY: torch.is_grad_enabled()}
        layout = inplace_layout(func, args)
        try:
            out = func(*args, **(kwargs or {}))
            # Meta kernels accept an empty `self` of an in-place op whatever the operands' broadcast shape; eager's
            # refuse ("output with shape [0, 1, 3] doesn't match the broadcast shape [0, 10, 3]"): asked of eager,
            # and raised here, before anything runs, with eager's message.
            error = empty_inplace_error(func, args, kwargs or {}, layout)
            if isinstance(error, RuntimeError):
                raise _exact(eager_error(str(error)))
            if error is not None:
                raise _exact(copy.copy(error))
            return out
        finally:
            if had:
                meta["custom"] = custom
            else:
                del meta["custom"]

    def annotate(self, gm: fx.GraphModule) -> None:
        grad = torch.is_grad_enabled()
        for node in gm.graph.nodes:
            custom = node.meta.get("custom")
            if isinstance(custom, dict) and custom.pop(OWN_COUNTER_KEY, False):
                node.meta[OWN_COUNTER_KEY] = True
            if isinstance(custom, dict) and custom.pop(RESHAPE_KEY, False):
                node.meta[RESHAPE_KEY] = True
            if isinstance(custom, dict) and _GRAD_KEY in custom:
                grad = custom.pop(_GRAD_KEY)
            if isinstance(custom, dict) and not custom:
                del node.meta["custom"]
            if node.op == "call_function":
                node.meta["grad"] = grad


_GRAD_KEY = "dealias_grad_enabled"
_EXACT = "dealias_eager_args"  # an exception's attribute: its arguments as eager raised them


def _exact(e: Exception) -> Exception:
    setattr(e, _EXACT, e.args)
    return e


def _return_inputs_as_themselves(gm: fx.GraphModule, returned_inputs: list[int | None]) -> None:
    """A result that is an input tensor object is returned as that input's placeholder. make_fx names a result
    by the node that last produced its value, and after an out= write into a view of the input
    (`slice_scatter(x, s, out=x.view(..))`) it names the input by that op, whose value is the view: the caller
    would get the view back instead of `x` itself. Alias analysis follows the placeholder's object, metadata
    changes included."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    out = gm.graph.output_node()
    results = list(out.args[0])
    for k, i in enumerate(returned_inputs):
        if i is not None and k < len(results):
            results[k] = placeholders[i]
    out.args = (results,)
    gm.recompile()


def _check_static(gm: fx.GraphModule) -> None:
    """Reject reads of tensor data into Python (`.item()`) and data-dependent shapes (`x[mask]`):
    make_fx traces them with unbacked symbols, which a static program cannot run exactly."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        val = node.meta.get("val")
        data_dependent = node.target is torch.ops.aten._local_scalar_dense.default
        if not data_dependent and node.target is not operator.getitem:
            vals = val if isinstance(val, (list, tuple)) else [val]
            data_dependent = any(isinstance(v, torch.Tensor) and free_unbacked_symbols(v) for v in vals)
        if data_dependent:
            what = ".item()/Python scalar of a tensor" if "scalar" in str(node.target) else "a data-dependent shape"
            raise DataDependentError(with_location(f"the program reads {what} ({node.target})", node_location(node)))


def _rename_inputs(gm: fx.GraphModule, names: list[str]) -> None:
    """Name each input after what the user calls it (`cache`, `self_lin_weight`)."""
    used: set[str] = set()
    for node, name in zip(gm.graph.find_nodes(op="placeholder"), names):
        base = re.sub(r"\W+", "_", name).strip("_") or "arg"
        if base[0].isdigit():
            base = f"arg_{base}"
        candidate, k = base, 1
        while candidate in used:
            candidate, k = f"{base}_{k}", k + 1
        used.add(candidate)
        node._rename(candidate)
    gm.recompile()
