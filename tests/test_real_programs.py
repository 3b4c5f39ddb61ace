"""Real programs end to end, each against eager PyTorch on identical copies: every torch.optim optimizer with
an LR scheduler, a greedy decoder with a KV cache kept in a plain Python object, HF transformers' Llama with its
StaticCache, and BatchNorm training with backward. Values are compared exactly wherever eager and the compiled
program run the same kernels."""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import re
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import dealias


@contextlib.contextmanager
def no_fallback():
    """A context in which any FallbackWarning (a silent eager fallback) fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        yield


def assert_not_fake(t: torch.Tensor, what: str) -> None:
    assert not isinstance(t, FakeTensor), f"{what} is a FakeTensor"


# --- 1. torch.optim: every built-in optimizer, foreach and single-tensor, with an LR scheduler ------------------

STEPS = 5
OPTIMIZERS = {
    "Adam": {},
    "AdamW": {},
    "RMSprop": {},
    "Adagrad": {},
    "Adamax": {},
    "NAdam": {},
    "RAdam": {},
    "SGD": {"momentum": 0.9},
}

# Under dynamo, torch.optim runs code of its own: with torch.compiler.is_compiling(), `_get_value(step)` keeps
# `step` a tensor and bias corrections, clr and the like become tensor ops instead of Python floats. So the graph
# dynamo hands to dealias is not eager's op sequence, and its float32 results differ from eager's in the last
# bits (measured: a few 1e-6 absolute over 5 steps). The exact reference for dealias is therefore that same
# graph run by eager kernels (`torch.compile(backend="eager")`); against plain eager the comparison is exact only
# for these (optimizer, foreach) pairs, whose compiled op sequence is eager's (measured), and otherwise
# torch.testing.assert_close with float32's default tolerances (rtol 1.3e-6, atol 1e-5). (dealias makes dynamo
# keep addcmul_/addcdiv_ as eager's ops rather than inductor's fma decomposition, so these differences are
# torch.optim's compiled code paths, not dealias's.)
SAME_OPS_AS_EAGER = {("SGD", True), ("SGD", False), ("RMSprop", True), ("RMSprop", False), ("Adagrad", True)}

# torch.optim's own graph breaks, which dealias reports as FallbackWarnings on the first call (these parts run
# eagerly under any dynamo backend): `_use_grad_for_differentiable` calls `torch._dynamo.graph_break()` around the
# update, and the LR scheduler wraps `opt.step` in a function of lr_scheduler.py, a file dynamo skips (so the
# wrapper runs eagerly and dynamo compiles the optimizer's own `step` as a frame of its own).
# Adagrad's single-tensor step also calls `param.add_(..., alpha=clr)` with a tensor clr: aten reads it with .item(),
# a graph break, since dealias keeps eager's ops (dynamo would otherwise rewrite it to inductor's fma).
OPTIMIZER_BREAK = re.compile(
    r"part of the program runs eagerly.*: (Call to `torch\._dynamo\.graph_break\(\)`"
    r"|Attempted to call function marked as skipped|Data dependent operator)$"
)


def _optimizer_cases():
    for name in OPTIMIZERS:
        for foreach in (True, False):
            for form in ("bound", "lambda"):
                case_id = f"{name}-{'foreach' if foreach else 'single'}-{form}"
                yield pytest.param(name, foreach, form, id=case_id)


def _tiny_model() -> torch.nn.Module:
    # 3 parameters of 3 shapes; each one more costs every compile (5 per test) about 8 %.
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, bias=False))


@functools.cache
def _batches() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(5, 4, generator=g) for _ in range(STEPS))


def _make_optimizer(model: torch.nn.Module, name: str, foreach: bool):
    opt = getattr(torch.optim, name)(model.parameters(), lr=0.1, foreach=foreach, **OPTIMIZERS[name])
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # a new lr every step
    return opt, sched


def _forward_backward(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()  # set_to_none
    model(x).square().sum().backward()


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer):
    params = [p.detach().clone() for p in model.parameters()]
    state = [
        {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in opt.state[p].items()}
        for p in model.parameters()
    ]
    return params, state, opt.param_groups[0]["lr"]


@functools.cache
def _reference(name: str, foreach: bool, kind: str):
    """Snapshots after every step of eager (`kind="eager"`) or of dynamo's graphs run by eager kernels."""
    model = copy.deepcopy(_tiny_model())
    opt, sched = _make_optimizer(model, name, foreach)
    step = opt.step
    if kind == "dynamo":
        step = torch.compile(opt.step, backend="eager", dynamic=False, recompile_limit=16, isolate_recompiles=True)
    snapshots = []
    # (With dealias's setting for its own frames: dynamo's prims.fma decompositions off, so a tensor-valued
    # `value=` runs eager's kernel, as dealias's tensor_scalars op does; dynamo's default would round otherwise.)
    with torch._dynamo.config.patch(enable_dynamo_decompositions=False):
        for x in _batches():
            _forward_backward(model, opt, x)
            step()
            sched.step()
            snapshots.append(_snapshot(model, opt))
    return snapshots


