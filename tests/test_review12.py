"""Review of the binding probes' cache (runtime/bindings.py): a cached answer must be the one a fresh probe gives
where it is used, also in the next process (the disk file) and after the environment the probe ran in changed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import dealias
from dealias.runtime import bindings, executor

aten = torch.ops.aten

_PROGRAM = textwrap.dedent(
    """
    import sys, warnings
    import torch, dealias
    from dealias.runtime import bindings

    warnings.simplefilter("ignore")
    if sys.argv[1] == "patched":  # a library's wrapper of a Tensor method (dynamo traces it: clamp, then mul)
        def clamp(self, *args, **kwargs):
            return torch.clamp(self, *args, **kwargs).mul(10)

        torch.Tensor.clamp = clamp

    def f(x):
        return x.clamp(min=0.0) + 1

    x = torch.randn(8)
    expected = f(x.clone())
    got = dealias.jit(f, executor="torch")(x.clone())
    bindings.flush()
    print(torch.equal(expected, got))
    """
)


def _run(tmp_path: Path, variant: str) -> str:
    script = tmp_path / "program.py"
    script.write_text(_PROGRAM)
    env = {"DEALIAS_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    src = Path(executor.__file__).parents[2]
    env["PYTHONPATH"] = str(src)
    done = subprocess.run(
        [sys.executable, str(script), variant], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_next_process_with_a_patched_method_matches_eager(tmp_path):
    """A process whose library replaced `torch.Tensor.clamp` reads the disk file an unpatched process wrote: the
    method answered there would run the wrapper (clamp and mul) for the graph's clamp node."""
    assert _run(tmp_path, "plain") == "True"
    assert _run(tmp_path, "patched") == "True"


def test_patched_binding_is_probed_again(monkeypatch, tmp_path):
    """In one process: after `torch.Tensor.clamp` is replaced, the cached answer (method) is not the probe's."""
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    bindings.clear()
    mode = torch._subclasses.fake_tensor.FakeTensorMode()
    with mode:
        x = torch.randn(8)
    call = (aten.clamp.default, (x, 0.0), {})
    assert executor.binding_for_call(*call) == ("method", "clamp")
    bindings.flush()
    original = torch.Tensor.clamp

    def clamp(self, *args, **kwargs):
        return original(self, *args, **kwargs).mul(10)

    monkeypatch.setattr(torch.Tensor, "clamp", clamp)
    want = executor.probe_binding(*call)
    assert want != ("method", "clamp")
    assert executor.binding_for_call(*call) == want
    bindings.clear()  # the next process, from the disk file
    assert executor.binding_for_call(*call) == want
    monkeypatch.undo()
    bindings.clear()
    assert executor.binding_for_call(*call) == ("method", "clamp")


def _context_calls():
    mode = torch._subclasses.fake_tensor.FakeTensorMode()
    with mode:
        x, b = torch.randn(4, 5), torch.randn(5, 3)
    return [
        (aten.mm.default, (x, b), {}),
        (aten.matmul.default, (x, b), {}),
        (aten.softmax.int, (x, 1), {}),
        (aten.to.dtype, (x, torch.float64), {}),
        (aten.view.dtype, (x, torch.int32), {}),
        (aten.dropout.default, (x, 0.5, True), {}),
    ]


_CONTEXTS = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "plain": torch.enable_grad,
}


@pytest.mark.parametrize("first", list(_CONTEXTS))
@pytest.mark.parametrize("then", list(_CONTEXTS))
def test_answer_is_the_probe_of_the_context_of_use(monkeypatch, tmp_path, first, then):
    """Probed in one grad/inference/autocast context, asked in another: the probe's answer there (inference mode is
    not no_grad: `matmul`, `softmax`, `to` reach other aten calls; autocast's casts make `mm` reach several)."""
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    bindings.clear()
    calls = _context_calls()
    with _CONTEXTS[first]():
        for call in calls:
            executor.binding_for_call(*call)
    with _CONTEXTS[then]():
        for call in calls:
            assert executor.binding_for_call(*call) == executor.probe_binding(*call), call[0]


def test_bindings_are_cached_when_jitting(monkeypatch, tmp_path):
    """The context checks above leave a plain program's probes cached (no autocast or function mode at compile)."""
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    bindings.clear()

    def f(x):
        return [x.mul(2).add(1) for x in x.unbind(0)]

    x = torch.randn(6, 4)
    expected = f(x.clone())
    got = dealias.jit(f, executor="torch")(x.clone())
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert bindings._memory


def test_autocast_disabled_region_under_ambient_autocast():
    def f(x, w):
        with torch.autocast("cpu", enabled=False):
            a = x @ w
        return a.sum(1), (x @ w).sum(1)

    x, w = torch.randn(4, 8), torch.randn(8, 3)
    # (pre-existing, not the cache: the caller's autocast applied again to the region's fp32 mm, bf16 where eager's
    # is fp32; such a call now runs eagerly, with a FallbackWarning)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = f(x, w)
        with pytest.warns(dealias.FallbackWarning, match="autocast region"):
            got = dealias.jit(f, executor="torch")(x, w)
    assert [t.dtype for t in got] == [t.dtype for t in expected]
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


@pytest.mark.parametrize("content", ["", "{", "[1]", '{"a": [1]}', "\x00\xff", '{"a":' * 100000])
def test_damaged_disk_file_is_probed_again(monkeypatch, tmp_path, content):
    """Whatever the file holds, the answer is the probe's, and writing it again works."""
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    bindings.clear()
    call = _context_calls()[0]
    bindings._path().write_text(content)
    assert executor.binding_for_call(*call) == executor.probe_binding(*call)
    bindings.flush()
    bindings.clear()
    assert executor.binding_for_call(*call) == executor.probe_binding(*call)


def test_autocast_region_without_ambient_autocast_still_compiles():
    """Only a region under the caller's autocast is left to eager: one in a call made without autocast compiles."""

    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = x @ w
        return a.float().sum(1), (x @ w).sum(1)

    x, w = torch.randn(4, 8), torch.randn(8, 3)
    expected = f(x, w)
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        jf = dealias.jit(f, executor="torch")
        got = jf(x, w)
    assert [t.dtype for t in got] == [t.dtype for t in expected]
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert dealias.cache_info(jf).eager_entries == 0
