"""dealias: a PyTorch compiler that gets in-place ops and tensor aliases exactly right."""

from . import report  # `dealias.report(path)`: the run's HTML report (report/)
from .api import (
    CacheInfo,
    JitFunction,
    JitModule,
    cache_info,
    explain,
    graph_breaks,
    jit,
    last_traces,
    wait_compiles,
)
from .errors import (
    DataDependentError,
    DealiasError,
    EagerRaisesError,
    EagerRaisesFallbackWarning,
    EagerSemanticsError,
    FallbackWarning,
    GraphBreakWarning,
    InternalError,
    NotFusedWarning,
    OverlapError,
    OverlapFallbackWarning,
    UnsupportedError,
)
from .runtime.verify import VerificationError

__all__ = [
    "CacheInfo",
    "DataDependentError",
    "DealiasError",
    "EagerRaisesError",
    "EagerRaisesFallbackWarning",
    "EagerSemanticsError",
    "FallbackWarning",
    "GraphBreakWarning",
    "InternalError",
    "JitFunction",
    "JitModule",
    "NotFusedWarning",
    "OverlapError",
    "OverlapFallbackWarning",
    "UnsupportedError",
    "VerificationError",
    "cache_info",
    "explain",
    "graph_breaks",
    "jit",
    "last_traces",
    "wait_compiles",
    "report",
]
