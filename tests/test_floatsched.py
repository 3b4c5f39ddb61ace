"""bench/optim_sweep.py's scheduler rows: an lr (or Adam's beta1 under OneCycleLR) that a scheduler changes each step
is a float input of the program (frontend/floats.py), a 0-d float64 tensor to the fused executor
(compat/inductor.py `floats_as_tensors`). SGD nesterov's `_foreach_add(xs, ys, alpha=-lr)`, RMSprop's
`addcdiv(p, g, avg, value=-lr)` (foreach and not) and Adam's `beta1 ** step` and lerp weight under OneCycleLR were
refused ("a float input inductor cannot take") and ran on the exact tiers at 1.0-1.9x eager. Each case here runs
fused, compiles no more after the float went dynamic, and matches eager (fused tolerance) over steps with the lr
changing each step. Few and small: each inductor compile costs seconds on CPU."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.utils import counters

import dealias

pytestmark = pytest.mark.inductor

SHAPES = ((16, 8), (8,), (4, 4))
STEPS = 6


def _exp(opt):
    return torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)


def _onecycle(opt):
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=100)


CASES = {
    "sgd_nesterov_foreach": (lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True, foreach=True), _exp),
    "rmsprop_foreach": (lambda ps: torch.optim.RMSprop(ps, lr=1e-2, foreach=True), _exp),
    "rmsprop_loop": (lambda ps: torch.optim.RMSprop(ps, lr=1e-2, foreach=False), _exp),
    "adam_foreach_onecycle": (lambda ps: torch.optim.Adam(ps, lr=1e-3, foreach=True), _onecycle),
}


def step(opt):
    opt.step()


def _trajectory(name, compile_step):
    """STEPS steps from one start with the same new gradients each step, the scheduler stepping after each: every
    parameter and state tensor after each step, the lr each step ran with, the stepping function."""
    make, sched_of = CASES[name]
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    opt = make(params)
    sched = sched_of(opt)
    f = compile_step(step)
    g = torch.Generator().manual_seed(1)
    states, lrs, graphs = [], [], []
    for _ in range(STEPS):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        lrs.append(opt.param_groups[0]["lr"])
        f(opt)
        sched.step()
        graphs.append(counters["stats"]["unique_graphs"])
        state = [p.detach().clone() for p in params]
        state += [v.detach().clone() for p in params for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
        states.append(state)
    return states, lrs, graphs, f


@pytest.mark.parametrize("name", list(CASES))
def test_scheduled_step_runs_fused(name):
    expected, lrs, _, _ = _trajectory(name, lambda s: s)
    assert len(set(lrs)) == STEPS  # (the lr changes every step)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.optim's own graph breaks: the profiler hook)
        got, _, graphs, f = _trajectory(name, lambda s: dealias.jit(s, executor="inductor"))
    info = dealias.cache_info(f)
    assert set(info.tiers) == {"fused"}, (info.tiers, info.tier_reasons)
    assert info.eager_entries == 0, info
    # The first call's lr is a constant; the second makes it a float input (frontend/floats.py); none after.
    assert graphs[-1] == graphs[1], graphs
    for k, (g, e) in enumerate(zip(got, expected)):
        for i, (x, y) in enumerate(zip(g, e)):
            assert x.dtype == y.dtype and x.shape == y.shape, (k, i)
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=lambda m, k=k, i=i: f"step {k} value {i}: {m}")
