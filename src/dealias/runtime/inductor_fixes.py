"""Where inductor's code is slower than it needs to be on dealias's graphs, corrected for dealias's compiles only
(the correction of inductor's view strides is compat/inductor.py's).

A variance (batch norm's statistics in training, layer and group norm, `torch.var`) is computed on CPU by a
Welford reduction over more than 1,024 elements per result (`config.cpp.use_two_step_variance_threshold`).
Welford's does several times the arithmetic per element of two passes, a mean and then a sum of squared
differences, and while the input stays in the caches the second pass costs little. On this host, CPU time at 1
thread: BatchNorm2d statistics over 16x64x32x32, 713 us Welford against 352 in two passes (0.49x); 8x256x28x28
0.66x; rows of 16,384 0.72x; rows of 4,096 0.48x; over 51 and 64 MB inputs (DRAM-bound) 0.96-1.05x. Inductor's
own two-pass lowering is not exact enough to take it for all of them: its sums are float32 ones, and over a
channel whose values sit far from zero (1234.567 + 1e-3 * noise) its mean lost its low digits, which `x - mean`
divided by a small deviation magnified: a batch norm's output was off by 1.5 where eager's is off by 0.006. Two
reviews found more (a shift by the group's first element broke on an outlier there; float32 sums of squares lost a
large term's neighbours, 1e-5 of a variance). dealias's compiles decompose `var_mean` and `var` of float32 inputs
(`decompositions`) into two passes accumulated in float64, rounded once: as precise as eager's or more on every
case those reviews tried (the channel above: 0.0019 off, eager's 0.0042; an outlier of 1e6 among values near 1,
a first element of 1e4, values near float32's largest), at 0.65-0.7x torch.compile's CPU time for bn_train.
Only where inductor takes Welford's (more than 1,024 elements per result), for inputs of at most
TWO_STEP_MAX_BYTES, static sizes, not reduced to one value (inductor splits such a reduction over threads, which
Welford's combines), and not over a float32 copy of a half-precision input (`_upcast`): a third review measured
float64 passes slower than inductor's own code for bfloat16 batch norm (2.5x) and for LayerNorm rows of 768
(1.4-1.9x, where inductor's float32 two passes ran).
Over symbolic sizes inductor's lowering runs, as torch.compile's does.

Which of the two is faster depends on the host, by large factors both ways: the 0.49x above was an AMD EPYC's;
on an Intel Xeon (AVX-512) the float64 passes took 2-3x Welford's time (bn_train: the fused step at 1.8x eager,
torch.compile's at 0.55x). So it is measured once per host, like the keep-ATen list (keep_aten.py, whose file
keeps the verdict): the statistics of a BatchNorm2d over 16x64x32x32 in float64 passes against inductor's
Welford, each compiled alone, and the float64 passes are taken only where they are not slower. Only a graph with a
variance the passes would take asks (`variance_decided`): the measurement is two C++ compiles, which ran in every
cold process's first fused compile before, an AdamW step's and GPT-2's too (no variance; LayerNorm rows of 768,
under the threshold), whose code the verdict never changed. Where they are slower,
inductor's Welford runs, as torch.compile's does. Its sums are float32 ones, and its relative error grows with the
square of the data's mean over its deviation: BatchNorm-like statistics of randn + c, Welford / eager (which
accumulates in double): 2.4e-7 / 5.7e-8 at c = 1 and 10, 5.5e-6 at 1e3, 1e-4 at 1e4 (the fused tolerance's
order), 6.7e-2 at 1e6 (torch.compile's alike). A program that needs eager's variances of such data pins the
float64 passes: `DEALIAS_VARIANCE` overrides the measurement, `float64` (the passes above) or `inductor`
(inductor's own lowering); another value raises.

The variance's is a decomposition table dealias's compiles pass to inductor: other compiles in the process see
inductor unchanged. The same table carries one correction of inductor's values: a floor division of floats
(`div(.., rounding_mode="floor")`, `floor_divide`, `//`) and a float `remainder` are lowered by inductor as
`floor(a / b)` and `a - b * floor(a / b)`, where eager's kernels (ATen's `div_floor_floating` and remainder) start
from `fmod(a, b)`: `1.0 // 0.1` is 9 in eager and 10 in inductor (torch.compile's too), `inf // 3` NaN and inf.
dealias's compiles decompose them into eager's own steps (`_floor_divide_float`, `_remainder_float`), which inductor
computes exactly (fmod, one division, comparisons), in float32 for half-precision inputs as eager's kernels do.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import torch

TWO_STEP_MAX_BYTES = 16 << 20
_MEASURED_SHAPE = (16, 64, 32, 32)  # BatchNorm2d(64)'s statistics over a batch of 16 images of 32x32
_SETTINGS = ("measure", "float64", "inductor")

aten = torch.ops.aten


def decompositions(gm: torch.fx.GraphModule | None = None) -> dict[Any, Any]:
    """Inductor's decomposition table, with the variance in two float64 passes where they are faster on this host
    (see the module's text). For a graph `gm` none of whose variances the passes would take (`variance_decided`),
    the host's verdict is not asked (its measurement is two C++ compiles, most of a cold first call's extra time):
    the table is the one of a host where the passes are slower, which traces such a graph to the same code."""
    if gm is not None and not variance_decided(gm):
        return _table(False)
    return _table(_float64_passes_here())


def variance_decided(gm: torch.fx.GraphModule) -> bool:
    """Whether tracing `gm` (and the graphs it calls) with the table may reach a variance that `_var_mean_two_pass`
    takes, where the host's verdict decides: a float32 variance on CPU over more than inductor's two-step
    threshold of elements per result, of at most TWO_STEP_MAX_BYTES. Over-inclusive where unsure: an op this does
    not read (an unknown op named like a norm or a variance, another library's op, which may decompose into one)
    counts as deciding; those it reads are the variances and the norms (batch, layer, group) whose decompositions
    compute one."""
    from torch._inductor import config

    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for n in module.graph.nodes:
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
                count = _variance_count(n)
                if count is _UNSURE or (count is not None and count > config.cpp.use_two_step_variance_threshold):
                    return True
    return False


_UNSURE = object()


def _plain(v: Any) -> int:
    """`v`, a plain int; a TypeError for anything else. Never `int()` of a symbolic size: it would specialize the
    size (a guard on its value added to the program's ShapeEnv: a batch norm over a changing batch size compiled
    again for each size)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"not a plain int: {v!r}")
    return v