def _assert_snapshots(got, expected, exact: bool, what: str) -> None:
    (params, state, lr), (eparams, estate, elr) = got, expected
    assert lr == elr
    for i, (p, e) in enumerate(zip(params, eparams)):
        if exact:
            assert torch.equal(p, e), f"{what}: param {i} differs by {(p - e).abs().max()}"
        else:
            torch.testing.assert_close(p, e, msg=lambda m, i=i: f"{what}: param {i}: {m}")
    for i, (s, e) in enumerate(zip(state, estate)):
        assert s.keys() == e.keys(), f"{what}: state keys of param {i}"
        for k in s:
            if not isinstance(s[k], torch.Tensor):
                assert s[k] == e[k], f"{what}: state {i} {k!r}"
            elif exact:
                assert torch.equal(s[k], e[k]), f"{what}: state {i} {k!r} differs by {(s[k] - e[k]).abs().max()}"
            else:
                torch.testing.assert_close(s[k], e[k], msg=lambda m, i=i, k=k: f"{what}: state {i} {k!r}: {m}")


def _call_with_optimizer_breaks(jf, first: bool) -> None:
    """Call `jf`: on its first call the only FallbackWarnings allowed are torch.optim's own graph breaks that are
    not an explicit `torch._dynamo.graph_break()` (those are listed by `dealias.graph_breaks`, not warned about);
    afterwards, none at all."""
    if not first:
        with no_fallback():
            jf()
        return
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        jf()
    fallbacks = [str(w.message) for w in record if issubclass(w.category, dealias.FallbackWarning)]
    unexpected = [m for m in fallbacks if not OPTIMIZER_BREAK.search(m) or "graph_break()" in m]
    assert not unexpected, unexpected
    assert all("graph_break()" not in b or "asked for by torch's own code" in b for b in dealias.graph_breaks(jf))


@pytest.mark.parametrize("name, foreach, form", list(_optimizer_cases()))
def test_optimizer_step_with_lr_scheduler(name, foreach, form):
    model = copy.deepcopy(_tiny_model())
    opt, sched = _make_optimizer(model, name, foreach)
    jf = dealias.jit(opt.step) if form == "bound" else dealias.jit(lambda: opt.step())
    exact_vs_eager = (name, foreach) in SAME_OPS_AS_EAGER
    for i, x in enumerate(_batches()):
        _forward_backward(model, opt, x)  # eagerly, outside the compiled function
        _call_with_optimizer_breaks(jf, first=i == 0)
        sched.step()
        snap = _snapshot(model, opt)
        if not exact_vs_eager:  # (otherwise dynamo's graph is eager's op sequence: the exact check below covers it)
            by_dynamo = _reference(name, foreach, "dynamo")
            _assert_snapshots(snap, by_dynamo[i], exact=True, what=f"step {i} vs dynamo's graph run eagerly")
        _assert_snapshots(snap, _reference(name, foreach, "eager")[i], exact=exact_vs_eager, what=f"step {i} vs eager")
        for j, p in enumerate(model.parameters()):
            assert type(p) is torch.nn.Parameter, f"param {j} is a {type(p).__name__}"
            assert_not_fake(p, f"param {j}")
            assert_not_fake(p.grad, f"grad {j}")
            for k, v in opt.state[p].items():
                if isinstance(v, torch.Tensor):
                    assert_not_fake(v, f"state {j} {k!r}")
        # lr is a Python float, a new one each step: specialized on the first step, an input of the graph once it
        # changed (an int step count is symbolic too), so at most two programs.
        info = dealias.cache_info(jf)
        assert info.misses <= min(i + 1, 2), info
        assert info.eager_entries == 0, info


