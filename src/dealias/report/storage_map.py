"""The write-back map: which bytes of a caller's storage a compiled program writes, and which inputs overlap.

Computed once per compile, from the call that compiled it (its real tensors) and the program's own write-back
reports (passes/writeback.py: per caller tensor its mode, its regions as text and as view chains). Nothing is
recomputed from the graph: each region's view chain is applied to a tensor of element positions laid out as the
caller's tensor, so the bytes marked are the ones the program's write covers, whatever the views (a KV-cache
step's `cache[:, :, pos]` is one 16-byte run per head, not the whole buffer).

A map is plain data (JSON in the run's records): per storage its size and lanes of byte intervals, drawn as SVG
by `svg()`.
"""

from __future__ import annotations

import html
import operator
import re
from typing import Any

import torch
import torch.fx as fx

_MAX_ELEMENTS = 1 << 22  # a non-dense layout with more elements is drawn as its extent (elements not listed)
_MAX_INTERVALS = 256  # per lane; beyond that runs are merged into their hull (the lane says so)

KIND_COLORS = {
    "tensor": "#c9d6e8",  # a caller tensor's own elements
    "overlap": "#e8a33d",  # memory two inputs share
    "in place": "#2e8b57",  # written in place (copy_ into the region)
    "indexed": "#8e44ad",  # an indexed write (index_put_, scatter_): at most the region drawn
    "copied": "#c0392b",  # the whole tensor copied back after the graph
}


def storage_maps(program: Any, leaves: list[Any], names: list[str]) -> list[dict[str, Any]]:
    """Per caller storage a program writes or inputs share: {id, nbytes, exact, lanes: [{label, kind, bytes,
    intervals}]}, from the call `leaves` that compiled `program`."""
    captured = getattr(program, "captured", None)
    reports = getattr(program, "reports", None)
    if captured is None or reports is None:
        return []
    positions = list(captured.tensor_positions)
    tensors = [leaves[p] for p in positions]
    tensor_names = [names[p] if p < len(names) else f"input {p}" for p in positions]
    by_storage: dict[int, dict[str, Any]] = {}

    def storage_of(t: torch.Tensor) -> dict[str, Any]:
        key = t.untyped_storage().data_ptr()
        if key not in by_storage:
            nbytes = t.untyped_storage().nbytes()
            by_storage[key] = {"id": len(by_storage), "nbytes": nbytes, "exact": True, "lanes": [], "members": []}
        return by_storage[key]

    # Inputs sharing memory: each member's footprint, and where they overlap.
    for g in getattr(captured, "groups", []):
        entry = storage_of(tensors[g.members[0]])
        spans = [_measured(entry, _footprint, tensors[i]) for i in g.members]
        for i, span in zip(g.members, spans):
            _add_lane(entry, tensor_names[i], "tensor", span)
            entry["members"].append(tensor_names[i])
        shared = _overlap(spans)
        if shared:
            _add_lane(entry, "overlap", "overlap", shared)
    # Written caller tensors: each region written.
    for report in reports:
        real, base, label = _target(report, captured, tensors, tensor_names)
        if base is None:
            continue
        entry = storage_of(real)
        if label not in entry["members"]:
            entry["members"].append(label)
            _add_lane(entry, label, "tensor", _measured(entry, _footprint, base))
        chains = list(getattr(report, "chains", []) or [])
        for i, region in enumerate(report.regions):
            kind = _kind(report.mode, region)
            chain = chains[i] if i < len(chains) else None
            spans = None
            if chain is not None:
                try:
                    spans = _measured(entry, _region_spans, base, chain, captured, leaves, tensors)
                except Exception:  # noqa: BLE001 - a chain over a symbol we cannot evaluate: drawn as unknown
                    spans = None
            if spans is None:
                entry["exact"] = False
                spans = _measured(entry, _footprint, base)
            text = region.replace("x", label, 1) if region.startswith("x") else region
            if kind == "indexed" and len(report.regions) == 1:  # (the region indexed: at most these bytes)
                text += f" ({report.nbytes} B written)"
            _add_lane(entry, text, kind, spans, written=True)
    return [{k: v for k, v in e.items() if k != "members"} for e in sorted(by_storage.values(), key=lambda e: e["id"])]


