"""State outside the arguments: module parameters and buffers, global tensors, closure cells.

Such tensors are *lifted* to inputs: each call fetches them from where they live (a module attribute, a
global name, a closure cell) and passes them to the compiled program like arguments, so their mutations
are written back into them, a tensor rebound between calls (`G = torch.zeros(3)`) is the one used, and
their shapes, strides and dtypes are part of the guard key. Modules are found as the jitted callable itself
and as globals or closure variables of the function; their `training` flags and identities are guarded.
While tracing, fake tensors are put in the lifted tensors' places and the originals restored afterwards.

Python state is not replayed: a program that changes a module's plain Python attribute (`self.calls += 1`
on an int) would do so only when compiled, so dealias refuses it (it runs eagerly, with a warning).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn.utils.stateless import _reparametrize_module

from .errors import UnsupportedError


def _entries(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """A module's lifted tensors: parameters, buffers, plain tensor attributes, then the `.grad` of each
    parameter that has one (an optimizer step reads and writes them), named by their dotted paths."""
    params = list(module.named_parameters(remove_duplicate=False))
    out = params + list(module.named_buffers(remove_duplicate=False))
    # Plain tensor attributes (`self.mask = torch.ones(..)`) too: a module may replace them between calls.
    for prefix, m in module.named_modules(remove_duplicate=False):
        for k, v in vars(m).items():
            if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter):
                out.append((f"{prefix}.{k}" if prefix else k, v))
    return out + [(f"{n}.grad", p.grad) for n, p in params if p.grad is not None]


def getattr_path(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


class Lifted:
    """The lifted state of one jitted callable."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        code_fn = fn.forward if isinstance(fn, torch.nn.Module) else fn
        code_fn = getattr(code_fn, "__func__", code_fn)
        self.fn_globals: dict[str, Any] = getattr(code_fn, "__globals__", {})
        code = getattr(code_fn, "__code__", None)
        names = list(dict.fromkeys(code.co_names)) if code is not None else []
        cells = list(enumerate(getattr(code_fn, "__closure__", None) or ()))
        self.global_names = [n for n in names if isinstance(self.fn_globals.get(n), torch.Tensor)]
        self.cells = [c for _, c in cells if isinstance(_contents(c), torch.Tensor)]
        # Modules: (how to find it now, name for messages)
        self.module_getters: list[tuple[Callable[[], torch.nn.Module], str]] = []
        if isinstance(fn, torch.nn.Module):
            self.module_getters.append((lambda: fn, "self"))
        for n in names:
            if isinstance(self.fn_globals.get(n), torch.nn.Module):
                self.module_getters.append((lambda n=n: self.fn_globals[n], n))
        for i, c in cells:
            if isinstance(_contents(c), torch.nn.Module):
                self.module_getters.append((lambda c=c: c.cell_contents, f"closure {i}"))

    def __bool__(self) -> bool:
        return bool(self.global_names or self.cells or self.module_getters)

    def modules(self, arg_modules: list[torch.nn.Module]) -> list[torch.nn.Module]:
        return [get() for get, _ in self.module_getters] + arg_modules

    def fetch(self, arg_modules: list[torch.nn.Module]) -> list[torch.Tensor]:
        """The lifted tensors as they are now (on every call); `arg_modules` are modules passed as arguments."""
        out = [self.fn_globals[n] for n in self.global_names] + [c.cell_contents for c in self.cells]
        for m in self.modules(arg_modules):
            out += [t for _, t in _entries(m)]
        return out

    def names(self, arg_modules: list[torch.nn.Module]) -> list[str]:
        out = list(self.global_names) + [f"closure{i}" for i in range(len(self.cells))]
        labels = [label for _, label in self.module_getters] + [f"arg{i}" for i in range(len(arg_modules))]
        for label, m in zip(labels, self.modules(arg_modules)):
            out += [n if label == "self" else f"{label}.{n}" for n, _ in _entries(m)]
        return out

    def key(self, arg_modules: list[torch.nn.Module]) -> tuple[Any, ...]:
        """Identity and `training` flags of every module: they change what the program means."""
        return tuple((id(m), tuple(s.training for s in m.modules())) for m in self.modules(arg_modules))

    @contextlib.contextmanager
    def installed(self, values: list[torch.Tensor], arg_modules: list[torch.nn.Module]) -> Iterator[None]:
        """Put `values` (fake tensors, while tracing) where the lifted tensors live; restore afterwards.
        Raise if the program rebinds lifted state or changes a module's Python attributes."""
        it = iter(values)
        saved_globals = {n: self.fn_globals[n] for n in self.global_names}
        saved_cells = [(c, c.cell_contents) for c in self.cells]
        modules = self.modules(arg_modules)
        before = [_python_state(m) for m in modules]
        try:
            for n in self.global_names:
                self.fn_globals[n] = next(it)
            for c in self.cells:
                c.cell_contents = next(it)
            entries = [[(n, next(it)) for n, _ in _entries(m)] for m in modules]
            states = [{n: t for n, t in e if not n.endswith(".grad")} for e in entries]
            grads = [{n[: -len(".grad")]: t for n, t in e if n.endswith(".grad")} for e in entries]
            with contextlib.ExitStack() as stack:
                for m, state in zip(modules, states):
                    stack.enter_context(_reparametrize_module(m, state))
                with torch._C.DisableTorchFunction():  # dealias's own assignment, not the program's
                    for m, g in zip(modules, grads):
                        for n, t in g.items():
                            getattr_path(m, n).grad = t
                yield
                for m, state, g in zip(modules, states, grads):
                    rebound = [n for n, t in state.items() if getattr_path(m, n) is not t]
                    rebound += [f"{n}.grad" for n, t in g.items() if getattr_path(m, n).grad is not t]
                    if rebound:
                        raise UnsupportedError(
                            f"the program assigns a new tensor to module state {rebound[0]}; update it in place "
                            f"(.copy_(...), .zero_()) so dealias can write it back"
                        )
            for i, n in enumerate(self.global_names):
                if self.fn_globals[n] is not values[i]:
                    raise UnsupportedError(f"the program rebinds global {n}; update it in place instead")
        finally:
            self.fn_globals.update(saved_globals)
            for c, v in saved_cells:
                c.cell_contents = v
        for m, b in zip(modules, before):
            after = _python_state(m)
            changed = sorted(k for k in set(b) | set(after) if b.get(k) != after.get(k))
            if changed:
                _restore(m, b)  # the eager fallback must find the state as the caller left it
                raise UnsupportedError(
                    f"the program changes Python attribute {changed[0]} of a module; dealias runs Python only "
                    "when it compiles, so later calls would not change it (keep such state in tensor buffers)"
                )


def _restore(module: torch.nn.Module, state: dict[str, Any]) -> None:
    for path, value in state.items():
        owner, _, attr = path.rpartition(".")
        setattr(getattr_path(module, owner) if owner else module, attr, value)


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _python_state(module: torch.nn.Module) -> dict[str, Any]:
    """The plain (number, string, bool) attributes of every submodule, for change detection."""
    out = {}
    for prefix, m in module.named_modules():
        for k, v in vars(m).items():
            if isinstance(v, (int, float, bool, str, type(None))):
                out[f"{prefix}.{k}" if prefix else k] = v
    return out