def test_optimizer_step_with_verify():
    model = copy.deepcopy(_tiny_model())
    eager_model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    jf = dealias.jit(opt.step, verify=True)
    for i, x in enumerate(_batches()[:3]):
        _forward_backward(model, opt, x)
        _forward_backward(eager_model, eager_opt, x)
        _call_with_optimizer_breaks(jf, first=i == 0)
        eager_opt.step()
        _assert_snapshots(_snapshot(model, opt), _snapshot(eager_model, eager_opt), exact=True, what=f"step {i}")


# --- 2. greedy decoding with a KV cache held by a plain Python object ----------------------------------------

VOCAB, DIM, HEADS, MAX_LEN, DECODE_STEPS = 32, 16, 2, 16, 16
HEAD_DIM = DIM // HEADS


class IndexCopyCache:
    """Preallocated k/v buffers written with index_copy_, and a Python int counting the tokens written."""

    def __init__(self) -> None:
        self.k = torch.zeros(1, HEADS, MAX_LEN, HEAD_DIM)
        self.v = torch.zeros(1, HEADS, MAX_LEN, HEAD_DIM)
        self.length = 0

    def update(self, pos, k, v):
        self.k.index_copy_(2, pos, k)
        self.v.index_copy_(2, pos, v)
        self.length += 1
        visible = torch.arange(MAX_LEN) <= pos  # the positions written so far
        return self.k, self.v, visible


class ListCache:
    """k/v of every step appended to Python lists, concatenated for each step's attention."""

    def __init__(self) -> None:
        self.ks = []
        self.vs = []

    def update(self, pos, k, v):
        self.ks.append(k)
        self.vs.append(v)
        return torch.cat(self.ks, 2), torch.cat(self.vs, 2), None


class Decoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, token, pos, cache):
        x = self.embed(token)  # (1, DIM)
        qkv = self.qkv(x).view(1, 3, HEADS, HEAD_DIM).transpose(1, 2).unsqueeze(3)  # (1, HEADS, 3, 1, HEAD_DIM)
        q, k, v = qkv.unbind(2)
        keys, values, visible = cache.update(pos, k, v)
        scores = (q @ keys.transpose(-1, -2)) / math.sqrt(HEAD_DIM)
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        attended = scores.softmax(-1) @ values  # (1, HEADS, 1, HEAD_DIM)
        x = x + self.proj(attended.transpose(1, 2).reshape(1, DIM))
        return self.head(x)


def decode_step(model, cache, token, pos):
    with torch.no_grad():
        logits = model(token, pos, cache)
    return logits, logits.argmax(-1)


def _assert_same_cache(cache, expected) -> None:
    got, want = vars(cache), vars(expected)
    assert got.keys() == want.keys()
    for key, value in got.items():
        if isinstance(value, list):
            assert len(value) == len(want[key]), key
            for i, (a, b) in enumerate(zip(value, want[key])):
                assert_not_fake(a, f"cache.{key}[{i}]")
                assert torch.equal(a, b), f"cache.{key}[{i}]"
        elif isinstance(value, torch.Tensor):
            assert_not_fake(value, f"cache.{key}")
            assert torch.equal(value, want[key]), f"cache.{key}"
        else:
            assert type(value) is type(want[key]) and value == want[key], f"cache.{key}: {value!r} != {want[key]!r}"


