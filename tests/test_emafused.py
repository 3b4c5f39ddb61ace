"""The fused executor writes into the caller's memory directly (issue 38, the EMA and Gauss-Seidel rows of
bench/real.py): a `_foreach_lerp_` EMA is one kernel storing into the averages, and a strided write whose source
reads only other elements of the same buffer (a red-black Gauss-Seidel sweep) is stored in place, without the
snapshot (a clone, then a copy) the hazard rule added before. Checked against eager, and on the generated code: no
loop reads an element of a buffer it has already written (loads of a written buffer are at the store's own index
or at elements the loop never stores). Few and small compiles (marked inductor)."""

from __future__ import annotations

import re
from unittest import mock

import pytest
import torch
from fused_harness import fused_graph, targets
from harness import check

from dealias.runtime.hazards import SNAPSHOT, check_hazards

pytestmark = pytest.mark.inductor


def ema_update(ema, params):
    torch._foreach_lerp_(ema, params, 0.001)


def gauss_seidel(u, f, h2: float):
    n = u.shape[0]
    for i0, j0 in ((1, 1), (2, 2), (1, 2), (2, 1)):
        c = u[i0 : n - 1 : 2, j0 : n - 1 : 2]
        up, down = u[i0 - 1 : n - 2 : 2, j0 : n - 1 : 2], u[i0 + 1 : n : 2, j0 : n - 1 : 2]
        left, right = u[i0 : n - 1 : 2, j0 - 1 : n - 2 : 2], u[i0 : n - 1 : 2, j0 + 1 : n : 2]
        c.copy_((up + down + left + right - h2 * f[i0 : n - 1 : 2, j0 : n - 1 : 2]) * 0.25)


def odd_rows_from_even(x):
    x[1::2] = x[0::2] * 2 + x[0::2].sum(0)  # reads only the even rows, also through a reduction


def even_rows_shifted(x):
    x[2::2] = x[0:-2:2] * 2  # rows 2, 4 read rows 0, 2: the same parity, overlapping the written rows


def odd_rows_from_every_third(x):
    x[1:12:2] = x[0::3] + 1  # rows 1, 3, .. 11 from rows 0, 3, 6, .. 15: rows 3 and 9 are written


def _grid(n=18):
    u = torch.zeros(n, n)
    u[1:-1, 1:-1] = torch.rand(n - 2, n - 2)
    return u, torch.randn(n, n), 1.0 / (n - 1) ** 2


def inductor_code(fn, *args):
    """`fn(*args)` and the code inductor generated meanwhile (its FX graph cache off: a hit saves no code)."""
    from torch._inductor.graph import GraphLowering

    codes = []
    with (
        mock.patch.object(GraphLowering, "save_output_code", codes.append),
        torch._inductor.config.patch(fx_graph_cache=False),
    ):
        out = fn(*args)
    return out, "\n".join(codes)


# --- the generated code: no loop loads an element of a buffer it stored before ---------------------------------
_KERNEL = re.compile(r"(\w+) = async_compile\.cpp_pybinding\(\[[^\]]*\], r'''(.*?)'''\)", re.S)
_PARAMS = re.compile(r"(?:const )?\w+\* (\w+)")
_INT = r"static_cast<int64_t>\((-?\d+)L?\)"
_LOOP = re.compile(rf"for\(int64_t (\w+)={_INT}; \1<{_INT}; \1\+={_INT}\)")
_ACCESS = re.compile(
    r"(?P<vload>loadu\((?P<p1>\w+) \+ static_cast<int64_t>\((?P<i1>[^;]*?)\)(?:, static_cast<int64_t>\(\d+L?\))?\))"
    r"|(?P<vstore>\.store\((?P<p2>\w+) \+ static_cast<int64_t>\((?P<i2>[^;]*?)\)(?:, static_cast<int64_t>\(\d+L?\))?\))"
    r"|(?P<scalar>(?P<p3>\w+)\[static_cast<int64_t>\((?P<i3>[^\]]*)\)\](?P<assign> = )?)"
)


def _positions(index: str, loops: dict[str, tuple[int, int, int]]) -> set[int]:
    """The elements an affine index expression of the loops' variables touches (a vector access: `step` of them)."""
    expr = re.sub(r"(\d+)L\b", r"\1", index)
    grids = torch.meshgrid(*[torch.arange(lo, hi, step) for lo, hi, step in loops.values()], indexing="ij")
    values = eval(expr, {}, dict(zip(loops, grids)))  # noqa: S307 - the generated code's own index arithmetic
    width = max(step for _, _, step in loops.values())
    base = torch.as_tensor(values).reshape(-1)
    return {int(v) for v in base for v in range(int(v), int(v) + width)}


