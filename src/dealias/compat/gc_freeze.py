"""Python's cyclic garbage collector kept to the objects a compile makes, while dealias compiles (issue 38: the warm
first call).

A full collection walks every object the process tracks, and a process that has imported torch, dynamo and inductor
tracks millions: each took 0.25-0.35 CPU s of a warm first call (torch 2.14.1, resnet18's training forward), and a
compile allocates enough to trigger several (dynamo's tracing, the capture, AOTAutograd's joint trace and
partition, whatever the fused program loads). Measured there (CPU s of the process, medians of 3 warm processes at
load 4, bench/first_call_phases.py's workload): 0.95 of 4.36 in the collector before, 0.26 of 3.76 with this;
torch.compile's 0.57 of 3.42.

`older_objects_frozen()` is `gc.freeze()` for as long as a compile (or dynamo's tracing of a frame for a dealias
backend) runs, `gc.unfreeze()` after: what was there before the compile is moved aside, and collections during the
compile walk only what it made. The collector still runs (the compile's own cyclic garbage is collected as before:
the peak RSS of a cold resnet18 training first call was the same, 1.00 GB, where `gc.disable()` made it 1.05); what
was there before is collected after, with its next full collection (a cycle of the user's dropped in the meantime
is freed a little later, which Python never promised sooner). Nothing is frozen where the collector is off
(`gc.disable()`, the user's choice), nor where something of the process froze objects itself (`gc.freeze()`, e.g.
before a fork): unfreezing would undo theirs. Nested and concurrent compiles freeze once, and unfreeze when the
last ends.

While frozen, the third generation's threshold is raised (x FULL_SPACING) and set back after, unless something
changed it meanwhile. Python starts a full collection when the objects that survived into the oldest generation
since the last one exceed a quarter of the objects that one left; `gc.freeze()` does not reset that count, so after
the first full collection of a compile only its own few objects count, and the next came after a few thousand more
survivors: a mobilenet-like training forward's warm first call (torch 2.14.1) ran 6 full collections, 0.60-0.65
CPU s in the collector; with the threshold raised, 1 and 0.27-0.33 s (torch.compile's process, which froze nothing,
ran 1-2).

`DEALIAS_GC_FREEZE=0` (read at import) turns it off.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

ENABLED = os.environ.get("DEALIAS_GC_FREEZE", "1") != "0"
_lock = threading.Lock()
_depth = 0  # (compiles running now, every thread's)
_frozen = False  # (whether the outermost of them froze: it is then unfrozen when the last ends)
FULL_SPACING = 10
_thresholds: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # (the collector's before the freeze, and ours)


@contextlib.contextmanager
def older_objects_frozen() -> Iterator[None]:
    """While a compile runs: the collector's full collections walk only the objects made since it began."""
    global _depth, _frozen
    with _lock:
        if _depth == 0:
            # (get_freeze_count walks the frozen objects: nothing to walk where nobody froze any)
            _frozen = ENABLED and gc.isenabled() and gc.get_freeze_count() == 0
            if _frozen:
                gc.freeze()
                _space_full_collections()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _frozen:
                _frozen = False
                gc.unfreeze()
                _restore_thresholds()


def _space_full_collections() -> None:
    global _thresholds
    before = gc.get_threshold()
    if len(before) == 3 and before[0] > 0:  # (a threshold of 0 is the collector off: left as it is)
        ours = (*before[:2], before[2] * FULL_SPACING)
        gc.set_threshold(*ours)
        _thresholds = (before, gc.get_threshold())


def _restore_thresholds() -> None:
    global _thresholds
    if _thresholds is not None and gc.get_threshold() == _thresholds[1]:  # (not if the user changed them meanwhile)
        gc.set_threshold(*_thresholds[0])
    _thresholds = None
