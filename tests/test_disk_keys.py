"""The binding probes' disk cache (runtime/bindings.py) where dealias's sources cannot be read (an install of
compiled files only, a zip): its key was built from them outside any guard, so the torch executor's `flush` raised
FileNotFoundError from every compile (kernel_verdicts.py had the same key, fixed in review15; both now use
keep_aten.source_key). Answers are then kept in the process only, and programs still give eager's results."""

from __future__ import annotations

from pathlib import Path

import torch

import dealias
from dealias.runtime import bindings


def test_unreadable_sources_keep_the_binding_answers_in_memory(monkeypatch, tmp_path):
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    real = Path.read_text

    def read_text(self, *args, **kwargs):
        if self.name == "executor.py":
            raise FileNotFoundError(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    bindings._build_key.cache_clear()
    bindings.clear()
    try:

        def f(x, y):
            x.add_(y)
            return (x * 2).sum(dim=0)

        x, y = torch.randn(4, 3), torch.randn(4, 3)
        ex, ey = x.clone(), y.clone()
        out = dealias.jit(f, executor="torch")(x, y)
        assert torch.equal(out, f(ex, ey)) and torch.equal(x, ex)
        assert bindings._path() is None
        assert not list(tmp_path.glob("bindings-*.json"))
    finally:
        monkeypatch.undo()
        bindings._build_key.cache_clear()
        bindings.clear()
