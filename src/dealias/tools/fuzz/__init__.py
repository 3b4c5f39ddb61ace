"""Differential fuzzer: random valid PyTorch programs full of views and in-place ops, run eagerly and through
`dealias.jit`, compared on everything eager makes observable (`dealias.verify`), shrunk to a minimal
program on a mismatch and printed as runnable Python.

By part: program.py (a program as source), generator.py (built one statement at a time against live example
tensors) with statements.py (the statements it tries), runner.py (run both ways, the oracle, the outcome),
shrink.py (the smallest program still failing), driver.py (`fuzz`: the run the command line and tests drive).
"""

from __future__ import annotations

from .driver import fuzz
from .generator import generate
from .program import Program
from .runner import Outcome, compare_grads, run_program
from .shrink import shrink

# (the name the tests import the gradient oracle by)
_compare_grads = compare_grads

__all__ = ["Outcome", "Program", "compare_grads", "fuzz", "generate", "run_program", "shrink"]
