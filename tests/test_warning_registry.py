"""A user's warning shown once per line (Python's "default" action) stays shown once across dealias's compiles:
they set warnings aside without marking Python's filters changed (compat/warns.py), which empties every module's
record of the lines that warned."""

from __future__ import annotations

import warnings

import pytest
import torch

import dealias
from dealias.compat import warns


def _users_warning() -> None:
    warnings.warn("the user's own warning", UserWarning, stacklevel=1)


def _step(x, i):
    x.index_put_((i,), torch.ones(()), accumulate=True)  # (an op dealias probes in eager when compiling: checks.py)
    return (x.sin() + 1).mul_(2)


def _shown(caught) -> int:
    return sum("the user's own warning" in str(w.message) for w in caught)


@pytest.mark.parametrize("executor", ["exact", "torch"])
def test_a_warning_once_per_line_is_shown_once_across_compiles(executor):
    # Each call compiles a program of its own (a new size, dynamic=False), so each compiles, probes ops and (on the
    # exact tiers) times them on copies: every compile's catch_warnings emptied the registries and the user's
    # warning was shown again after each (4 times here, eager once). (Not tested: torch's first compile in a
    # process, and the fused executor's C++ compiler run in subprocesses, whose start empties them too, as
    # torch.compile's does.)
    i = torch.tensor([0, 1, 1])
    dealias.jit(_step, executor=executor, dynamic=False)(torch.randn(2), i)  # (torch's first compile's imports)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for n in range(4):
            _users_warning()
            jf = dealias.jit(_step, executor=executor, dynamic=False)
            x = torch.randn(n + 3)
            torch.testing.assert_close(jf(x.clone(), i), _step(x.clone(), i), rtol=0, atol=0)
    assert _shown(caught) == 1, [str(w.message) for w in caught]


def test_ignored_sets_warnings_aside_and_back():
    before = list(warnings.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with warns.ignored():
            _users_warning()
            with warns.ignored():  # (nested)
                _users_warning()
            _users_warning()
        _users_warning()
    assert _shown(caught) == 1
    assert warnings.filters == before


def test_recorded_takes_the_warnings_shown_meanwhile():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        with warns.recorded() as inner:
            _users_warning()
            _users_warning()
        _users_warning()  # (recorded inside, "always": not in the registry, so shown once here)
    assert _shown(inner) == 2 and _shown(caught) == 1


def test_a_program_loaded_from_the_disk_cache_gives_no_warning_of_dealias(tmp_path, monkeypatch):
    # torch 2.13 deprecates constructing pytree's LeafSpec: unpickling a kept program (passes/kept_graphs.py) gave
    # the user a FutureWarning at dealias's line, and under `-W error::FutureWarning` no kept program loaded.
    from dealias.passes import kept_graphs, program_cache

    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(program_cache, "ENABLED", True)  # (the suite's conftest turns the kept programs off)
    i = torch.tensor([0, 1, 1])
    x = torch.randn(7)
    dealias.jit(_step, executor="torch", dynamic=False)(x.clone(), i)
    loaded = []
    loads = kept_graphs.loads
    monkeypatch.setattr(program_cache, "loads", lambda *a: loaded.append(loads(*a)) or loaded[-1])
    torch._dynamo.reset()  # (dynamo's own caches gone: the next compile reads dealias's)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = dealias.jit(_step, executor="torch", dynamic=False)(x.clone(), i)
    torch.testing.assert_close(got, _step(x.clone(), i), rtol=0, atol=0)
    assert loaded and all(p is not None for p in loaded), loaded
