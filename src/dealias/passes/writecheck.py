"""The checks functionalize makes before it records a write: raise where eager's kernel raises (memory that
overlaps itself or an argument the op reads), refuse what eager runs with a result that depends on its kernel's
order, and refuse a write through a view the inverses cannot push back into its base. Nothing is written before
they pass, so the caller's tensors are untouched when they raise."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense
from torch.utils import _pytree as pytree

from ..errors import EagerSemanticsError, OverlapError, UnsupportedError, eager_error
from ..ir.checks import NoProbe, aliasing_is_benign, metadata_error, probe
from ..ir.opfacts import OpKind, bind_args, facts
from ..ir.sharing import has_symbols, overlaps
from ..ir.viewops import ViewStep, check_inverse, extent, internal_overlap, same_layout
from .alias import Value

aten = torch.ops.aten


# Writes of one value everywhere: eager runs them on tensors whose elements share memory (an expanded
# tensor), and every alias of a location receives the same value, so the result is well defined.
# (fill_.Tensor is left out: eager's `x[i] = 3.0` reaches it under tracing but runs copy_, which refuses.)
UNIFORM_WRITES = {aten.fill_.Scalar, aten.zero_.default}


def check_writable(node: fx.Node, written: list[Value], others: list[Value]) -> None:
    """Raise where eager raises (or where dealias cannot follow eager) before anything is written."""
    if facts(node.target).kind is OpKind.MUTABLE:
        # Two arguments it writes share memory (a BatchNorm whose running_var is its running_mean, or views of one
        # buffer): its kernel writes one, then reads or writes it again through the other, where the functional
        # form computes both new values from the old ones. Refused (an island runs eager's kernel, or eagerly).
        for i, v in enumerate(written):
            if any(o.storage is v.storage and overlaps(v.meta, o.meta) for o in written[i + 1 :]):
                raise OverlapError(f"{node.target} writes two arguments that share memory")
    for v in written:
        overlap = internal_overlap(v.meta)
        if overlap != "no" and node.target not in UNIFORM_WRITES:
            if overlap == "yes" and torch.Tag.pointwise in node.target.tags:
                raise EagerSemanticsError(
                    f"{node.target}: unsupported operation: more than one element of the written-to "
                    "tensor refers to a single memory location. Please clone() the tensor before "
                    "performing the operation."
                )
            # Eager runs some of these (masked_fill_ on an expanded tensor) with results that depend on
            # which alias it writes last: refuse rather than guess.
            raise OverlapError(f"{node.target} writes a tensor whose elements overlap in memory")
        shared = [o for o in others if o.storage is v.storage and overlaps(v.meta, o.meta)]
        # copy_ is elementwise too (each element read before the same element is written; eager raises on a
        # partial overlap as pointwise kernels do), but eager, asked below, also runs some non-dense overlaps
        # exactly: pointwise rules only where it cannot be asked (a view at a symbolic position).
        elementwise = torch.Tag.pointwise in node.target.tags or (
            node.target is aten.copy_.default and any(has_symbols(t.meta) for t in (v, *shared))
        )
        if shared and not elementwise:
            # The written tensor is also read through another argument (`index_add_(0, i, x)` on x,
            # `torch.sum(x, 0, out=x[1])`, `mm(a, x, out=x)`). Pointwise kernels allow an exact alias; other
            # kernels check it each their own way, or read what they already wrote in an order of their own.
            # Ask eager (on zeros laid out like these arguments): raise its error, or run the graph eagerly.
            error = _eager_overlap_error(node)
            if error is not None:
                raise EagerSemanticsError(f"{node.target}: {error}")
            if facts(node.target).kind is OpKind.MUTABLE:
                # Its kernel updates state then computes with it (`_fused_moving_avg_obs_fq_helper(x, .., x[0],
                # ..)` quantizes x with its new running minimum), often behind integer flags that the probe
                # below fills with zeros: not asked, refused.
                raise OverlapError(f"{node.target} reads memory it writes, through another argument")
            if aliasing_is_benign(node, _written_nodes(node)):
                continue  # (`slice_scatter(x, s, out=x.view(..))`: eager copies x first, as copies would)
            raise OverlapError(f"{node.target} reads memory it writes, through another argument")
        benign: list[bool] = []  # (asked of eager once per node)
        for o in shared:
            if same_layout(o.meta, v.meta):
                continue  # the same elements: a pointwise kernel reads each before writing it
            if not _partial_overlap(v.meta, o.meta):
                # Eager's check cannot tell (non-dense layouts) and it reads elements it may already have
                # written, in an order its kernel decides: asked of eager (as above) where one thread runs it,
                # else refused rather than guessed.
                if not benign:
                    benign.append(_single_threaded(node) and aliasing_is_benign(node, _written_nodes(node)))
                if benign[0]:
                    continue
                raise OverlapError(f"{node.target} reads memory it writes through another view")
            raise EagerSemanticsError(
                f"{node.target}: unsupported operation: some elements of the input tensor and the "
                "written-to tensor refer to a single memory location. Please clone() the tensor "
                "before performing the operation."
            )


# Elements a pointwise kernel runs in one thread (ATen's GRAIN_SIZE): over it, eager splits the elements between
# threads, and which of two aliased elements is written first may differ from run to run.
SINGLE_THREAD_ELEMENTS = 32768


def _single_threaded(node: fx.Node) -> bool:
    tensors = [a.meta.get("val") for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, fx.Node)]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    return not any(has_symbols(t) for t in tensors) and all(t.numel() < SINGLE_THREAD_ELEMENTS for t in tensors)


def _written_nodes(node: fx.Node) -> list[fx.Node]:
    bound = bind_args(node.target._schema, node.args, node.kwargs)
    targets = [a for name in facts(node.target).mutated for a in pytree.tree_leaves(bound.get(name))]
    return [a for a in targets if isinstance(a, fx.Node)]


def check_invertible(chain: tuple[ViewStep, ...], bases: list[fx.Node], node: fx.Node) -> None:
    """Raise UnsupportedError, at the user's line, before recording a write of `node` through `chain` that the
    view inverses cannot push back into its base (bases[i] is the value step i applies to)."""
    try:
        for i, step in enumerate(chain):
            check_inverse(step, bases[i].meta["val"], bases[i + 1].meta["val"])
    except UnsupportedError as e:
        raise UnsupportedError(f"{node.target}: {e}") from None


def _eager_overlap_error(node: fx.Node) -> str | None:
    """Eager's "unsupported operation: ... refer to a single memory location" for `node`'s op with its arguments'
    aliasing (checks.probe: overlap checks run before any computation, so zeros tell). None if eager accepts it,
    or if nothing can be learned (large or symbolic memory)."""
    message = _eager_error(node)
    return message if "refer to a single memory location" in message else None


def eager_metadata_error(node: fx.Node) -> Exception | None:
    """Eager's error for a write whose result has another dtype than the written tensor, asked of eager's kernel
    (it raises whatever the values: checks.metadata_error), as it is to be raised (`EagerSemanticsError` with
    eager's message for a RuntimeError; another type as eager's own, and the backend then runs the call eagerly): an
    out= tensor some kernels refuse ("Expected out tensor to have dtype float, but got double": `amax`, `sort`,
    `sum.out`; "expected scalar_type Float but found Double": `cummax`) though fake tensors accept it and a cast
    would write it, and eager's own words for a result it cannot cast (`addmm_` checks its operands' dtypes
    first). None if eager accepts it, or nothing can be learned."""
    try:
        error = metadata_error(node)
    except NoProbe:
        return None
    return eager_error(str(error)) if type(error) is RuntimeError else error


def _eager_error(node: fx.Node) -> str:
    """The first line of the RuntimeError eager raises running `node`'s op on zeros (checks.probe); "" if it
    returns, raises something else, or nothing can be learned."""
    try:
        error = probe(node)
    except NoProbe:
        return ""
    return (str(error).strip().splitlines() or [""])[0] if isinstance(error, RuntimeError) else ""


def _partial_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Eager's `assert_no_partial_overlap`: both dense, their byte ranges intersect, yet not identical."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    if not (is_non_overlapping_and_dense(a) and is_non_overlapping_and_dense(b)):
        return False
    (fa, la), (fb, lb) = extent(a), extent(b)
    sa, sb = fa * a.element_size(), fb * b.element_size()
    ea, eb = (la + 1) * a.element_size(), (lb + 1) * b.element_size()
    if sa == sb and ea == eb and a.stride() == b.stride() and a.shape == b.shape:
        return False
    return sa < eb and sb < ea
