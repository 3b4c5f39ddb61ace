"""Differential fuzzer: random valid PyTorch programs full of views and in-place ops, run eagerly and through
`dealias.jit`, compared on everything eager makes observable (`dealias.verify`), shrunk to a minimal
program on a mismatch and printed as runnable Python.

Programs are built one statement at a time against live example tensors, so every statement kept is
valid where it stands (shapes, dtypes); a statement eager rejects is dropped, except that with a small
probability the generator keeps one of eager's error cases (a write through `expand`) to check that
dealias raises too without touching the inputs.
"""

from __future__ import annotations

import math
import random
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import EagerRaisesFallbackWarning, FallbackWarning, GraphBreakWarning, OverlapFallbackWarning
from ..runtime.verify import compare_call, view_on


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
        if self.autograd and any(name in line for line in self.body for name in _AUTOGRAD_NAMES):
            lines = [*lines[:2], _AUTOGRAD_PRELUDE, *lines[2:]]
        lines += ["", f"def program({', '.join(self.params)}):"]
        lines += [f"    {s}" for s in self.body] or ["    pass"]
        lines.append(f"    return ({', '.join(self.outputs)}{',' if len(self.outputs) == 1 else ''})")
        return "\n".join(lines) + "\n"

    def load(self) -> tuple[Callable[..., Any], Callable[[], Any]]:
        namespace: dict[str, Any] = {}
        exec(compile(self.source(), f"<fuzz program {self.seed}>", "exec"), namespace)  # noqa: S102
        return namespace["program"], namespace["make_args"]


class _Gen:
    """Builds one program: keeps example tensors for every variable and tries statements against them."""

    def __init__(self, seed: int, autograd: bool) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.autograd = autograd
        self.env: dict[str, Any] = {"torch": torch}
        if autograd:
            exec(_AUTOGRAD_PRELUDE, self.env)  # noqa: S102 - the generator's own Functions
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
        if self.autograd and r.random() < _AUTOGRAD_SHARE:
            self.kind = "autograd"
            return _autograd_statement(r, n, r.choice(ts), self.env)
        if kind < _NEW_KINDS:
            # tensors made by the program, `out=` writes, in-place ops given an alias of what they write
            if kind < 0.07:
                self.kind = "create"
                t = r.choice(ts)
                return f"{n} = {_create(r, t, self.env[t])}", n
            if kind < 0.14:
                self.kind = "out"
                st = _out(r, ts, self.env)
                return (st, None) if st else None
            self.kind = "aliased"
            st = _aliased_write(r, ts, self.env)
            return (st, None) if st else None
        kind = (kind - _NEW_KINDS) / (1 - _NEW_KINDS)
        t = r.choice(ts)
        x = self.env[t]
        if kind < 0.45:
            self.kind = "view"
            view = _view(r, t, x)
            return (f"{n} = {view}", n) if view else None
        if kind < 0.6:
            self.kind = "functional"
            fn = _functional(r, t, x, self.tensors(x.is_floating_point()), self.env)
            return (f"{n} = {fn}", n) if fn else None
        self.kind = "write"
        write = _write(r, t, x, self.tensors(x.is_floating_point()), self.env)
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


def _dim(r: random.Random, x: torch.Tensor) -> int:
    return r.randrange(x.dim()) if x.dim() else 0


