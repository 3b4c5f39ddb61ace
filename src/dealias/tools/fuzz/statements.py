"""The statements the generator tries, each made against the example values of the variables so far: views,
functional ops, in-place writes, autograd (custom Functions, hooks, writes through detach()), and, at a smaller
share, tensors the program makes, `out=` writes and in-place ops given an alias of what they write."""

from __future__ import annotations

import math
import random
import warnings
from typing import Any

import torch

from .program import AUTOGRAD_NAMES


def _dim(r: random.Random, x: torch.Tensor) -> int:
    return r.randrange(x.dim()) if x.dim() else 0


def view(r: random.Random, t: str, x: torch.Tensor) -> str | None:
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


def functional(r: random.Random, t: str, x: torch.Tensor, same: list[str], env: dict[str, Any]) -> str | None:
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


def write(r: random.Random, t: str, x: torch.Tensor, same: list[str], env: dict[str, Any]) -> str | None:
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


# --- autograd: custom Functions (AUTOGRAD_PRELUDE), hooks, writes through detach() ---------------------------
AUTOGRAD_SHARE = 0.12  # the share of an autograd program's statements that are of this kind


def autograd_statement(r: random.Random, n: str, t: str, env: dict[str, Any]) -> tuple[str, str | None] | None:
    x = env[t]
    if not x.is_floating_point():
        return None
    choice = r.randrange(5)
    if choice in (2, 3) and (x._base is not None or not x.requires_grad):
        # Eager itself crashes (segfault, torch 2.13) registering a hook on a view whose base was written and
        # then split; hooks go on tensors that are not views.
        return None
    if choice == 0:
        return f"{n} = {r.choice(AUTOGRAD_NAMES)}({t})", n
    if choice == 1:
        return f"{n} = {r.choice(AUTOGRAD_NAMES)}({t} * 1)", n
    if choice == 2:
        return f"{t}.register_hook(lambda g: g * {r.choice(['2', '-1', '0.5'])})", None
    if choice == 3:
        return f"{t}.register_hook(lambda g: g + 1)", None
    return f"{t}.detach().{r.choice(['mul_(0.5)', 'add_(1)', 'zero_()', 'clamp_(-1, 1)'])}", None


# --- statements of the kinds below: tensors the program makes, `out=` writes, in-place ops given aliases ------
NEW_KINDS = 0.18  # their share of the statements tried (create 7 %, out= 7 %, aliased in-place 4 %)
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


def create(r: random.Random, t: str, x: torch.Tensor) -> str:
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


def out_write(r: random.Random, ts: list[str], env: dict[str, Any]) -> str | None:
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


def aliased_write(r: random.Random, ts: list[str], env: dict[str, Any]) -> str | None:
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


# --- wider statements (`generate(wide=True)`, the twenty-first session): ops the kinds above never make -------
WIDE_SHARE = 0.3  # the share of a wide program's statements that are of these kinds


