"""The fused executor's hazards: a value read before a write of its memory is snapshotted (and the verifier
rejects the graph without the snapshot), what inductor gets wrong is not handed to it, and stored values are read
back rather than copied. Few and small: each compile costs seconds on CPU."""

from __future__ import annotations

import pytest
import torch
from fused_harness import flip_in_place, fused_graph, slice_write, targets
from harness import check

import dealias
from dealias.errors import InternalError
from dealias.runtime.hazards import SNAPSHOTS, check_hazards


def remove_snapshots(gm) -> None:
    for n in list(gm.graph.nodes):
        if n.target in SNAPSHOTS:  # (either kind: hazards.aligned_snapshot too)
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)


def swap_rows(buf):
    t = buf[0].clone()
    buf[0] = buf[1]
    buf[1] = t


def scatter_then_zero(x, s):
    y = torch.slice_scatter(x, s, 0, 0, 1)
    x.zero_()
    return y


def read_then_write_region(x):
    a = x[0] * 2
    x[0] = 1.0
    return a + x[0]


def shift_rows(x):
    x[1:] = x[:-1].clone()  # one kernel reading x[i - 1] while it writes x[i] would read what it wrote


def fill_then_flipped_update(x):
    # (found by the fuzzer, seed 9128) after a write into x, inductor fused the snapshot's generated copy with
    # the copy_ of it into x: one loop read x[3 - i] after writing it
    x[2:] = 3.0
    x += x.flip(0)


def rolled_update_after_a_write(x):
    # (fuzzer, seed 9137) the same through a rolled view
    v = x[:, 1:]
    torch.abs(v[3, 0], out=v[3, 0])
    v.addcmul_(v.roll(1, 0), v.roll(1, 0), value=0.5)


@pytest.mark.parametrize(
    "fn",
    [
        swap_rows,
        read_then_write_region,
        shift_rows,
        flip_in_place,
        fill_then_flipped_update,
        rolled_update_after_a_write,
    ],
)
def test_read_before_a_write_is_snapshotted(fn):
    # Inductor alone recomputes these values after (or during) the write (both rows equal, y all zeros, every
    # shifted row equal to the first): a snapshot keeps them where the program computed them, and the verifier
    # rejects the graph without it.
    jf = check(fn, torch.randn(4, 3), executor="inductor")
    gm = fused_graph(jf)
    assert SNAPSHOTS & set(targets(gm))
    check_hazards(gm)
    remove_snapshots(gm)
    with pytest.raises(InternalError, match="after .* overwrote"):
        check_hazards(gm)


def foreach_then_overwrite(x):
    a, b = x[0], x[1]
    t = torch._foreach_mul([a, b], 2.0)  # each result read from its own row, then used after that row is written
    a.copy_(b)
    b.zero_()
    return t


def foreach_shifted_into_itself(x):
    # The first result reads x one row above the row it is stored to: one kernel would read rows it already wrote.
    y = x.clone()
    t = torch._foreach_add([x[:-1], y[1:]], [y[:-1], x[:-1]])
    x[1:] = t[0]
    return t[1]


@pytest.mark.parametrize("fn", [foreach_then_overwrite, foreach_shifted_into_itself])
def test_a_foreach_result_read_before_its_memory_is_written_is_snapshotted(fn):
    # A foreach op's i-th result reads only the i-th tensor of its lists (hazards.foreach_element), but that one
    # it does read: these still need their snapshots, and fail the verifier without them.
    jf = check(fn, torch.randn(4, 3), executor="inductor")
    gm = fused_graph(jf)
    assert SNAPSHOTS & set(targets(gm))
    remove_snapshots(gm)
    with pytest.raises(InternalError, match="after .* overwrote"):
        check_hazards(gm)


def test_a_snapshot_is_a_copy_in_inductors_code_not_a_python_call():
    # inductor_fixes lowers dealias::snapshot to a realized copy: no call of the custom op (the dispatcher, then
    # clone, ~25 us each), and the rows still swap as eager's do.
    jf = check(swap_rows, torch.randn(4, 3), executor="inductor")
    assert SNAPSHOTS & set(targets(fused_graph(jf)))
    with torch.profiler.profile() as prof:
        jf(torch.randn(4, 3))
    assert not [e.name for e in prof.events() if "snapshot" in e.name]


def neg_then_flipped_update(x, first):
    v = x.squeeze()
    x.neg_()
    first.copy_(first)
    v.addcmul_(v.flip(0), v.flip(0), value=0.5)
    return x


def write_through_a_dtype_view(x):
    x.view(torch.int32)[1].add_(1)  # fuzz seed 910733: inductor stored float(bits + 1) as a float


def square_an_overlapping_input(v2, v1):
    v2.mul_(v1)  # fuzz seed 920403: the two inputs are one view, 12 elements into their storage


@pytest.mark.parametrize(
    "fn", [scatter_then_zero, neg_then_flipped_update, write_through_a_dtype_view, square_an_overlapping_input]
)
def test_what_inductor_gets_wrong_is_not_handed_to_it(fn):
    # Inductor runs a functional scatter in place into its base and read the flipped elements it had already
    # written in the same kernel (fuzz seed 910067: 0.2 off). Only writes dealias lowered in place, under the
    # hazard rule, go to inductor; a graph with a functional scatter runs on the torch executor. So do dtype
    # views, and inputs sharing memory (their views of one base would need as_strided, whose storage offset is
    # absolute: fused, they came back 6.6 off).
    x = torch.randn(6)
    args = (torch.randn(4, 3), torch.randn(1, 3)) if fn is scatter_then_zero else (x, x[:1])
    args = (x,) if fn is write_through_a_dtype_view else args
    if fn is square_an_overlapping_input:
        v = torch.randn(2, 3, 4)[1:].unfold(2, 2, 3)
        args = (v, v)
    jf = check(fn, *args, executor="inductor")
    assert "not fused" in str(dealias.last_traces(jf)[3])


def momentum(p, m, g):
    m.mul_(0.9).add_(g)
    p.sub_(m, alpha=0.1)


def test_stored_value_is_read_back_not_snapshotted():
    # m's new value is read again by p's update: it is read from where it was stored, no extra copy.
    jf = check(momentum, torch.randn(64), torch.randn(64), torch.randn(64), executor="inductor")
    gm = fused_graph(jf)
    assert not SNAPSHOTS & set(targets(gm))
    check_hazards(gm)


def test_slice_write_moves_only_the_written_rows():
    jf = check(slice_write, torch.randn(256, 64), torch.randn(64), executor="inductor")
    assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]
    [report] = dealias.explain(jf)
    assert (report.mode, report.nbytes) == ("in place", 2 * 64 * 4)
    copies = [n for n in fused_graph(jf).graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert copies and all(n.args[0].meta["val"].shape == (64,) for n in copies)


def second_moment(v, g):
    v.mul_(0.999).addcmul_(g, g, value=0.001)
    return v.sqrt()


def test_a_tensor_written_whole_twice_is_stored_once():
    jf = check(second_moment, torch.rand(64), torch.randn(64), executor="inductor")
    gm = fused_graph(jf)
    assert targets(gm).count(torch.ops.aten.copy_.default) == 1
    assert not SNAPSHOTS & set(targets(gm))