def _target(report: Any, captured: Any, tensors: list[torch.Tensor], names: list[str]) -> tuple[Any, Any, str]:
    """The caller tensor a report writes (an input, or an alias group's first member), its layout in its storage
    as a meta tensor (a group's: its base over the members' memory), and its name."""
    kind = getattr(report.ref.kind, "value", str(report.ref.kind))
    key = report.ref.key
    if kind == "input" and isinstance(key, int) and key < len(tensors):
        return tensors[key], _meta(tensors[key]), names[key]
    if kind == "group" and isinstance(key, int) and key < len(captured.groups):
        g = captured.groups[key]
        first = _meta(tensors[g.members[0]])
        base = first.as_strided((g.extent,), (1,), first.storage_offset() - g.lead)
        return tensors[g.members[0]], base, "(" + " & ".join(names[i] for i in g.members) + ")"
    return None, None, ""


def _measured(entry: dict[str, Any], spans: Any, *args: Any) -> list[list[int]]:
    """`spans(*args)`, or the extent of a layout too large to list (the storage's map then says it is not exact)."""
    try:
        return spans(*args)
    except _Inexact as e:
        entry["exact"] = False
        return e.hull


def _kind(mode: str, region: str) -> str:
    """`x.select(2, 3).copy_(..)`: in place; `x.index_put_(..)`: indexed; a whole copy: copied."""
    if mode != "in place":
        return "copied"
    op = re.search(r"\.(\w+)\(\.\.\)$", region)
    name = op.group(1) if op else ""
    return "indexed" if name.startswith(("index", "_index", "scatter", "put")) else "in place"


