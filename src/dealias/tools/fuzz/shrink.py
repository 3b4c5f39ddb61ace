"""The shrinker: statements and outputs removed from a failing program while it still fails, so a mismatch is
printed as the smallest program that shows it."""

from __future__ import annotations

from collections.abc import Callable

from .program import Program


def shrink(prog: Program, still_fails: Callable[[Program], bool]) -> Program:
    """Remove statements and outputs while the program still fails."""
    changed = True
    while changed:
        changed = False
        for i in range(len(prog.body) - 1, -1, -1):
            body = prog.body[:i] + prog.body[i + 1 :]
            # an output defined by the removed statement is replaced by the first argument
            target = prog.body[i].split(" = ")[0].strip() if " = " in prog.body[i] else None
            outputs = list(dict.fromkeys(prog.params[0] if o == target else o for o in prog.outputs))
            cand = Program(prog.seed, prog.setup, prog.params, body, outputs, prog.autograd)
            if _valid(cand) and still_fails(cand):
                prog, changed = cand, True
        for i in range(len(prog.outputs) - 1, -1, -1):
            if len(prog.outputs) > 1:
                cand = Program(
                    prog.seed,
                    prog.setup,
                    prog.params,
                    prog.body,
                    prog.outputs[:i] + prog.outputs[i + 1 :],
                    prog.autograd,
                )
                if _valid(cand) and still_fails(cand):
                    prog, changed = cand, True
    return prog


def _valid(prog: Program) -> bool:
    """Every name it uses is defined before (statements removed by shrinking may have defined them)."""
    defined = set(prog.params)
    for line in prog.body:
        lhs, _, rhs = line.partition(" = ")
        target = lhs.strip() if rhs and lhs.strip().isidentifier() else None
        used = {w for w in _words(rhs if target else line) if w.startswith("v") and w[1:].isdigit()}
        if not used <= defined:
            return False
        if target:
            defined.add(target)
    return set(prog.outputs) <= defined


def _words(line: str) -> list[str]:
    return "".join(c if c.isalnum() or c == "_" else " " for c in line).split()
