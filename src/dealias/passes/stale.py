"""Eager's error at a stale saved tensor, asked of eager: the message a graph's backward raises where it reaches
the backward node of an op whose saved tensor the program wrote afterwards (passes/saved.py finds them).

Eager's forward of such a program succeeds; its backward raises "one of the variables needed for gradient
computation has been modified by an inplace operation: [torch.FloatTensor [3, 4]], which is output 0 of Mul, is
at version 2; expected version 1 instead. ..." only if it reaches that node. The message names the saved tensor's
type and sizes, the node its saved original belongs to when backward runs (`CopySlices` after a write through a
view, `AsStrided` for a view whose base was written), and two versions of its counter: all facts of the whole
program's history, not of the op. So the captured graph runs once, eagerly, on copies of the call's tensors
(same values, sizes, strides, versions, requires_grad, leaf or not), and each such op's node is differentiated
after the run (its results kept alive, as the caller keeps them), from a tensor computed of its result right after
the op: eager's own check raises eager's own message. The compiled graph raises it (gradops.stale_saved) where
its backward reaches the op's result.

What this cannot see (the graph then runs eagerly, as before): inputs sharing memory that are not views of one
tensor, a tensor input that is not dense, symbolic sizes (the message names the sizes: the backend compiles with
sizes specialized), inputs over 256 MB together, and an op whose node does not raise in the run. Versions: eager
counts them from the counter of the caller's tensor the saved one shares; the compiled graph moves the message's
by as much as that counter moved since this compile (gradops.stale_saved). A write of the saved memory after the
call moves the version eager reports, not dealias's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from ..compat import saved_hooks, warns
from ..ir.draws import kept_rng
from ..ir.opfacts import OWN_COUNTER_KEY
from .capture import restriction

# Bytes the eager run may copy, all inputs and attributes together (more: the graph runs eagerly). The run holds the
# copies and its own intermediates besides the caller's: a limit per input let a model of many parameters double
# its memory at the compile (a device running out where eager does not).
_COPY_LIMIT = 1 << 28


def eager_messages(gm: fx.GraphModule, tensors: list[Any], nodes: list[fx.Node]) -> dict[fx.Node, tuple[str, str]]:
    """For each of `nodes` (ops of `gm` whose saved tensor is written afterwards), eager's error at backward, as
    `gm` run eagerly on copies of its tensor inputs `tensors` raises it, without and with anomaly detection; the
    nodes it cannot tell are left out."""
    budget = [_COPY_LIMIT]
    copies = _copies(tensors, budget)
    if copies is None or not nodes:
        return {}
    made, leaves = copies
    probe = _Probe(gm, set(nodes), leaves, budget)
    try:
        with kept_rng(gm), saved_hooks.set_aside():  # (the caller's pack hooks are not called by this run)
            # (the results stay alive until the backward, as the caller's do: which nodes autograd keeps decides
            # what the message names, a view's node at the save or the op's own)
            results = probe.run(*made)
    except Exception:  # noqa: BLE001 - eager cannot run it on copies: nothing learned, the graph runs eagerly
        return {}
    out: dict[fx.Node, tuple[str, str]] = {}
    for n, (t, nodes) in probe.heads.items():
        ran: list[tuple[str, int]] = []
        handles = []
        for i, node in enumerate(nodes):
            handles.append(node.register_prehook(lambda *_, i=i, ran=ran: ran.append(("entered", i))))
            handles.append(node.register_hook(lambda *_, i=i, ran=ran: ran.append(("left", i))))
        try:
            # Raised by the op's node itself: its version check, or reading a saved view autograd forbids once
            # its base was written ("Output 0 of Split is a view and its base ... has been modified inplace").
            # A message naming the node behind a copy names, in eager, the node the caller's tensor came from on
            # that call, a fact of the call (a later one's may be Add where this one's is Mul): not compiled.
            # Eager words its hint after whether anomaly detection is on at backward: both are asked.
            with saved_hooks.set_aside():
                said = [_said(t, probe.leaves, ran, len(nodes) - 1, anomaly) for anomaly in (False, True)]
            if all(m is not None and _CallersHistory.__name__ not in m for m in said):
                out[n] = (said[0], said[1])
        finally:
            for h in handles:
                h.remove()
    del results
    return out


def _said(t: torch.Tensor, leaves: list[torch.Tensor], ran: list[Any], last: int, anomaly: bool) -> str | None:
    """The error a backward from `t` raises in the last of the nodes `ran` records (with anomaly detection on or
    off), or None (the graph is kept for the next ask)."""
    ran.clear()
    try:
        with (
            torch.enable_grad(),
            torch.autograd.set_detect_anomaly(anomaly, check_nan=False),
            warns.ignored(),  # (anomaly detection's warning: the traceback of a forward not recorded)
        ):
            torch.autograd.grad(t, leaves, grad_outputs=torch.ones_like(t), allow_unused=True, retain_graph=True)
    except RuntimeError as e:
        return str(e) if ran and ran[-1] == ("entered", last) else None
    return None


class _Probe(fx.Interpreter):
    """Runs the captured graph eagerly, each op in its grad mode, and keeps, right after each op of `targets`,
    `result * 1` (of the written base for a write of a view): a tensor whose backward goes first to the op's node
    (for a write of a view, the CopySlices holding it), with that node."""

    def __init__(
        self, gm: fx.GraphModule, targets: set[fx.Node], leaves: list[torch.Tensor], budget: list[int]
    ) -> None:
        super().__init__(gm)
        self.budget = budget
        self.targets = targets
        self.leaves = list(leaves)
        self.heads: dict[fx.Node, tuple[torch.Tensor, list[Any]]] = {}

    def run_node(self, n: fx.Node) -> Any:
        grad = n.meta.get("grad")
        with torch.set_grad_enabled(torch.is_grad_enabled() if grad is None else bool(grad)):
            if n.meta.get(OWN_COUNTER_KEY) and n.target is torch.ops.aten.detach.default:
                # `x.data`, traced to aten.detach, which shares x's counter: run as `.data`, whose writes move no
                # counter of x (else the message names a version one higher per such write, as for a later no_grad
                # write of a tensor saved before: `b = x * x; x[1] += 1` under no_grad; `x.data.mul_(2)`)
                (a,) = self.fetch_args_kwargs_from_env(n)[0]
                return a.data
            out = super().run_node(n)
            result = out[0] if isinstance(out, (list, tuple)) and out else out
            if n in self.targets and isinstance(result, torch.Tensor) and result.requires_grad:
                # For a write of a view, the CopySlices on its base holding the op's node, from the base: a head
                # on the view would keep the view's node of this moment alive, which eager's message names
                # (a saved view's grad_fn at the save, held weakly) only while something else keeps it.
                written = result._base if result._is_view() and n.target._schema.is_mutable else result
                with torch.enable_grad():
                    head = written * 1
                node = head.grad_fn.next_functions[0][0]
                if node is not None:
                    self.heads[n] = (head, [node])
        return out

    def fetch_attr(self, target: str) -> Any:
        # A tensor the graph reads as an attribute is the caller's own (a module's buffer): copied, never written.
        value = super().fetch_attr(target)
        if isinstance(value, torch.Tensor):
            made = _copies([value], self.budget)
            if made is None:
                raise _NoCopy
            self.leaves += made[1]
            return made[0][0]
        return value


class _CallersHistory(torch.autograd.Function):
    """The node a copy of a caller's non-leaf tensor comes from: eager's message names the node of a saved
    tensor's history at backward, which for a caller's tensor the graph does not write with grad is the caller's
    (whatever it was on that call); this name in a message tells that case."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        return t.clone(memory_format=torch.preserve_format)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _NoCopy(Exception):
    pass