# Norms whose decompositions compute no variance: vector and matrix norms (a gradient clipping's), weight and RMS norms.
_NO_VARIANCE = frozenset(
    "norm linalg_vector_norm linalg_matrix_norm linalg_norm _foreach_norm renorm frobenius_norm nuclear_norm "
    "_weight_norm _weight_norm_interface _weight_norm_interface_backward rms_norm _fused_rms_norm".split()
)


def _variance_count(n: torch.fx.Node) -> Any:
    """The elements per result of the float32 CPU variance within TWO_STEP_MAX_BYTES that the op `n` computes
    (after decomposition), None where it computes none that the passes would take, _UNSURE where not known."""
    from ..ir.opfacts import bind_args

    op = n.target
    namespace, name = op._schema.name.split("::", 1)
    if namespace in ("prims", "dealias"):
        return None
    family = re.search(r"var|std|norm", name)
    if namespace != "aten":
        return _UNSURE
    if family is None or name in _NO_VARIANCE:
        return None
    x = n.args[0].meta.get("val") if n.args and isinstance(n.args[0], torch.fx.Node) else None
    if not isinstance(x, torch.Tensor):
        return _UNSURE
    try:
        args = bind_args(op._schema, n.args, n.kwargs, defaults=True)
        shape = [_plain(d) for d in x.shape]
    except Exception:  # noqa: BLE001 - symbolic sizes, arguments the schema does not bind: unsure
        return _UNSURE
    if x.device.type != "cpu" or x.dtype is not torch.float32 or x.numel() * 4 > TWO_STEP_MAX_BYTES:
        return None  # (a half-precision input's float32 copy is `_upcast`: inductor's own code there)
    numel = math.prod(shape)
    try:
        if name in ("var", "var_mean", "std", "std_mean"):
            dims = args.get("dim")
            dims = [dims] if isinstance(dims, int) else list(dims or [])
            if not dims or len({d % len(shape) for d in dims}) == len(shape):
                return None  # (reduced to one value: inductor's own code)
            return math.prod(shape[d] for d in dims)
        if name in ("native_layer_norm", "layer_norm"):
            return math.prod(_plain(d) for d in args["normalized_shape"])
        if name == "native_group_norm":
            return _plain(args["C"]) // _plain(args["group"]) * _plain(args["HxW"])
        if "batch_norm" in name and "backward" not in name:
            if args.get("training", True) is False or name.endswith("no_training"):
                return None  # (the running statistics: no variance computed)
            return numel // shape[1]
    except Exception:  # noqa: BLE001 - an argument of another form: unsure
        return _UNSURE
    if "backward" in name:
        return None  # (a norm's backward reads the saved statistics)
    return _UNSURE


