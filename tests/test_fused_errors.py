"""The fused executor against eager on programs eager rejects, from PyTorch's op database (test_opinfo.py's programs).

test_opinfo.py builds small programs from each op's first OpInfo sample; few of them make eager raise (7 of 793).
This sweep derives variants that eager rejects for dtype or shape reasons, from the same samples, and keeps those
eager rejects:
- `other-float64`: the in-place program (`r = x.op_(...)`) with its other floating-point tensors float64 (a replay
  buffer fed from numpy): eager's index and scatter kernels refuse another dtype, pointwise ones accept it;
- `index-int32`: the in-place program with its int64 tensors int32 (index_copy_, index_fill_... want int64);
- `self-int64`: the in-place program on an int64 `x` (a float result cannot be cast into it);
- `out-float64` / `out-int64`: the out= program with its out= tensors of another dtype than the result's;
- `empty-broadcast`: an in-place binary ufunc on an empty `x` of [0, 1, 3] with an operand of [0, 10, 3].
Each kept program is compiled with `executor="inductor"` and compared with eager on fresh copies of its inputs, on a
first and a cached call: the same exception type and message (an index checked before the call may name its op and
line after eager's message), the inputs untouched. Bounded for time: every STRIDE-th kept program (each costs a
compile; one that does not raise costs an inductor compile of seconds). Run with -s for the counts.
"""

from __future__ import annotations

import functools
import os
import time
import types
import warnings
from typing import Any

import torch
from test_opinfo import (
    POINTWISE,
    Program,
    _build,
    _cheaper_compiles,
    _inplace_programs,
    _ops,
    _out_programs,
    _Source,
    binary_ufuncs,
)

import dealias

# Every third program eager rejects (all of them: DEALIAS_ERROR_SWEEP_STRIDE=1, about three times as long).
STRIDE = int(os.environ.get("DEALIAS_ERROR_SWEEP_STRIDE", "3"))

# (op, kind) -> why the fused executor differs from eager there; an entry swept that matches fails the test.
KNOWN_MISMATCHES = {
    ("native_batch_norm", "out-float64"): "make_fx traces the out= overload as the functional op and copies into the "
    "out= tensors (casting), so no out= op is left to ask; eager raises 'expected scalar type Float but found Double'",
    ("normal", "out-int64"): "eager's kernel refuses a Long out= tensor (NotImplementedError); asked again on other "
    "values (a negative std) it raises another error, so the error is not taken as one of metadata, and dealias "
    "raises its own 'result type Float can't be cast to the desired output type Long' (a RuntimeError too)",
}


def _retyped(p: Program, kind: str, change: Any) -> Program | None:
    """`p` with its tensor arguments changed by `change(name, tensor)` (None: unchanged); None if none changed."""
    names = p.fn.__code__.co_varnames[: p.fn.__code__.co_argcount]
    args = [change(n, t) for n, t in zip(names, p.args)]
    if all(a is None for a in args):
        return None
    new = [t if a is None else a for t, a in zip(p.args, args)]
    fn = p.fn  # (a code object of its own: dynamo keeps compiled code on it)
    fn = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return Program(p.family, kind, p.op, p.source, fn, tuple(new))


def _float64_others(name: str, t: torch.Tensor) -> torch.Tensor | None:
    return t.double() if name not in ("x", "xb") and t.dtype == torch.float32 else None


def _int32_indices(name: str, t: torch.Tensor) -> torch.Tensor | None:
    return t.int() if t.dtype == torch.int64 else None


def _int64_self(name: str, t: torch.Tensor) -> torch.Tensor | None:
    return t.long() if name == "x" else None


def _out_dtype(dtype: torch.dtype) -> Any:
    def change(name: str, t: torch.Tensor) -> torch.Tensor | None:
        return t.to(dtype) if name.startswith("o") and t.dtype != dtype else None

    return change


def _empty_broadcast() -> list[Program]:
    out = []
    for op in _ops(lambda op: op.inplace_variant is not None and id(op) in POINTWISE and op in binary_ufuncs):
        src = _Source()
        src.tensor(torch.zeros(0, 1, 3), "x")
        call = src.call("x", (torch.zeros(0, 10, 3),), {})
        out.append(_build("inplace", "empty-broadcast", op, [f"r = {call}", "return r, x"], src, op.inplace_variant))
    return out


def _variants() -> list[Program]:
    inplace = [p for p in _inplace_programs() if p.kind == "inplace-input"]
    outs = [p for p in _out_programs() if p.kind == "out-input"]
    found = []
    for programs, kind, change in (
        (inplace, "other-float64", _float64_others),
        (inplace, "index-int32", _int32_indices),
        (inplace, "self-int64", _int64_self),
        (outs, "out-float64", _out_dtype(torch.float64)),
        (outs, "out-int64", _out_dtype(torch.int64)),
    ):
        found += [v for p in programs if (v := _retyped(p, kind, change)) is not None]
    return found + _empty_broadcast()


def _clones(args: tuple[Any, ...]) -> list[Any]:
    return [a.clone() for a in args]


def _eager_error(p: Program, args: list[Any] | None = None) -> BaseException | None:
    try:
        p.fn(*(_clones(p.args) if args is None else args))
    except Exception as e:  # noqa: BLE001 - the programs kept are those eager rejects
        return e
    return None


def run_fused(p: Program) -> str | None:
    """The first difference between eager and the fused executor on `p` (two calls), or None. A failed call must
    leave the inputs as they were, or as eager's failed call left them (`addbmm(.., out=o)` writes o, then checks
    its operands' dtypes)."""
    jf = dealias.jit(p.fn, executor="inductor")
    for call in (1, 2):
        eager_args = _clones(p.args)
        expected = _eager_error(p, eager_args)
        mine = _clones(p.args)
        try:
            jf(*mine)
            got = None
        except Exception as e:  # noqa: BLE001 - compared with eager's
            got = e
        if got is None:
            return f"call {call}: eager raised {type(expected).__name__}: {expected}; fused returned"
        same = str(got) == str(expected) or str(got).startswith(f"{expected} (aten.")
        if not isinstance(got, type(expected)) or not same:
            return f"call {call}: eager raised {expected!r}, fused {got!r}"
        for i, (before, eager, after) in enumerate(zip(p.args, eager_args, mine)):
            as_eager = torch.equal(eager, after) and after._version == eager._version
            if not (torch.equal(before, after) and after._version == 0) and not as_eager:
                return f"call {call}: input {i} touched by a failed call"
    return None


@functools.cache
def rejected() -> list[tuple[Program, BaseException]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        programs = _variants()
        return [(p, e) for p in programs if (e := _eager_error(p)) is not None]


def test_fused_rejects_as_eager():
    kept = rejected()
    sample = kept[::STRIDE]
    start, mismatches = time.perf_counter(), []
    with _cheaper_compiles(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for p, _ in sample:
            diff = run_fused(p)
            if (diff is None) == ((p.op, p.kind) in KNOWN_MISMATCHES):
                diff = diff or "matches eager: remove it from KNOWN_MISMATCHES"
                mismatches.append(f"{p.op} [{p.kind}] {diff.splitlines()[0][:300]}\n{p.source}")
            p.fn = None  # (frees the compiled code as we go)
    by_kind: dict[str, int] = {}
    for p, _ in sample:
        by_kind[p.kind] = by_kind.get(p.kind, 0) + 1
    took = time.perf_counter() - start
    print(f"\n{len(kept)} programs eager rejects, {len(sample)} swept ({by_kind}) in {took:.0f} s")
    print(f"{len(mismatches)} mismatches")
    assert not mismatches, "\n".join(mismatches)
