"""The tier a program's calls settled on, kept on disk, so that a later process's first call of the same program on
the same host runs that tier at once: no runs on copies, no measurement, and no fused compile where an exact tier won
(issue 38: the warm first call; a resnet18 training step settles on dynamo's graph, its fused forward and backward,
loaded from inductor's cache and run on copies, were 0.3-0.5 s of a warm first call torch.compile makes in 2.1 s).

copies_record.py keeps what the first call's runs on copies measured; this keeps what the user's calls decided after
them (a training step's fused tier ran 2-4 % faster than the exact ones on copies, 1.2-1.5x slower on the user's
calls: only those calls tell). A record is written where a program whose first call fused (FUSE_FIRST) settles by
a choice its user's calls made (or with no choice: one exact tier, the fused program not fusable; a choice the runs on
copies made alone is not kept, a few runs of one tier after another, which under load chose GPT-2's torch executor
over its fused program), once, with the tier, the exact tier that runs calls the fused program's guard rejects, the
times measured and why, and read where the next process's first call of the same program asks (`Tiered._first`).
It is keyed as the copies record is (dealias's source, the torch build, the host and its thread count, dynamo's
graph, every leaf's metadata, the options, grad mode) and on the tiers this process can run. Which tier runs a call
is a matter of speed only (every tier is exact, or within the fused tolerance): a stale record (a user whose calls
changed) costs speed, never a result; an unreadable, damaged or mismatched one is ignored and the tiers are measured
as before.

`DEALIAS_TIER_RECORD=0` (read at import; the test suite's setting, whose tier tests measure afresh) turns it off.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.keep_aten import cache_dir, read_json, write_whole
from . import copies_record

ENABLED = os.environ.get("DEALIAS_TIER_RECORD", "1") != "0"
VERSION = 1
TIERS = ("torch", "graph", "fused")
counts = {"read": 0, "written": 0}  # records read and written in this process (tests)


@dataclass(frozen=True)
class Settled:
    """What a program's calls settled on: `tier` runs its calls, `exact` those the fused program's guard rejects;
    `timings` (seconds, each tier's fastest calls), `measured` and `notes` say why (Tiered.tier_reason);
    `fused_note` why the fused tier is not among them (not fusable), or ""."""

    tier: str
    exact: str
    timings: dict[str, float]
    measured: str
    notes: list[str]
    fused_note: str


def key(entry: Any, leaves: list[Any]) -> str | None:
    """The record's key for cache entry `entry` (tiers.Tiered, before its first call) called with `leaves`."""
    if not ENABLED:
        return None
    # (the tiers this process can run: dynamo's graph is one only where the capture corrected nothing)
    return copies_record.key(entry, leaves, ["settled", *sorted(entry.runs)])


def _path(k: str) -> Path:
    return cache_dir() / "tiers" / f"{k}.json"


def load(k: str | None, runs: dict[str, Any]) -> Settled | None:
    """The record under `k`, where its tiers are ones this entry can run (`runs`; "fused" once compiled); else None."""
    if k is None or not ENABLED:
        return None
    data = read_json(_path(k))
    if not isinstance(data, dict) or data.get("version") != VERSION or data.get("key") != k:
        return None
    tier, exact, timings = data.get("tier"), data.get("exact"), data.get("timings")
    measured, notes, fused_note = data.get("measured"), data.get("notes"), data.get("fused_note")
    if not isinstance(notes, list) or len(notes) > 100:
        return None
    texts = [measured, fused_note, *notes]
    if tier not in TIERS or exact not in runs or exact == "fused" or (tier != "fused" and tier not in runs):
        return None
    if not all(isinstance(t, str) and len(t) < 4000 for t in texts) or not isinstance(timings, dict):
        return None
    if not all(
        t in TIERS and isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and s > 0
        for t, s in timings.items()
    ):
        return None
    if tier == "fused" and fused_note:  # (a note says why the fused tier is not among them)
        return None
    counts["read"] += 1
    return Settled(tier, exact, {t: float(s) for t, s in timings.items()}, measured, list(notes), fused_note)


def save(k: str | None, settled: Settled) -> None:
    """Keep what a program's calls settled on under `k` (a directory that cannot be written: not kept)."""
    if k is None or not ENABLED:
        return
    record = {"version": VERSION, "key": k, **settled.__dict__}
    write_whole(_path(k), json.dumps(record))
    counts["written"] += 1