def _view(r: random.Random, t: str, x: torch.Tensor) -> str | None:
    if x.is_complex() and r.random() < 0.5:  # (most ops below reject complex tensors: back to real memory)
        return r.choice([f"torch.view_as_real({t})", f"{t}.real", f"{t}.imag"])
    if x.dim() == 0:
        return r.choice([f"{t}.view(1)", f"{t}.unsqueeze(0)", f"{t}.detach()"])
    d = _dim(r, x)
    size = x.shape[d]
    options = [
        lambda: f"{t}.view(-1)" if x.is_contiguous() else None,
        lambda: f"{t}.reshape(-1)",
        lambda: f"{t}.flatten()",
        lambda: f"{t}.t()" if x.dim() <= 2 else None,
        lambda: f"{t}.transpose(0, {x.dim() - 1})",
        lambda: f"{t}.permute({', '.join(map(str, r.sample(range(x.dim()), x.dim())))})",
        lambda: f"{t}.movedim(0, -1)",
        lambda: f"{t}[{':, ' * d}{r.randrange(size)}:]" if size else None,
        lambda: f"{t}[{':, ' * d}::{r.choice([2, 3])}]",
        lambda: f"{t}[{':, ' * d}{r.randrange(size)}]" if size else None,
        lambda: f"{t}.select({d}, {r.randrange(-size, size)})" if size else None,
        lambda: f"{t}.narrow({d}, {r.randrange(size)}, 1)" if size else None,
        lambda: f"{t}.diagonal({r.choice([0, 1, -1])})" if x.dim() >= 2 else None,
        lambda: f"{t}.unbind({d})[{r.randrange(size)}]" if size else None,
        lambda: f"{t}.split(2, {d})[0]",
        lambda: f"{t}.chunk(2, {d})[-1]",
        lambda: f"{t}.unsafe_chunk(2, {d})[0]",  # shares memory without being an autograd view
        lambda: f"{t}.unsqueeze({r.randrange(x.dim() + 1)})",
        lambda: f"{t}.squeeze()",
        lambda: f"{t}.unfold({d}, 2, {r.choice([1, 2, 3])})" if size >= 2 else None,
        lambda: f"{t}.view(torch.int32)" if x.dtype == torch.float32 and x.is_contiguous() else None,
        lambda: f"{t}.view(torch.float32)" if x.dtype == torch.int32 and x.is_contiguous() else None,
        # complex views of float memory and back (`c.real.add_(x)`: a write through a view of another dtype)
        lambda: f"torch.view_as_complex({t})" if x.dtype == torch.float32 and x.dim() and x.shape[-1] == 2 else None,
        lambda: f"{t}.detach()",
        lambda: f"{t}.expand(2, *{t}.shape)",
        lambda: (
            f"{t}.as_strided(({max(1, x.numel() // 2)},), (1,), {t}.storage_offset())" if x.is_contiguous() else None
        ),
    ]
    return r.choice(options)()


def _other(r: random.Random, x: torch.Tensor, same_kind: list[str], env: dict[str, Any]) -> str | None:
    """A variable whose shape broadcasts to x's."""
    ok = [n for n in same_kind if _broadcasts(env[n].shape, x.shape)]
    return r.choice(ok) if ok else None


def _broadcasts(src: torch.Size, dst: torch.Size) -> bool:
    if len(src) > len(dst):
        return False
    return all(s in (1, d) for s, d in zip(reversed(src), reversed(dst)))


def _functional(r: random.Random, t: str, x: torch.Tensor, same: list[str], env: dict[str, Any]) -> str | None:
    if not x.is_floating_point():
        return r.choice([f"{t} + 1", f"{t} * 2", f"{t}.clone()"])
    u = _other(r, x, same, env)
    options = [f"{t} * {r.choice([2, -1, 0.5])}", f"{t}.sin()", f"{t}.clone()", f"{t} + 1", f"{t}.exp()"]
    if u:
        options += [f"{t} + {u}", f"torch.where({u} > 0, {t}, {u})"]
    if x.dim():
        options += [f"{t}.sum({_dim(r, x)}, keepdim=True)", f"{t}.cumsum({_dim(r, x)})"]
    return r.choice(options)


_DRAWS = 0.06  # the share of in-place writes of a float tensor that are random draws


def _write(r: random.Random, t: str, x: torch.Tensor, same: list[str], env: dict[str, Any]) -> str | None:
    c = r.choice([1.5, -2.0, 0.25, 3.0])
    if not x.is_floating_point():
        return r.choice([f"{t}.add_(1)", f"{t}.bitwise_xor_(5)", f"{t}.mul_(3)", f"{t}.zero_()"])
    if r.random() < _DRAWS:  # (compare_call runs both from the same generator state: the draws must agree)
        return r.choice([f"{t}.bernoulli_(0.5)", f"{t}.uniform_(-1, 2)", f"{t}.normal_()", f"{t}.exponential_()"])
    u = _other(r, x, same, env)
    options = [
        f"{t}.add_({c})",
        f"{t}.mul_({c})",
        f"{t}.zero_()",
        f"{t}.fill_({c})",
        f"{t}.clamp_(-1, 1)",
        f"{t}.relu_()",
        f"{t}.neg_()",
        f"{t}.masked_fill_({t} > 0, {c})",
        f"{t}.sin_()",
    ]
    if u:
        options += [f"{t}.add_({u})", f"{t}.copy_({u})", f"{t}.mul_({u})", f"{t} += {u}"]
    if x.dim():
        d = _dim(r, x)
        if x.shape[d]:
            i = r.randrange(x.shape[d])
            options += [f"{t}[{':, ' * d}{i}] = {c}", f"{t}[{':, ' * d}{i}:] = {c}"]
            options.append(f"{t}.index_fill_({d}, torch.tensor([{i}]), {c})")
    if x.dim() >= 1 and r.random() < 0.15:
        options += [f"{t}.t_()" if x.dim() <= 2 else f"{t}.transpose_(0, 1)", f"{t}.unsqueeze_(0)", f"{t}.squeeze_()"]
    return r.choice(options)


