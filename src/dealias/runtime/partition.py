"""The partition of a graph autograd records into a forward and a backward (fused_autograd.py's custom partitioner
for inductor): inductor's min-cut partition, which may recompute in the backward from inputs eager does not save
(saved here as copies made in the forward, so that a write of them before backward goes on as eager's), or
AOTAutograd's default one (the forward saves what the graph computed, as eager does) where min-cut would save an
input the epilogue writes, fewer inputs than eager, or boolean masks (inductor's CPU store of a comparison's mask is
slow); then the fixes both need: inputs saved as themselves rather than views, copies of results saved where several
results require grad, snapshots nothing saves turned back into clones.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from operator import getitem
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ..compat.graph_cache import source_hash
from ..ir.opfacts import is_view_node
from .hazards import ALIGNED_SNAPSHOT, SNAPSHOT, Unfusable
from .keep_aten import _host_key, cache_dir, read_json, source_key, write_whole

aten = torch.ops.aten


def partition_saving_no_written_input(written: frozenset[int], copy_saved_results: bool) -> Any:
    """Inductor's custom partitioner: its own min-cut partition (which may recompute values from inputs in the
    backward) if it saves the inputs AOTAutograd's default one (the forward saves what the graph computed, as
    eager does) saves, those it alone saves as copies taken in the forward where that stores fewer bytes than the
    default one (none the graph or the epilogue writes), else the default one; Unfusable if the one taken saves
    one of the `written` inputs (positions among the graph's placeholders). An input the min-cut partition alone
    saves would make backward raise if the caller writes it after the call (a buffer refilled before backward, a
    bias an optimizer steps), where eager's goes on from what it saved, and its copy does not; an input it does
    not save where eager does would not be checked at backward (fuzz seed 962673:
    a gradient not depending on the incoming one, `mul_(x)` then `fill_`, was computed in the forward, and a write
    of x after the call did not make backward raise). With `copy_saved_results`, a result the forward saves for
    backward is saved as a copy (see _save_copies_of_results). (Inductor is imported here, not when dealias is.)"""
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
    from torch._inductor.custom_graph_pass import CustomPartitionerFn

    def saved_inputs(fw: fx.GraphModule, num_fwd_outputs: int) -> set[int]:
        """The inputs the forward saves for backward, themselves or through a view of one (`x[0]`)."""
        primals = fw.graph.find_nodes(op="placeholder")  # (no parameters: the graph's inputs, in order)
        out = set()
        for s in fw.graph.output_node().args[0][num_fwd_outputs:]:
            while isinstance(s, fx.Node) and is_view_node(s):
                s = s.args[0]
            if s in primals:
                out.add(primals.index(s))
        return out

    class Partition(CustomPartitionerFn):
        def __call__(self, gm: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
            n = kwargs["num_fwd_outputs"]
            recorded = _default_verdict_key(gm, joint_inputs, kwargs, written, copy_saved_results)
            verdict = _recorded_verdict(recorded)
            if verdict is True:
                # (an earlier compile of this joint graph took the default one: the min-cut one is not made again)
                kwargs.pop("compiler", None)
                fw, bw = default_partition(copy.deepcopy(gm), joint_inputs, **kwargs)
                saved, copied = saved_inputs(fw, n), set()
            else:
                fw, bw = min_cut_rematerialization_partition(copy.deepcopy(gm), joint_inputs, **kwargs)
                kwargs.pop("compiler", None)
                saved = saved_inputs(fw, n)
                # (an earlier compile took this min-cut partition, saving the same inputs: the default one, made
                # there only to be dropped, is not made again; its saved inputs are the record's)
                by_default = verdict[1] if verdict is not None and verdict[0] == saved else None
                copied = saved - by_default if by_default is not None else set()
                if by_default is None or by_default - saved or copied & written:
                    default = default_partition(copy.deepcopy(gm), joint_inputs, **kwargs)
                    by_default = saved_inputs(default[0], n)
                    copied = saved - by_default  # (min-cut's alone: saved as copies, if that stores less)
                    if (
                        by_default - saved
                        or copied & written
                        or _saves_masks(fw, n)
                        and not _saves_masks(default[0], n)
                        or not _copies_store_less(fw, default[0], n, copied)
                    ):
                        (fw, bw), saved, copied = default, by_default, set()
                        _record_default(recorded)
                    else:
                        _record_min_cut(recorded, saved, by_default)
            if saved & written:
                raise Unfusable(f"backward would save input {min(saved & written)}, which the epilogue writes into")
            if copied:
                _save_copies_of_inputs(fw, n, copied)
            _save_inputs_not_views_of_them(fw, bw, n)
            if copy_saved_results:
                _save_copies_of_results(fw, n)
            _unsaved_snapshots_plain(fw)
            return fw, bw

        def __reduce__(self) -> Any:  # (inductor pickles its config into some cache keys: made again from these)
            return partition_saving_no_written_input, (written, copy_saved_results)

        def uuid(self) -> Any:  # inductor's graph cache key: a cached graph passed this check when compiled
            # (and was compiled with no donated buffer: see compat/inductor.py's no_donated_buffers; AOTAutograd's
            # cache keeps the list of them with the compiled graph)
            return (
                "dealias partition saving the inputs eager saves, copies of min-cut's own where they store less, "
                "unsaved snapshots plain clones, no donated buffers, none of",
                tuple(sorted(written)),
                copy_saved_results,
            )

    return Partition()


# The verdict "the default partition" kept on disk per joint graph (issue 38: the warm first call). A process that
# does not backpropagate the first call's outputs leaves AOTAutograd's cache entry unwritten (it keeps one only once
# the backward is compiled), and every later process traces the joint graph and partitions it again; the min-cut
# partition, made only to be dropped where the default one is taken, was 0.4-0.6 of resnet18's warm training first
# call's 3.8 CPU s. The default partition is the one taken whenever min-cut's is not safe (every check above only
# ever turns to it), so a record of it, stale or wrong, can cost speed, never a result. Where min-cut's was taken,
# the record keeps the inputs it saves and those the default one saves: a compile whose min-cut partition saves the
# same inputs makes the default one no more (made only for those and for the checks of speed, ~0.13 of a
# mobilenet-like training forward's warm first call of 4 CPU s), and checks with them what it checks for safety
# (no input the default one saves left unsaved, no written one copied); a record that does not match, or those
# checks failing, partitions both ways as before. Keyed on dealias's source, the torch build, the host, the joint
# graph's code, its inputs' layouts and dtypes, the partitioner's arguments and AOTAutograd's configuration;
# `DEALIAS_PARTITION_RECORD=0` (read at import) turns it off.
RECORD = os.environ.get("DEALIAS_PARTITION_RECORD", "1") != "0"
VERSION = 1


def _default_verdict_key(
    gm: fx.GraphModule, joint_inputs: Any, kwargs: dict[str, Any], written: frozenset[int], copy_saved_results: bool
) -> str | None:
    """The record's key for this joint graph and partitioner; None where it is not kept or cannot be named."""
    if not RECORD:
        return None
    try:
        build = source_key((), source_hash(), _host_key())
        if build is None:
            return None
        layouts = []
        for t in pytree.tree_leaves(joint_inputs):
            if not isinstance(t, torch.Tensor):
                layouts.append(repr(t) if isinstance(t, (type(None), bool, int, float)) else None)
                continue
            if any(not isinstance(d, int) for d in (*t.shape, *t.stride())):
                return None  # (symbolic sizes: the verdict weighs bytes)
            layouts.append((tuple(t.shape), t.stride(), str(t.dtype), t.requires_grad))
        if None in layouts:
            return None
        others = sorted((k, repr(v)) for k, v in kwargs.items() if k != "compiler")
        config = sorted(torch._functorch.config.save_config_portable().items())
        code = gm.graph.python_code("self").src  # (not gm.code: a lazy module would generate its own for it)
        parts = [f"v{VERSION}", build, code, repr(layouts), repr(others), repr(sorted(written))]
        parts += [str(copy_saved_results), repr(config)]
    except Exception:  # noqa: BLE001 - not named: partitioned both ways, as without the record
        return None
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _record_path(k: str) -> Path:
    return cache_dir() / "partitions" / f"{k}.json"


def _recorded_verdict(k: str | None) -> Any:
    """The verdict recorded under `k`: True (the default partition), (the inputs min-cut's saves, those the default
    one saves) where min-cut's was taken, or None (none, or one that cannot be read)."""
    data = read_json(_record_path(k)) if k is not None else None
    if not isinstance(data, dict) or data.get("version") != VERSION or data.get("key") != k:
        return None
    if data.get("default") is True:
        return True
    sets = data.get("min_cut")
    if not isinstance(sets, list) or len(sets) != 2:
        return None
    if not all(isinstance(p, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in p) for p in sets):
        return None
    return set(sets[0]), set(sets[1])


def _record_default(k: str | None) -> None:
    if k is not None:
        write_whole(_record_path(k), json.dumps({"version": VERSION, "key": k, "default": True}))


def _record_min_cut(k: str | None, saved: set[int], by_default: set[int]) -> None:
    if k is not None:
        record = {"version": VERSION, "key": k, "min_cut": [sorted(saved), sorted(by_default)]}
        write_whole(_record_path(k), json.dumps(record))


def _copies_store_less(fw: fx.GraphModule, default: fx.GraphModule, num_fwd_outputs: int, copied: set[int]) -> bool:
    """Whether the min-cut forward `fw`, saving copies of the `copied` inputs (by position among its placeholders),
    stores fewer bytes for backward than the `default` forward. Min-cut saves a BatchNorm's bias where the default
    saves the normalized result before a ReLU6 (whose backward recomputes it): a mobilenet-like training forward
    stored 12 MB where the default stored 17.5, a store inductor's fused BatchNorm + ReLU6 kernel otherwise skips.
    No: where a copied input is saved through a view (a copy's layout could differ from what the backward was
    compiled for), or where sizes are symbolic."""
    if not copied:
        return True
    primals = fw.graph.find_nodes(op="placeholder")
    copies = 0
    for s in fw.graph.output_node().args[0][num_fwd_outputs:]:
        base = s
        while isinstance(base, fx.Node) and is_view_node(base):
            base = base.args[0]
        if base in primals and primals.index(base) in copied:
            if base is not s:
                return False
            copies += _bytes(s)
    mine, theirs = _computed_saved_bytes(fw, num_fwd_outputs), _computed_saved_bytes(default, num_fwd_outputs)
    return isinstance(mine + copies, int) and isinstance(theirs, int) and mine + copies < theirs


def _bytes(n: fx.Node) -> Any:
    val = n.meta.get("val")
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def _computed_saved_bytes(fw: fx.GraphModule, num_fwd_outputs: int) -> Any:
    """The bytes of the tensors the forward `fw` computes and saves for backward (not its inputs, nor views of them):
    a SymInt where sizes are symbolic."""
    total, seen = 0, set()
    for s in fw.graph.output_node().args[0][num_fwd_outputs:]:
        base = s
        while isinstance(base, fx.Node) and is_view_node(base):
            base = base.args[0]
        if isinstance(base, fx.Node) and base.op != "placeholder" and base not in seen:
            seen.add(base)
            total = total + _bytes(base)
    return total


def _save_copies_of_inputs(fw: fx.GraphModule, num_fwd_outputs: int, copied: set[int]) -> None:
    """Make the forward `fw` save a copy of each of the `copied` inputs it saves for backward, itself
    (_copies_store_less checked it is not through a view). The min-cut partition saves inputs eager's backward does
    not (a BatchNorm's bias, to recompute its result): a caller's write of one after the call (an optimizer step
    before backward) would make backward raise "modified by an inplace operation" where eager's goes on; a copy
    taken in the forward holds the value eager's saved result was computed from. The copy is an aligned snapshot,
    which inductor keeps and generates itself, fused into a kernel the forward runs anyway (a plain snapshot was an
    ATen clone called from inductor's Python wrapper, ~3 us a bias): nothing in the forward writes these inputs
    (`copied` holds none the graph writes), so wherever the copy is computed it reads the value the call was given."""
    primals = fw.graph.find_nodes(op="placeholder")
    outputs = list(fw.graph.output_node().args[0])
    for k in range(num_fwd_outputs, len(outputs)):
        s = outputs[k]
        if s in primals and primals.index(s) in copied:
            with fw.graph.inserting_before(fw.graph.output_node()):
                outputs[k] = fw.graph.call_function(ALIGNED_SNAPSHOT, (s,))
            outputs[k].meta = dict(s.meta)
    fw.graph.output_node().args = (tuple(outputs),)
    fw.recompile()


def _saves_masks(fw: fx.GraphModule, num_fwd_outputs: int) -> bool:
    """Whether the forward `fw` saves for backward a boolean tensor it computes (min-cut's choice for a ReLU's
    backward: `out <= 0`, a quarter of the bytes of `out`). Inductor's CPU code stores a comparison's mask into
    bool memory through a generic, unvectorized conversion: `x <= 0` over 262,144 floats took 7.1 ms where the
    same mask stored as 0./1. floats took 0.28 (torch 2.13, one thread); a conv + BatchNorm2d + ReLU training
    forward spent 11 of its 17 ms there. The default partition saves the float result instead, and the backward
    computes the mask in registers."""
    for s in fw.graph.output_node().args[0][num_fwd_outputs:]:
        val = s.meta.get("val") if isinstance(s, fx.Node) else None
        if s.op != "placeholder" and isinstance(val, torch.Tensor) and val.dtype is torch.bool and val.numel() > 1:
            return True
    return False


def _unsaved_snapshots_plain(fw: fx.GraphModule) -> None:
    """Turn back into plain clones the forward's snapshots (see _clones_of_inputs_kept) that it neither saves for
    backward nor returns, itself or through a view: inductor may then drop them. A snapshot is a copy inductor must
    materialize (it was an opaque kernel of its own, which stopped fusion around it: bn_train, with a snapshot of
    each running statistic, which BatchNorm's training backward does not read, cost 0.47x eager, 0.39x without)."""
    kept = set()
    for s in fw.graph.output_node().args[0]:
        while isinstance(s, fx.Node) and is_view_node(s):
            s = s.args[0]
        kept.add(s)
    changed = False
    for n in fw.graph.nodes:
        if n.op == "call_function" and n.target is SNAPSHOT and n not in kept:
            n.target = aten.clone.default
            changed = True
    if changed:
        fw.recompile()


def _save_inputs_not_views_of_them(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int) -> None:
    """Make the forward `fw` save an input itself where it saves a view of it (`w.t()` for `x @ w`), and the
    backward `bw` take the view again. Inductor returns such a view as a tensor of its own, with a version counter
    of its own: a write of the input after the call (an optimizer step before backward) then went unseen, and
    backward read the new values, where eager's (which saved a view sharing the input's counter) raises. Views
    whose symbolic arguments the backward is given too; a placeholder of `bw` has the name of the forward node
    saved into it (AOTAutograd's partitioner names them so)."""
    primals = fw.graph.find_nodes(op="placeholder")
    outputs = list(fw.graph.output_node().args[0])
    taking = {n.name: n for n in bw.graph.find_nodes(op="placeholder")}
    changed = False
    for k in range(num_fwd_outputs, len(outputs)):
        chain, n = [], outputs[k]
        while isinstance(n, fx.Node) and is_view_node(n) and n.target is not getitem:
            chain.append(n)
            n = n.args[0]
        if not chain or n not in primals or chain[0].name not in taking:
            continue
        sizes = [a for v in chain for a in pytree.tree_leaves((v.args[1:], v.kwargs)) if isinstance(a, fx.Node)]
        if any(a.name not in taking for a in sizes):
            continue  # (a symbolic size the backward is not given)

        def in_bw(a: Any) -> Any:
            return taking[a.name] if isinstance(a, fx.Node) else a

        ph = taking[chain[0].name]
        users, node = list(ph.users), ph
        for v in reversed(chain):  # (after the placeholders, in order)
            with bw.graph.inserting_after(node if node is not ph else bw.graph.find_nodes(op="placeholder")[-1]):
                args, kwargs = pytree.tree_map(in_bw, (v.args[1:], dict(v.kwargs)))
                node = bw.graph.call_function(v.target, (node, *args), kwargs)
            node.meta = dict(v.meta)
        for u in users:
            u.replace_input_with(ph, node)
        ph.meta = dict(n.meta)
        outputs[k] = n
        changed = True
    if changed:
        fw.graph.output_node().args = (tuple(outputs),)
        fw.graph.eliminate_dead_code()
        fw.recompile()
        bw.recompile()


def _save_copies_of_results(fw: fx.GraphModule, num_fwd_outputs: int) -> None:
    """Make the forward `fw` save a copy of each result of the graph it saves for backward (exp's, sigmoid's). The
    compiled graph has one backward node for all its results, where eager has one per op: AOTAutograd's check of
    a saved result the caller wrote after the call would raise for a gradient through any result, where eager's
    exp backward runs only for a gradient through its own. On a copy, the check is dealias's pre-hook
    (_check_saved_results_at_backward), which asks where the gradient comes in."""

    def base(n: Any) -> Any:
        while isinstance(n, fx.Node) and is_view_node(n):
            n = n.args[0]
        return n

    outputs = list(fw.graph.output_node().args[0])
    results = {base(r) for r in outputs[:num_fwd_outputs]}  # (a view returned shares its base's counter)
    for k in range(num_fwd_outputs, len(outputs)):
        s = outputs[k]
        if base(s) in results and isinstance(s.meta.get("val"), torch.Tensor):
            with fw.graph.inserting_before(fw.graph.output_node()):
                copied = fw.graph.call_function(aten.clone.default, (s,))
            copied.meta = dict(s.meta)
            outputs[k] = copied
    fw.graph.output_node().args = (tuple(outputs),)
    fw.recompile()