def _table(float64_passes: bool) -> dict[Any, Any]:
    from torch._inductor.decomposition import select_decomp_table

    table = dict(select_decomp_table())
    table.update({op: _before(fn, table.get(op)) for op, fn in _EAGER_FLOAT_DIVISIONS.items()})
    if float64_passes:
        table.update({aten.var_mean.correction: _var_mean_two_pass, aten.var.correction: _var_two_pass})
    return _Table(table, float64_passes)


class _Table(dict):
    """The table, pickled as the call of `_table` that makes it: inductor hashes the table handed to `compile_fx`
    into its cache keys, and one of inductor's own entries is a C++ function that cannot be pickled (the FX graph
    cache was then bypassed for every graph autograd records). What the entries do is in dealias's source, which
    the key holds (compat/graph_cache.py); which variance they compute, in the argument."""

    def __init__(self, table: dict[Any, Any], float64_passes: bool) -> None:
        super().__init__(table)
        self.float64_passes = float64_passes

    def __reduce__(self) -> Any:
        return _table, (self.float64_passes,)


def _float64_passes_here() -> bool:
    setting = os.environ.get("DEALIAS_VARIANCE", "measure").strip().lower()
    if setting not in _SETTINGS:
        raise ValueError(f"DEALIAS_VARIANCE={setting!r}: expected one of {', '.join(_SETTINGS)}")
    if setting != "measure":
        return setting == "float64"
    from .keep_aten import measured

    key = f"variance in float64 passes|{_MEASURED_SHAPE}|threads={torch.get_num_threads()}"
    passes_s, welford_s = measured(key, measure)
    return passes_s <= welford_s


def measure() -> tuple[float, float]:
    """Seconds per call of a BatchNorm2d's statistics (`_MEASURED_SHAPE`, float32): in the float64 passes, and by
    inductor's own lowering (Welford's). Each compiled alone by inductor; best of interleaved rounds."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..compat.vec_isa import vec_isa_config
    from .keep_aten import best_of

    def statistics(x: torch.Tensor) -> Any:
        return torch.var_mean(x, (0, 2, 3), correction=0)

    # (Real tensors in a clean context, off the caller's random numbers: as keep_aten.aten_against_inductor.)
    with unset_fake_temporarily(), torch._guards.tracing(None), torch.no_grad(), torch.random.fork_rng(devices=[]):
        x = torch.randn(_MEASURED_SHAPE)
        compiled = []
        for float64_passes in (True, False):
            gm = make_fx(statistics, decomposition_table=_table(float64_passes))(x)
            with inductor_config.patch(vec_isa_config()):  # (its ISA probes recorded: keep_aten.py's)
                compiled.append(compile_fx_inner(gm, [x]))
        passes, welford = compiled
        return best_of(lambda: passes([x]), lambda: welford([x]))


def _var_two_pass(x: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    out = _var_mean_two_pass(x, dim, correction=correction, keepdim=keepdim)
    return out if out is NotImplemented else out[0]


def _var_mean_two_pass(x: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    """`var_mean(x, dim, correction, keepdim)` in two passes accumulated in float64 (the mean, then the squared
    differences from it), rounded once to x's dtype. NotImplemented (inductor's own lowering) outside the cases
    the module's text names."""
    from torch._inductor import config

    dims = [dim] if isinstance(dim, int) else list(dim or [])
    if x.device.type != "cpu" or x.dtype is not torch.float32 or not dims or x.dim() == 0:
        return NotImplemented
    if not all(isinstance(n, int) for n in x.shape):
        return NotImplemented
    dims = sorted({d % x.dim() for d in dims})
    if len(dims) == x.dim() or any(x.shape[d] == 0 for d in dims):
        return NotImplemented
    if x.numel() * x.element_size() > TWO_STEP_MAX_BYTES:
        return NotImplemented
    count = math.prod(x.shape[d] for d in dims)
    if count <= config.cpp.use_two_step_variance_threshold or _upcast(x):
        return NotImplemented  # (inductor's own code: float64 passes cost more there)
    c = 1 if correction is None else correction
    y = x.to(torch.float64)
    mean = y.sum(dims, keepdim=True) / count
    d = y - mean
    var = (d * d).sum(dims, keepdim=True) / max(count - c, 0)
    if not keepdim:
        var, mean = var.squeeze(dims), mean.squeeze(dims)
    return var.to(x.dtype), mean.to(x.dtype)


