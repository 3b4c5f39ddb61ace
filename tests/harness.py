"""Differential harness for the tests: dealias.verify's comparison, on a first (tracing) call and on cached
calls, plus the expected number of compilations."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import dealias
from dealias.verify import alias_pattern, clone_args, compare_call, first_difference  # noqa: F401


def check(fn: Callable[..., Any], *args: Any, calls: int = 2, allow_fallback: bool = False, **jit_kw: Any) -> Any:
    """Compare `fn` eager vs jitted on `calls` successive calls with fresh copies of `args`. Returns the
    jitted function (for structural checks). Fails on any difference, and on a silent eager fallback
    unless `allow_fallback`."""
    jf = dealias.jit(fn, **jit_kw)
    for call in range(calls):
        with warnings.catch_warnings():
            warnings.simplefilter("error" if not allow_fallback else "ignore", dealias.FallbackWarning)
            diff = compare_call(fn, jf, args)
        assert diff is None, f"call {call + 1}: {diff}"
    info = dealias.cache_info(jf)
    compiled_once = info.misses == 1 and info.hits == calls - 1
    raised = info.entries == 0  # every call raised (eager's error): nothing was cached
    assert raised or compiled_once, f"expected one compile and {calls - 1} hits, got {info}"
    return jf


def functional_ops(jf: Any) -> list[str]:
    """The targets of the functional trace of the last program `jf` ran."""
    gm = jf.last.functional_gm
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
