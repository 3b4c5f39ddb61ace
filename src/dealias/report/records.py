"""The run's records: one JSON line per compile event, appended to DIR/records-<pid>.jsonl as the run goes.

`DEALIAS_REPORT=DIR` (read once, at import) or `dealias.report(DIR)` starts a Recorder. dealias's front end calls
it only where it compiles, misses or falls back (frontend/backend.py, api.py), behind one check of `ACTIVE`: a
call that hits the cache never reaches it, so recording costs nothing per step. Each event is flushed when
written, so a run that crashes keeps its records up to the crash, and `dealias report DIR` rebuilds the page from
them. The page (html.py) is written at exit, on `dealias.report()`, and after an event at most once a second.

Nothing here may break the user's run: every hook catches its own errors (logged on the "dealias" logger).
"""

from __future__ import annotations

import atexit
import dataclasses
import inspect
import json
import linecache
import logging
import os
import re
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

log = logging.getLogger("dealias")

ENV = "DEALIAS_REPORT"
RECORDS = "records*.jsonl"  # records-<pid>.jsonl: one file per process of the run
INDEX = "index.html"
ACTIVE: Recorder | None = None  # the hooks' one check
_LOCATION = re.compile(r"(\S+?\.py):(\d+)")
_RENDER_EVERY = 1.0  # seconds between pages rewritten after events (the last one is written at exit)