def _greedy_decode(cache_cls, cache_limit: int, on_call=None):
    torch.manual_seed(0)
    model = Decoder()
    eager_model = copy.deepcopy(model)
    cache, eager_cache = cache_cls(), cache_cls()
    jstep = dealias.jit(decode_step, cache_limit=cache_limit)
    token = eager_token = torch.tensor([1])
    tokens = []
    for i in range(DECODE_STEPS):
        pos = torch.tensor([i])
        call = lambda: jstep(model, cache, token, pos)  # noqa: B023 - called right away
        logits, token = on_call(i, call) if on_call else call()
        eager_logits, eager_token = decode_step(eager_model, eager_cache, eager_token, pos.clone())
        assert torch.equal(logits, eager_logits), f"step {i}: logits"
        assert torch.equal(token, eager_token), f"step {i}: token"
        _assert_same_cache(cache, eager_cache)
        tokens.append(token.item())
    assert len(set(tokens)) > 1  # the decode is not degenerate: the comparison sees different tokens
    return jstep


def _strict_call(i, call):
    with no_fallback():
        return call()


def test_greedy_decode_index_copy_cache():
    # `cache.length` is a Python int that grows every step: dynamo makes it symbolic after its second value, and
    # one program serves every later step (returning `length + 1` to the cache object, a plain int each time).
    jstep = _greedy_decode(IndexCopyCache, cache_limit=DECODE_STEPS, on_call=_strict_call)
    info = dealias.cache_info(jstep)
    assert (info.misses, info.entries, info.eager_entries) == (2, 2, 0), info
    assert all(r.mode == "in place" for r in dealias.explain(jstep))


def test_greedy_decode_list_cache():
    # The lists grow every step (a new length and new concatenated shapes): each step is a new program.
    jstep = _greedy_decode(ListCache, cache_limit=DECODE_STEPS, on_call=_strict_call)
    info = dealias.cache_info(jstep)
    assert (info.misses, info.entries, info.eager_entries) == (DECODE_STEPS, DECODE_STEPS, 0), info


def test_greedy_decode_past_the_default_cache_limit_runs_eagerly():
    # With the default cache_limit (8), the 9th length of the growing lists is one compile too many: dealias
    # warns once, and that call and the later ones (which match no compiled program) run eagerly, still exactly.
    limit = dealias.jit(decode_step).options.cache_limit

    def on_call(i, call):
        if i == limit:
            with pytest.warns(dealias.FallbackWarning, match=r"compiled 8 times \(cache_limit\)"):
                return call()
        with no_fallback():
            return call()

    jstep = _greedy_decode(ListCache, cache_limit=limit, on_call=on_call)
    info = dealias.cache_info(jstep)
    assert (info.misses, info.entries, info.eager_entries) == (limit + 1, limit, 0), info


# --- 3. BatchNorm training with backward ---------------------------------------------------------------------


def _conv_bn_relu() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(inplace=True))


def _train_conv_bn(net: torch.nn.Module, jit_step: bool) -> None:
    eager_net = copy.deepcopy(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, foreach=False)
    eager_opt = torch.optim.SGD(eager_net.parameters(), lr=0.1, momentum=0.9, foreach=False)
    jnet = dealias.jit(net)
    step = dealias.jit(opt.step) if jit_step else opt.step
    g = torch.Generator().manual_seed(2)
    for i in range(3):
        x = torch.randn(2, 3, 6, 6, generator=g)
        opt.zero_grad()
        eager_opt.zero_grad()
        with no_fallback():
            loss = jnet(x.clone()).square().mean()
        loss.backward()
        if jit_step:
            _call_with_optimizer_breaks(step, first=i == 0)
        else:
            step()
        eager_loss = eager_net(x.clone()).square().mean()
        eager_loss.backward()
        eager_opt.step()
        assert torch.equal(loss, eager_loss), f"step {i}: loss"
        for (name, p), (_, e) in zip(net.named_parameters(), eager_net.named_parameters()):
            assert type(p) is torch.nn.Parameter and not isinstance(p, FakeTensor), name
            assert torch.equal(p, e), f"step {i}: {name}"
            assert torch.equal(p.grad, e.grad), f"step {i}: {name}.grad"
        for (name, b), (_, e) in zip(net.named_buffers(), eager_net.named_buffers()):
            assert_not_fake(b, name)
            assert torch.equal(b, e), f"step {i}: {name}"
    assert dealias.cache_info(jnet).misses == 1  # one program for the three steps