def _upcast(x: torch.Tensor) -> bool:
    """Whether the traced `x` is a float32 copy of a half-precision tensor (a bfloat16 batch norm's input, which
    its decomposition upcasts): float64 passes over it ran 2.5x slower than inductor's Welford."""
    from torch.fx.experimental.proxy_tensor import get_innermost_proxy_mode, get_proxy_slot

    mode = get_innermost_proxy_mode()
    proxy = get_proxy_slot(x, mode.tracer, None) if mode is not None else None
    node = getattr(getattr(proxy, "proxy", None), "node", None)
    if node is None or node.target not in (torch.ops.prims.convert_element_type.default, aten._to_copy.default):
        return False
    source = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    return isinstance(source, torch.Tensor) and source.dtype in (torch.float16, torch.bfloat16)


def _float_operands(a: Any, b: Any, scalar_in_result_dtype: bool) -> tuple[Any, Any, torch.dtype] | None:
    """`a` and `b` as eager's float kernels read them: tensors in the result's dtype, computed in float32 where that
    is a half-precision one (ATen's opmath); a Python number rounded to the result's dtype where
    `scalar_in_result_dtype` (remainder's kernel), else to the computation's (the floor division's keeps it in
    float32 for a half-precision tensor: `half(1.0) // 0.1` is 9, `// half(0.1)` 10). The number is rounded here,
    in Python: inductor drops a conversion to half precision inside a kernel. None where the result is not a float
    (inductor's integer divisions are eager's)."""
    dtype = torch.result_type(a, b)
    if not dtype.is_floating_point:
        return None
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    like = a if isinstance(a, torch.Tensor) else b

    def operand(v: Any) -> torch.Tensor:
        if isinstance(v, torch.Tensor):
            return v.to(dtype).to(compute)
        if scalar_in_result_dtype:
            v = torch.tensor(v, dtype=dtype).item()
        return torch.scalar_tensor(v, dtype=compute, device=like.device)

    return operand(a), operand(b), dtype


def _floor_divide_float(a: Any, b: Any) -> Any:
    """Eager's floor division of floats (ATen's `div_floor_floating`); NotImplemented for integers."""
    operands = _float_operands(a, b, scalar_in_result_dtype=False)
    if operands is None:
        return NotImplemented
    a, b, dtype = operands
    mod, signs_differ = _fmod(a, b)
    div = (a - mod) / b
    div = torch.where(signs_differ, div - 1, div)
    floor = torch.floor(div)
    floor = torch.where(div - floor > 0.5, floor + 1, floor)
    quotient = a / b
    floor = torch.where(div != 0, floor, torch.copysign(torch.zeros_like(quotient), quotient))
    return torch.where(b != 0, floor, quotient).to(dtype)


def _div_mode(a: Any, b: Any, *, rounding_mode: str | None = None) -> Any:
    return _floor_divide_float(a, b) if rounding_mode == "floor" else NotImplemented


def _remainder_float(a: Any, b: Any) -> Any:
    """Eager's remainder of floats (ATen's: fmod, then `+ b` where the signs differ); NotImplemented for integers."""
    operands = _float_operands(a, b, scalar_in_result_dtype=True)
    if operands is None:
        return NotImplemented
    a, b, dtype = operands
    mod, signs_differ = _fmod(a, b)
    return torch.where(signs_differ, mod + b, mod).to(dtype)


def _fmod(a: Any, b: Any) -> tuple[Any, Any]:
    """The step both of eager's float kernels start from: `fmod(a, b)`, and where it is nonzero with another sign
    than `b` (where floor division takes one off the quotient and remainder adds `b`)."""
    mod = torch.fmod(a, b)
    return mod, (mod != 0) & ((b < 0) != (mod < 0))


def _before(decomposition: Any, inductors: Any) -> Any:
    """`decomposition`, and where it leaves the op (NotImplemented: integers) inductor's own entry for it, if any
    (`floor_divide` of integers as `div(.., rounding_mode="floor")`, which inductor lowers)."""
    if inductors is None:
        return decomposition

    def decompose(*args: Any, **kwargs: Any) -> Any:
        out = decomposition(*args, **kwargs)
        return inductors(*args, **kwargs) if out is NotImplemented else out

    return decompose


_EAGER_FLOAT_DIVISIONS = {
    aten.div.Tensor_mode: _div_mode,
    aten.div.Scalar_mode: _div_mode,
    aten.floor_divide.default: _floor_divide_float,
    aten.floor_divide.Scalar: _floor_divide_float,
    aten.remainder.Tensor: _remainder_float,
    aten.remainder.Scalar: _remainder_float,
    aten.remainder.Scalar_Tensor: _remainder_float,
}
