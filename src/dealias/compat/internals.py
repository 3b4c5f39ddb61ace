"""The private functions of torch dealias calls outside its corrections (torch._C's, its _autograd's and its
_dynamo's), looked up once, here, with registry.require: version counters set and moved where eager's are, the
creation meta autograd keeps of a view, whether the running backward keeps its graph, what `x.data` traces to, a
tensor's storage id, dynamo's tensor guard.

Each is bound once at import (the generated call runs some on every call: no lookup there). Where this torch has
one no longer, dealias takes the safe side, as each says: a program that would need it is refused when compiled
(UnsupportedError: its frame runs eagerly, with a FallbackWarning), or the slower public equivalent runs; never
the program without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch._guards
import torch._subclasses.fake_tensor

from ..errors import UnsupportedError
from .registry import Missing, require


def _lookup(owner: Any, attr: str) -> tuple[Any, str]:
    """`owner.attr` and "", or None and why it is missing."""
    try:
        return require(owner, attr), ""
    except Missing as e:
        return None, str(e)


def _refused(why: str) -> Callable[..., Any]:
    def refused(*args: Any) -> Any:
        raise UnsupportedError(why)

    return refused


# Version counters: what autograd checks at backward. A counter left unmoved by a write (inductor's kernels write
# through pointers) or moved where eager's is not (a layout change eager makes in place, a write-back) would let
# backward read new values where eager's raises, or raise where eager's does not.
_SET, _SET_MISSING = _lookup(torch._C._autograd, "_unsafe_set_version_counter")
_INCREMENT, _INCREMENT_MISSING = _lookup(torch._C, "_increment_version")

# `set_version_counters(tensors, versions)`: set each tensor's counter (shared with its base and views). Bound into
# generated calls as it is (the builtin itself); without it, programs that set counters are refused when compiled
# (`version_counters_missing`) and this raises.
set_version_counters: Callable[[tuple[torch.Tensor, ...], tuple[int, ...]], None] = _SET or _refused(
    f"version counters cannot be set here: {_SET_MISSING}"
)
# `increment_versions(tensors)`: move each tensor's counter once, as one in-place op of eager's does.
increment_versions: Callable[[tuple[torch.Tensor, ...]], None] = _INCREMENT or _refused(
    f"version counters cannot be moved here: {_INCREMENT_MISSING}"
)


def version_counters_missing(moved: bool = False) -> str:
    """Why this torch cannot set version counters (`moved`: nor move them), or "": a compile that would need them
    refuses the program."""
    if _SET is None:
        return f"version counters cannot be set here: {_SET_MISSING}"
    return f"version counters cannot be moved here: {_INCREMENT_MISSING}" if moved and _INCREMENT is None else ""


# The creation meta of a view: how eager restricts it (made under no_grad, by split, in inference mode, by a custom
# Function), and autograd's CreationMeta members by name ({} where this torch has none). Without them every view
# that requires grad reads as UNKNOWN_CREATION: restricted in a way dealias does not compile (it runs eagerly).
UNKNOWN_CREATION = "a creation this torch does not tell"
_META, _ = _lookup(torch._C._autograd, "CreationMeta")
CREATION_META: dict[str, Any] = dict(_META.__members__) if _META is not None else {}
creation_meta: Callable[[torch.Tensor], Any] = _lookup(torch._C._autograd, "_get_creation_meta")[0] or (
    lambda x: UNKNOWN_CREATION
)


# What dynamo's graphs call for `x.data` (a view sharing x's memory, not its version counter): passes/capture.py
# tags its nodes. None where this torch has no such function (no node is tagged).
DATA_ATTR, _ = _lookup(torch._C._autograd, "_get_data_attr")


# Whether the backward running now keeps its graph (retain_graph=True): without it, taken as freed (a second
# backward through a fused graph's double-backward recompute then raises eager's "a second time").
_KEEP_GRAPH, _ = _lookup(torch._C._autograd, "_get_current_graph_task_keep_graph")


def backward_keeps_graph() -> bool:
    return bool(_KEEP_GRAPH()) if _KEEP_GRAPH is not None else False


# A function that runs without dynamo, called often: `torch._dynamo.disable(fn)` is a Python frame of dynamo's
# around each call that turns dynamo's frame hook off for everything fn calls and back on after (~1 us a backward of a
# small fused training step, whose node runs such a function), where the hook is almost always off already (a
# backward run from the user's code outside compiled frames). Such a function reads the hook itself
# (`dynamo_hook()`, in C: None where off) and calls its `disable`d self only where it is on (a backward run between
# two graphs of a frame dynamo evaluates); its own frames are ones dynamo passes by (`skip_frames`:
# `torch._dynamo.decorators.skip`, a mark on the code object read in C before any of dynamo's Python runs). Where
# this torch has no hook to read, `dynamo_hook()` is never None (`object()`: a builtin, no frame of its own); where
# it has no mark, `skip_frames` is `disable`.
def _skip_marker() -> Callable[[Callable[..., Any]], Any] | None:
    try:
        from torch._dynamo import decorators

        return require(decorators, "skip", "fn")
    except (ImportError, Missing):
        return None


_SKIP = _skip_marker()
dynamo_hook: Callable[[], Any] = _lookup(torch._C._dynamo.eval_frame, "get_eval_frame_callback")[0] or object


def skip_frames(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, its own frames passed by dynamo's frame hook (see above); `disable(fn)` where this torch cannot."""
    return _SKIP(fn) if _SKIP is not None else torch._dynamo.disable(fn)


