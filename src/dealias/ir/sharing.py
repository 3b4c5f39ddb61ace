"""Inputs that share memory: which tensor arguments overlap, and the synthetic base each overlapping group
is traced as.

Tensors that share a storage but whose memory does not overlap (disjoint slices of one buffer) are
independent for every purpose and stay separate inputs. Tensors whose memory overlaps (the same tensor
twice, a tensor and its row, `b[:4]` and `b[2:6]`, `t` and `t.t()`) form an *alias group*: the program is
traced over one synthetic base, a 1-D view covering the group's memory, and each member is an
`as_strided` view of it, so a write through one member is seen through the others exactly where eager
would show it.

This runs when compiling, and on a call only when some inputs share a storage (the guard key then holds the
overlap structure, `guards.overlap_structure`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

from ..errors import UnsupportedError
from .viewops import extent, same_layout, surely

_EXACT_LIMIT = 1 << 26  # elements of a group's extent up to which overlap is computed exactly


@dataclass(frozen=True)
class AliasGroup:
    members: tuple[int, ...]  # positions among the tensor inputs, in order
    dtype: torch.dtype
    start: int  # storage offset (in elements) of the synthetic base, in the call it was found in
    extent: int  # its number of elements
    lead: int = 0  # the first member's offset from `start`: a later call's base starts `lead` before it

    def base_of(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The synthetic base over the caller's memory: a 1-D view of the group's storage. Under autograd it is
        taken from the members' common view base (`_base`): an `as_strided` of one member differentiates only
        into that member's own elements, and the gradient of memory only other members cover would be lost."""
        t = tensors[self.members[0]]
        for i in self.members:
            if tensors[i].requires_grad:
                t = tensors[i]
                root = t._base
                if root is not None and root.dtype == t.dtype:
                    t = root
                break
        # Relative to the first member: a program compiled for one placement serves every placement with the
        # same overlap structure (the guard key holds the members' offsets relative to each other).
        start = tensors[self.members[0]].storage_offset() - self.lead
        return t.as_strided((self.extent,), (1,), start)


def _positions(t: torch.Tensor, lo: int) -> torch.Tensor:
    """The element positions `t` touches, relative to `lo`."""
    span = torch.arange(0, extent(t)[1] - lo + 1)
    return span.as_strided(t.shape, t.stride(), t.storage_offset() - lo).reshape(-1)


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one storage share at least one element of memory."""
    if has_symbols(a) or has_symbols(b):
        return _overlaps_symbolically(a, b)
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.dtype.itemsize != b.dtype.itemsize:
        ea, eb = a.element_size(), b.element_size()
        (la, ha), (lb, hb) = extent(a), extent(b)
        return la * ea < (hb + 1) * eb and lb * eb < (ha + 1) * ea  # byte ranges: conservative
    (la, ha), (lb, hb) = extent(a), extent(b)
    if ha < lb or hb < la:
        return False
    lo, hi = min(la, lb), max(ha, hb)
    if hi - lo + 1 > _EXACT_LIMIT:
        return True  # conservative: an alias group is correct for disjoint members too, only slower
    mask = torch.zeros(hi - lo + 1, dtype=torch.bool)
    mask[_positions(a, lo)] = True
    return bool(mask[_positions(b, lo)].any())


def has_symbols(t: torch.Tensor) -> bool:
    """Whether a (fake) tensor's sizes, strides or storage offset hold symbols."""
    return any(isinstance(n, torch.SymInt) for n in (*t.shape, *t.stride(), t.storage_offset()))


