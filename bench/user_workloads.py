"""User-style programs for bench/user_programs.py (issue 38: "22 more user-style programs"): the small in-place
code people write around a model (a replay buffer, an EMA, message passing, a sampler loop, a hand-written
optimizer step, a GAN's losses, QAT's fake quantization, a decode step), sized so that an eager call takes
0.05-3 ms on one thread. The decoder with its KV cache and the conv + BatchNorm training step are those of
tests/test_real_programs.py, imported from there.

Each workload is a bench/real_workloads.Workload: `make()` gives fresh arguments (after `torch.manual_seed(0)`),
`fn` is what is compiled, `backward` rows time `fn(*args).backward()`.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from real_workloads import Workload  # noqa: E402 - bench/ is on sys.path (bench/user_programs.py puts it there)
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import test_real_programs as real_programs  # noqa: E402 - the tests' programs, reused as they are tested


def _mlp(*widths: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


# --- reinforcement learning: a replay buffer written at a tensor pointer -----------------------------------
class ReplayBuffer:
    def __init__(self, capacity: int = 8192, obs: int = 64) -> None:
        self.obs = torch.zeros(capacity, obs)
        self.action = torch.zeros(capacity, dtype=torch.long)
        self.reward = torch.zeros(capacity)
        self.done = torch.zeros(capacity, dtype=torch.bool)
        self.ptr = torch.zeros((), dtype=torch.long)
        self.capacity = capacity


def replay_add_sample(buf, obs, action, reward, done, idx):
    pos = (buf.ptr + torch.arange(obs.shape[0])) % buf.capacity
    buf.obs.index_copy_(0, pos, obs)
    buf.action[pos] = action
    buf.reward[pos] = reward
    buf.done[pos] = done
    buf.ptr.add_(obs.shape[0]).remainder_(buf.capacity)
    return buf.obs[idx], buf.action[idx], buf.reward[idx], buf.done[idx]


def _replay() -> tuple[Any, ...]:
    n = 256
    return (
        ReplayBuffer(),
        torch.randn(n, 64),
        torch.randint(0, 6, (n,)),
        torch.randn(n),
        torch.rand(n) < 0.05,
        torch.randint(0, 8192, (512,)),
    )


def td_target(q_net, target_net, obs, next_obs, action, reward, done, gamma: float = 0.99):
    """A DQN loss: the target network's max over the next state, the online network's value of the action."""
    with torch.no_grad():
        target = reward + gamma * target_net(next_obs).max(1).values * (~done)
    q = q_net(obs).gather(1, action.unsqueeze(1)).squeeze(1)
    return F.smooth_l1_loss(q, target)


def _dqn() -> tuple[Any, ...]:
    q = _mlp(64, 256, 256, 6)
    b = 128
    return (
        q,
        _mlp(64, 256, 256, 6),
        torch.randn(b, 64),
        torch.randn(b, 64),
        torch.randint(0, 6, (b,)),
        torch.randn(b),
        torch.rand(b) < 0.1,
    )


def soft_update(target, online, tau: float = 0.005):
    """Polyak averaging of a target network's parameters, parameter by parameter."""
    with torch.no_grad():
        for t, p in zip(target.parameters(), online.parameters()):
            t.mul_(1 - tau).add_(p, alpha=tau)


def _soft_update() -> tuple[Any, ...]:
    return (_mlp(64, 256, 256, 6), _mlp(64, 256, 256, 6))


# --- moving averages ---------------------------------------------------------------------------------------
def ema_foreach(ema, params, decay: float = 0.999):
    torch._foreach_mul_(ema, decay)
    torch._foreach_add_(ema, params, alpha=1 - decay)


def _ema_foreach() -> tuple[Any, ...]:
    params = [p.detach().clone() for p in _mlp(256, 512, 512, 10).parameters()]
    return ([p + 0.1 * torch.randn_like(p) for p in params], params)


def welford_update(count, mean, m2, x):
    """Running mean and variance of a stream of batches (Chan's parallel update), in place."""
    n = x.shape[0]
    batch_mean = x.mean(0)
    delta = batch_mean - mean
    total = count + n
    mean.add_(delta * n / total)
    m2.add_(((x - batch_mean) ** 2).sum(0) + delta**2 * count * n / total)
    count.add_(n)
    return m2 / (count - 1)