def _copies(tensors: list[Any], budget: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """Copies of `tensors` eager's autograd treats as it treats them (requiring grad, a leaf or computed from one,
    at the same version; inputs that are views of one tensor as views of its copy), and the leaves behind them;
    None when that cannot be made (memory shared otherwise, a layout a copy does not keep)."""
    made, leaves = [], []
    roots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # storage -> (the caller's base, its copy)
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            made.append(t)
            continue
        if t.is_sparse or t.is_inference() or t.layout != torch.strided:
            return None
        if restriction(t) is not None:
            # (a view eager restricts, a split element: eager's error at backward names how it was made, and a
            # view of the copy is an AsStrided one)
            return None
        root = t._base if t._is_view() else t
        key = t.untyped_storage()._cdata
        if key not in roots:
            c = _copy(root, leaves, budget)
            if c is None:
                return None
            roots[key] = (root, c)
        base, copy = roots[key]
        if base is not root or t.requires_grad != root.requires_grad:
            return None  # (memory shared by tensors that are not views of one: their counters may differ)
        made.append(copy if t is root else copy.as_strided(t.shape, t.stride(), t.storage_offset()))
    return made, leaves


def _copy(t: torch.Tensor, leaves: list[torch.Tensor], budget: list[int]) -> torch.Tensor | None:
    """A copy of `t` (its whole memory in its layout, so its views are views of the copy), or None."""
    if not _dense(t) or t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        return None
    budget[0] -= t.untyped_storage().nbytes()
    if budget[0] < 0:
        return None
    # (a clone, not `empty_strided(...).copy_(t)`: a copy_ moves the copy's counter, so a leaf's copy would start a
    # version ahead of the caller's tensor and the message would name versions one higher than eager's)
    c = t.detach().clone(memory_format=torch.preserve_format)
    if c.stride() != t.stride() or c._version > t._version:
        return None
    if t.requires_grad:
        c.requires_grad_()
        leaves.append(c)
        if not t.is_leaf:
            with torch.enable_grad():
                c = _CallersHistory.apply(c)  # (a tensor computed from a leaf, as the caller's is; strides kept)
            if c.stride() != t.stride():
                return None
    for _ in range(t._version - c._version):
        torch.autograd.graph.increment_version(c)
    return c


def _dense(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and (t.numel() <= 1 or t.is_contiguous() or _non_overlapping_dense(t))


def _non_overlapping_dense(t: torch.Tensor) -> bool:
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True
