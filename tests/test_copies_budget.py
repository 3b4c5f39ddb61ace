"""The first call's runs on copies (frontend/tiers.py, FUSE_FIRST) stop once they took COPIES_SECONDS in all: each is
one more run of the program where eager runs it once (a 2.3 s program ran 5 more times in its first call). The tiers
not measured there are measured on the user's calls, as without copies. Timing is faked, as in test_promote_early."""

from __future__ import annotations

from test_promote_early import call, fake, slice_write

import dealias
from dealias.frontend import copies, tiers


def test_long_runs_on_copies_stop_at_the_budget_and_the_rest_is_measured_on_the_calls(monkeypatch):
    # each run "takes" 0.6-0.7 s: the exact tiers' warm-ups on copies (1.3 s), then no more
    ran, _ = fake(monkeypatch, torch=0.6, graph=0.7, fused=0.1)
    monkeypatch.setattr(copies, "COPIES_SECONDS", 1.0)
    jf = dealias.jit(slice_write)
    call(slice_write, jf)
    # (the user's call: the tier measured least, the fused program, not yet warm)
    assert ran == [("torch", False), ("graph", False), ("fused", True)], ran
    assert any("runs on copies stopped" in n for n in dealias.cache_info(jf).tier_reasons), dealias.cache_info(jf)
    # later calls: dynamo's graph warmed up and measured on the calls, every call compared with eager's
    call(slice_write, jf, 12)
    on_calls = [t for t, mine in ran if mine]
    assert "graph" in on_calls, on_calls
    assert [t for t, mine in ran if not mine] == ["torch", "graph"], ran  # (none after the first call)
    assert dealias.cache_info(jf).tiers == ("fused",)


def test_short_runs_on_copies_take_every_sample(monkeypatch):
    ran, _ = fake(monkeypatch, torch=2e-5, graph=3e-5, fused=1e-5)
    jf = dealias.jit(slice_write)
    call(slice_write, jf)
    copies = [t for t, mine in ran if not mine]
    assert copies == ["torch", "graph", "fused"] * (tiers.SAMPLES + 1), ran