def _welford() -> tuple[Any, ...]:
    return (torch.tensor(10.0), torch.zeros(512), torch.ones(512), torch.randn(256, 512))


# --- graphs: message passing with index_add_ / scatter_add_ ------------------------------------------------
def gnn_layer(lin, x, src, dst):
    msg = lin(x)[src]
    out = torch.zeros(x.shape[0], msg.shape[1]).index_add_(0, dst, msg)
    deg = torch.zeros(x.shape[0]).scatter_add_(0, dst, torch.ones_like(dst, dtype=x.dtype))
    return torch.relu(out / deg.clamp(min=1).unsqueeze(1) + x)


def _gnn() -> tuple[Any, ...]:
    nodes, edges = 2048, 8192
    return (
        nn.Linear(64, 64),
        torch.randn(nodes, 64),
        torch.randint(0, nodes, (edges,)),
        torch.randint(0, nodes, (edges,)),
    )


# --- generative models -------------------------------------------------------------------------------------
def ddpm_sample(model, x, noises, alphas, alpha_bars):
    """A DDPM sampler's last steps: the denoiser's noise estimate, the mean step and the sampled noise."""
    with torch.no_grad():
        for t in reversed(range(len(noises))):
            tt = torch.full((x.shape[0], 1), t / len(noises))
            eps = model(torch.cat([x, tt], 1))
            x = (x - (1 - alphas[t]) / math.sqrt(1 - alpha_bars[t]) * eps) / math.sqrt(alphas[t])
            x = x + math.sqrt(1 - alphas[t]) * noises[t]
    return x


def _ddpm() -> tuple[Any, ...]:
    steps = 4
    alphas = [1 - 0.02 * (i + 1) / steps for i in range(steps)]
    alpha_bars = [math.prod(alphas[: i + 1]) for i in range(steps)]
    return (
        _mlp(33, 256, 256, 32),
        torch.randn(64, 32),
        [torch.randn(64, 32) for _ in range(steps)],
        alphas,
        alpha_bars,
    )


def gan_d_loss(gen, disc, z, real):
    fake = gen(z).detach()
    real_logits, fake_logits = disc(real), disc(fake)
    return F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits)) + (
        F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))
    )


def gan_g_loss(gen, disc, z):
    logits = disc(gen(z))
    return F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))


def _gan(with_real: bool):
    def make() -> tuple[Any, ...]:
        gen = nn.Sequential(nn.Linear(32, 256), nn.LeakyReLU(0.2), nn.Linear(256, 128), nn.Tanh())
        disc = nn.Sequential(nn.Linear(128, 256), nn.LeakyReLU(0.2, inplace=True), nn.Linear(256, 1))
        z = torch.randn(64, 32)
        return (gen, disc, z, torch.randn(64, 128)) if with_real else (gen, disc, z)

    return make


# --- training steps written by hand ------------------------------------------------------------------------
def micro_batch_loss(model, x, y, accumulate: int = 4):
    """One micro-batch of gradient accumulation: the loss scaled by the number of micro-batches."""
    return F.mse_loss(model(x), y) / accumulate


def _micro_batch() -> tuple[Any, ...]:
    return (_mlp(64, 256, 256, 16), torch.randn(64, 64), torch.randn(64, 16))


def manual_sgd_momentum(model, momenta, lr: float = 0.01):
    """The step after accumulation: momentum SGD by hand, then the gradients zeroed for the next accumulation."""
    with torch.no_grad():
        for p, m in zip(model.parameters(), momenta):
            m.mul_(0.9).add_(p.grad)
            p.sub_(m, alpha=lr)
            p.grad.zero_()


def _manual_sgd() -> tuple[Any, ...]:
    model = _mlp(64, 256, 256, 16)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    return (model, [torch.zeros_like(p) for p in model.parameters()])


