"""User-style programs of bench/user_programs.py (issue 38) where the fused call did Python work torch.compile's does
not: a replay buffer's write position `(ptr + torch.arange(n)) % capacity` is in 0 .. capacity - 1 whatever ptr is
(runtime/index_ranges.py: no index computed with aten calls before the call), and an index checked for several
reads or writes is read once (runtime/prologue.py). Each compared with eager: outputs and every buffer written, and
eager's error with the caller's tensors untouched where an index is out of range."""

from __future__ import annotations

import pytest
import torch

import dealias

pytestmark = pytest.mark.inductor


class Replay:
    def __init__(self, capacity=16, obs=3):
        self.obs = torch.zeros(capacity, obs)
        self.reward = torch.zeros(capacity)
        self.ptr = torch.zeros((), dtype=torch.long)


def add_and_sample(buf, obs, reward, idx, capacity: int):
    pos = (buf.ptr + torch.arange(obs.shape[0])) % capacity
    buf.obs.index_copy_(0, pos, obs)
    buf.reward[pos] = reward
    buf.ptr.add_(obs.shape[0]).remainder_(capacity)
    return buf.obs[idx], buf.reward[idx], buf.obs[idx].sum(1)  # (idx read three times)


def _state(buf):
    return [buf.obs.clone(), buf.reward.clone(), buf.ptr.clone()]


def _same(a, b, atol=1e-6):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=atol)


_GEN = torch.Generator().manual_seed(0)


def _batch(n=5, samples=70, g=_GEN):
    # (70 sampled rows: more than the prologue reads entry by entry in Python)
    return torch.randn(n, 3, generator=g), torch.randn(n, generator=g), torch.randint(0, 16, (samples,), generator=g)


def test_a_ring_buffers_position_is_the_graphs_and_each_index_is_read_once():
    ours, eagers = Replay(), Replay()
    jf = dealias.jit(add_and_sample, executor="inductor")
    for _ in range(5):  # 25 rows into 16: the position wraps
        obs, reward, idx = _batch()
        got, expected = jf(ours, obs, reward, idx, 16), add_and_sample(eagers, obs, reward, idx, 16)
        _same(got, expected)
        _same(_state(ours), _state(eagers))
        assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]
    run = jf.last.run_graph
    # The position is left to the graph (its range 0 .. 15 inside the buffer's 16 rows: nothing to check), the
    # sampled rows are reduced once for the three reads.
    assert not [n.name for n in run.graph.graph.find_nodes(op="placeholder") if n.name.endswith("_computed_first")]
    source = run.prologue.source
    assert "compute(" not in source and source.count("extremes(") == 1, source
    with torch.profiler.profile() as prof:
        jf(ours, *_batch(), 16)
    ops = [e.name for e in prof.events()]
    assert not {"aten::arange", "aten::add", "aten::remainder"} & set(ops), ops
    assert ops.count("aten::aminmax") == 1, ops
    assert dealias.cache_info(jf).misses == 1


def test_a_remainder_past_the_buffer_is_checked_entry_by_entry():
    # `% 20` into 16 rows: the range 0 .. 19 is not inside the rows, so the position is computed and checked before
    # the call: eager's error where an entry is past the rows (ptr 12: rows 12 .. 16; ptr 19: 19, 0 ..), none where
    # none is.
    jf = dealias.jit(add_and_sample, executor="inductor")
    for ptr, raises in ((0, False), (12, True), (8, False), (19, True)):
        ours, eagers = Replay(), Replay()
        for b in (ours, eagers):
            b.ptr.fill_(ptr)
            b.obs.copy_(torch.arange(48.0).view(16, 3))
        obs, reward, idx = _batch()
        if raises:
            with pytest.raises(IndexError) as expected:
                add_and_sample(eagers, obs, reward, idx, 20)
            with pytest.raises(IndexError, match="index_copy_") as got:
                jf(ours, obs, reward, idx, 20)
            assert str(got.value).startswith(str(expected.value).splitlines()[0])
            _same(_state(ours), _state(eagers), atol=0)  # (eager's kernel's rows before the bad one: written)
        else:
            _same(jf(ours, obs, reward, idx, 20), add_and_sample(eagers, obs, reward, idx, 20))
            _same(_state(ours), _state(eagers))
        assert jf.last.tier == "fused"


@pytest.mark.parametrize("bad", [16, -17])
def test_a_sampled_index_read_once_still_gives_eagers_error(bad):
    ours, eagers = Replay(), Replay()
    jf = dealias.jit(add_and_sample, executor="inductor")
    obs, reward, idx = _batch()
    _same(jf(ours, obs, reward, idx, 16), add_and_sample(eagers, obs, reward, idx, 16))
    obs, reward, idx = _batch()
    idx[40] = bad
    with pytest.raises(IndexError) as expected:
        add_and_sample(eagers, obs, reward, idx, 16)
    with pytest.raises(IndexError) as got:
        jf(ours, obs, reward, idx, 16)
    assert str(got.value).startswith(str(expected.value).splitlines()[0])
    assert dealias.cache_info(jf).misses == 1


# --- a loss recorded beside a target computed under no_grad (a DQN's TD loss): fused with autograd ----------------
def td_loss(q_net, target_net, obs, next_obs, action, reward, done):
    with torch.no_grad():
        target = reward + 0.99 * target_net(next_obs).max(1).values * (~done)
    q = q_net(obs).gather(1, action.unsqueeze(1)).squeeze(1)
    return torch.nn.functional.smooth_l1_loss(q, target), target


def _dqn_args():
    torch.manual_seed(0)
    net = lambda: torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))  # noqa: E731
    b = 6
    return (
        net(),
        net(),
        torch.randn(b, 4),
        torch.randn(b, 4),
        torch.randint(0, 3, (b,)),
        torch.randn(b),
        torch.rand(b) < 0.3,
    )


def test_a_target_under_no_grad_beside_a_recorded_loss_is_fused():
    # The graph switches grad mode where eager's `with torch.no_grad()` does (AOTAutograd traces the switches): the
    # target requires no grad and the target network gets no gradient, as in eager; the loss's gradients eager's.
    jf = dealias.jit(td_loss, executor="inductor")
    for _ in range(3):
        ours, eagers = _dqn_args(), _dqn_args()
        loss, target = jf(*ours)
        eager_loss, eager_target = td_loss(*eagers)
        assert not target.requires_grad and loss.requires_grad
        torch.testing.assert_close(loss, eager_loss)
        torch.testing.assert_close(target, eager_target)
        loss.backward()
        eager_loss.backward()
        for p, e in zip(ours[0].parameters(), eagers[0].parameters()):
            torch.testing.assert_close(p.grad, e.grad)
        assert all(p.grad is None for p in ours[1].parameters())
        assert torch.is_grad_enabled()
        assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]
    with torch.no_grad():  # (a call in the other mode: a program of its own, every op unrecorded)
        loss, target = jf(*_dqn_args())
        torch.testing.assert_close(loss, td_loss(*_dqn_args())[0])
        assert not loss.requires_grad
    assert torch.is_grad_enabled()
