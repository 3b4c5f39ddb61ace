"""The generator: one program built a statement at a time against live example tensors, so every statement
kept is valid where it stands; a statement eager rejects is dropped, except that with a small probability the
generator keeps one of eager's error cases (a write through `expand`) to check that dealias raises too without
touching the inputs. The statements themselves are in statements.py."""

from __future__ import annotations

import random
import warnings
from typing import Any

import torch

from . import statements
from .program import AUTOGRAD_PRELUDE, Program


class _Gen:
    """Builds one program: keeps example tensors for every variable and tries statements against them."""

    def __init__(self, seed: int, autograd: bool, wide: bool = False) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.autograd = autograd
        self.wide = wide  # also statements.wide's (drawn only when set: other programs stay as they were)
        self.env: dict[str, Any] = {"torch": torch}
        if autograd:
            exec(AUTOGRAD_PRELUDE, self.env)  # noqa: S102 - the generator's own Functions
        self.names: list[str] = []
        self.count = 0
        self.kind = ""  # kind of the last statement made, and of every statement kept (for statistics)
        self.kinds: list[str] = []

    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def tensors(self, floating: bool | None = None) -> list[str]:
        out = []
        for n in self.names:
            t = self.env[n]
            if isinstance(t, torch.Tensor) and (floating is None or t.is_floating_point() == floating):
                out.append(n)
        return out

    def setup(self) -> Program:
        r = self.rng
        shape = r.choice([(4, 6), (6,), (3, 4, 2), (5, 5), (2, 3, 4)])
        dims = ", ".join(map(str, shape))
        grad = ", requires_grad=True" if self.autograd else ""
        lines = [f"g = torch.Generator().manual_seed({self.seed})", f"b0 = torch.randn({dims}, generator=g{grad})"]
        base = "(b0 * 1)" if self.autograd else "b0"  # non-leaf inputs: eager allows writing into them
        lines.append(f"a0 = {base}")
        params = ["x0"]
        args = ["a0"]
        pattern = r.random()
        if pattern < 0.35:
            view = r.choice(["a0", "a0[1:]", "a0[0]", "a0.t()" if len(shape) == 2 else "a0[:1]", "a0[::2]"])
            lines.append(f"a1 = {view}")
            params.append("x1")
            args.append("a1")
        elif pattern < 0.6:
            lines.append(f"a1 = torch.randn({r.choice(['3', '4, 6', '6', '2, 3'])}, generator=g{grad})")
            if self.autograd:
                lines[-1] = lines[-1].replace("a1 = ", "l1 = ") + "; a1 = l1 * 1"
            params.append("x1")
            args.append("a1")
        lines.append(f"return ({', '.join(args)},)" if len(args) == 1 else f"return ({', '.join(args)})")
        prog = Program(self.seed, lines, params, autograd=self.autograd)
        _, make_args = prog.load()
        for p, t in zip(params, make_args()):
            self.env[p] = t
            self.names.append(p)
        return prog

    def statement(self) -> tuple[str, str | None] | None:
        """A random statement: (source, name it defines or None). `self.kind` says which kind it is."""
        r = self.rng
        ts = self.tensors()
        if not ts:
            return None
        kind = r.random()
        n = self.fresh()
        if self.wide and r.random() < statements.WIDE_SHARE:
            self.kind = "wide"
            return statements.wide(r, n, ts, self.env)
        if self.autograd and r.random() < statements.AUTOGRAD_SHARE:
            self.kind = "autograd"
            return statements.autograd_statement(r, n, r.choice(ts), self.env)
        if kind < statements.NEW_KINDS:
            # tensors made by the program, `out=` writes, in-place ops given an alias of what they write
            if kind < 0.07:
                self.kind = "create"
                t = r.choice(ts)
                return f"{n} = {statements.create(r, t, self.env[t])}", n
            if kind < 0.14:
                self.kind = "out"
                st = statements.out_write(r, ts, self.env)
                return (st, None) if st else None
            self.kind = "aliased"
            st = statements.aliased_write(r, ts, self.env)
            return (st, None) if st else None
        kind = (kind - statements.NEW_KINDS) / (1 - statements.NEW_KINDS)
        t = r.choice(ts)
        x = self.env[t]
        if kind < 0.45:
            self.kind = "view"
            view = statements.view(r, t, x)
            return (f"{n} = {view}", n) if view else None
        if kind < 0.6:
            self.kind = "functional"
            fn = statements.functional(r, t, x, self.tensors(x.is_floating_point()), self.env)
            return (f"{n} = {fn}", n) if fn else None
        self.kind = "write"
        write = statements.write(r, t, x, self.tensors(x.is_floating_point()), self.env)
        return (write, None) if write else None

    def program(self, steps: int) -> Program:
        prog = self.setup()
        attempts = 0
        while len(prog.body) < steps and attempts < steps * 6:
            attempts += 1
            st = self.statement()
            if st is None:
                continue
            src, name = st
            if self.autograd and self.rng.random() < 0.15:
                # A statement under no_grad: a write there is invisible to autograd, in eager and in dealias.
                src = f"with torch.no_grad(): {src}"
            snapshot = {k: v for k, v in self.env.items()}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    exec(src, self.env)  # noqa: S102 - the generator's own statement on its examples
            except Exception:  # noqa: BLE001 - eager rejects it: keep it only as an error case, rarely
                self.env = snapshot
                if self.rng.random() < 0.03 and not self.autograd:
                    prog.body.append(src)
                    self.kinds.append(self.kind + " (error)")
                    break
                continue
            prog.body.append(src)
            self.kinds.append(self.kind)
            if name is not None:
                self.names.append(name)
        outs = [n for n in self.names if isinstance(self.env.get(n), torch.Tensor)]
        k = min(len(outs), self.rng.choice([1, 1, 2, 3]))
        prog.outputs = self.rng.sample(outs, k) if outs else []
        return prog


def generate(seed: int, steps: int | None = None, autograd: bool | None = None, wide: bool = False) -> Program:
    """The program of `seed`; `wide` adds statements.wide's kinds (a different program for the same seed)."""
    r = random.Random(seed * 7919 + 1)
    if autograd is None:
        autograd = r.random() < 0.2
    return _Gen(seed, autograd, wide).program(steps if steps is not None else r.randint(3, 12))
