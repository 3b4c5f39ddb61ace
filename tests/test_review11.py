"""Review of the default's first call (frontend/tiers.py, FUSE_FIRST): the exact tiers run on copies of the call's
tensors there, and those runs must be invisible. A custom op's Python body, or a function `allow_in_graph` put in
dynamo's graph, ran once per run on copies (13 times in the first call where eager runs it once: a counter, a log
line, a collective every rank must call alike). Timing is faked as in test_promote_early.py (the "fused" program is
the torch executor's, labelled fused), but for the one test marked `inductor`."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_copytiers import fake_fused
from torch._subclasses.fake_tensor import FakeTensor

import dealias
from dealias.frontend import tiers

CALLS: list[str] = []  # what the side-effecting callables below saw, real tensors only ("real" runs)


@torch.library.custom_op("review11::logged", mutates_args=())
def logged(x: torch.Tensor) -> torch.Tensor:
    CALLS.append("op")
    return x + 1


@logged.register_fake
def _(x):
    return torch.empty_like(x)


@torch.compiler.allow_in_graph
def noted(x):
    if not isinstance(x, FakeTensor):  # (dynamo and dealias trace it on fake tensors: not a call)
        CALLS.append("fn")
    return x * 3


def with_op(buf, x):
    buf[3:5].add_(x)
    return logged(x) * 2


def with_fn(buf, x):
    buf[3:5].add_(x)
    return noted(x) + 1


def make_args():
    return torch.randn(32, 8), torch.randn(8)


def calls_of(fn, compiled, n: int = 3) -> list[tuple[list[str], list[str]]]:
    """Per call, what eager's and the compiled function's calls ran of the side-effecting callables, and their
    results compared."""
    out = []
    for _ in range(n):
        args = make_args()
        mine = [a.clone() for a in args]
        CALLS.clear()
        expected = fn(*args)
        eager = list(CALLS)
        CALLS.clear()
        got = compiled(*mine)
        out.append((eager, list(CALLS)))
        assert torch.equal(got, expected) and all(torch.equal(a, b) for a, b in zip(args, mine))
    return out


@pytest.mark.parametrize("fn", [with_op, with_fn], ids=["custom_op", "allow_in_graph"])
def test_the_runs_on_copies_do_not_run_a_callable_with_effects_of_its_own(monkeypatch, fn):
    fake_fused(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    jf = dealias.jit(fn)
    seen = calls_of(fn, jf)
    # (allow_in_graph: dealias's torch executor and fused program run what dynamo traced of it, not the function)
    assert all(len(got) <= len(eager) == 1 for eager, got in seen), seen
    reasons = dealias.cache_info(jf).tier_reasons[0]
    assert "tiers measured on the calls: it calls" in reasons, reasons


def test_a_graph_of_torch_ops_alone_is_still_timed_on_copies(monkeypatch):
    fake_fused(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)

    def plain(buf, x):
        buf[3:5].add_(torch.nn.functional.gelu(x))
        return buf.sum()

    jf = dealias.jit(plain)
    for _ in range(3):
        args = make_args()
        mine = [a.clone() for a in args]
        assert torch.equal(jf(*mine), plain(*args)) and torch.equal(mine[0], args[0])
    reasons = dealias.cache_info(jf).tier_reasons[0]
    assert "on copies in the first call" in reasons, reasons


def test_the_runs_on_copies_do_not_call_the_callers_saved_tensor_hooks(monkeypatch):
    fake_fused(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)

    def scaled(buf, x, w):
        buf[3:5].add_(x @ w)
        return (buf @ w).sum()  # (w requires grad: the call records autograd, saving tensors)

    jf = dealias.jit(scaled)
    for call in range(3):
        torch.manual_seed(call)
        args = (torch.randn(32, 8), torch.randn(2, 8), torch.randn(8, 8, requires_grad=True))
        mine = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        packed = {"eager": 0, "dealias": 0}
        for who, fn, a in (("eager", scaled, args), ("dealias", jf, mine)):

            def pack(t, who=who, packed=packed):
                packed[who] += 1
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                fn(*a).backward()
        assert packed["dealias"] == packed["eager"], (call, packed)
        assert torch.equal(mine[0], args[0]) and torch.equal(mine[2].grad, args[2].grad)


def test_the_runs_on_copies_do_not_repeat_a_warning_from_dynamos_graph(monkeypatch):
    fake_fused(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)

    def implicit(buf, x):
        buf[3:5].add_(x)
        return torch.nn.functional.softmax(x.view(2, 4))  # (no dim: a UserWarning from F.softmax's Python body)

    jf = dealias.jit(implicit)
    seen = {}
    for who, fn in (("eager", implicit), ("dealias", jf)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                fn(*make_args())
        seen[who] = [w for w in caught if "Implicit dimension" in str(w.message)]
    # (dealias's capture traces F.softmax once more: one more warning, in the compile; its runs on copies, none)
    assert len(seen["dealias"]) <= len(seen["eager"]) + 1, (len(seen["dealias"]), len(seen["eager"]))


@pytest.mark.inductor
def test_torch_compile_backend_runs_a_custom_op_once_a_call(monkeypatch):
    monkeypatch.setattr(tiers, "FUSE_FIRST", True, raising=False)
    jf = torch.compile(with_op, backend="dealias")
    seen = calls_of(with_op, jf, 2)
    assert all(got == eager == ["op"] for eager, got in seen), seen


@pytest.mark.inductor
def test_an_index_error_on_the_fused_program_leaves_eagers_earlier_writes(monkeypatch):
    monkeypatch.setattr(tiers, "FUSE_FIRST", True, raising=False)

    def bump_then_read(buf, i):
        buf.add_(1)
        return buf[i]

    jf = dealias.jit(bump_then_read)
    for idx in ([1, 3], [1, 9]):  # (the second call's index out of range: eager raises after buf.add_(1))
        i = torch.tensor(idx)
        expected, got = torch.zeros(8), torch.zeros(8)
        errors = []
        for fn, buf in ((bump_then_read, expected), (jf, got)):
            try:
                fn(buf, i)
            except IndexError as e:
                errors.append(str(e).split("(")[0].strip())
        assert len(errors) in (0, 2) and len(set(errors)) <= 1, errors
        assert torch.equal(got, expected), (idx, got, expected)