# Whether a backward run now may be compiled autograd's (`torch._dynamo.config.compiled_autograd`, or inside
# `compiled_autograd._enable(compiler)`): its compiler is the user's callback, called on the backward's graph (and a
# compile), which eager's backward runs once a call; True where this torch cannot tell.
def compiled_autograd_in_force() -> bool:
    try:
        from torch._dynamo import compiled_autograd, config

        flags = require(config, "compiled_autograd"), require(compiled_autograd, "compiled_autograd_enabled")
    except (ImportError, Missing):
        return True
    return any(bool(flag) for flag in flags)


# A tensor's StorageImpl address, as `untyped_storage()._cdata` (which it falls back to) without making a storage
# object: ~0.1 us a tensor less in the guard every call runs.
storage_id: Callable[[torch.Tensor], int] = _lookup(torch._C, "_storage_id")[0] or (
    lambda t: t.untyped_storage()._cdata
)


def _storage_object() -> Callable[[torch.Tensor], Any] | None:
    """`TensorBase.untyped_storage` where a storage has one Python object while one is alive (torch keeps it in the
    StorageImpl, PyObject preservation): tensors share a storage exactly when it gives them one object, so a set of
    these objects counts storages as `storage_id` does, at ~40 ns a tensor against its ~65 (a pybind call). Probed
    here on tensors sharing a storage and not; None where the probe fails (the ids are used)."""
    method = _lookup(torch._C.TensorBase, "untyped_storage")[0]
    if method is None:
        return None
    try:
        t, other = torch.empty(4), torch.empty(4)
        held = method(t)
        same = method(t[2:]) is held and method(t.view(2, 2)) is held and method(other) is not held
    except Exception:  # noqa: BLE001 - any failure of the probe: the ids
        return None
    return method if same else None


# `storage_object(t)`: the Python object of t's storage, one per storage while alive (see above), or None here.
storage_object = _storage_object()


def _grad_source() -> type | None:
    try:
        from torch._dynamo import source
    except ImportError:  # pragma: no cover - not in the torch this project pins
        return None
    found = _lookup(source, "GradSource")[0]
    return found if isinstance(found, type) else None


# Dynamo's source of a `p.grad` it reads (torch._dynamo.source.GradSource). Dynamo guards an optimizer's gradients
# with NOT_NONE only, no tensor match (variables/builder.py: a GradSource under an optimizer's source), leaving
# their sizes and strides to inductor's asserts: the backend checks every gradient input itself
# (frontend/backend.py `_statically_guarded`). None where this torch has none: then no input counts as guarded by
# dynamo, and every one is checked.
GRAD_SOURCE = _grad_source()


# Dynamo's C++ check of tensors' dtypes, devices, sizes and strides (frontend/guards.py `tensor_check`); None where
# this torch has none: the Python check of the same keys runs.
try:
    from torch._C._dynamo.guards import TensorGuards
except ImportError:  # pragma: no cover - not in the torch this project pins
    TensorGuards = None


# Eager's dispatch of an op in a symbolic trace: make_fx turns torch's Python dispatcher on for symbolic tracing,
# and it runs the Python decompositions torch registers on some ops' autograd keys (`py_impl`) in place of the C++
# kernels eager runs. Some differ from eager: `aten.dropout` outside training returns a clone where eager's
# returns the input tensor itself (a write through the result then missed the input: a silent wrong result), and in
# training draws through `native_dropout` (another autograd node); `aten.native_batch_norm` becomes
# `_native_batch_norm_legit*` (NativeBatchNormLegitBackward0 where eager's is NativeBatchNormBackward0); the recurrent
# ops (`rnn_tanh`, `rnn_relu`, `lstm`, `gru`) draw the dropout between layers otherwise than eager's kernels (other
# numbers in training: a silent wrong result); `matmul` of batches returns a `view` of its bmm where eager's returns
# `_unsafe_view` (a tensor of its own: made under no_grad, the view raised at an in-place op with grad on). Their C++
# composites take symbolic sizes, so capture traces the torch functions reaching them with the dispatcher off (a
# thread-local switch). Without the switch, those functions are refused in a symbolic trace (UnsupportedError: the
# frame runs eagerly with a FallbackWarning).
_NO_PYTHON_DISPATCHER, _NO_PYTHON_DISPATCHER_MISSING = _lookup(torch._C, "_DisablePythonDispatcher")


