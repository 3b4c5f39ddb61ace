"""A fuzz program: the source of its arguments' setup, its body and outputs, runnable as Python (what a
mismatch prints, shrunk)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Program:
    seed: int
    setup: list[str]  # body of make_args(): builds the arguments (some of them aliasing each other)
    params: list[str]
    body: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    autograd: bool = False

    def source(self) -> str:
        lines = ["import torch", "", "", "def make_args():", *(f"    {s}" for s in self.setup), ""]
        if self.autograd and any(name in line for line in self.body for name in AUTOGRAD_NAMES):
            lines = [*lines[:2], AUTOGRAD_PRELUDE, *lines[2:]]
        lines += ["", f"def program({', '.join(self.params)}):"]
        lines += [f"    {s}" for s in self.body] or ["    pass"]
        lines.append(f"    return ({', '.join(self.outputs)}{',' if len(self.outputs) == 1 else ''})")
        return "\n".join(lines) + "\n"

    def load(self) -> tuple[Callable[..., Any], Callable[[], Any]]:
        namespace: dict[str, Any] = {}
        exec(compile(self.source(), f"<fuzz program {self.seed}>", "exec"), namespace)  # noqa: S102
        return namespace["program"], namespace["make_args"]


# Autograd programs also call autograd.Functions (a custom backward that is not the forward's derivative, so a
# lost backward shows; one saving its input for backward), register hooks, and write through detach().
AUTOGRAD_PRELUDE = """
class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 + x


class Ident(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 0.5
"""
AUTOGRAD_NAMES = ("Scale.apply", "Ident.apply")