@pytest.mark.parametrize("jit_step", [False, True], ids=["eager_step", "jit_step"])
def test_batchnorm_training_with_backward(jit_step):
    # Losses, parameters, gradients, running_mean/var and num_batches_tracked after each of 3 steps, exactly.
    _train_conv_bn(_conv_bn_relu(), jit_step)


def test_conv_bn_training_fused_with_autograd():
    # executor="inductor": the forward (conv, BatchNorm training, in-place ReLU, cross entropy) is a graph autograd
    # records, compiled by AOTAutograd and inductor; the SGD step is lowered in place and fused. Fused kernels are
    # not bitwise ATen's: losses, parameters, gradients, running stats and momentum buffers within 1e-5.
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(inplace=True),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    )
    eager_net = copy.deepcopy(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, foreach=False)
    eager_opt = torch.optim.SGD(eager_net.parameters(), lr=0.1, momentum=0.9, foreach=False)

    def loss_of(net, x, y):
        return torch.nn.functional.cross_entropy(net(x), y)

    jloss = dealias.jit(loss_of, executor="inductor")
    step = dealias.jit(opt.step, executor="inductor")
    g = torch.Generator().manual_seed(3)
    close = dict(rtol=1e-5, atol=1e-5)
    for i in range(3):
        x, y = torch.randn(4, 3, 6, 6, generator=g), torch.randint(0, 4, (4,), generator=g)
        for o in (opt, eager_opt):
            o.zero_grad()
        loss, eager_loss = jloss(net, x, y), loss_of(eager_net, x, y)
        loss.backward()
        eager_loss.backward()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.GraphBreakWarning)  # (the optimizer's own graph breaks)
            step()
        eager_opt.step()
        torch.testing.assert_close(loss, eager_loss, **close)
        for (name, p), (_, e) in zip(net.named_parameters(), eager_net.named_parameters()):
            torch.testing.assert_close(p.grad, e.grad, **close, msg=f"step {i}: {name}.grad")
            torch.testing.assert_close(p, e, **close, msg=f"step {i}: {name}")
            torch.testing.assert_close(opt.state[p]["momentum_buffer"], eager_opt.state[e]["momentum_buffer"], **close)
        for (name, b), (_, e) in zip(net.named_buffers(), eager_net.named_buffers()):
            torch.testing.assert_close(b, e, **close, msg=f"step {i}: {name}")
    assert dealias.cache_info(jloss).tiers == ("fused",)
    assert "fused with autograd" in str(dealias.last_traces(jloss)[3])


def tiny_decoder_config(config_class, **extra):
    """An HF decoder-only config (Llama's family) at test size: 2 layers, width 32, 4 heads over 2 key/value heads."""
    return config_class(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **extra,
    )