# --- statements of the kinds below: tensors the program makes, `out=` writes, in-place ops given aliases ------
# Autograd programs also call autograd.Functions (a custom backward that is not the forward's derivative, so a
# lost backward shows; one saving its input for backward), register hooks, and write through detach().
_AUTOGRAD_PRELUDE = """
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
_AUTOGRAD_NAMES = ("Scale.apply", "Ident.apply")
_AUTOGRAD_SHARE = 0.12


def _autograd_statement(r: random.Random, n: str, t: str, env: dict[str, Any]) -> tuple[str, str | None] | None:
    x = env[t]
    if not x.is_floating_point():
        return None
    choice = r.randrange(5)
    if choice in (2, 3) and (x._base is not None or not x.requires_grad):
        # Eager itself crashes (segfault, torch 2.13) registering a hook on a view whose base was written and
        # then split; hooks go on tensors that are not views.
        return None
    if choice == 0:
        return f"{n} = {r.choice(_AUTOGRAD_NAMES)}({t})", n
    if choice == 1:
        return f"{n} = {r.choice(_AUTOGRAD_NAMES)}({t} * 1)", n
    if choice == 2:
        return f"{t}.register_hook(lambda g: g * {r.choice(['2', '-1', '0.5'])})", None
    if choice == 3:
        return f"{t}.register_hook(lambda g: g + 1)", None
    return f"{t}.detach().{r.choice(['mul_(0.5)', 'add_(1)', 'zero_()', 'clamp_(-1, 1)'])}", None


_NEW_KINDS = 0.18  # their share of the statements tried (create 7 %, out= 7 %, aliased in-place 4 %)
_CONSTANTS = [1.5, -2.0, 0.25, 3.0]


def _tuple(shape: tuple[int, ...]) -> str:
    return f"({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})"


def _eval(expr: str, env: dict[str, Any]) -> torch.Tensor | None:
    """The example value of a side-effect-free expression (a view or a copy), or None where eager rejects it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            v = eval(expr, env)  # noqa: S307 - the generator's own expression on its examples
    except Exception:  # noqa: BLE001
        return None
    return v if isinstance(v, torch.Tensor) else None


def _create(r: random.Random, t: str, x: torch.Tensor) -> str:
    """A tensor made inside the program, shaped like `t` (or like a shape that broadcasts to t's)."""
    shape = tuple(x.shape)
    if shape and r.random() < 0.3:
        shape = tuple(1 if r.random() < 0.3 else s for s in shape[r.randrange(len(shape)) :])
    dims, tup, numel, c = (
        ", ".join(map(str, shape)) or "()",
        _tuple(shape),
        math.prod(shape),
        r.choice(_CONSTANTS),
    )
    floating = x.is_floating_point()
    options = [
        f"torch.zeros({dims})",
        f"torch.ones({dims})",
        f"torch.full({tup}, {c})",
        f"torch.arange({numel}, dtype=torch.float32).view({tup})",
        f"torch.linspace(-1, 1, {numel}).view({tup})",
        f"torch.zeros_like({t})",
        f"torch.ones_like({t})",
        f"torch.full_like({t}, {c if floating else 3})",
        f"{t}.new_full({tup}, {c if floating else 3})",
        f"{t}.new_zeros({tup})",
        f"{t}.new_ones({tup})",
        f"torch.arange({numel}).view({tup})",  # int64
    ]
    if len(shape) == 1:
        options.append(f"torch.tensor({[r.choice(_CONSTANTS) for _ in range(shape[0])]})")
    if len(shape) == 2:
        options += [f"torch.zeros({shape[1]}, {shape[0]}).t()", f"torch.eye({shape[0]}, {shape[1]})"]
    return r.choice(options)


