"""bench/optim_sweep.py's findings: the fused executor's hazard rule moves a write past the uses of what it
overwrites (no snapshot) only where nothing in between takes the written memory; results compared with eager.
Few and small: each inductor compile costs seconds on CPU."""

from __future__ import annotations

import pytest
import torch
from fused_harness import fused_graph, targets

import dealias
from dealias.runtime.hazards import ALIGNED_SNAPSHOT, SNAPSHOT

pytestmark = pytest.mark.inductor


def read_write_use(a, b):
    d = a * 2  # computed from a before a's write, used after it by b's: the write moves past b's
    a.mul_(3)
    b.add_(d)


def read_write_read_again(a, b):
    d = a * 2
    a.mul_(3)
    e = a + 1  # reads a's new contents: a's write cannot move past it, d is snapshotted
    b.add_(d + e)


def written_twice_between(a, b):
    d = a * 2
    a.mul_(3)
    a[:8].add_(1)  # another write of a (a part: not merged with the first) before d's use
    b.add_(d)


def _run(fn, *shapes):
    torch.manual_seed(0)
    args = [torch.randn(s) for s in shapes]
    ref = [a.clone() for a in args]
    fn(*ref)
    jf = dealias.jit(fn, executor="inductor")
    for _ in range(2):
        got = [a.clone() for a in args]
        jf(*got)
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    return jf


def test_write_moves_past_the_use_of_what_it_overwrote():
    jf = _run(read_write_use, (64,), (64,))
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert SNAPSHOT not in targets(fused_graph(jf))


@pytest.mark.parametrize("fn, kind", [(read_write_read_again, ALIGNED_SNAPSHOT), (written_twice_between, SNAPSHOT)])
def test_write_stays_where_its_memory_is_read_or_written(fn, kind):
    """d snapshotted: a copy inductor may fuse where a's later writes store each element where d read it (a's
    whole write), ATen's clone where not (a[:8]'s write: test_optimgap.py)."""
    jf = _run(fn, (64,), (64,))
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert kind in targets(fused_graph(jf))


@pytest.mark.parametrize("make", ["adadelta", "rprop"])
def test_foreach_step_without_snapshots(make):
    """torch.optim.Adadelta(foreach=True): `deltas` (from acc_delta) is added to the parameters after acc_delta's
    write; it was one snapshot per parameter (the step 2.3x torch.compile's). Rprop(foreach=True): its `prev`
    stored from a `_foreach_copy` of values read from `prev` (elementwise, but not known as such): a snapshot per
    parameter too (1.5-1.8x torch.compile's step). Compared with eager over 3 steps."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s)) for s in ((16, 8), (8,), (4, 4))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    if make == "adadelta":
        opts = [torch.optim.Adadelta(ps, lr=1.0, foreach=True) for ps in (params, ref)]
    else:
        opts = [torch.optim.Rprop(ps, lr=1e-2, foreach=True) for ps in (params, ref)]

    def step(opt):
        opt.step()

    jf = dealias.jit(step, executor="inductor")
    for k in range(3):
        g = torch.Generator().manual_seed(k)
        for p, r in zip(params, ref):
            p.grad = torch.randn(p.shape, generator=g)
            r.grad = p.grad.clone()
        jf(opts[0])
        opts[1].step()
        for p, r in zip(params, ref):
            torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-5, atol=1e-6)
        for p, r in zip(params, ref):
            for key, v in opts[1].state[r].items():
                torch.testing.assert_close(opts[0].state[p][key], v, rtol=1e-5, atol=1e-6)
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert SNAPSHOT not in targets(fused_graph(jf))