@pytest.mark.parametrize("executor", ["torch", "inductor"])
def test_transformers_llama_greedy_decode_with_a_static_cache(executor):
    # HF's StaticCache (the canonical compiled decode): each layer computes its write position inside the step,
    # from a count it moves first, and writes keys and values with index_copy_. Prefill and decode steps are
    # compiled; the decode steps reuse one program, fused with executor="inductor".
    import transformers  # (a dev dependency: installed by the README's set-up)

    torch.manual_seed(0)
    config = tiny_decoder_config(transformers.LlamaConfig, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config).eval()

    def step(model, ids, pos, cache):
        return model(input_ids=ids, cache_position=pos, cache=cache, use_cache=True).logits

    # Under dynamo, this model's results differ from eager's by rounding (dynamo's graph run eagerly too,
    # backend="eager"): the torch executor is compared exactly with that run, and every run with eager's within a
    # tolerance.
    jstep = dealias.jit(step, executor=executor)
    runs = [jstep, torch.compile(step, backend="eager"), step]
    caches = [transformers.StaticCache(config=config, max_cache_len=16) for _ in runs]
    compares = [(2, {})] + ([(1, {"rtol": 0, "atol": 0})] if executor == "torch" else [])  # (run, tolerance)
    ids = torch.randint(0, 64, (1, 5))
    pos = torch.arange(5)
    with torch.no_grad(), no_fallback():
        for _ in range(6):
            results = [run(model, ids, pos, cache) for run, cache in zip(runs, caches)]
            for other, tolerance in compares:
                torch.testing.assert_close(results[0], results[other], **tolerance)
                for mine, theirs in zip(caches[0].layers, caches[other].layers):
                    for name in ("keys", "values", "cumulative_length"):
                        torch.testing.assert_close(getattr(mine, name), getattr(theirs, name), **tolerance)
            assert torch.equal(results[0][:, -1].argmax(-1), results[2][:, -1].argmax(-1))
            ids, pos = results[2][:, -1:].argmax(-1), pos[-1:] + 1
    info = dealias.cache_info(jstep)
    assert (info.misses, info.hits) == (2, 4)  # prefill, then one program for every decode step
    assert info.tiers == (("fused",) * 2 if executor == "inductor" else ("torch",) * 2)  # (prefill makes the caches)
    # Each step writes one position of each cache (2 heads of 8 floats: 64 bytes) and the count, in place.
    written = {r.target: (r.mode, r.nbytes) for r in dealias.explain(jstep)}
    assert written == {
        f"cache_layers_{i}_{name}": ("in place", 8 if name == "cumulative_length" else 64)
        for i in range(2)
        for name in ("keys", "values", "cumulative_length")
    }


@pytest.mark.parametrize("arch", ["mistral", "t5"])
def test_transformers_training_over_changing_lengths_is_fused(arch):
    # HF's Mistral (and T5, encoder and decoder) trained on batches whose sequence length changes (8, then 12 and 5
    # over one program over the length symbol): its loss graph holds tensor constants, index reads into masks it
    # builds, a loss whose targets carry ignore_index, and arithmetic of the length; all of it fused with
    # autograd, with eager's gradients (within fused kernels' rounding) and eager's error for a label out of
    # range. (T5's attention views a product AOTAutograd lays out otherwise than eager: `reshape` there.)
    import transformers

    torch.manual_seed(0)
    if arch == "mistral":
        config = tiny_decoder_config(transformers.MistralConfig)
        model = transformers.MistralForCausalLM(config).train()  # (use_cache: the step makes a DynamicCache too)
    else:
        config = transformers.T5Config(
            vocab_size=64,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            dropout_rate=0.0,
            decoder_start_token_id=0,
        )
        model = transformers.T5ForConditionalGeneration(config).train()
    ours = copy.deepcopy(model)

    def loss_of(model, ids, labels):
        return model(input_ids=ids, labels=labels).loss

    torch._dynamo.reset()  # (the other architecture's lengths would make this one's first compile symbolic)
    jloss = dealias.jit(loss_of, executor="inductor")
    with no_fallback():
        for length in (8, 12, 5):
            ids = torch.randint(0, 64, (2, length))
            labels = ids.masked_fill(torch.rand(2, length) < 0.2, -100)
            expected, got = loss_of(model, ids, labels), jloss(ours, ids, labels)
            expected.backward()
            got.backward()  # (a backward of the program over the length: AOTAutograd's donated buffers, kept once)
            torch.testing.assert_close(got, expected)
            for (name, a), b in zip(model.named_parameters(), ours.parameters()):
                torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)
            assert jloss.last.tier == "fused", dealias.last_traces(jloss)[3].text.splitlines()[0]
    assert dealias.cache_info(jloss).misses == 2
    labels[0, 1] = 64
    with pytest.raises(IndexError) as raised:
        loss_of(model, ids, labels)
    with pytest.raises(
        IndexError, match=rf"{re.escape(str(raised.value))} \(aten\."
    ):  # (T5: at its decoder's embedding)
        jloss(ours, ids, labels)