def _out(r: random.Random, ts: list[str], env: dict[str, Any]) -> str | None:
    """`torch.op(..., out=o)`: o is a tensor or a view of one, the result exactly o's shape and dtype; the inputs
    are sometimes o itself (full overlap, which eager allows for pointwise ops)."""
    t = r.choice(ts)
    x = env[t]
    targets = [t, t, t]
    if x.dim():
        d = _dim(r, x)
        if x.shape[d]:
            targets += [f"{t}[{':, ' * d}{r.randrange(x.shape[d])}]", f"{t}[{':, ' * d}1:]", f"{t}[{':, ' * d}::2]"]
    if x.dim() == 2:
        targets += [f"{t}.t()", f"{t}.diagonal()"]
    values = {e: v for e in targets if (v := _eval(e, env)) is not None and v.numel()}
    dense = [e for e in targets if e in values and values[e].is_contiguous()]
    # dynamo breaks the graph at a non-contiguous `out=` (it never reaches dealias): mostly contiguous targets
    o = r.choice(dense if dense and r.random() < 0.75 else targets)
    if o not in values:
        return None
    ov = values[o]
    same = [n for n in ts if env[n].dtype == ov.dtype]
    # inputs of o's shape: variables, rows of variables, transposed matrices (any of them may alias o)
    exact = [n for n in same if env[n].shape == ov.shape]
    rows = [n for n in same if env[n].dim() and len(env[n]) and env[n].shape[1:] == ov.shape]  # (not 0 rows)
    exact += [f"{n}[{r.randrange(len(env[n]))}]" for n in rows]
    exact += [f"{n}.t()" for n in same if env[n].dim() == 2 and env[n].shape[::-1] == ov.shape]
    exact = [e for e in exact if e != o]
    a = o if r.random() < 0.35 or not exact else r.choice(exact)  # o itself: full overlap
    wide = [n for n in same if _broadcasts(env[n].shape, ov.shape) and n != o]
    b = r.choice(wide) if wide and r.random() < 0.6 else r.choice([o, a])
    if r.random() < 0.5:
        a, b = b, a
    c = r.choice(_CONSTANTS)
    if not ov.is_floating_point():
        options = [
            f"torch.add({a}, {b}, out={o})",
            f"torch.mul({a}, 3, out={o})",
            f"torch.neg({a}, out={o})",
            f"torch.bitwise_xor({a}, {b}, out={o})",
        ]
        return r.choice(options)
    options = [
        f"torch.add({a}, {b}, out={o})",
        f"torch.add({a}, {b}, alpha={c}, out={o})",
        f"torch.sub({a}, {b}, out={o})",
        f"torch.mul({a}, {b}, out={o})",
        f"torch.mul({a}, {c}, out={o})",
        f"torch.maximum({a}, {b}, out={o})",
        f"torch.where({b} > 0, {a}, {b}, out={o})",
        f"torch.neg({a}, out={o})",
        f"torch.sin({a}, out={o})",
        f"torch.exp({a}, out={o})",
        f"torch.abs({a}, out={o})",
        f"torch.clamp({a}, -1, 1, out={o})",
    ]
    if ov.dim():
        options.append(f"torch.cumsum({a}, {_dim(r, ov)}, out={o})")
    if ov.dim() == 2:  # a matrix product into o, from any two matrices of fitting shapes (o itself when square)
        m, k = ov.shape
        left = [n for n in [o, *same] if (v := env.get(n, ov)).dim() == 2 and v.shape[0] == m]
        p = r.choice(left)
        pk = (env[p] if p in env else ov).shape[1]
        right = [n for n in [o, *same] if (v := env.get(n, ov)).dim() == 2 and v.shape == (pk, k)]
        if right:
            options.append(f"torch.mm({p}, {r.choice(right)}, out={o})")
    sums = []  # a reduction of any tensor whose reduced shape is o's
    for n in same:
        s = tuple(env[n].shape)
        for d in range(len(s)):
            if s[:d] + s[d + 1 :] == tuple(ov.shape):
                sums.append(f"torch.sum({n}, {d}, out={o})")
            if s[:d] + (1,) + s[d + 1 :] == tuple(ov.shape):
                sums.append(f"torch.amax({n}, {d}, keepdim=True, out={o})")
    if sums:
        options.append(r.choice(sums))
    return r.choice(options)


