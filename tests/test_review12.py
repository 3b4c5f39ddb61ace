"""Review of the binding probes' cache (runtime/bindings.py): a cached answer must be the one a fresh probe gives
where it is used, also in the next process (the disk file) and after the environment the probe ran in changed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch

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