class Recorder:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._pid = os.getpid()
        self.path = self.dir / f"records-{self._pid}.jsonl"
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run
        self._lock = threading.RLock()
        self._ids: dict[int, int] = {}  # id(stats) / id(graph program) -> its number in the records
        self._objects: list[Any] = []
        self._counts: dict[str, int] = {}
        self._functions: dict[int, Any] = {}  # number -> weak reference to a JitFunction, for its final cache_info
        self._last_render = 0.0
        self._closed = False
        import torch

        self.write(
            {
                "event": "run",
                "argv": list(sys.argv),
                "pid": os.getpid(),
                "torch": torch.__version__,
                "start": time.time(),
            }
        )
        atexit.register(self.close)

    # -- writing -------------------------------------------------------------------------------------------------
    def write(self, event: dict[str, Any]) -> None:
        event.setdefault("t", time.time())
        line = json.dumps(event, default=str)
        with self._lock:
            if self._closed:
                return
            if os.getpid() != self._pid:  # a forked process (a DataLoader worker): its own file, not its parent's
                self._pid = os.getpid()
                self._file = open(self.dir / f"records-{self._pid}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
            self._file.write(line + "\n")
            self._file.flush()

    def number(self, obj: Any, kind: str = "function") -> int:
        """A function's (its Stats') or a graph's number in the records, in the order they were first seen."""
        with self._lock:
            n = self._ids.get(id(obj))
            if n is None:
                n = self._ids[id(obj)] = self._counts.get(kind, 0)
                self._counts[kind] = n + 1
                try:  # forgotten when it dies (its id may be reused): the records keep no program alive
                    weakref.finalize(obj, self._ids.pop, id(obj), None)
                except TypeError:
                    self._objects.append(obj)  # (no weak reference: kept, so its id is not reused)
            return n

    def _maybe_render(self) -> None:
        if time.monotonic() - self._last_render >= _RENDER_EVERY:
            self.render()

    def render(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the page: the final cache_info of every function still alive, then the HTML of all records."""
        from .html import write_report

        self._last_render = time.monotonic()
        for number, ref in list(self._functions.items()):
            jf = ref()
            if jf is not None:
                try:
                    info = dataclasses.asdict(jf.cache_info())
                except Exception:  # noqa: BLE001 - a summary is best effort
                    continue
                self.write({"event": "summary", "function": number, "name": jf.stats.name, "cache_info": info})
        with self._lock:
            self._file.flush()
        return write_report(self.dir, Path(path) if path is not None else None)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.render()
        except Exception:  # noqa: BLE001 - at exit: say so, do not raise
            log.warning("dealias: could not write the report in %s", self.dir, exc_info=True)
        with self._lock:
            self._closed = True
            self._file.close()

    # -- hooks (called by the front end) -------------------------------------------------------------------------
    def compiled(self, graph: Any, leaves: list[Any], entry: Any, described: Any = None) -> None:
        """A graph program compiled a program (or chose to run eagerly) for a new input layout."""
        try:
            self._compiled(graph, leaves, entry)
        except Exception:  # noqa: BLE001 - the report never breaks the run
            log.debug("dealias: report: could not record a compile", exc_info=True)

    def _compiled(self, graph: Any, leaves: list[Any], entry: Any) -> None:
        from .storage_map import storage_maps

        stats = graph.stats
        traces = list(getattr(entry, "traces", None) or [])
        program = getattr(entry, "program", entry)  # (a tiered executor's entry wraps its program)
        reason = stats.last_miss_reason if graph.entries else "first call of this graph"
        trace_data = [{"name": t.name, "text": t.text, "passes": [[n, s] for n, s in t.passes]} for t in traces]
        executed = trace_data[-1]["text"].splitlines()[0] if trace_data else ""
        reports = [
            {"target": r.target or str(r.ref), "mode": r.mode, "nbytes": r.nbytes, "regions": list(r.regions)}
            for r in (getattr(entry, "reports", None) or [])
        ]
        inputs = []
        for name, x in zip(graph.names, leaves):
            inputs.append(_describe_input(name, x))
        event = {
            "event": "compile",
            "function": self.number(stats),
            "name": stats.name,
            "graph": self.number(graph, "graph"),
            "layout": graph.entries,
            "reason": reason,
            "kind": "program" if traces else "eager",
            "tier": str(getattr(entry, "tier", "")) if traces else "eager",
            "tier_why": executed.lstrip("# "),
            "compile_seconds": sum(s for t in traces for _, s in t.passes),
            "symbolic": list(getattr(program, "symbolic_inputs", lambda: [])()),
            "inputs": inputs,
            "traces": trace_data,
            "writebacks": reports,
            "storages": storage_maps(program, leaves, graph.names) if traces else [],
        }
        event["sources"] = _sources([t["text"] for t in trace_data])
        self.write(event)
        self._maybe_render()

    def fell_back(self, graph: Any, error: BaseException) -> None:
        """A graph runs eagerly (a FallbackWarning)."""
        try:
            message = str(error)
            self.write(
                {
                    "event": "fallback",
                    "function": self.number(graph.stats),
                    "name": graph.stats.name,
                    "graph": self.number(graph, "graph"),
                    "error": type(error).__name__,
                    "message": message,
                    "sources": _sources([message]),
                }
            )
        except Exception:  # noqa: BLE001
            log.debug("dealias: report: could not record a fallback", exc_info=True)

    def settled(self, graph: Any, entry: Any) -> None:
        """A program of executor "tiered"/"exact" chose its tier (frontend/tiers.py): which, why, the medians."""
        try:
            self.write(
                {
                    "event": "tier",
                    "function": self.number(graph.stats),
                    "name": graph.stats.name,
                    "graph": self.number(graph, "graph"),
                    "tier": str(entry.tier),
                    "why": entry.tier_reason,
                    "timings": {k: float(v) for k, v in entry.timings.items()},
                }
            )
        except Exception:  # noqa: BLE001 - the report never breaks the run
            log.debug("dealias: report: could not record a tier", exc_info=True)

    def missed(self, jf: Any, breaks_before: int) -> None:
        """A call of a jitted function compiled something (dynamo or dealias): its reason, its new graph breaks."""
        try:
            number = self.number(jf.stats)
            self._functions[number] = weakref.ref(jf)
            breaks = list(jf.graph_breaks[breaks_before:])
            fn = jf.fn.forward if hasattr(jf.fn, "_call_impl") else jf.fn  # (a module: its forward)
            code = getattr(inspect.unwrap(fn), "__code__", None)
            where = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""
            self.write(
                {
                    "event": "miss",
                    "function": number,
                    "name": jf.stats.name,
                    "where": where,
                    "misses": jf.misses,
                    "reason": jf.last_miss_reason,
                    "eager": bool(jf.eager),
                    "graph_breaks": breaks,
                    "cache_info": dataclasses.asdict(jf.cache_info()),
                    "sources": _sources([*breaks, where]),
                }
            )
            self._maybe_render()
        except Exception:  # noqa: BLE001
            log.debug("dealias: report: could not record a miss", exc_info=True)


def _describe_input(name: str, x: Any) -> dict[str, Any]:
    import torch

    if not isinstance(x, torch.Tensor):
        return {"name": name, "value": repr(x)[:80]}
    try:
        storage = x.untyped_storage()
        return {
            "name": name,
            "dtype": str(x.dtype).removeprefix("torch."),
            "shape": list(x.shape),
            "stride": list(x.stride()),
            "offset": x.storage_offset(),
            "storage_bytes": storage.nbytes(),
            "requires_grad": x.requires_grad,
        }
    except Exception:  # noqa: BLE001 - a tensor without storage (a subclass): its shape only
        return {"name": name, "dtype": str(x.dtype), "shape": list(x.shape)}


def _sources(texts: list[str]) -> dict[str, dict[str, str]]:
    """The user's source lines the texts name (`file.py:12`), with two lines around each: the page shows them
    beside the traces, even where the run's files have changed or are elsewhere since."""
    out: dict[str, dict[str, str]] = {}
    for text in texts:
        for path, line in _LOCATION.findall(text):
            lines = out.setdefault(path, {})
            n = int(line)
            for k in range(max(n - 2, 1), n + 3):
                if str(k) not in lines:
                    source = linecache.getline(path, k)
                    if source:
                        lines[str(k)] = source.rstrip("\n")
    return out


def start(directory: str | os.PathLike[str]) -> Recorder:
    """Record this run into `directory` (the recorder already recording there, if any)."""
    global ACTIVE
    if ACTIVE is not None and ACTIVE.dir.resolve() == Path(directory).resolve() and not ACTIVE._closed:
        return ACTIVE
    if ACTIVE is not None:
        ACTIVE.close()
    ACTIVE = Recorder(directory)
    return ACTIVE


def stop() -> None:
    """Stop recording (the page is written first)."""
    global ACTIVE
    if ACTIVE is not None:
        ACTIVE.close()
        atexit.unregister(ACTIVE.close)
    ACTIVE = None


def from_environment() -> None:
    directory = os.environ.get(ENV)
    if directory:
        try:
            start(directory)
        except OSError as e:  # (a directory it cannot write: the run goes on, unrecorded, and says so)
            log.warning("dealias: %s=%s: cannot record the run there: %s", ENV, directory, e)