def _aliased_write(r: random.Random, ts: list[str], env: dict[str, Any]) -> str | None:
    """An in-place op whose other argument aliases what it writes: the tensor itself, a view of it, or another
    variable sharing its memory (eager rejects many partial overlaps, and the generator drops those)."""
    t = r.choice(ts)
    x = env[t]
    if not x.numel():
        return None
    cands = [t, t]
    d = _dim(r, x)
    if x.dim():
        i = r.randrange(x.shape[d])
        cands += [f"{t}[0]", f"{t}.flip({d})", f"{t}.narrow({d}, {i}, 1)", f"{t}.roll(1, {d})"]
    if x.dim() == 2:
        cands += [f"{t}.t()", f"{t}.diagonal()"]
    cands += [n for n in ts if n != t and env[n].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()]
    ok = [a for a in cands if (v := _eval(a, env)) is not None and v.dtype == x.dtype and _broadcasts(v.shape, x.shape)]
    if not ok:
        return None
    a = r.choice(ok)
    if not x.is_floating_point():
        return r.choice([f"{t}.add_({a})", f"{t}.mul_({a})", f"{t}.bitwise_xor_({a})", f"{t}.copy_({a})"])
    c = r.choice(_CONSTANTS)
    options = [
        f"{t}.add_({a})",
        f"{t}.mul_({a})",
        f"{t}.sub_({a}, alpha={c})",
        f"{t}.copy_({a})",
        f"{t}.addcmul_({a}, {a}, value=0.5)",
        f"{t}.lerp_({a}, 0.5)",
        f"{t}.clamp_(min={a})",
        f"{t} += {a}",
    ]
    full = _eval(a, env)
    if full is not None and full.shape == x.shape:
        options.append(f"{t}.masked_scatter_({t} > 0, {a})")
        if x.dim():
            perm = r.sample(range(x.shape[d]), x.shape[d])
            idx = r.choice([f"torch.tensor({perm})", f"torch.arange({x.shape[d]}).flip(0)"])
            options += [f"{t}.index_add_({d}, {idx}, {a})", f"{t}.index_copy_({d}, {idx}, {a})"]
    if x.dim() == 2 and x.shape[0] == x.shape[1]:
        options += [f"{t}.addmm_({t}, {t}.t())", f"{t}.mul_({t}.t())"]
    return r.choice(options)


def generate(seed: int, steps: int | None = None, autograd: bool | None = None) -> Program:
    r = random.Random(seed * 7919 + 1)
    if autograd is None:
        autograd = r.random() < 0.2
    return _Gen(seed, autograd).program(steps if steps is not None else r.randint(3, 12))


# --- running, comparing, shrinking ---------------------------------------------------------------------
@dataclass
class Outcome:
    # "ok"; "fallback" (dealias ran a graph or the program eagerly); "overlap" (a graph ran eagerly because a write
    # shares memory between elements: eager's result depends on its kernel's order); "graph-break" (dynamo ran a
    # part eagerly, the rest compiled); "error-matched"; "refused" (dynamo's fake tensors raised on an op eager
    # runs, after user code ran: a clear error, not a silent result); "eager-raises" (a graph ran eagerly because
    # eager raises on it later: at backward, or at a view autograd forbids); "mismatch"
    status: str
    detail: str = ""


# Errors dynamo's tracing raised where eager ran the program, after user code had run (so the call could not be
# re-run eagerly): a clear error, not a silent result, counted apart from mismatches.
_DYNAMO_TRACING_ERRORS = ("dealias raised TorchRuntimeError", "dealias raised InternalTorchDynamoError")


def run_program(prog: Program, executor: str = "torch", dynamic: bool = False) -> Outcome:
    import dealias

    try:
        program, make_args = prog.load()
    except Exception as e:  # noqa: BLE001
        return Outcome("ok", f"does not load: {e}")
    from ..runtime.verify import ULP_TOLERANT

    jitted = dealias.jit(program, executor=executor, dynamic=True if dynamic else None)
    tolerant = ULP_TOLERANT.set(executor != "torch")
    try:
        return _run_calls(prog, program, make_args, jitted)
    finally:
        ULP_TOLERANT.reset(tolerant)


