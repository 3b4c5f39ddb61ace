"""Inductor's FX graph cache for dealias's fused compiles: a second process compiling the same program loads
inductor's generated code from `TORCHINDUCTOR_CACHE_DIR` instead of generating and compiling it again.

Inductor caches a graph only when a tracing context gives it a fake mode with a ShapeEnv (its guards on symbolic
sizes are kept with the entry and checked at a lookup), and keys the entry on the graph's code, the example
inputs' metadata, its config and torch's own source. dealias compiles its graphs itself, at a program's first call,
outside dynamo's tracing context: every fused compile bypassed the cache ("No shape env") and ran inductor's
codegen and C++ compile again in every process (10 s of a warm 16 s Adam first call).

`graph_cache(example)` gives the compile what the cache needs:
- a tracing context whose fake mode is the example's: the capture's own for a program over symbols (the guards a
  cache hit replays then go into the program's ShapeEnv, and from there into its shape guard), a static one for
  a program of static sizes, whose real example tensors are handed to inductor as fake tensors of the same layout
  (inductor would otherwise hash the tensors' values into the key, and never find an entry again);
- dealias's own part of the key: a no-op post-grad pass whose `uuid` is a hash of dealias's source and the names
  of the corrections in force, since dealias changes what inductor generates for its graphs (compat/inductor.py's
  corrections, the `dealias::snapshot` lowering) where the graph's code does not show it. Another dealias, or a
  torch.compile graph of the same code, never shares an entry.

A graph over symbols that an input's size binds without a SymInt input of its own (a decode step's cache length)
is not cached: inductor's entry keeps only guards over its SymInt inputs, so a guard on such a symbol would not be
checked at a lookup nor replayed into the program's shape guard. It compiles as before.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .registry import Missing, active, correction, corrections, ensure, require, require_module


@correction(
    "inductor_graph_cache",
    corrects="inductor's FX graph cache is bypassed for a graph compiled outside dynamo's tracing (no ShapeEnv)",
    without="every fused compile runs inductor's code generation and C++ compile again, in every process",
    lazy=True,
)
def install_graph_cache() -> None:
    codecache = require_module("torch._inductor.codecache")
    require(require(codecache, "FxGraphCache"), "_get_shape_env")
    require(torch._guards, "TracingContext")
    require(torch._guards, "tracing")
    require(require_module("torch._inductor.custom_graph_pass"), "CustomGraphPass")
    require(require_module("torch._subclasses.fake_tensor"), "FakeTensorMode")
    require(require_module("torch.fx.experimental.symbolic_shapes"), "ShapeEnv")
    config = require_module("torch._inductor.config")
    if not hasattr(config, "post_grad_custom_post_pass"):
        raise Missing("torch._inductor.config.post_grad_custom_post_pass is not there")


@contextlib.contextmanager
def graph_cache(example: list[Any]) -> Iterator[list[Any]]:
    """While inductor compiles a graph of dealias's for `example` (real tensors, or the capture's fake tensors and
    symbols): its FX graph cache in use. Yields the example inductor is to be given."""
    if not ensure("inductor_graph_cache"):
        yield example
        return
    from torch._inductor import config

    fakes = [a for a in example if isinstance(a, torch._subclasses.FakeTensor)]
    if fakes:
        mode = fakes[0].fake_mode
        if not _symbols_are_inputs(example) or any(f.fake_mode is not mode for f in fakes):
            yield example  # (bypassed: no shape env, as before)
            return
        handed = example
    else:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        mode = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True)
        try:
            handed = [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in example]
        except Exception:  # noqa: BLE001 - a tensor fake tensors cannot stand for: compiled as before, uncached
            yield example
            return
    with torch._guards.tracing(torch._guards.TracingContext(mode)), config.patch(key_config()):
        yield handed


def key_config() -> dict[str, Any]:
    """The inductor config that puts dealias's part into the cache key, for `compile_fx(config_patches=...)`: a
    backward AOTAutograd compiles at the first backward (after `graph_cache` has exited) gets it from there."""
    return {"post_grad_custom_post_pass": _key_pass()} if ensure("inductor_graph_cache") else {}


def _symbols_are_inputs(example: list[Any]) -> bool:
    """Whether every symbol in the example tensors' sizes, strides and offsets is one of its SymInt inputs."""
    from torch.fx.experimental.symbolic_shapes import free_symbols

    bound = {a.node.expr for a in example if isinstance(a, torch.SymInt)}
    used: set[Any] = set()
    for a in example:
        if isinstance(a, torch.Tensor):
            used |= free_symbols(a)
    return used <= bound


@functools.cache
def _key_pass() -> Any:
    """The no-op post-grad pass that puts dealias's source into inductor's cache key."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class DealiasKey(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            pass  # (nothing: only its uuid matters)

        def uuid(self) -> str:
            # (asked at each compile: which corrections are in force changes what inductor generates, and tests
            # take some out of force for a while)
            return f"{source_hash()}|{','.join(sorted(c.name for c in corrections() if active(c.name)))}"

    return DealiasKey()


@functools.cache
def source_hash() -> str:
    """A hash of every source file of the dealias package imported (its version whatever it is called)."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return f"dealias-{digest.hexdigest()[:32]}"
