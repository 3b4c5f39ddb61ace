"""A warm first call (issue 38): the tier a program's calls settled on is kept on disk (frontend/tier_record.py), and a
later process's first call of the same program on this host runs it at once: nothing run on copies, nothing measured,
no fused compile where an exact tier won. A choice the runs on copies made alone is not kept; a record of another
program or layout is never read, a damaged one is ignored (the tiers measured afresh); results are eager's either
way."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import dealias
from dealias.frontend import copies, tier_record, tiers

pytestmark = pytest.mark.inductor


@pytest.fixture
def seen(monkeypatch, tmp_path_factory):
    """The first call fuses and times on copies (as users run it), tier records on, in a fresh cache dir; returns
    what each first call did: its runs on copies and its fused compiles, counted."""
    root = tmp_path_factory.mktemp("tierrecord")
    monkeypatch.setenv("DEALIAS_CACHE_DIR", str(root / "dealias"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tierrecord-inductor"))
    monkeypatch.setattr(tiers, "FUSE_FIRST", True)
    # (every tier close on copies, so the user's calls choose: a choice made on copies alone is not recorded)
    monkeypatch.setattr(tiers, "COPIES_CLOSE", 100.0)
    monkeypatch.setattr(tier_record, "ENABLED", True)
    monkeypatch.setattr(tier_record, "counts", {"read": 0, "written": 0})
    counted = {"copies": 0, "fused compiles": 0}
    run_on_copies, compile_program = copies.run_on_copies, tiers.compile_program

    def on_copies(*args, **kwargs):
        counted["copies"] += 1
        return run_on_copies(*args, **kwargs)

    def compiling(gm, leaves, names, executor, *args, **kwargs):
        counted["fused compiles"] += executor == "inductor"
        return compile_program(gm, leaves, names, executor, *args, **kwargs)

    monkeypatch.setattr(copies, "run_on_copies", on_copies)
    monkeypatch.setattr(tiers, "compile_program", compiling)
    return counted


def step(x, y):
    x.mul_(2).add_(y)
    return (x * y).sum()


def other_step(x, y):
    x.mul_(3).sub_(y)
    return (x * y).sum()


def _call_like_eager(jf, fn, x, y):
    got_x, want_x = x.clone(), x.clone()
    out = jf(got_x, y)
    want = fn(want_x, y)
    torch.testing.assert_close(out, want)
    assert torch.equal(got_x, want_x)  # (the write of x: elementwise, the same bits on every tier)


def settle(fn, x, y):
    """A fresh compile of `fn` called, each call checked against eager's, until its tier settles (the record
    written); returns the compiled function."""
    torch._dynamo.reset()
    jf = dealias.jit(fn)
    for _ in range(400):
        _call_like_eager(jf, fn, x, y)
        if tier_record.counts["written"]:
            return jf
    raise AssertionError(f"not settled: {dealias.cache_info(jf).tier_reasons}")


def first_call(fn, x, y):
    torch._dynamo.reset()
    jf = dealias.jit(fn)
    _call_like_eager(jf, fn, x, y)
    return jf


def _record_path() -> Path:
    (path,) = (Path(os.environ["DEALIAS_CACHE_DIR"]) / "tiers").glob("*.json")
    return path


def test_a_settled_tier_is_run_at_once_by_the_next_compile(seen):
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    jf = settle(step, x, y)
    settled = dealias.cache_info(jf).tiers
    before = dict(seen)
    jf = first_call(step, x, y)
    assert tier_record.counts == {"read": 1, "written": 1}
    assert dealias.cache_info(jf).tiers == settled
    assert seen["copies"] == before["copies"]  # (nothing run on copies, nothing timed)
    assert seen["fused compiles"] == before["fused compiles"] + (settled == ("fused",))
    (reason,) = dealias.cache_info(jf).tier_reasons
    assert "earlier process" in reason
    for _ in range(3):  # (the next calls: the same tier, eager's results)
        _call_like_eager(jf, step, x, y)
    assert dealias.cache_info(jf).tiers == settled


@pytest.mark.parametrize("tier", ["torch", "graph"])
def test_a_record_of_an_exact_tier_compiles_no_fused_program(seen, tier):
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    settle(step, x, y)
    path = _record_path()
    record = json.loads(path.read_text())
    record.update(tier=tier, exact=tier, fused_note="")
    path.write_text(json.dumps(record))
    compiles = seen["fused compiles"]
    jf = first_call(step, x, y)
    assert tier_record.counts["read"] == 1
    assert dealias.cache_info(jf).tiers == (tier,)
    assert seen["fused compiles"] == compiles
    _call_like_eager(jf, step, x, y)


@pytest.mark.parametrize("change", ["program", "shape", "stride", "grad"])
def test_a_record_of_anything_else_is_never_read(seen, change):
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    settle(step, x, y)
    fn = other_step if change == "program" else step
    if change == "shape":
        x, y = torch.randn(64, 65), torch.randn(64, 65)
    elif change == "stride":
        x = x.t()
    copies_before = seen["copies"]
    if change == "grad":
        with torch.no_grad():
            first_call(fn, x, y)
    else:
        first_call(fn, x, y)
    assert tier_record.counts["read"] == 0
    assert seen["copies"] > copies_before  # (measured afresh)


@pytest.mark.parametrize("damage", ["garbage", "tier", "exact", "timings", "notes", "fused_with_note", "key"])
def test_a_damaged_record_is_ignored(seen, damage):
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    settle(step, x, y)
    path = _record_path()
    record = json.loads(path.read_text())
    if damage == "garbage":
        path.write_bytes(b"\x00\xff{not json")
    else:
        record.update(
            {
                "tier": {"tier": "eager"},
                "exact": {"exact": "fused"},
                "timings": {"timings": {"torch": -1.0}},
                "notes": {"notes": "not a list"},
                "fused_with_note": {"tier": "fused", "fused_note": "not fusable"},
                "key": {"key": "0" * 32},
            }[damage]
        )
        path.write_text(json.dumps(record))
    copies_before = seen["copies"]
    jf = first_call(step, x, y)
    assert tier_record.counts["read"] == 0
    assert seen["copies"] > copies_before  # (measured afresh)
    assert "earlier process" not in " ".join(dealias.cache_info(jf).tier_reasons)


def test_a_choice_made_on_copies_alone_is_not_recorded(seen, monkeypatch):
    # (a few runs on copies, blocks of one tier after another, in the first call: under load GPT-2's chose the torch
    # executor, 1.2x eager, over the fused program, 0.8x; kept, every later process would run it)
    monkeypatch.setattr(tiers, "COPIES_CLOSE", 0.0)
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    torch._dynamo.reset()
    jf = dealias.jit(step)
    for _ in range(60):
        _call_like_eager(jf, step, x, y)
    assert "on copies in the first call" in dealias.cache_info(jf).tier_reasons[0]
    assert tier_record.counts["written"] == 0
