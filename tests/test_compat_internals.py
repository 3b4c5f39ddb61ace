"""compat/internals.py: the private functions of torch dealias calls outside its corrections. On a torch without
one, the programs that need it are refused (run eagerly, with a FallbackWarning) or run on the torch executor, with
eager's results: never run without it. Each missing function is faked by monkeypatching the lookup's result."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import check

import dealias
from dealias.compat import internals
from dealias.runtime.verify import compare_call


def t_between_views(x):  # its call sets a layout back without moving the version counter (as_strided_keeping_version)
    y = x * 2
    z = y[0]
    y.t_()
    w = y[1]
    return y, z, w


def make():
    return (torch.randn(3, 3, requires_grad=True) * 1,)


def test_a_program_that_sets_version_counters_compiles_where_torch_can():
    jf = dealias.jit(t_between_views)
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        for _ in range(2):
            assert compare_call(t_between_views, jf, make()) is None
    assert "as_strided_keeping_version(" in jf.last.source


def test_a_program_that_sets_version_counters_runs_eagerly_where_torch_cannot(monkeypatch):
    monkeypatch.setattr(internals, "_SET", None)
    monkeypatch.setattr(internals, "_SET_MISSING", "torch._C._autograd._unsafe_set_version_counter is not there")
    jf = dealias.jit(t_between_views)
    with pytest.warns(dealias.FallbackWarning, match="version counters cannot be set here"):
        assert compare_call(t_between_views, jf, make()) is None
    assert compare_call(t_between_views, jf, make()) is None
    assert dealias.cache_info(jf).eager_entries == 1


def add_one(x):
    x.add_(1)  # inductor's kernel writes x through a pointer: the call moves its version counter itself
    return x * 2


@pytest.mark.inductor
@pytest.mark.parametrize("missing", [False, True])
def test_a_fused_write_runs_on_the_torch_executor_where_counters_cannot_be_moved(monkeypatch, missing):
    if missing:
        monkeypatch.setattr(internals, "_INCREMENT", None)
        monkeypatch.setattr(internals, "_INCREMENT_MISSING", "torch._C._increment_version is not there")
    jf = check(add_one, torch.randn(8), executor="inductor", allow_fallback=True)
    assert jf.last.tier == ("torch" if missing else "fused")
    if missing:
        assert "version counters cannot be moved here" in jf.last.unfused
    x = torch.randn(8)
    version = x._version
    jf(x)
    assert x._version > version


def test_a_storage_id_is_the_storages_address():
    x = torch.randn(4)
    assert internals.storage_id(x) == x.untyped_storage()._cdata == internals.storage_id(x[1:])