def _overlaps_symbolically(a: torch.Tensor, b: torch.Tensor) -> bool:
    """`overlaps` for fake tensors whose layout holds symbols (views at a symbolic position): decided only where
    it holds for every value of the symbols, without a guard. Two views with the same layout (`x[p, :, q] += 1`
    reads and writes back one view, taken twice) overlap, and so does a view lying inside a dense one; views
    whose extents are apart do not. Views apart in this call only (two rows `x[p]`, `x[q]`) are apart under a
    guard. Anything else raises UnsupportedError, and the program is compiled again with its symbols
    specialized."""
    if surely(a.numel() == 0) or surely(b.numel() == 0):
        return False
    if a.dtype.itemsize == b.dtype.itemsize and same_layout(a, b) and surely(a.numel() > 0):
        return True  # the same elements
    # Byte ranges (`extent` skips dims of size 0, which asks a symbolic size for a guard; an empty tensor's range
    # below may be off, but it overlaps nothing, so a False drawn from it is right).
    (la, ha), (lb, hb) = [(t.storage_offset() * t.element_size(), (_last(t) + 1) * t.element_size()) for t in (a, b)]
    if surely(ha <= lb) or surely(hb <= la):
        return False
    for x, y, (lx, hx), (ly, hy) in ((a, b, (la, ha), (lb, hb)), (b, a, (lb, hb), (la, ha))):
        inside = surely(lx <= ly) and surely(hy <= hx) and surely(y.numel() > 0)
        if inside and is_non_overlapping_and_dense(x):
            return True  # (y lies inside x, which covers every element of its range: `x[p, :]` and `x[p, 0]`)
    apart = (ha <= lb) | (hb <= la)
    if isinstance(apart, torch.SymBool) and apart.node.hint is True:
        # Apart in this call (`x[p] = x[q]` with p != q): a guard keeps the program to the calls where they are.
        return not bool(apart)
    raise UnsupportedError("whether two views at symbolic positions share memory depends on the positions")


def _last(t: torch.Tensor) -> Any:
    """The storage position of a non-empty tensor's last element (strides are never negative)."""
    return t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))


def find_groups(tensors: list[torch.Tensor]) -> list[AliasGroup]:
    """The alias groups among `tensors`: connected components of the "memory overlaps" relation among
    tensors of one storage. Tensors alone in their component are not listed."""
    by_storage: dict[int, list[int]] = {}
    for i, t in enumerate(tensors):
        by_storage.setdefault(t.untyped_storage()._cdata, []).append(i)
    groups = []
    for members in by_storage.values():
        if len(members) < 2:
            continue
        parent = {i: i for i in members}
        for x, i in enumerate(members):
            for j in members[x + 1 :]:
                ri, rj = _root(parent, i), _root(parent, j)
                if ri != rj and overlaps(tensors[i], tensors[j]):
                    parent[rj] = ri
        components: dict[int, list[int]] = {}
        for i in members:
            components.setdefault(_root(parent, i), []).append(i)
        for comp in components.values():
            if len(comp) > 1:
                groups.append(_group(tensors, tuple(comp)))
    return groups


def _root(parent: dict[int, int], i: int) -> int:
    while parent[i] != i:
        i = parent[i]
    return i


def overlapping_pairs(tensors: list[torch.Tensor], groups: list[AliasGroup]) -> set[tuple[int, int]]:
    """Pairs (i, j), i < j, of tensor positions whose memory overlaps (for explaining recompiles)."""
    return {
        (i, j)
        for g in groups
        for x, i in enumerate(g.members)
        for j in g.members[x + 1 :]
        if overlaps(tensors[i], tensors[j])
    }


def find_groups_or_none(tensors: list[torch.Tensor]) -> list[AliasGroup]:
    """`find_groups`, with groups of mixed dtypes kept (they are only being described)."""
    try:
        return find_groups(tensors)
    except UnsupportedError:
        return [AliasGroup(tuple(range(len(tensors))), torch.uint8, 0, 0)]


def _group(tensors: list[torch.Tensor], members: tuple[int, ...]) -> AliasGroup:
    dtypes = {tensors[i].dtype for i in members}
    if len(dtypes) > 1:
        names = ", ".join(str(d) for d in sorted(dtypes, key=str))
        raise UnsupportedError(
            f"inputs {list(members)} view overlapping memory with different dtypes ({names}); "
            "pass them as one tensor and view it inside the function"
        )
    spans = [extent(tensors[i]) for i in members]
    start = min(lo for lo, _ in spans)
    end = max(hi for _, hi in spans)
    lead = tensors[members[0]].storage_offset() - start
    return AliasGroup(members, dtypes.pop(), start, end - start + 1, lead)
