"""A hook on a graph input registered before the graph runs, for dealias's compiles only (issue 39).

`x.register_hook(h)` on a tensor the frame received, then a write of x's memory (`x.add_(1)`, `x[0] = 0`, through a
view): eager hooks the version of x before the write (x's grad_fn at the registration), so `h` sees the gradient
of that version. Dynamo registers the hooks of a frame after its graph has run, on x as the graph left it (the
written version): a different gradient, with every backend. dealias's hook_write_break (dynamo_tensor.py) breaks
the graph before such a write (or, with hook_split, dynamo_hook_split.py, at the registration), so that the hook
lands where eager's does; the rest of the frame then runs as a graph of its own (or eagerly, where dynamo cannot
trace the code after the break: fuzz seeds 1100082, 1100230).

Where nothing in the frame wrote x's memory with grad mode on before the registration (a write under no_grad
leaves x's grad_fn, which the hook attaches to, as it was), x's version at the registration is the one the frame
received: registering the hook before the graph runs hooks that very version, as eager does. For such a
write this correction marks x's graph input (`EARLY`) instead of breaking the graph, and dynamo's code after the
graph is changed so that it registers that hook before calling the graph (the handle `register_hook` returns is
kept for the code after the graph, which uses it as dynamo's own code does). Only where
- x is a graph input dynamo reads from the frame (it has a source); its hooks registered so far, in their order,
  are registered before the graph (a registration on it after that breaks the graph there: it may come after a
  write),
- and the hook is a function that can be built before the graph: one dynamo reads from the frame or a global (a
  source), or a function made in the frame without a closure (`lambda g: g * 2`).
Everything else keeps the break. Without this correction the break applies (exact).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .registry import active, correction, require, require_module

NAME = "hook_early"
EARLY = "dealias_hook_early"  # placeholder node meta: the frame's hook on it is registered before the graph runs
_PLANS = "_dealias_early_hooks"  # attribute on dynamo's SideEffects: hook key -> (hook var name, handle var name)
_nested: Any = None


def _hooks_on(output: Any, node: torch.fx.Node) -> list[Any]:
    return [
        entry
        for entry in output.side_effects.tensor_hooks.values()
        if getattr(getattr(entry[0], "proxy", None), "node", None) is node
    ]


def _buildable(hook: Any) -> bool:
    """A hook function the code before the graph can build: read from a source, or made without a closure."""
    if getattr(hook, "source", None) is not None:
        return True
    return type(hook) is _nested and getattr(hook, "closure", None) is None


def mark(output: Any, tensor: torch.fx.Node, written_before: bool) -> bool:
    """Mark graph input `tensor` (its hook registered before anything wrote it: not `written_before`) as hooked
    before the graph, where the module docstring allows; whether it was marked."""
    if not active(NAME) or written_before or tensor.op != "placeholder":
        return False
    if tensor.meta.get(EARLY):
        return True
    # (At the first write of the tensor after its first registration: every hook on it so far was registered
    # before any write of it, the first one checked by the caller, the others after it and before this write.)
    hooks = _hooks_on(output, tensor)
    if not hooks or not all(
        name == "register_hook" and getattr(var, "source", None) is not None and _buildable(hook)
        for var, hook, _handle, name in hooks
    ):
        return False
    tensor.meta[EARLY] = True
    return True


@correction(
    NAME,
    corrects="a write of a graph input after `x.register_hook(h)`: dynamo hooks the written version",
    without="the graph breaks before such a write (hook_write_break), exact",
)
def install() -> None:
    global _nested
    _nested = require(require_module("torch._dynamo.variables.functions"), "NestedUserFunctionVariable")
    side_effects = require(require_module("torch._dynamo.side_effects"), "SideEffects")
    codegen_hooks = require(side_effects, "codegen_hooks", "self", "cg")
    output_graph = require(require_module("torch._dynamo.output_graph"), "OutputGraph")
    compile_and_call = require(output_graph, "compile_and_call_fx_graph", "self", "tx", "rv", "root")
    require(output_graph, "new_var")
    pycodegen = require(require_module("torch._dynamo.codegen"), "PyCodegen")
    require(pycodegen, "add_cache"), require(pycodegen, "add_push_null"), require(pycodegen, "create_load")
    require(pycodegen, "create_store"), require(pycodegen, "create_load_attr"), require(pycodegen, "extend_output")
    create_call_function = require(require_module("torch._dynamo.bytecode_transformation"), "create_call_function")

    def early(effects: Any) -> dict[Any, Any]:
        return {
            key: entry
            for key, entry in effects.tensor_hooks.items()
            if getattr(getattr(entry[0], "proxy", None), "node", None) is not None
            and entry[0].proxy.node.meta.get(EARLY)
        }

    @functools.wraps(codegen_hooks)
    def codegen_hooks_after(self: Any, cg: Any) -> None:
        hooks = early(self) if active(NAME) else {}
        # (No call in the graph: dynamo calls no graph, so nothing would register them before it; nor is there a
        # write there, and the hooks registered after it, by dynamo's own code, land on the version eager hooks.)
        calls = any(n.op in ("call_function", "call_method", "call_module") for n in cg.tx.output.graph.nodes)
        if not hooks or not calls:
            return codegen_hooks(self, cg)
        plans = getattr(self, _PLANS, None)
        if plans is None:
            output = cg.tx.output
            plans = {key: (output.new_var("dealias_hook"), output.new_var("dealias_handle")) for key in hooks}
            setattr(self, _PLANS, plans)
        late = {key: entry for key, entry in self.tensor_hooks.items() if key not in hooks}
        saved = self.tensor_hooks
        try:
            self.tensor_hooks = late
            codegen_hooks(self, cg)
        finally:
            self.tensor_hooks = saved
        # The hooks registered before the graph: the code after it takes their function and handle from where that
        # code left them (dynamo's later references load them from there, as from its own cache).
        for key, (_tensor, hook, handle, _name) in hooks.items():
            hook_var, handle_var = plans[key]
            cg.extend_output([cg.create_load(hook_var)])
            cg.add_cache(hook)
            cg.extend_output([cg.create_load(handle_var)])
            cg.add_cache(handle)
        return None

    @functools.wraps(compile_and_call)
    def compile_and_call_fx_graph(self: Any, tx: Any, rv: Any, root: Any) -> Any:
        instructions, pycode = compile_and_call(self, tx, rv, root)
        plans = getattr(self.side_effects, _PLANS, None)
        if not plans:
            return instructions, pycode
        hooks = early(self.side_effects)
        cg = pycodegen(self.root_tx, root)
        for key, (hook_var, handle_var) in plans.items():
            tensor, hook, _handle, name = hooks[key]

            def method(tensor: Any = tensor, name: str = name) -> None:
                cg(tensor)
                cg.extend_output([cg.create_load_attr(name)])

            cg.add_push_null(method)
            cg(hook)
            cg.extend_output([cg.create_store(hook_var), cg.create_load(hook_var)])
            cg.extend_output(create_call_function(1, False))
            cg.extend_output([cg.create_store(handle_var)])
        if cg.graph_outputs:  # (the hook's function needs the graph's results: cannot be: _buildable)
            raise AssertionError("dealias: a hook registered before the graph reads the graph's outputs")
        return [*cg.get_instructions(), *instructions], pycode

    side_effects.codegen_hooks = codegen_hooks_after
    output_graph.compile_and_call_fx_graph = compile_and_call_fx_graph