def eager_dispatch() -> Any:
    """A context manager under which ops dispatch as in eager (torch's Python dispatcher off, this thread)."""
    if _NO_PYTHON_DISPATCHER is None:
        raise UnsupportedError(f"eager's dispatch cannot be traced here: {_NO_PYTHON_DISPATCHER_MISSING}")
    return _NO_PYTHON_DISPATCHER()


# The other way round: torch's Python decompositions where eager's C++ composite checks values that fake tensors do
# not have. `one_hot`'s C++ kernel, given a fake tensor, skips its checks of the classes (negative, or not below
# num_classes: eager raises) and traces to `eq` with an arange: a static trace gave rows of zeros where eager
# raises; torch's Python decomposition (`py_impl`, what a symbolic trace and AOTAutograd run) asserts them in the
# graph (`_assert_async`, kept: opfacts.may_raise).
_PYTHON_DISPATCHER, _PYTHON_DISPATCHER_MISSING = _lookup(torch._dispatch.python, "enable_python_dispatcher")


def checked_dispatch() -> Any:
    """A context manager under which ops dispatch to torch's Python decompositions (its Python dispatcher on)."""
    if _PYTHON_DISPATCHER is None:
        raise UnsupportedError(f"eager's value checks cannot be traced here: {_PYTHON_DISPATCHER_MISSING}")
    return _PYTHON_DISPATCHER()


# A custom autograd Function's C `apply`, bound to the Function's class: what `Function.apply` calls after its
# Python checks (default arguments bound for a `setup_context`, functorch's transforms). For a Function without
# `setup_context` called where no functorch transform is active, those checks do nothing; the caller asks
# `torch._C._are_functorch_transforms_active()` and takes `Function.apply` then. None where this torch has no such
# `apply`: `Function.apply` runs.
_APPLY, _ = _lookup(torch._C, "_FunctionBase")


def function_apply(cls: type) -> Callable[..., Any]:
    """`cls.apply`, by its C `apply` where Function.apply's Python checks would do nothing."""
    import inspect

    raw = inspect.getattr_static(_APPLY, "apply", None) if _APPLY is not None else None
    if (
        not hasattr(raw, "__get__")
        or cls.setup_context is not torch.autograd.function._SingleLevelFunction.setup_context
    ):
        return cls.apply
    c_apply = raw.__get__(None, cls)

    def apply(*args: Any) -> Any:
        if torch._C._are_functorch_transforms_active():
            return cls.apply(*args)
        return c_apply(*args)

    return apply


def fake_maker(mode: Any) -> Callable[[torch.Tensor, torch.device], torch.Tensor] | None:
    """`make(meta, device)`: a fake tensor of `mode` over the meta tensor `meta` (its storage shared with `meta`'s,
    so with every other fake made over that storage), on `device`, by the fake mode's converter without a dispatch
    through the mode (the program cache makes a graph's fakes again: 25 us each this way, 1.6 ms by an op under the
    mode). None where this torch has no such converter method: the program cache then loads nothing."""
    try:
        converter = require(mode, "fake_tensor_converter")
        make = require(converter, "from_meta_and_device", "fake_mode", "t", "device")
    except Missing:
        return None
    return lambda meta, device: make(mode, meta, device)


# The autograd engine's queue of callbacks run at the end of the backward running now (`queue_callback`, what
# autograd.Function's hooks use): the tiers' first backward timed there (frontend/tiers.py). False where this torch
# has none, or no backward runs: the next call times it instead.
_QUEUE, _ = _lookup(torch.autograd.Variable._execution_engine, "queue_callback")


def queue_backward_callback(fn: Callable[[], None]) -> bool:
    if _QUEUE is None:
        return False
    try:
        _QUEUE(fn)
    except RuntimeError:  # ("Final callbacks can only be installed during backward pass")
        return False
    return True


