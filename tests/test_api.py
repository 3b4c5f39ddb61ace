"""The user-facing wrapper: `dealias.jit(module)` is a module as torch.compile's is (parameters, state_dict,
train/eval, indexing, copies), checked by one training script run eagerly, through torch.compile and through
dealias."""

from __future__ import annotations

import copy
import io
import logging
import pickle
import warnings

import numpy as np
import pytest
import torch
from torch._dynamo.eval_frame import OptimizedModule

import dealias
from dealias.runtime.verify import clone_args


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _train(model: torch.nn.Module, inner: torch.nn.Sequential) -> list[torch.Tensor]:
    """A few AdamW steps in training mode, an evaluation, a state_dict round trip; what it saw along the way.
    `inner` is the Sequential itself (model[0] is not subscriptable on torch.compile's wrapper)."""
    torch.manual_seed(1)
    data = [(torch.randn(5, 6), torch.randn(5, 2)) for _ in range(3)]
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    seen = []
    model.train()
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen.append(loss.detach())
    model.eval()
    with torch.no_grad():
        seen.append(model(data[0][0]))
    saved = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        inner[0].weight.zero_()
    model.load_state_dict(saved)
    model.train()
    seen.append(model(data[1][0]).detach())
    seen += [p.detach() for p in model.parameters()] + [inner[1].running_mean, inner[1].running_var]
    return seen


def test_jit_module_trains_like_eager_and_torch_compile():
    eager = _model()
    expected = _train(eager, eager)
    compiled = torch.compile(_model(), backend="eager")
    assert isinstance(compiled, OptimizedModule)
    through_compile = _train(compiled, compiled._orig_mod)
    jitted = dealias.jit(_model())
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        through_dealias = _train(jitted, jitted)
    for got in (through_compile, through_dealias):
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    # The wrapper's surface, as torch.compile's: the same state_dict keys and parameter names, the module reached
    assert list(jitted.state_dict()) == list(compiled.state_dict())
    swapped = dealias.jit(_model())
    swapped.load_state_dict(compiled.state_dict())  # a checkpoint of one wrapper loads into the other
    torch.testing.assert_close(swapped.state_dict(), compiled.state_dict(), rtol=0, atol=0)
    assert [n for n, _ in jitted.named_parameters()] == [n for n, _ in compiled.named_parameters()]
    assert isinstance(jitted, OptimizedModule) and isinstance(jitted._orig_mod, torch.nn.Sequential)
    assert jitted[0] is jitted._orig_mod[0] and len(jitted) == 4 and list(jitted)[2] is jitted._orig_mod[2]
    assert jitted.training and not jitted.eval().training and not jitted._orig_mod.training
    info = dealias.cache_info(jitted)
    assert info.misses >= 2 and info.hits >= 2, info  # (train and eval programs, then cache hits)
    assert dealias.last_traces(jitted) and isinstance(dealias.explain(jitted), list)


class _Named(torch.nn.Module):
    """A module whose attributes are named like the JitFunction's: they stay the module's."""

    def __init__(self) -> None:
        super().__init__()
        self.last = torch.nn.Linear(3, 3)
        self.stats = "user's"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(x).add_(1)


