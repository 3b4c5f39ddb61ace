"""Long straight-line programs compile (no recursion limit, no fallback) and match eager."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from harness import check

import dealias

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from compile_time import make_program  # noqa: E402


def test_a_thousand_in_place_statements_compile():
    # Write-back lowering took each version apart recursively down to the first one: a RecursionError at ~1,000
    # statements, and the program ran eagerly. (bench/compile_time.py measures the time.)
    program = make_program(1000)
    jf = check(program, torch.randn(16, 64), torch.randn(64), strict=True)
    assert {r.mode for r in dealias.explain(jf)} == {"in place"}
