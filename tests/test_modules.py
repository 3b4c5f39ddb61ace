"""Modules and state outside the arguments: parameters and buffers are inputs written back; globals and
closure tensors are lifted; training mode is guarded; Python attribute changes are refused."""

from __future__ import annotations

import copy
import warnings

import torch

import dealias


def _compare_modules(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sb[k], sa[k], msg=lambda m, k=k: f"state {k}: {m}")


def _run_module(module: torch.nn.Module, make_inputs, calls: int = 3, toggles=()) -> dealias.JitFunction:
    eager = copy.deepcopy(module)
    jitted_module = copy.deepcopy(module)
    jm = dealias.jit(jitted_module)
    for i in range(calls):
        if i in toggles:
            for m in (eager, jitted_module):
                m.train(not m.training)
        inputs = make_inputs()
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            got = jm(*[t.clone() for t in inputs])
        expected = eager(*[t.clone() for t in inputs])
        torch.testing.assert_close(got, expected)
        _compare_modules(eager, jitted_module)
    return jm


def test_batchnorm_training_stats_and_eval_toggle():
    bn = torch.nn.BatchNorm1d(4)
    jm = _run_module(bn, lambda: (torch.randn(8, 4),), calls=6, toggles=(3, 5))
    info = dealias.cache_info(jm)
    assert info.misses == 2 and info.entries == 2  # train, eval; then train again from the cache


def test_batchnorm_eval_writes_nothing():
    bn = torch.nn.BatchNorm2d(3).eval()
    jm = dealias.jit(bn)
    jm(torch.randn(2, 3, 4, 4))
    assert jm.last.functional.writebacks == [] and dealias.explain(jm) == []


class KVCache(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 2, 16, 4))
        self.register_buffer("v", torch.zeros(1, 2, 16, 4))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, pos, k, v):
        self.k.index_copy_(2, pos, k)
        self.v[:, :, pos] = v
        self.calls += 1
        return self.k[:, :, :16].sum(-1) + self.v.sum()


def test_kv_cache_module():
    pos = iter(range(10))
    jm = _run_module(
        KVCache(),
        lambda: (torch.tensor([next(pos)]), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)),
        calls=4,
    )
    assert all(r.mode == "in place" for r in dealias.explain(jm))


class EMA(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("ema", torch.zeros(4))

    def forward(self, x):
        y = self.lin(x)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(y.mean(0), alpha=0.1)
        return torch.relu_(y)


def test_ema_buffer_and_grads():
    m = EMA()
    eager, jitted = copy.deepcopy(m), copy.deepcopy(m)
    jm = dealias.jit(jitted)
    for _ in range(3):
        x = torch.randn(5, 4)
        out_e, out_j = eager(x), jm(x)
        torch.testing.assert_close(out_j, out_e)
        ge = torch.autograd.grad(out_e.sum(), list(eager.parameters()))
        gj = torch.autograd.grad(out_j.sum(), list(jitted.parameters()))
        for a, b in zip(ge, gj):
            torch.testing.assert_close(b, a)
        _compare_modules(eager, jitted)


class PyCounter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * 2


def test_python_attribute_change_falls_back():
    m = PyCounter()
    jm = dealias.jit(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        jm(torch.ones(2))
        jm(torch.ones(2))
    assert m.calls == 2  # dynamo replays the attribute write on every call, as eager makes it
    strict = PyCounter()
    dealias.jit(strict, strict=True)(torch.ones(2))
    assert strict.calls == 1


def test_parameters_mutated_under_no_grad():
    lin = torch.nn.Linear(3, 3)

    def step(model, x):
        loss = model(x).pow(2).sum()
        return loss

    def clamp_and_sgd(model, lr: float):
        with torch.no_grad():
            for p in model.parameters():
                p.clamp_(-0.5, 0.5)
                p.sub_(p.grad, alpha=lr) if p.grad is not None else None

    eager, jitted = copy.deepcopy(lin), copy.deepcopy(lin)
    for m in (eager, jitted):
        step(m, torch.ones(2, 3)).backward()
    jclamp = dealias.jit(clamp_and_sgd, strict=True)  # compiled, not run eagerly
    clamp_and_sgd(eager, 0.1)
    jclamp(jitted, 0.1)
    _compare_modules(eager, jitted)


G = torch.zeros(3)


def bump_global(x):
    G.add_(x)
    return G * 2


def test_global_tensor_is_lifted_and_rebinding_is_seen():
    global G
    G = torch.zeros(3)
    jf = dealias.jit(bump_global)
    jf(torch.ones(3))
    out = jf(torch.ones(3))
    assert torch.equal(G, torch.full((3,), 2.0)) and torch.equal(out, torch.full((3,), 4.0))
    G = torch.full((3,), 10.0)  # a new tensor of the same shape: the next call must use it
    out = jf(torch.ones(3))
    assert torch.equal(G, torch.full((3,), 11.0)) and torch.equal(out, torch.full((3,), 22.0))
    assert dealias.cache_info(jf).misses == 1


def test_closure_tensor_is_lifted():
    acc = torch.zeros(2)

    def f(x):
        acc.add_(x)
        return acc.sum()

    jf = dealias.jit(f)
    for _ in range(3):
        jf(torch.ones(2))
    assert torch.equal(acc, torch.full((2,), 3.0))


MODEL = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5), torch.nn.BatchNorm1d(4))


def use_global_model(x):
    return MODEL(x)


def test_global_module_mode_is_guarded():
    MODEL.eval()
    jf = dealias.jit(use_global_model)
    x = torch.randn(6, 4)
    torch.testing.assert_close(jf(x), MODEL(x))
    MODEL.train()
    torch.manual_seed(0)
    eager_state = copy.deepcopy(MODEL.state_dict())
    expected = MODEL(x)
    MODEL.load_state_dict(eager_state)
    torch.manual_seed(0)
    got = jf(x)
    torch.testing.assert_close(got, expected)
    assert dealias.cache_info(jf).misses == 2
    MODEL.eval()


class WithPlainTensor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mask = torch.ones(4)  # not a buffer: a plain attribute

    def forward(self, x):
        self.mask.mul_(0.5)
        return x * self.mask


def test_plain_tensor_attribute_is_lifted_and_replacement_is_seen():
    m = WithPlainTensor()
    jm = dealias.jit(m, strict=True)
    jm(torch.ones(4))
    assert torch.equal(m.mask, torch.full((4,), 0.5))
    m.mask = torch.full((4,), 8.0)  # replaced between calls: the next call must use the new tensor
    out = jm(torch.ones(4))
    assert torch.equal(out, torch.full((4,), 4.0)) and torch.equal(m.mask, torch.full((4,), 4.0))
    assert dealias.cache_info(jm).misses == 1


def test_dropout_of_a_batch_first_transformer_layer_draws_as_eager():
    # Its attention output is dropped out transposed (bernoulli_ on memory laid out as a transpose): the mask
    # must fall on eager's elements, in the forward and in the gradients.
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.25, batch_first=True)
    eager, jitted = copy.deepcopy(layer), copy.deepcopy(layer)
    jm = dealias.jit(jitted)
    for _ in range(2):
        x = torch.randn(2, 5, 8)
        seed = torch.seed()
        expected = eager(x)
        expected.square().sum().backward()
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            got = jm(x)
        got.square().sum().backward()
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        for (name, a), b in zip(eager.named_parameters(), jitted.parameters()):
            torch.testing.assert_close(b.grad, a.grad, msg=lambda m, name=name: f"grad of {name}: {m}")
