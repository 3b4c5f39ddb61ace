"""Dynamo's settings dealias needs, in force only while dynamo traces a frame for a dealias backend.

- `enable_dynamo_decompositions = False`: dynamo decomposes `addcmul_`/`addcdiv_`/`add_(alpha=tensor)` into
  inductor's `prims.fma` for inductor's numerics; dealias runs eager's kernels, so it keeps eager's ops (eager's
  bits; and prims.fma run eagerly is slow: a hand-written Adam ran 2.4x eager with it).
- `skip_nnmodule_hook_guards = False`: dynamo does not guard module hooks by default, so a forward hook
  registered after the first call would be ignored. Dynamo then guards each hook dict of each module the frame calls
  (six a module, ~20 ns each warm in C++; four where dynamo_guards.py's `hook_kwargs_guards` leaves the two dicts of
  keyword-argument flags out: after a mobilenet-like training forward's kernels, with the caches cold, six a module
  cost ~90 us of a 2.4 ms call). A cheaper check was measured and left out: one Python check per frame,
  passing while `RemovableHandle.next_id` (moved by every registration) is unchanged, ran the first program for
  another module instance hooked before the compile (dynamo checks a module's class, not which object it is); with
  each module's identity read as well it cost as much as dynamo's per-dict guards once warm, and still missed a hook
  dict changed without a registration (tests/test_module_hook_guards.py).
- `specialize_float = False` (dynamo's default, set explicitly so a process-wide change does not reach dealias):
  a Python float is specialized on the first call and, once its value changed, handed over as a 0-d float64 tensor
  read back with `.item()` (automatic dynamic, as for ints). The backend takes such an input as the Python float
  itself (frontend/floats.py), traced as a float symbol: an LR schedule compiles twice, not once per value up to
  `cache_limit` (issue 39). Dynamo still specializes a nan or an inf (its guards cannot reason about them).
- Where the storage_offset correction is not in force: static shapes (dynamo itself then breaks the graph at
  `t.storage_offset()`; with symbolic shapes it would compute the first call's offset, unguarded).

They used to be set process-wide on import, which changed how every other backend compiled (a hand-written Adam
loop compiled to one graph under any backend without dealias imported, to none with it). Now a wrapper of
dynamo's frame conversion (`ConvertFrameAssert.__call__`, through which every frame dynamo traces passes, with
`fullgraph` or not) patches them for frames traced for a dealias backend, under dynamo's compile lock, so that no
other thread's tracing sees them. Dynamo reads these settings while it traces and while it builds the frame's
guards, both inside that call.

The same wrapper says when dynamo gives up on a whole frame of the user's (an error it cannot handle gracefully,
a graph break inside a loop): dynamo then runs the frame eagerly and says nothing, so the user's code would run
eagerly in silence (issue 39: a hand-written Adam step). One FallbackWarning per frame names the function, its
line and dynamo's reason; frames of torch's own code are left quiet.

Without this correction every dealias graph runs eagerly, with a warning (`settings_in_force` is False): the
settings decide exactness (eager's bits, hooks seen), and they cannot be made otherwise for dealias alone.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from .gc_freeze import older_objects_frozen
from .registry import Missing, active, correction, require, require_module

NAME = "dynamo_settings"
SETTINGS = {"enable_dynamo_decompositions": False, "skip_nnmodule_hook_guards": False, "specialize_float": False}
STATIC = {"automatic_dynamic_shapes": False, "assume_static_by_default": True}


def for_dealias(compiler_fn: Any) -> bool:
    """Whether dynamo's compiler function is a dealias backend, under the wrappers dynamo puts around it
    (`WrapBackendDebug`, `functools.partial` for options, DDPOptimizer's `compile_fn`)."""
    for _ in range(8):
        if getattr(compiler_fn, "is_dealias_backend", False) is True:  # (not any object answering every getattr)
            return True
        inner = (
            getattr(compiler_fn, "compiler_fn", None)
            or getattr(compiler_fn, "func", None)
            or getattr(getattr(compiler_fn, "__self__", None), "backend_compile_fn", None)
        )
        if inner is None:
            return False
        compiler_fn = inner
    return False


def applies(name: str, tx: Any) -> bool:
    """Whether correction `name` is in force and dynamo's instruction translator `tx` traces for a dealias backend:
    the test every wrapper of dynamo's tracing makes before changing anything."""
    return active(name) and for_dealias(getattr(tx.output, "compiler_fn", None))


def _tell_skipped(code: Any, e: BaseException) -> None:
    """One FallbackWarning for a frame of the user's that dynamo will run eagerly (module docstring)."""
    import warnings

    from ..errors import FallbackWarning, is_library_file

    if is_library_file(code.co_filename):
        return  # (torch's own code: its frames are not the user's program)
    reason = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
    where = f"{code.co_filename}:{code.co_firstlineno}"
    name = code.co_name
    if "torch_dynamo_resume_in_" in name:
        name = "the code after a graph break in " + name.split("torch_dynamo_resume_in_")[1].rsplit("_at_", 1)[0]
    warnings.warn(
        f"dealias: {name} ({where}) runs eagerly: dynamo gave up on the whole frame: {reason[:300]}",
        FallbackWarning,
        stacklevel=2,
    )


_frame = threading.local()


def in_dealias_frame() -> bool:
    """Whether this thread's dynamo is converting a frame for a dealias backend now (tracing it, building its
    guards): for corrections that dynamo's callbacks cannot tell otherwise (dynamo_guards.py)."""
    return getattr(_frame, "depth", 0) > 0


def settings_in_force() -> bool:
    """Whether dealias's frames are traced with its settings (else the backend runs every graph eagerly)."""
    return active(NAME)


def _settings() -> dict[str, Any]:
    settings = dict(SETTINGS)
    if not active("storage_offset"):
        settings.update(STATIC)
    return settings


@correction(
    NAME,
    corrects="dynamo's settings for dealias's frames only: eager's addcmul_/addcdiv_ (no prims.fma), guards on "
    "module hooks, a changing Python float an input of the graph",
    without="every dealias graph runs eagerly, with a warning (importing dealias changes no setting)",
)
def install() -> None:
    convert_frame = require_module("torch._dynamo.convert_frame")
    config = require_module("torch._dynamo.config")
    lock = require(convert_frame, "compile_lock")
    patch = require(config, "patch")
    cls = require(convert_frame, "ConvertFrameAssert")
    original = require(cls, "__call__", "self", "frame", "cache_entry", "hooks", "frame_state")
    for name in (*SETTINGS, *STATIC):
        if not hasattr(config, name):
            raise Missing(f"torch._dynamo.config.{name} is not there")

    unsupported = require(require_module("torch._dynamo.exc"), "Unsupported")

    @functools.wraps(original)
    def call(self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
        if not active(NAME) or not for_dealias(getattr(self, "_torchdynamo_orig_backend", None)):
            return original(self, frame, *args, **kwargs)
        _frame.depth = getattr(_frame, "depth", 0) + 1
        try:
            # (the collector's full collections walk only what the trace makes: gc_freeze.py)
            with lock, patch(_settings()), older_objects_frozen():
                return original(self, frame, *args, **kwargs)
        except unsupported as e:
            if not getattr(self, "_one_graph", False):  # (strict compiles raise it to the user)
                _tell_skipped(frame.f_code, e)
            raise
        finally:
            _frame.depth -= 1

    cls.__call__ = call