def _meta(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with `t`'s layout in a storage of `t`'s size: view steps applied to it give the layout of the
    region they select, and allocate nothing."""
    elements = t.untyped_storage().nbytes() // max(t.element_size(), 1)
    storage = torch.empty(elements, dtype=t.dtype, device="meta")
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


def _footprint(t: torch.Tensor) -> list[list[int]]:
    """The byte intervals a layout's elements cover in its storage."""
    return _spans(t if t.device.type == "meta" else _meta(t))


def _spans(v: torch.Tensor) -> list[list[int]]:
    """A (meta) layout's elements as byte intervals [start, end): one run for a dense layout, otherwise from its
    elements' offsets (up to _MAX_ELEMENTS of them; past that, _Inexact with its extent)."""
    size = v.element_size()
    if v.numel() == 0:
        return []
    dims = sorted((s, n) for n, s in zip(v.shape, v.stride()) if n != 1)
    lo = v.storage_offset() + sum((n - 1) * s for s, n in dims if s < 0)
    hi = v.storage_offset() + sum((n - 1) * s for s, n in dims if s > 0)
    expected = 1
    for s, n in dims:  # dense: strides are the sizes' running products, in some order of the dims
        if s != expected:
            break
        expected *= n
    else:
        return [[lo * size, (hi + 1) * size]]
    if v.numel() > _MAX_ELEMENTS:
        raise _Inexact([[lo * size, (hi + 1) * size]])
    pos = torch.tensor(v.storage_offset(), dtype=torch.int64)
    for d, (n, s) in enumerate(zip(v.shape, v.stride())):
        shape = [1] * v.dim()
        shape[d] = n
        pos = pos + (torch.arange(n, dtype=torch.int64) * s).view(shape)
    return _runs(pos, size)


class _Inexact(Exception):
    """A layout too large to list its elements: its extent instead."""

    def __init__(self, hull: list[list[int]]) -> None:
        super().__init__("inexact")
        self.hull = hull


def _region_spans(
    base: torch.Tensor, chain: tuple[Any, ...], captured: Any, leaves: list[Any], tensors: list[torch.Tensor]
) -> list[list[int]] | None:
    view = base
    for step in chain:
        args = [_value(a, captured, leaves, tensors) for a in step.args]
        kwargs = {k: _value(v, captured, leaves, tensors) for k, v in step.kwargs}
        view = step.op(view, *args, **kwargs)
    return _spans(view)


def _value(a: Any, captured: Any, leaves: list[Any], tensors: list[torch.Tensor]) -> Any:
    """A view step's argument, with symbols (a decode position) given the compiling call's values."""
    if isinstance(a, (list, tuple)):
        return type(a)(_value(x, captured, leaves, tensors) for x in a)
    if isinstance(a, torch.SymInt):
        raise ValueError("symbolic size")
    if not isinstance(a, fx.Node):
        return a
    if a.op == "placeholder":
        k = a.graph.find_nodes(op="placeholder").index(a)
        symbols = list(getattr(captured, "sym_positions", []))
        if len(tensors) <= k < len(tensors) + len(symbols):
            return leaves[symbols[k - len(tensors)]]
        raise ValueError("not a symbol")
    args = [_value(x, captured, leaves, tensors) for x in a.args]
    if a.target in (operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg):
        return a.target(*args)
    raise ValueError(f"cannot evaluate {a.target}")


def _runs(pos: torch.Tensor, itemsize: int) -> list[list[int]]:
    """Sorted element offsets as byte intervals [start, end)."""
    flat = torch.unique(pos.reshape(-1))
    if flat.numel() == 0:
        return []
    breaks = torch.nonzero(flat[1:] - flat[:-1] != 1).reshape(-1) + 1
    starts = torch.cat([flat[:1], flat[breaks]]).tolist()
    ends = torch.cat([flat[breaks - 1], flat[-1:]]).tolist()
    return [[s * itemsize, (e + 1) * itemsize] for s, e in zip(starts, ends)]


def _overlap(spans: list[list[list[int]]]) -> list[list[int]]:
    """Byte intervals covered by at least two of the members' interval lists."""
    events: list[tuple[int, int]] = []
    for member in spans:
        for a, b in member:
            events += [(a, 1), (b, -1)]
    out: list[list[int]] = []
    depth, start = 0, 0
    for x, d in sorted(events, key=lambda e: (e[0], e[1])):
        if depth < 2 <= depth + d:
            start = x
        elif depth >= 2 > depth + d and x > start:
            out.append([start, x])
        depth += d
    return out


def _add_lane(entry: dict[str, Any], label: str, kind: str, spans: list[list[int]], written: bool = False) -> None:
    merged = len(spans) > _MAX_INTERVALS
    if merged:  # the hull of each consecutive chunk of runs: wider than what is written, said in the lane
        step = -(-len(spans) // _MAX_INTERVALS)
        spans = [[spans[i][0], spans[min(i + step, len(spans)) - 1][1]] for i in range(0, len(spans), step)]
        entry["exact"] = False
    nbytes = sum(b - a for a, b in spans)
    lane = {"label": label, "kind": kind, "bytes": nbytes, "intervals": spans, "merged": merged, "written": written}
    entry["lanes"].append(lane)


def svg(entry: dict[str, Any], title: str = "") -> str:
    """One storage as a bar per lane, its intervals drawn to scale: each written region a rect with
    `data-kind`, `data-start` and `data-end` (bytes), so a test (or a curious user) can read exactly what it is."""
    width, label_w, lane_h, gap = 720, 230, 18, 6
    bar_w = width - label_w - 64
    total = max(entry["nbytes"], 1)
    lanes = entry["lanes"]
    height = 22 + len(lanes) * (lane_h + gap)
    e = html.escape
    out = [
        f'<svg class="storage-map" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'data-storage="{entry["id"]}" data-nbytes="{entry["nbytes"]}" data-exact="{int(entry["exact"])}">',
        f"<title>{e(title or 'storage')} ({entry['nbytes']} bytes)</title>",
        f'<text x="0" y="12" class="axis">storage of {e(title[:30])}</text>',
        f'<text x="{label_w}" y="12" class="axis">byte 0</text>',
        f'<text x="{label_w + bar_w}" y="12" class="axis" text-anchor="end">byte {entry["nbytes"]}</text>',
    ]
    for i, lane in enumerate(lanes):
        y = 22 + i * (lane_h + gap)
        color = KIND_COLORS.get(lane["kind"], "#999")
        label = lane["label"] if len(lane["label"]) <= 34 else lane["label"][:33] + "…"
        out.append(
            f'<g class="lane" data-label="{e(lane["label"])}" data-kind="{e(lane["kind"])}" '
            f'data-bytes="{lane["bytes"]}" data-written="{int(lane["written"])}" data-merged="{int(lane["merged"])}">'
        )
        out.append(f"<title>{e(lane['label'])}: {e(lane['kind'])}, {lane['bytes']} bytes</title>")
        out.append(f'<text x="0" y="{y + 13}" class="lane-label">{e(label)}</text>')
        out.append(f'<rect x="{label_w}" y="{y}" width="{bar_w}" height="{lane_h}" class="bar"/>')
        out.append(f'<text x="{label_w + bar_w + 6}" y="{y + 13}" class="lane-bytes">{lane["bytes"]} B</text>')
        for a, b in lane["intervals"]:
            x = label_w + bar_w * a / total
            w = max(bar_w * (b - a) / total, 1.0)
            out.append(
                f'<rect class="region" x="{x:.2f}" y="{y}" width="{w:.2f}" height="{lane_h}" fill="{color}" '
                f'data-kind="{e(lane["kind"])}" data-start="{a}" data-end="{b}"/>'
            )
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)