def test_jit_module_attributes_copies_and_pickles():
    jitted = dealias.jit(_Named(), verify=True)
    x = torch.randn(2, 3)
    expected = jitted._orig_mod(x)
    torch.testing.assert_close(jitted(x), expected)
    assert isinstance(jitted.last, torch.nn.Linear) and jitted.stats == "user's"
    jitted.scale = 2.0  # set on the module, as torch.compile's wrapper does
    assert jitted._orig_mod.scale == 2.0
    assert jitted.to(torch.float64) is jitted and jitted.last.weight.dtype == torch.float64
    jitted.to(torch.float32)
    for copied in (copy.deepcopy(jitted), pickle.loads(pickle.dumps(jitted))):
        assert type(copied) is dealias.JitModule and copied._orig_mod is not jitted._orig_mod
        assert dealias.cache_info(copied).misses == 0  # a fresh cache, the same options
        assert copied._dealias.options == jitted._dealias.options
        torch.testing.assert_close(copied(x), expected)
        assert dealias.cache_info(copied).misses == 1
    buffer = io.BytesIO()
    torch.save(jitted, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(loaded(x), expected)


def _add_n(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.add_(n)


def _sub_n(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.sub_(n)


def _double_plus_one(x: torch.Tensor) -> torch.Tensor:
    return x.mul(2).add_(1)


def test_last_miss_reason_is_the_functions_own():
    # dynamo records recompile reasons process-wide: each function reports those of its own cache entries
    jf, jg = dealias.jit(_add_n), dealias.jit(_double_plus_one)
    jf(torch.ones(3), 1)
    jg(torch.ones(3))
    jf(torch.ones(3), 2)  # f recompiles on the int
    with torch.no_grad():
        jg(torch.ones(3))  # g on grad mode
    assert dealias.cache_info(jf).last_miss_reason.startswith("n == 1"), dealias.cache_info(jf)
    assert "grad_mode" in dealias.cache_info(jg).last_miss_reason, dealias.cache_info(jg)
    # Two jitted copies of one function share dynamo's frame, not their cache entries
    a, b = dealias.jit(_sub_n), dealias.jit(_sub_n)
    a(torch.ones(3), 1)
    b(torch.ones(3), 1)
    with torch.no_grad():
        b(torch.ones(3), 1)
    a(torch.ones(3), 2)
    assert "grad_mode" in dealias.cache_info(b).last_miss_reason, dealias.cache_info(b)
    assert dealias.cache_info(a).last_miss_reason.startswith("n == 1"), dealias.cache_info(a)


def _write_one_read_other(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a.add_(1)
    return b * 2, b[1:]


def _over_one_buffer() -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    buffer = np.arange(6, dtype=np.float32)
    return buffer, torch.from_numpy(buffer[:4]), torch.from_numpy(buffer[2:])  # two storages, one memory


def test_verify_copies_storages_over_one_memory_as_one():
    jf = dealias.jit(_write_one_read_other, verify=True)
    for _ in range(2):  # the first call and the cached one
        eager_buffer, a, b = _over_one_buffer()
        assert a.untyped_storage()._cdata != b.untyped_storage()._cdata
        expected = _write_one_read_other(a, b)
        buffer, a, b = _over_one_buffer()
        got = jf(a, b)  # verify=True runs the graph eagerly on copies that overlap as a and b do
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        np.testing.assert_array_equal(buffer, eager_buffer)
        assert got[1].untyped_storage()._cdata == b.untyped_storage()._cdata
    assert dealias.cache_info(jf).misses == 1
    _, a, b = _over_one_buffer()
    copies = clone_args((a, b))
    copies[0][3] = 100.0  # the copies share memory as the caller's tensors do, not storage objects
    assert copies[1][1].item() == 100.0 and b[1].item() == 3.0
    assert copies[0].untyped_storage()._cdata != copies[1].untyped_storage()._cdata
    metas = clone_args((torch.empty(3, device="meta"), torch.empty(3, device="meta")))  # (no memory: data pointer 0)
    assert metas[0].untyped_storage()._cdata != metas[1].untyped_storage()._cdata


def _broadcast_into_smaller(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z = x * 2
    z.add_(y)  # eager raises: an output of shape (3,) cannot take the broadcast shape (2, 3)
    return z


def _broadcast_into_smaller_for_torch(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z = x * 2
    z.add_(y)
    return z


class _Pick(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, index):
        return x[index] * 2  # eager raises for an index out of range (the fake tensors dynamo traces do not)

    @staticmethod
    def backward(ctx, g):
        return None, None


def _pick(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return _Pick.apply(x * 1, index)


def _eager_error(fn, *args) -> BaseException:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - the error is what is compared
        return e
    raise AssertionError("eager did not raise")


def _torch_logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("torch") and r.levelno >= logging.WARNING]


def test_eager_error_without_torchs_internals_on_the_console(capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="dealias")
    for fn, args in (
        (_broadcast_into_smaller, (torch.ones(3), torch.ones(2, 3))),
        (_pick, (torch.ones(3, requires_grad=True), torch.tensor([5]))),
    ):
        expected = _eager_error(fn, *args)
        capfd.readouterr()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.GraphBreakWarning)
            got = _eager_error(dealias.jit(fn), *args)
        assert type(got) is type(expected) and str(got) == str(expected)
        console = capfd.readouterr().err
        assert "FX-traced Module" not in console, console
        assert _torch_logged(caplog) == [], _torch_logged(caplog)
    assert any("failed while attempting to run meta" in r.getMessage() for r in caplog.records if r.name == "dealias")


def test_other_backends_and_graph_modules_log_as_before(capfd, caplog):
    # the redirection is dealias's compiles' only: torch.compile's eager backend still logs dynamo's detail, and
    # a graph module dealias did not make still prints fx's context
    with pytest.raises(RuntimeError):
        torch.compile(_broadcast_into_smaller_for_torch, backend="eager")(torch.ones(3), torch.ones(2, 3))
    assert any("failed while attempting to run meta" in m for m in _torch_logged(caplog))
    traced = torch.fx.symbolic_trace(lambda x, i: x[i] * 2)
    with pytest.raises(IndexError):
        traced(torch.ones(3), torch.tensor([5]))
    assert "FX-traced Module" in capfd.readouterr().err
