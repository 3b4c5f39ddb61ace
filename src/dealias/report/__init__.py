"""`dealias.report`: an HTML page of every function dealias compiled in a run (records.py, html.py,
storage_map.py).

`DEALIAS_REPORT=DIR python train.py` records the run into DIR and writes DIR/index.html at exit;
`dealias.report(DIR)` from code starts recording there (if not already) and writes the page of what is recorded
so far; `dealias report DIR` rebuilds the page from DIR's records (a crashed run's too).

The package is itself callable (`dealias.report(path)`), so `dealias.report.records` stays the module.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

from . import records


def report(path: str | os.PathLike[str]) -> Path:
    """Record this run into the directory `path` from now on (a run already recording there goes on), and write
    the page of everything recorded so far: the path of its index.html. A path ending in .html is the page: the
    records go beside it."""
    target = Path(path)
    directory = target.parent if target.suffix == ".html" else target
    recorder = records.ACTIVE if records.ACTIVE is not None else records.start(directory)
    if recorder.dir.resolve() != directory.resolve() and target.suffix != ".html":
        recorder = records.start(directory)
    return recorder.render(target if target.suffix == ".html" else None)


def rebuild(directory: str | os.PathLike[str]) -> Path:
    """The page of a run's records in `directory` (`dealias report DIR`), written to directory/index.html."""
    from .html import write_report

    return write_report(Path(directory))


class _CallableModule(types.ModuleType):
    def __call__(self, path: str | os.PathLike[str]) -> Path:
        return report(path)


sys.modules[__name__].__class__ = _CallableModule
records.from_environment()