def _run_calls(prog: Program, program: Callable[..., Any], make_args: Callable[[], Any], jitted: Any) -> Outcome:
    import dealias

    # Calls 1 and 2 compile and hit the cache; call 3 moves the arguments elsewhere in memory (same sharing, new
    # storage offsets), which a program must not depend on.
    for call in range(2 if prog.autograd else 3):
        args = make_args() if call < 2 else _shifted(make_args(), pad=1 + prog.seed % 7)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FallbackWarning)
            diff = compare_call(program, jitted, args)
            if diff is None and prog.autograd:
                diff = _compare_grads(program, jitted, make_args)
        if diff is not None and diff.startswith(_DYNAMO_TRACING_ERRORS):
            return Outcome("refused", f"call {call + 1}: {diff.splitlines()[0]}")
        if diff is not None:
            return Outcome("mismatch", f"call {call + 1}: {diff}")
        # The most serious fallback names the outcome: dealias's own, then an overlap, then dynamo's graph break.
        for category, status in _FALLBACKS:
            told = [w for w in caught if w.category is category]
            if told:
                return Outcome(status, str(told[0].message))
    if dealias.cache_info(jitted).entries == 0:
        return Outcome("error-matched")
    return Outcome("ok")


_FALLBACKS = (
    (FallbackWarning, "fallback"),
    (OverlapFallbackWarning, "overlap"),
    (EagerRaisesFallbackWarning, "eager-raises"),
    (GraphBreakWarning, "graph-break"),
)


def _shifted(args: tuple[Any, ...], pad: int) -> tuple[Any, ...]:
    """`args` copied into storages `pad` elements longer at the front: same values, sizes, strides and sharing,
    every storage offset moved by `pad`."""
    moved: dict[int, torch.Tensor] = {}  # storage -> a byte tensor over its padded copy
    out = []
    for x in args:
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        key = x.untyped_storage()._cdata
        if key not in moved:
            old = torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage())
            moved[key] = torch.cat([torch.zeros(pad * x.element_size(), dtype=torch.uint8), old.detach()])
        out.append(view_on(moved[key], x, shift=pad))
    return tuple(out)


def _compare_grads(program: Callable[..., Any], jitted: Callable[..., Any], make_args: Callable[[], Any]) -> str | None:
    """Gradients of a weighted sum of the outputs with respect to the leaves behind the arguments."""
    grads = []
    for f in (program, jitted):
        torch.manual_seed(0)
        args = make_args()
        roots = _grad_leaves(args)  # before the program writes into the arguments
        try:
            out = f(*args)
            outs = [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor)]
            weights = [1 + torch.arange(o.numel()).view(o.shape) % 3 for o in outs]
            weighted = [(o.float() * w).sum() for o, w in zip(outs, weights) if o.requires_grad]
            if not roots:
                return None
            # (No output requiring grad is compared too: one side's alone would be a gradient lost or made up.)
            grads.append(torch.autograd.grad(sum(weighted), roots, allow_unused=True) if weighted else _NO_GRAD)
        except Exception as e:  # noqa: BLE001
            grads.append(e)  # eager's error (e.g. "modified by an inplace operation" at backward) is dealias's
    if any(g is _NO_GRAD for g in grads):
        if grads[0] is grads[1]:
            return None
        side = "eager's" if grads[0] is _NO_GRAD else "dealias's"
        return f"autograd: no output of {side} requires grad, the other's do"
    if any(isinstance(g, Exception) for g in grads):
        kinds = [type(g).__name__ if isinstance(g, Exception) else "gradients" for g in grads]
        return None if kinds[0] == kinds[1] else f"autograd: eager gave {kinds[0]}, dealias {kinds[1]}"
    for i, (a, b) in enumerate(zip(*grads)):
        if (a is None) != (b is None) or (a is not None and not torch.allclose(a, b, rtol=1e-4, atol=1e-5)):
            return f"grad of leaf {i} differs"
    return None


_NO_GRAD = object()  # (a program whose outputs require no grad: nothing to differentiate)


