"""Random state calls and generators traced into the graph in program order, for dealias's compiles only (issue 39).

Dynamo breaks the graph, with every backend, at
- `torch.manual_seed(s)`, `torch.get_rng_state()`, `torch.set_rng_state(t)`: its trace rules skip them (they are
  not aten ops, and a graph whose ops were reordered would draw after the wrong seed);
- a `torch.Generator` handed to a draw (`torch.randn(3, generator=g)`, `x.normal_(generator=g)`): it is a plain
  Python object to dynamo, with no proxy to put in the graph;
- `x.random_(..)` in every form: `x.random_(a, b)` traces to `aten.random_.from`, which fx prints as
  `torch.ops.aten.random_.from(..)`, a syntax error (`from` is a keyword), and dynamo refuses all of random_.

For dealias's frames:
- the three state calls are ops of dealias's own (`dealias::manual_seed`, `dealias::get_rng_state`,
  `dealias::set_rng_state`), tagged `nondeterministic_seeded` like aten's draws: fx and dealias keep them and never
  merge or reorder them with the draws (opfacts.has_effect), the fused executor leaves such a graph to the torch
  executor (a draw, fused.unfusable). Their kernels are torch's own functions, so a seed reaches every device's
  generator as in eager. A seed must be an int (a constant within int64, or one dynamo made symbolic);
- a CPU generator the frame reads (an argument, a global, an attribute) is put in the graph as an attribute of it
  (`get_attr`), guarded by identity (ID_MATCH: the graph draws from that very object; another generator compiles
  again). Its draws are aten's own overloads with `generator=`, run by the torch executor as eager runs them. A
  generator on another device, or one the frame made, keeps dynamo's graph break;
- `x.random_()` traces as aten's; `x.random_(a, b)` as `dealias::random_from_`, eager's op under a printable name,
  and `x.random_(to)` as `dealias::random_to_` (its bound a SymInt: aten's `int to` would pin a changing bound and
  compile once per value); each has a functional twin (`dealias::random_from`), found from the schema as aten's
  are, and is drawn by ir/draws.draw_like into memory of x's layout like any in-place draw. Where x requires grad
  under grad mode dynamo's break stays (no derivative formula of dealias's).

Without this correction each of these breaks the graph, as with every backend (exact: the calls run eagerly).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from .registry import correction, replace_method, require, require_module
from .settings import applies

NAME = "rng"
_LIB: Any = None
_INT64 = (-(2**63), 2**63 - 1)


def _define() -> None:
    global _LIB
    _LIB = torch.library.Library("dealias", "FRAGMENT")
    tags = (torch.Tag.nondeterministic_seeded,)
    _LIB.define("manual_seed(SymInt seed) -> ()", tags=tags)
    _LIB.define("get_rng_state() -> Tensor", tags=tags)
    _LIB.define("set_rng_state(Tensor new_state) -> ()", tags=tags)
    # (`low`/`high`, not aten's `from`/`to`: a keyword argument named `from` would not print either)
    bounds = "SymInt low, SymInt? high, *, Generator? generator=None"
    _LIB.define(f"random_from_(Tensor(a!) self, {bounds}) -> Tensor(a!)", tags=tags)
    _LIB.define(f"random_from(Tensor self, {bounds}) -> Tensor", tags=tags)
    _LIB.define("random_to_(Tensor(a!) self, SymInt high, *, Generator? generator=None) -> Tensor(a!)", tags=tags)
    _LIB.define("random_to(Tensor self, SymInt high, *, Generator? generator=None) -> Tensor", tags=tags)
    # A generator's own state calls (`g.manual_seed(s)`, `g.get_state()`, `g.set_state(t)`), on a CPU generator
    _LIB.define("generator_manual_seed(Generator generator, SymInt seed) -> ()", tags=tags)
    _LIB.define("generator_get_state(Generator generator) -> Tensor", tags=tags)
    _LIB.define("generator_set_state(Generator generator, Tensor new_state) -> ()", tags=tags)
    state_size = torch.random.default_generator.get_state().numel()

    def generator_manual_seed(generator: Any, seed: int) -> None:
        generator.manual_seed(seed)

    def generator_get_state(generator: Any) -> torch.Tensor:
        return generator.get_state()

    def generator_set_state(generator: Any, new_state: torch.Tensor) -> None:
        generator.set_state(new_state)

    def manual_seed(seed: int) -> None:
        torch.random.manual_seed(seed)

    def get_rng_state() -> torch.Tensor:
        return torch.random.get_rng_state()

    def set_rng_state(new_state: torch.Tensor) -> None:
        torch.random.set_rng_state(new_state)

    # (looked up once: the packet's `__getattr__` builds the overload anew on every call, ~150 us)
    aten_from_, aten_from = getattr(torch.ops.aten.random_, "from"), getattr(torch.ops.aten.random, "from")

    def random_from_(self: torch.Tensor, low: int, high: int | None, *, generator: Any = None) -> torch.Tensor:
        return aten_from_(self, low, high, generator=generator)

    def random_from(self: torch.Tensor, low: int, high: int | None, *, generator: Any = None) -> torch.Tensor:
        return aten_from(self, low, high, generator=generator)

    def random_to_(self: torch.Tensor, high: int, *, generator: Any = None) -> torch.Tensor:
        return torch.ops.aten.random_.to(self, high, generator=generator)

    def random_to(self: torch.Tensor, high: int, *, generator: Any = None) -> torch.Tensor:
        return torch.ops.aten.random.to(self, high, generator=generator)

    for name, kernel in [
        ("generator_manual_seed", generator_manual_seed),
        ("generator_get_state", generator_get_state),
        ("generator_set_state", generator_set_state),
        ("random_to_", random_to_),
        ("random_to", random_to),
        ("manual_seed", manual_seed),
        ("get_rng_state", get_rng_state),
        ("set_rng_state", set_rng_state),
        ("random_from_", random_from_),
        ("random_from", random_from),
    ]:
        _LIB.impl(name, kernel, "CompositeExplicitAutograd")

    torch.library.register_fake("dealias::manual_seed", lambda seed: None, lib=_LIB)
    torch.library.register_fake(
        "dealias::get_rng_state", lambda: torch.empty(state_size, dtype=torch.uint8, device="cpu"), lib=_LIB
    )
    torch.library.register_fake("dealias::set_rng_state", lambda new_state: None, lib=_LIB)
    torch.library.register_fake("dealias::generator_manual_seed", lambda generator, seed: None, lib=_LIB)
    torch.library.register_fake(
        "dealias::generator_get_state",
        lambda generator: torch.empty(state_size, dtype=torch.uint8, device="cpu"),
        lib=_LIB,
    )
    torch.library.register_fake("dealias::generator_set_state", lambda generator, new_state: None, lib=_LIB)
    torch.library.register_fake("dealias::random_from_", lambda self, low, high, *, generator=None: self, lib=_LIB)
    torch.library.register_fake(
        "dealias::random_from", lambda self, low, high, *, generator=None: torch.empty_like(self), lib=_LIB
    )
    torch.library.register_fake("dealias::random_to_", lambda self, high, *, generator=None: self, lib=_LIB)
    torch.library.register_fake(
        "dealias::random_to", lambda self, high, *, generator=None: torch.empty_like(self), lib=_LIB
    )


def _fake(var: Any) -> Any:
    node = getattr(getattr(var, "proxy", None), "node", None)
    return node.meta.get("example_value") if node is not None else None


def _seed(var: Any) -> bool:
    """Whether `var` is a seed the op takes as eager's `int(seed)` would: an int constant within int64, or an int
    dynamo made symbolic (a SymNodeVariable)."""
    if var.is_python_constant():
        value = var.as_python_constant()
        return type(value) is int and _INT64[0] <= value <= _INT64[1]
    return isinstance(_fake(var), torch.SymInt)


@correction(
    NAME,
    corrects="torch.manual_seed / get_rng_state / set_rng_state, a torch.Generator argument and x.random_(..) "
    "break the graph",
    without="each of them breaks the graph, as with every backend (the call runs eagerly)",
)
def install() -> None:
    require(torch.library, "register_fake")
    require(torch.library, "Library")
    functions = require_module("torch._dynamo.variables.functions")
    skip_cls = require(functions, "SkipFunctionVariable")
    skip_call = require(skip_cls, "call_function", "self", "tx", "args", "kwargs")
    user_defined = require_module("torch._dynamo.variables.user_defined")
    object_cls = require(user_defined, "UserDefinedObjectVariable")
    as_proxy = require(object_cls, "as_proxy", "self")
    object_call = require(object_cls, "call_method", "self", "tx", "name", "args", "kwargs")
    tensor_cls = require(require_module("torch._dynamo.variables.tensor"), "TensorVariable")
    method_call = require(tensor_cls, "call_method", "self", "tx", "name", "args", "kwargs")
    in_graph = require(require_module("torch._dynamo.variables"), "TorchInGraphFunctionVariable")
    guards = require_module("torch._dynamo.guards")
    install_guard = require(guards, "install_guard")
    id_match = require(require(guards, "GuardBuilder"), "ID_MATCH")
    translator_cls = require(require_module("torch._dynamo.symbolic_convert"), "InstructionTranslator")
    translator = require(translator_cls, "current_tx")
    output_graph = require(require_module("torch._dynamo.output_graph"), "OutputGraph")
    require(output_graph, "register_static_attr_and_return_proxy", "self", "attr_prefix", "attr_value")
    sources = require_module("torch._dynamo.source")
    builder = require_module("torch._dynamo.variables.builder")
    require(builder, "VariableBuilder")
    attr_source, import_source = require(sources, "AttrSource"), require(sources, "ImportSource")
    if _LIB is None:
        _define()
    ops = torch.ops.dealias
    state_calls = {
        torch.random.manual_seed: ops.manual_seed.default,
        torch.random.get_rng_state: ops.get_rng_state.default,
        torch.random.set_rng_state: ops.set_rng_state.default,
    }

    @functools.wraps(skip_call)
    def call_function(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        op = state_calls.get(inspect.unwrap(self.value)) if callable(self.value) else None
        if op is None or kwargs or not applies(NAME, tx):
            return skip_call(self, tx, args, kwargs)
        if op is ops.manual_seed.default:
            if len(args) != 1 or not _seed(args[0]):
                return skip_call(self, tx, args, kwargs)
            in_graph(op).call_function(tx, list(args), {})
            # Eager returns the default generator: built from `torch.default_generator`, so that a draw from it goes
            # into the graph like any generator's and the code after a graph break can be given it.
            source = attr_source(import_source("torch"), "default_generator")  # (guards `torch` by identity)
            return builder.VariableBuilder(tx, source)(torch.default_generator)
        if op is ops.set_rng_state.default:
            if len(args) != 1 or not isinstance(_fake(args[0]), torch.Tensor):
                return skip_call(self, tx, args, kwargs)
            in_graph(op).call_function(tx, list(args), {})
            from torch._dynamo.variables import ConstantVariable

            return ConstantVariable.create(None)
        if args:
            return skip_call(self, tx, args, kwargs)
        return in_graph(op).call_function(tx, [], {})

    def generator_call(self: Any, tx: Any, name: str, args: Any, kwargs: Any) -> Any:
        value = self.value
        if (
            type(value) is not torch._C.Generator
            or name not in ("manual_seed", "get_state", "set_state")
            or kwargs
            or len(args) != (0 if name == "get_state" else 1)
            or not applies(NAME, tx)
            or self.source is None
            or value.device.type != "cpu"
        ):
            return object_call(self, tx, name, args, kwargs)
        if name == "manual_seed" and not _seed(args[0]):
            return object_call(self, tx, name, args, kwargs)
        if name == "set_state" and not isinstance(_fake(args[0]), torch.Tensor):
            return object_call(self, tx, name, args, kwargs)
        op = getattr(ops, f"generator_{name}").default
        result = in_graph(op).call_function(tx, [self, *args], {})
        return self if name == "manual_seed" else result  # (manual_seed returns the generator, set_state None)

    def generator_proxy(self: Any) -> Any:
        value = self.value
        if type(value) is torch._C.Generator and self.source is not None and value.device.type == "cpu":
            tx = translator()
            if tx is not None and applies(NAME, tx):
                held = tx.output.__dict__.setdefault("_dealias_generators", {})
                if id(value) not in held:
                    install_guard(self.source.make_guard(id_match))
                    held[id(value)] = tx.output.register_static_attr_and_return_proxy("generator", value)
                return held[id(value)]
        return as_proxy(self)

    def call_method(self: Any, tx: Any, name: str, args: Any, kwargs: Any) -> Any:
        if name != "random_" or not applies(NAME, tx) or set(kwargs) - {"to", "generator"} or len(args) > 2:
            return method_call(self, tx, name, args, kwargs)
        fake = _fake(self)
        if not isinstance(fake, torch.Tensor) or (torch.is_grad_enabled() and fake.requires_grad):
            return method_call(self, tx, name, args, kwargs)
        kwargs = dict(kwargs)
        bounds = [*args, *([kwargs.pop("to")] if "to" in kwargs else [])]
        none = len(bounds) == 2 and bounds[1].is_python_constant() and bounds[1].as_python_constant() is None
        if not all(_seed(b) for b in bounds[: 1 if none else 2]):
            return method_call(self, tx, name, args, kwargs)  # (eager's TypeError, or a tensor bound: dynamo's way)
        if len(bounds) == 2:
            op = ops.random_from_.default
        elif len(bounds) == 1:
            op = ops.random_to_.default
        else:
            op = torch.ops.aten.random_.default
        in_graph(op).call_function(tx, [self, *bounds], kwargs)
        return self

    replace_method(skip_cls, "call_function", skip_call, call_function)
    object_cls.as_proxy = generator_proxy
    replace_method(object_cls, "call_method", object_call, generator_call)
    replace_method(tensor_cls, "call_method", method_call, call_method)