def wide(r: random.Random, n: str, ts: list[str], env: dict[str, Any]) -> tuple[str, str | None] | None:
    """Views that alias or copy by their input's layout (`contiguous`, `reshape` to another shape, `to` the same
    dtype), an in-place op's result kept (an alias of what it wrote), scatters, masked and index writes, triangle
    and diagonal fills, in-place autograd changes (`detach_`, `requires_grad_`), and functional ops of several
    tensors or of other dtypes."""
    t = r.choice(ts)
    x = env[t]
    d = _dim(r, x)
    size = x.shape[d] if x.dim() else 1
    floating = x.is_floating_point()
    same = [u for u in ts if env[u].dtype == x.dtype]
    u = _other(r, x, same, env) or t
    c = r.choice(_CONSTANTS) if floating else 3
    shape = _tuple(tuple(x.shape))
    views = [
        f"{t}.contiguous()",
        f"{t}.to({x.dtype})",
        f"{t}.reshape({x.shape[-1]}, -1)" if x.dim() and x.shape[-1] else f"{t}.reshape(1, -1)",
        f"{t}.mT" if x.dim() >= 2 else f"{t}[None]",
        f"{t}.swapaxes(0, -1)" if x.dim() else f"{t}[..., None]",
        f"{t}.tensor_split(3, {d})[1]" if x.dim() else f"{t}.view_as({t})",
        f"{t}.unflatten(0, (1, -1))" if x.dim() else f"{t}.expand(3)",
        f"{t}.split_with_sizes([1, {size - 1}], {d})[1]" if x.dim() and size >= 1 else f"{t}.ravel()",
        f"{t}.data",
        f"{t}.ravel()",
        f"{t}.expand_as({u})" if env[u].dim() >= x.dim() else f"{t}.view_as({t})",
        f"{t}[torch.tensor([0, -1])]" if x.dim() and len(x) else f"{t}[None]",
    ]
    kept = [  # an in-place op's result: the written tensor itself
        f"{t}.mul_({c})",
        f"torch.nn.functional.relu({t}, inplace=True)" if floating else f"{t}.add_(1)",
        f"{t}.t_()" if x.dim() <= 2 else f"{t}.swapdims_(0, 1)",
    ]
    writes = []
    if x.dim() and size and len(x):
        idx = f"torch.zeros({shape}, dtype=torch.long)"
        writes += [
            f"{t}.scatter_({d}, {idx}, {c})",
            f"{t}.index_put_((torch.tensor([{r.randrange(len(x))}]),), torch.tensor({c}, dtype={x.dtype}), True)",
            f"{t}[{t} > 0] = {c}",
            f"{t}.put_(torch.tensor([0, {x.numel() - 1}]), torch.tensor([{c}, {c}], dtype={x.dtype}))",
        ]
        if floating:
            writes += [f"{t}.scatter_add_({d}, {idx}, {u}.expand_as({t}).clone())"]
    if x.dim() == 2:
        writes += [f"{t}.fill_diagonal_({c})", f"{t}.tril_()", f"{t}.triu_(1)"]
    if floating:
        writes += [
            f"{t}.div_({c})",
            f"{t}.pow_(2)",
            f"{t}.addcdiv_({u}, {u}.abs() + 1)",
            f"{t}.lerp_({u}, 0.3)",
            f"{t}.abs_()",
            f"{t}.random_(0, 5)",
            f"{t}.detach_()",
            # (no `requires_grad_()`: of a caller's tensor after a view of it was written, a known difference,
            # tests/test_fuzz21.py's xfail, that would fill the runs)
            f"{t}.data.mul_({c})",
        ]
    else:
        writes += [f"{t}.floor_divide_(2)", f"{t}.remainder_(3)", f"{t} <<= 1"]
    functionals = [
        f"torch.cat([{t}, {u}.expand_as({t})], {d})" if x.dim() else f"torch.stack([{t}, {u}])",
        f"torch.stack([{t}, {t}])",
        f"{t}.flip(0)" if x.dim() else f"{t} * 1",
        f"{t}.roll(1, {d})" if x.dim() else f"{t} + 0",
        f"{t}.to(torch.float64)",
        f"{t}.int()" if floating else f"{t}.float()",
        f"{t}.sum()",
        f"{t}.clone(memory_format=torch.contiguous_format)",
    ]
    if x.dim():
        functionals += [f"{t}.max({d}).values", f"{t}.sort({d}).values", f"{t}.index_select({d}, torch.tensor([0]))"]
    if floating and x.dim() >= 2:
        functionals += [f"{t} @ {t}.mT", f"torch.softmax({t}, -1)"]
    kind = r.random()
    if kind < 0.3:
        return f"{n} = {r.choice(views)}", n
    if kind < 0.4:
        return f"{n} = {r.choice(kept)}", n
    if kind < 0.8:
        return r.choice(writes), None
    return f"{n} = {r.choice(functionals)}", n
