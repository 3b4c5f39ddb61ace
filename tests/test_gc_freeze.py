"""The collector kept to a compile's own objects while dealias compiles (compat/gc_freeze.py, issue 38: the warm
first call): what was there before is frozen during the compile and unfrozen after; the user's own freeze and a
collector turned off are left alone; results stay eager's."""

from __future__ import annotations

import gc

import pytest
import torch

import dealias
from dealias.compat import gc_freeze, settings
from dealias.passes import pipeline


def step(x, w):
    x.mul_(2)
    return (x @ w).relu().sum(), x[1:]


def inputs():
    torch.manual_seed(0)
    return torch.randn(4, 3), torch.randn(3, 5)


@pytest.fixture
def seen(monkeypatch):
    """gc.get_freeze_count() as the capture (inside compile_program) and dynamo's trace of a dealias frame saw it."""
    counts = {"capture": [], "trace": []}
    capture = pipeline.capture

    def counted(*args, **kwargs):
        counts["capture"].append(gc.get_freeze_count())
        return capture(*args, **kwargs)

    monkeypatch.setattr(pipeline, "capture", counted)
    frozen = gc_freeze.older_objects_frozen

    def traced():
        counts["trace"].append(None)
        return frozen()

    monkeypatch.setattr(settings, "older_objects_frozen", traced)
    monkeypatch.setattr(gc_freeze, "ENABLED", True)
    return counts


def test_compile_freezes_what_was_there_and_unfreezes_after(seen):
    assert gc.isenabled() and gc.get_freeze_count() == 0
    x, w = inputs()
    ex, ew = inputs()
    out = dealias.jit(step)(x, w)
    expected = step(ex, ew)
    assert seen["capture"] and all(c > 0 for c in seen["capture"])  # (frozen while the passes ran)
    assert seen["trace"]  # (dynamo's trace of the frame too)
    assert gc.get_freeze_count() == 0  # (and unfrozen after)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(x, ex, rtol=0, atol=0)


def test_users_freeze_is_left_alone(seen):
    gc.freeze()
    try:
        x, w = inputs()
        ex, ew = inputs()
        out = dealias.jit(step)(x, w)
        assert seen["capture"] and gc.get_freeze_count() > 0  # (not unfrozen by dealias: freed ones leave it)
    finally:
        gc.unfreeze()
    torch.testing.assert_close(out, step(ex, ew), rtol=0, atol=0)


def test_collector_off_freezes_nothing(seen):
    gc.disable()
    try:
        x, w = inputs()
        ex, ew = inputs()
        out = dealias.jit(step)(x, w)
        assert seen["capture"] == [0] * len(seen["capture"]) and seen["capture"]
        assert not gc.isenabled()  # (still the user's setting)
    finally:
        gc.enable()
    torch.testing.assert_close(out, step(ex, ew), rtol=0, atol=0)


def test_nested_and_raising_compiles_unfreeze_once(monkeypatch):
    monkeypatch.setattr(gc_freeze, "ENABLED", True)
    with gc_freeze.older_objects_frozen():
        assert gc.get_freeze_count() > 0
        with gc_freeze.older_objects_frozen():
            assert gc.get_freeze_count() > 0
        # (the outer compile still runs: still frozen; the count itself drops as frozen objects are freed)
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    with pytest.raises(ValueError), gc_freeze.older_objects_frozen():
        raise ValueError("a compile that fails")
    assert gc.get_freeze_count() == 0


def test_off_setting_freezes_nothing(monkeypatch):
    monkeypatch.setattr(gc_freeze, "ENABLED", False)
    with gc_freeze.older_objects_frozen():
        assert gc.get_freeze_count() == 0


def test_full_collections_spaced_while_frozen_and_thresholds_restored(monkeypatch):
    monkeypatch.setattr(gc_freeze, "ENABLED", True)
    before = gc.get_threshold()
    with gc_freeze.older_objects_frozen():
        during = gc.get_threshold()
    assert during == (*before[:2], before[2] * gc_freeze.FULL_SPACING)
    assert gc.get_threshold() == before


def test_thresholds_the_user_set_during_a_compile_stay(monkeypatch):
    monkeypatch.setattr(gc_freeze, "ENABLED", True)
    before = gc.get_threshold()
    try:
        with gc_freeze.older_objects_frozen():
            gc.set_threshold(500, 5, 5)
        assert gc.get_threshold() == (500, 5, 5)
    finally:
        gc.set_threshold(*before)


def test_a_compile_runs_fewer_full_collections(monkeypatch):
    """A compile allocating as a warm first call does (survivors, in batches): with the oldest generation's
    threshold raised while frozen, fewer full collections run than with the freeze alone."""

    def full_collections(spacing):
        monkeypatch.setattr(gc_freeze, "FULL_SPACING", spacing)
        runs = []

        def counted(phase, info):
            if phase == "start" and info["generation"] == 2:
                runs.append(1)

        kept = []
        gc.callbacks.append(counted)
        try:
            with gc_freeze.older_objects_frozen():
                for _ in range(200):
                    kept.append([[i] for i in range(2000)])  # (survivors: they stay referenced)
        finally:
            gc.callbacks.remove(counted)
        return len(runs)

    monkeypatch.setattr(gc_freeze, "ENABLED", True)
    spaced, unspaced = full_collections(gc_freeze.FULL_SPACING), full_collections(1)
    assert unspaced >= 2 and spaced < unspaced