def manual_adam(params, grads, exp_avgs, exp_avg_sqs, step, lr: float = 1e-3):
    """Adam written out per parameter, the step count a tensor."""
    step.add_(1)
    bias1, bias2 = 1 - 0.9**step, 1 - 0.999**step
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        m.lerp_(g, 0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        p.sub_(lr * (m / bias1) / ((v / bias2).sqrt() + 1e-8))


def _manual_adam() -> tuple[Any, ...]:
    params = [p.detach().clone() for p in _mlp(64, 256, 256, 16).parameters()]
    return (
        params,
        [torch.randn_like(p) for p in params],
        [torch.zeros_like(p) for p in params],
        [torch.zeros_like(p) for p in params],
        torch.zeros(()),
    )


def clip_grads(model, max_norm: float = 1.0):
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def _clip() -> tuple[Any, ...]:
    model = _mlp(64, 256, 256, 16)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    return (model,)


def smoothed_ce(model, x, target, eps: float = 0.1):
    """Cross entropy against label-smoothed one-hot targets built with scatter_."""
    logits = model(x)
    t = torch.full_like(logits, eps / (logits.shape[1] - 1))
    t.scatter_(1, target.unsqueeze(1), 1 - eps)
    return -(t * logits.log_softmax(-1)).sum(-1).mean()


def _smoothed_ce() -> tuple[Any, ...]:
    return (_mlp(128, 256, 100), torch.randn(128, 128), torch.randint(0, 100, (128,)))


# --- quantization-aware training ---------------------------------------------------------------------------
class QATLinear(nn.Linear):
    """A linear layer trained with fake-quantized weights and inputs, its input range observed in a buffer."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(a, b)
        self.register_buffer("x_absmax", torch.ones(()))

    def forward(self, x):
        with torch.no_grad():
            self.x_absmax.mul_(0.99).add_(x.detach().abs().max(), alpha=0.01)
        x_scale = (self.x_absmax / 127).clamp(min=1e-8)
        w_scale = (self.weight.detach().abs().max() / 127).clamp(min=1e-8)
        xq = torch.fake_quantize_per_tensor_affine(x, x_scale, torch.zeros((), dtype=torch.int32), -128, 127)
        wq = torch.fake_quantize_per_tensor_affine(self.weight, w_scale, torch.zeros((), dtype=torch.int32), -128, 127)
        return F.linear(xq, wq, self.bias)


def qat_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def _qat() -> tuple[Any, ...]:
    model = nn.Sequential(QATLinear(128, 256), nn.ReLU(), QATLinear(256, 10))
    return (model, torch.randn(64, 128), torch.randint(0, 10, (64,)))


# --- inference with in-place ops ---------------------------------------------------------------------------
def inplace_mlp_block(w1, b1, w2, b2, x):
    """A residual block written with in-place activations, as inference code often is."""
    with torch.no_grad():
        h = x @ w1
        h.add_(b1).relu_()
        out = h @ w2
        out.add_(b2).mul_(0.5)
        out += x
        return out


def _inplace_mlp() -> tuple[Any, ...]:
    return (
        torch.randn(256, 1024) / 16,
        torch.randn(1024),
        torch.randn(1024, 256) / 32,
        torch.randn(256),
        torch.randn(64, 256),
    )


def causal_attention(q, k, v):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu_(1)
    scores.masked_fill_(mask, float("-inf"))
    return scores.softmax(-1) @ v


def _attention() -> tuple[Any, ...]:
    return tuple(torch.randn(4, 4, 64, 32) for _ in range(3))


def normalize_batch(x, mean, std, flip):
    """Data preprocessing in place: per-channel normalization, then a horizontal flip of the chosen images."""
    x.sub_(mean[:, None, None]).div_(std[:, None, None])
    x[flip] = x[flip].flip(-1)
    return x


def _normalize() -> tuple[Any, ...]:
    return (
        torch.rand(16, 3, 64, 64),
        torch.tensor([0.485, 0.456, 0.406]),
        torch.tensor([0.229, 0.224, 0.225]),
        torch.arange(16) % 2 == 0,
    )


# --- simulation --------------------------------------------------------------------------------------------
def particles_step(pos, vel, dt: float = 1e-3):
    """An n-body step: pairwise forces, then velocity and position updated in place."""
    d = pos.unsqueeze(0) - pos.unsqueeze(1)
    r2 = (d * d).sum(-1) + 1e-2
    acc = (d / r2.pow(1.5).unsqueeze(-1)).sum(1)
    vel.add_(acc, alpha=dt)
    pos.add_(vel, alpha=dt)


def _particles() -> tuple[Any, ...]:
    return (torch.randn(256, 3), torch.zeros(256, 3))


def heat_step(u, alpha: float = 0.1):
    """An explicit heat-equation step on the interior of a grid, written through a slice."""
    lap = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
    u[1:-1, 1:-1] += alpha * lap


def _heat() -> tuple[Any, ...]:
    return (torch.rand(258, 258),)


def word2vec_step(emb_in, emb_out, center, context, negative, lr: float = 0.025):
    """Skip-gram with negative sampling, its SGD by hand on the rows read (index_add_)."""
    v, u, n = emb_in[center], emb_out[context], emb_out[negative]
    pos = (v * u).sum(-1).sigmoid() - 1
    neg = torch.bmm(n, v.unsqueeze(2)).squeeze(2).sigmoid()
    grad_v = pos.unsqueeze(1) * u + (neg.unsqueeze(2) * n).sum(1)
    emb_out.index_add_(0, context, pos.unsqueeze(1) * v, alpha=-lr)
    emb_out.index_add_(0, negative.flatten(), (neg.unsqueeze(2) * v.unsqueeze(1)).flatten(0, 1), alpha=-lr)
    emb_in.index_add_(0, center, grad_v, alpha=-lr)


def _word2vec() -> tuple[Any, ...]:
    vocab, dim, b = 5000, 64, 256
    return (
        torch.randn(vocab, dim) * 0.1,
        torch.zeros(vocab, dim),
        torch.randint(0, vocab, (b,)),
        torch.randint(0, vocab, (b,)),
        torch.randint(0, vocab, (b, 5)),
    )


# --- from tests/test_real_programs.py ----------------------------------------------------------------------
def _decode() -> tuple[Any, ...]:
    torch.manual_seed(0)
    return (real_programs.Decoder(), real_programs.IndexCopyCache(), torch.tensor([1]), torch.tensor([3]))


def decode_step(model, cache, token, pos):
    # (the tests' decode step; cache.length, a Python int, grows each call: dynamo makes it symbolic)
    return real_programs.decode_step(model, cache, token, pos)


def conv_bn_loss(net, x):
    return net(x).square().mean()


def _conv_bn() -> tuple[Any, ...]:
    return (real_programs._conv_bn_relu(), torch.randn(8, 3, 32, 32))


WORKLOADS = [
    Workload("replay", "RL replay buffer: add at a tensor pointer, sample", replay_add_sample, _replay),
    Workload("dqn_loss", "DQN TD loss + backward", td_target, _dqn, backward=True),
    Workload("soft_update", "target-network soft update (per-parameter mul_/add_)", soft_update, _soft_update),
    Workload("ema_foreach", "EMA with `_foreach_mul_` / `_foreach_add_`", ema_foreach, _ema_foreach),
    Workload("welford", "running mean/variance (Welford) in place", welford_update, _welford),
    Workload("gnn", "GNN layer: index_add_ / scatter_add_ messages", gnn_layer, _gnn),
    Workload("ddpm", "diffusion sampler, 4 steps, `no_grad`", ddpm_sample, _ddpm),
    Workload("gan_d", "GAN discriminator loss + backward", gan_d_loss, _gan(True), backward=True),
    Workload("gan_g", "GAN generator loss + backward", gan_g_loss, _gan(False), backward=True),
    Workload(
        "micro_batch", "grad accumulation: micro-batch loss + backward", micro_batch_loss, _micro_batch, backward=True
    ),
    Workload("manual_sgd", "manual momentum SGD step, grads zeroed", manual_sgd_momentum, _manual_sgd),
    Workload("manual_adam", "hand-written Adam, tensor step", manual_adam, _manual_adam),
    Workload("clip_grad", "`clip_grad_norm_`", clip_grads, _clip),
    Workload("smoothed_ce", "label-smoothed CE (scatter_) + backward", smoothed_ce, _smoothed_ce, backward=True),
    Workload("qat", "QAT: fake-quantized linears, observer buffer + backward", qat_loss, _qat, backward=True),
    Workload("inplace_mlp", "residual block with in-place activations", inplace_mlp_block, _inplace_mlp),
    Workload("attention", "causal attention, `masked_fill_`", causal_attention, _attention),
    Workload("normalize", "batch normalize + flip in place", normalize_batch, _normalize),
    Workload("particles", "n-body step in place", particles_step, _particles),
    Workload("heat", "heat-equation step through a slice", heat_step, _heat),
    Workload("word2vec", "word2vec SGD on rows (index_add_)", word2vec_step, _word2vec),
    Workload("decode", "KV-cache decode step (tests' Decoder, IndexCopyCache)", decode_step, _decode),
    Workload("conv_bn", "conv + BN + ReLU(inplace) loss + backward (tests')", conv_bn_loss, _conv_bn, backward=True),
]
