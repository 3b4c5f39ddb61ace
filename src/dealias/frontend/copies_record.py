"""What a first call's runs on copies measured, kept on disk, so that a later process's first call of the same
program on the same host reads the tiers' times instead of timing them again (issue 38: the warm first call).

A record holds each tier's timed runs on copies (seconds; forward and backward, and the forwards alone where the
call records autograd; a lazy tier's backward untimed, frontend/choosing.py), nothing else: which tier runs a call
is a matter of speed only (every tier is exact, or within the fused tolerance), so a stale or wrong record costs
speed, never a result. It is keyed on everything that makes the program and its measure the same: dealias's source,
the torch build, the host (CPU, ISA, torch's thread count), dynamo's graph (its code), every leaf's metadata (type,
dtype, sizes, strides, offset, device, requires_grad, leaf or not, which leaves share a storage, scalar values), the
options, grad mode, the tiers measured and those whose backward is left untimed. A file that cannot be read, is
damaged or does not match what is asked is ignored: the tiers are timed as before.

A first call that reads a record still runs on copies the tier(s) the record makes fastest, once and untimed: the
fused program's first run is its warm-up (its first calls after the compile ran 1.1-1.3x eager, its backward
compiled in its first backward), which the user's calls would take otherwise; so are the tiers close enough to the
fastest that the user's calls measure them (tiers.COPIES_CLOSE), as where the first call times them: otherwise a
tier whose turn is not the first made its first, cold run at the user's fifth or ninth call (clip_grad_norm_'s
torch executor there: 3.3x eager's median call). The other tiers' first runs are not made.

`DEALIAS_COPIES_RECORD=0` (read at import; the test suite's setting, whose tier tests time afresh) turns it off.
Only real measurements are kept: where tests replace `tiers.measure`, nothing is read or written.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..compat.graph_cache import source_hash
from ..runtime.keep_aten import _host_key, cache_dir, read_json, source_key, write_whole
from . import copies

ENABLED = os.environ.get("DEALIAS_COPIES_RECORD", "1") != "0"
VERSION = 2  # (2: the tiers whose backward is untimed, `lazy`, in the key; no `whole` for them)
# Records read and written in this process (tests: a second process read the first's, not timing anything).
counts = {"read": 0, "written": 0}


def key(entry: Any, leaves: list[Any], tiers: list[str], lazy: frozenset[str] = frozenset()) -> str | None:
    """The record's key for the tiers `tiers` (`lazy`: those whose backward is untimed) of cache entry `entry`
    (tiers.Tiered) called with `leaves`; None where
    the program cannot be named surely (dynamo's graph has no code; a torch source that cannot be read)."""
    build = source_key((), source_hash(), _host_key())
    if build is None:
        return None
    try:
        code = entry.backend.gm.code
    except Exception:  # noqa: BLE001 - no code: not recorded
        return None
    storages: dict[int, int] = {}  # (which leaves share a storage, by first appearance: not the addresses)
    metas = []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            try:
                storage = storages.setdefault(x.untyped_storage()._cdata, len(storages))
                nbytes = x.untyped_storage().nbytes()
            except Exception:  # noqa: BLE001 - a tensor without storage (a subclass): not recorded
                return None
            metas.append(
                (
                    type(x).__qualname__,
                    str(x.dtype),
                    tuple(x.shape),
                    tuple(x.stride()),
                    x.storage_offset(),
                    str(x.device),
                    str(x.layout),
                    x.requires_grad,
                    x.is_leaf,
                    storage,
                    nbytes,
                    x.is_inference(),
                )
            )
        elif x is None or isinstance(x, (bool, int, float, str)):
            metas.append((type(x).__qualname__, repr(x)))
        else:
            metas.append((type(x).__qualname__,))
    options = entry.backend.options
    parts = [
        f"v{VERSION}",
        build,
        str(torch.get_num_threads()),
        str(torch.is_grad_enabled()),
        repr(options),
        repr(sorted(tiers)),
        repr(sorted(lazy)),
        str(entry.narrower is not None),
        code,
        repr(metas),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _path(k: str) -> Path:
    return cache_dir() / "copies" / f"{k}.json"


def _times(value: Any, tiers: list[str]) -> dict[str, list[float]] | None:
    """Each tier's timed runs from a record's `value`, where it holds exactly `tiers`, each a non-empty list of
    finite positive seconds; else None."""
    if not isinstance(value, dict) or set(value) != set(tiers):
        return None
    out: dict[str, list[float]] = {}
    for t, s in value.items():
        if not isinstance(s, list) or not s or len(s) > 1000:
            return None
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in s):
            return None
        out[t] = [float(x) for x in s]
    return out


def load(
    k: str | None, tiers: list[str], lazy: frozenset[str] = frozenset()
) -> tuple[dict[str, list[float]], dict[str, list[float]] | None] | None:
    """The record under `k` for `tiers`: (each tier's timed runs, but the `lazy` ones' where the call records
    autograd, their forwards alone or None); None where there is none usable."""
    if k is None or not ENABLED:
        return None
    data = read_json(_path(k))
    if not isinstance(data, dict) or data.get("version") != VERSION or data.get("key") != k:
        return None
    samples = _times(data.get("samples"), _whole(tiers, lazy, data.get("forwards") is not None))
    forwards = data.get("forwards")
    forwards = None if forwards is None else _times(forwards, tiers)
    if samples is None or (data.get("forwards") is not None and forwards is None):
        return None
    return samples, forwards


def _whole(tiers: list[str], lazy: frozenset[str], records: bool) -> list[str]:
    """The tiers whose forward and backward runs on copies time (`records`: the call records autograd)."""
    return [t for t in tiers if not (records and t in lazy)]


def save(k: str | None, samples: dict[str, list[float]], forwards: dict[str, list[float]] | None) -> None:
    """Keep what the runs on copies measured under `k` (a directory that cannot be written: not kept)."""
    if k is None or not ENABLED:
        return
    record = {"version": VERSION, "key": k, "samples": samples, "forwards": forwards}
    write_whole(_path(k), json.dumps(record))
    counts["written"] += 1


def runs(
    entry: Any,
    leaves: list[Any],
    tiers: list[str],
    measure: Callable,
    samples_per_tier: int,
    measure_seconds: float,
    fastest_of: Callable[[list[float]], float],
    real: bool,
    lazy: frozenset[str] = frozenset(),
    close: float = 0.0,
    warm: frozenset[str] = frozenset(),
) -> tuple[dict[str, list[float]], set[str], list[str], dict[str, list[float]] | None]:
    """copies.run_on_copies for cache entry `entry` (tiers.Tiered), its times read from a record where there is
    one (only the untimed first runs made of the recorded fastest tiers and of those within `close` of the fastest,
    which the user's calls measure: the fused program's warm-up, and each such tier's first run, whose cold call
    would otherwise be one of the user's), else timed and recorded for the next process. `real`: the times are real
    ones (tests faking them: nothing read or kept). `warm`: tiers whose first run, forward and backward, this call
    made on copies already (the runs after the first backward: the exact tiers warmed in the call's forward), not
    made again (nor where the runs are timed)."""
    k = key(entry, leaves, tiers, lazy) if real and ENABLED and tiers else None
    found = load(k, tiers, lazy)
    if found is not None:
        recorded, recorded_forwards = found
        best = min(map(fastest_of, recorded.values()), default=0.0)
        fastest = {t for t, s in recorded.items() if fastest_of(s) <= (1 + close) * best}
        if recorded_forwards is not None:
            best = min(map(fastest_of, recorded_forwards.values()), default=0.0)
            fastest |= {t for t, s in recorded_forwards.items() if fastest_of(s) <= (1 + close) * best}
        # (a tier warmed already is not run again: resnet18's training step ran the torch executor's and dynamo's
        # graph's forward and backward on copies in its forward and again after its first backward, 0.09 CPU s)
        cold = [t for t in tiers if t in fastest and t not in warm]
        if cold:
            _, warmed, notes, forwards = copies.run_on_copies(entry, leaves, cold, measure, 0, measure_seconds, lazy)
            refused = any(n.startswith("tiers measured on the calls:") for n in notes)
        else:  # (the tiers' first runs, their backward included, were this call's: it records autograd)
            warmed, refused, forwards = set(), False, {}
        # (the warm-up ran as the record's runs did: not refused, and recording autograd where they did)
        if not refused and warmed == set(cold) and (forwards is None) == (recorded_forwards is None):
            counts["read"] += 1
            return recorded, warmed, ["times on copies read from an earlier process's record (copies_record)"], found[1]
    samples, warmed, notes, forwards = copies.run_on_copies(
        entry, leaves, tiers, measure, samples_per_tier, measure_seconds, lazy, warm
    )
    # (a record only of a complete measure: every tier timed, nothing refused)
    whole = set(_whole(tiers, lazy, forwards is not None))
    if k is not None and samples and set(samples) == whole and not notes:
        if forwards is None or set(forwards) == set(tiers):
            save(k, samples, forwards)
    return samples, warmed, notes, forwards