def _grad_leaves(args: tuple[Any, ...]) -> list[torch.Tensor]:
    """The leaves behind the arguments: what `b0 * 1` was computed from, or an argument that is a leaf itself."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_leaf and a.requires_grad:
            if all(a is not o for o in out):
                out.append(a)
            continue
        fn = a.grad_fn
        while fn is not None and fn.next_functions:
            nxt = [f for f, _ in fn.next_functions if f is not None]
            if not nxt:
                break
            fn = nxt[0]
        leaf = getattr(fn, "variable", None)
        if leaf is not None and all(leaf is not o for o in out):
            out.append(leaf)
    return out


def shrink(prog: Program, still_fails: Callable[[Program], bool]) -> Program:
    """Remove statements and outputs while the program still fails."""
    changed = True
    while changed:
        changed = False
        for i in range(len(prog.body) - 1, -1, -1):
            body = prog.body[:i] + prog.body[i + 1 :]
            # an output defined by the removed statement is replaced by the first argument
            target = prog.body[i].split(" = ")[0].strip() if " = " in prog.body[i] else None
            outputs = list(dict.fromkeys(prog.params[0] if o == target else o for o in prog.outputs))
            cand = Program(prog.seed, prog.setup, prog.params, body, outputs, prog.autograd)
            if _valid(cand) and still_fails(cand):
                prog, changed = cand, True
        for i in range(len(prog.outputs) - 1, -1, -1):
            if len(prog.outputs) > 1:
                cand = Program(
                    prog.seed,
                    prog.setup,
                    prog.params,
                    prog.body,
                    prog.outputs[:i] + prog.outputs[i + 1 :],
                    prog.autograd,
                )
                if _valid(cand) and still_fails(cand):
                    prog, changed = cand, True
    return prog


def _valid(prog: Program) -> bool:
    """Every name it uses is defined before (statements removed by shrinking may have defined them)."""
    defined = set(prog.params)
    for line in prog.body:
        lhs, _, rhs = line.partition(" = ")
        target = lhs.strip() if rhs and lhs.strip().isidentifier() else None
        used = {w for w in _words(rhs if target else line) if w.startswith("v") and w[1:].isdigit()}
        if not used <= defined:
            return False
        if target:
            defined.add(target)
    return set(prog.outputs) <= defined


def _words(line: str) -> list[str]:
    return "".join(c if c.isalnum() or c == "_" else " " for c in line).split()


def fuzz(
    seed: int,
    count: int,
    seconds: float | None = None,
    out: Any = sys.stdout,
    progress: bool = True,
    autograd: bool | None = None,
    executor: str = "torch",
    dynamic: bool = False,
) -> dict[str, Any]:
    """Run `count` programs from `seed` (or until `seconds` pass); `autograd` True makes every program an
    autograd one (None: one in five). Returns a summary; mismatches are shrunk and printed. With the fused
    executor (`executor="inductor"`), float values compare with a tolerance (verify's). `dynamic`: every size
    symbolic from the first call (the same programs through the passes' and executors' symbolic paths)."""
    start = time.monotonic()
    summary: dict[str, Any] = {
        "ok": 0,
        "fallback": 0,
        "overlap": 0,
        "eager-raises": 0,
        "graph-break": 0,
        "error-matched": 0,
        "refused": 0,
        "mismatch": 0,
        "programs": 0,
        "failures": [],
    }
    for i in range(count):
        if seconds is not None and time.monotonic() - start > seconds:
            break
        prog = generate(seed + i, autograd=autograd)
        outcome = run_program(prog, executor, dynamic)
        summary[outcome.status] += 1
        summary["programs"] += 1
        if outcome.status == "mismatch":
            small = shrink(prog, lambda p: run_program(p, executor, dynamic).status == "mismatch")
            detail = run_program(small, executor, dynamic).detail
            summary["failures"].append((small, detail))
            print(f"\nMISMATCH (seed {prog.seed}): {detail}\n{small.source()}", file=out)
        if progress:
            done = int(30 * (i + 1) / count)
            print(f"\r[{'#' * done}{' ' * (30 - done)}] {i + 1}/{count}", end="", file=out, flush=True)
    if progress:
        print(file=out)
    summary["seconds"] = round(time.monotonic() - start, 1)
    return summary