def loop_nest_violations(code: str) -> list[str]:
    """For each kernel's loop nests (`#pragma omp for` blocks, run one after another), the buffers a nest both
    stores to and loads from at another index where the two sets of elements meet: a load that may read what the
    same loop already stored. Kernel pointers are mapped to the wrapper's buffers by the kernel's call."""
    problems = []
    for name, body in _KERNEL.findall(code):
        params = _PARAMS.findall(body.split("{", 1)[0])
        call = re.search(rf"{name}\(([^)]*)\)", code.split("def call", 1)[1]).group(1)
        buffer_of = dict(zip(params, [a.strip() for a in call.split(",")]))
        for nest in body.split("#pragma omp for")[1:]:
            loops = {v: (int(lo), int(hi), int(st)) for v, lo, hi, st in _LOOP.findall(nest)}
            loads, stores = [], []
            for m in _ACCESS.finditer(nest):
                if m.group("vload"):
                    loads.append((m.group("p1"), m.group("i1")))
                elif m.group("vstore"):
                    stores.append((m.group("p2"), m.group("i2")))
                elif m.group("assign"):
                    stores.append((m.group("p3"), m.group("i3")))
                else:
                    loads.append((m.group("p3"), m.group("i3")))
            for sp, si in stores:
                for lp, li in loads:
                    if buffer_of.get(sp, sp) != buffer_of.get(lp, lp) or li == si:
                        continue
                    used = {v: r for v, r in loops.items() if re.search(rf"\b{v}\b", li + si)}
                    if _positions(li, used) & _positions(si, used):
                        problems.append(f"{name}: {lp}[{li}] loaded where {sp}[{si}] is stored")
    return problems


# --- the EMA ----------------------------------------------------------------------------------------------------
def _ema_args():
    params = [torch.randn(s) for s in [(64, 32), (32,), (10, 32), (10,)]]
    return [p + 0.1 * torch.randn_like(p) for p in params], params


def test_ema_is_one_kernel_storing_into_the_averages():
    ema, params = _ema_args()
    jf = check(ema_update, ema, params, executor="inductor")
    _, code = inductor_code(_fresh(ema_update), *_ema_args())
    assert code, "no code generated"
    wrapper = code.split("def call", 1)[1].split("return", 1)[0]
    assert wrapper.count("cpp_fused") == 1  # one kernel for all the tensors
    assert "empty_strided" not in wrapper and "clone" not in wrapper and "copy_" not in wrapper  # no buffer, no copy
    kernel_call = re.search(r"cpp_fused\w*\(([^)]*)\)", wrapper).group(1).split(", ")
    assert kernel_call.count("ema_0") == 2  # read and written through the caller's own tensor
    assert loop_nest_violations(code) == []
    assert SNAPSHOT not in targets(fused_graph(jf))


def _fresh(fn):
    import dealias

    return dealias.jit(fn, executor="inductor")


def test_ema_with_an_average_that_is_a_parameter_matches_eager():
    # The same tensor in both lists: an alias group, which the fused executor does not take (the torch executor
    # runs it); eager's result either way.
    ema, params = _ema_args()
    ema[1] = params[1]
    check(ema_update, ema, params, executor="inductor", allow_fallback=True)


def test_ema_of_views_of_one_buffer_matches_eager():
    # Averages that are disjoint rows of one buffer (not an alias group): written in place, nothing else moves.
    buf = torch.randn(8, 16)
    params = [torch.randn(16) for _ in range(4)]
    check(ema_update, [buf[0], buf[2], buf[4], buf[6]], params, executor="inductor")


# --- writes whose source reads other elements of the same buffer ------------------------------------------------
def test_gauss_seidel_sweep_is_stored_in_place():
    jf = check(gauss_seidel, *_grid(), executor="inductor")
    gm = fused_graph(jf)
    assert SNAPSHOT not in targets(gm)  # (before: one per colour, each a clone and a copy of it into the grid)
    check_hazards(gm)
    _, code = inductor_code(_fresh(gauss_seidel), *_grid())
    assert code and "clone" not in code.split("def call", 1)[1]
    assert loop_nest_violations(code) == []


def test_source_reading_only_unwritten_rows_is_not_snapshotted():
    jf = check(odd_rows_from_even, torch.randn(8, 5), executor="inductor")
    assert SNAPSHOT not in targets(fused_graph(jf))


@pytest.mark.parametrize("fn", [even_rows_shifted, odd_rows_from_every_third])
def test_source_reading_written_rows_keeps_its_snapshot(fn):
    # Strided views of the same buffer that do share elements with the written rows: the source is still
    # materialized before the store, and the values are eager's.
    jf = check(fn, torch.randn(18, 5), executor="inductor")
    assert SNAPSHOT in targets(fused_graph(jf))
    _, code = inductor_code(_fresh(fn), torch.randn(18, 5))
    assert loop_nest_violations(code) == []


def test_the_code_check_finds_a_load_of_stored_elements():
    # The structure check itself: a loop that stores x[i + 1] and loads x[i] is reported.
    code = """
cpp_fused_0 = async_compile.cpp_pybinding(['float*'], r'''
extern "C"  void  kernel(float* out_ptr0)
{
    #pragma omp for
    for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(7L); x0+=static_cast<int64_t>(1L))
    {
        auto tmp0 = out_ptr0[static_cast<int64_t>(x0)];
        out_ptr0[static_cast<int64_t>(1L + x0)] = tmp0;
    }
}
''')
    def call(self, args):
        cpp_fused_0(x)
"""
    assert loop_nest_violations(code) == ["cpp_fused_0: out_ptr0[x0] loaded where out_ptr0[1L + x0] is stored"]