# Dynamo's check of the global state its frames were compiled under (grad mode, autocast, default dtype,
# deterministic algorithms, matmul precision...): a program run outside a call, at the end of a backward, only where
# the state is the call's.
_GLOBAL_STATE, _ = _lookup(torch._C._dynamo.guards, "GlobalStateGuard")
_DISPATCH_MODES, _ = _lookup(torch._C, "_len_torch_dispatch_stack")
_FUNCTION_MODES, _ = _lookup(torch._C, "_len_torch_function_stack")


def autocast_now() -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """A context manager that sets the autocast state in force now (the device types autocasting, their dtypes,
    the cache), to run code later as it was: a backward outside the user's autocast (the mixed-precision idiom,
    `with autocast(): loss = f(x)`, then `loss.backward()`). Where that cannot be read, one that changes nothing:
    `state_check` then tells the state apart."""
    try:
        cache = torch.is_autocast_cache_enabled()
        on = [(d, torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES if torch.is_autocast_enabled(d)]
    except Exception:  # noqa: BLE001 - (another signature: the state as it will be)
        return contextlib.nullcontext

    def enter() -> contextlib.AbstractContextManager[Any]:
        stack = contextlib.ExitStack()
        for device, dtype in on:
            stack.enter_context(torch.autocast(device, dtype=dtype, cache_enabled=cache))
        return stack

    return enter


_AUTOCAST_DEVICES = ("cpu", "cuda")


def state_check() -> Callable[[], bool] | None:
    """A check that the thread's global state is the one now, and no user's torch function or dispatch mode in force
    (it would see the ops run); None where this torch cannot tell."""
    if _GLOBAL_STATE is None or _DISPATCH_MODES is None or _FUNCTION_MODES is None:
        return None
    try:
        same = _GLOBAL_STATE().check
    except Exception:  # noqa: BLE001 - (cannot tell: None)
        return None
    return lambda: bool(same()) and _DISPATCH_MODES() == 0 and _FUNCTION_MODES() == 0


# The id of the autograd graph task this thread runs (-1 outside any backward): a call made inside a backward.
_GRAPH_TASK, _ = _lookup(torch._C, "_current_graph_task_id")


def in_backward() -> bool:
    """Whether this thread runs inside the autograd engine's backward (a hook, a checkpoint's recomputation); False
    where this torch cannot tell."""
    if _GRAPH_TASK is None:
        return False
    try:
        return _GRAPH_TASK() != -1
    except RuntimeError:
        return False


# Inside dynamo's backend call: dynamo's fake mode may be current and its tracing context is (inductor's compile takes
# the fake mode from it, `detect_fake_mode`, not from its own inputs).
_UNSET_FAKE, _ = _lookup(torch._subclasses.fake_tensor, "unset_fake_temporarily")
_TRACING, _ = _lookup(torch._guards, "tracing")


@contextlib.contextmanager
def as_at_the_call() -> Any:
    """Inside dynamo's backend call, a context in which a compile runs as it would at the compiled frame's call: no fake
    mode of dynamo's current, no tracing context of dynamo's. Yields False, changing nothing, where this torch lacks the
    means or a torch function or dispatch mode is still in force (dynamo sets the user's aside while it compiles: one
    left would see the compile's ops); the caller then leaves the compile to the call."""
    if _UNSET_FAKE is None or _TRACING is None or _DISPATCH_MODES is None or _FUNCTION_MODES is None:
        yield False
        return
    with _UNSET_FAKE(), _TRACING(None):
        yield _DISPATCH_MODES() == 0 and _FUNCTION_MODES() == 0


# A user's torch function modes at a compiled call: dynamo traced their `__torch_function__` into the graph (and
# guards the mode stack), so a program that ran the graph's ops under them would apply them twice (a mode adding one
# to every `add`: (x + y + 2) * 2 where eager gives (x + y + 1) * 2; `backend="eager"` alike, dynamo's bug).
_POP_FUNCTION_MODE, _ = _lookup(torch._C, "_pop_torch_function_stack")
_PUSH_FUNCTION_MODE, _ = _lookup(torch._C, "_push_on_torch_function_stack")
if _POP_FUNCTION_MODE is None or _PUSH_FUNCTION_MODE is None or _FUNCTION_MODES is None:
    function_modes: Callable[[], int] = lambda: 0  # (cannot be set aside here: the call runs as dynamo's graph would)
else:
    function_modes = _FUNCTION_MODES


def with_function_modes_aside(run: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """`run(args)` with this thread's torch function modes off the stack (`function_modes()` said some are on it), and
    back on after, in their order."""
    modes = [_POP_FUNCTION_MODE() for _ in range(_FUNCTION_MODES())]
    try:
        return run(*args)
    finally:
        for mode in reversed(modes):
            _PUSH_FUNCTION_MODE(mode)
