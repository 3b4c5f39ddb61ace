"""The fused executors' prologue: what a compiled call does in Python before its kernels run.

Index bounds are checked before any write, with eager's error (a call refused so runs the graph eagerly instead,
for eager's writes before the failing op: `mark_refused`; inductor checks indices
inside its kernels, after earlier kernels wrote, with an error of its own naming its C++ source). An index the
graph computes (HF's static cache: `torch.arange(n) + self.cumulative_length`) from memory no earlier write of the
graph touched is checked here by its range where its ops allow (index_ranges.py: read from one-element inputs
with `.item()`, the index left to the graph), else computed here and handed to the graph as an input (`_Hoisted`).
Version bumps of inputs run here for a graph that records no autograd (when they happen inside the call is not
observable then). The whole is one generated function (`prologue.source`), each check inline.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from operator import getitem
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

from ..errors import mark_refused, node_location, with_location
from ..ir.checks import bounds_check, index_args, index_policy, indexed_write, is_bounds_check
from ..ir.gradops import bump_version
from ..ir.opfacts import facts, has_effect, is_view_node, may_raise, op_name
from ..ir.viewops import symbolic_layout
from .hazards import Unfusable, is_scatter, memory_of, reads_of
from .index_ranges import RESHAPES, Ranged, index_range

aten = torch.ops.aten


def in_prologue(n: fx.Node) -> bool:
    """Python steps of a graph that run before its compiled call: index bounds checks, and version bumps
    (`x.copy_(x)`: with no autograd recording in the graph, when the bump happens inside the call is not
    observable)."""
    return is_bounds_check(n.target) or n.target is bump_version


def make_prologue(gm: fx.GraphModule, autograd: bool = False) -> Callable[[tuple[Any, ...]], tuple[Any, ...]] | None:
    """The graph's Python steps (`in_prologue`), taken out of it, as one function of the call's inputs (None if
    it has none). An index computed inside the graph (`torch.arange(n) + self.cumulative_length`, as HF's static
    cache computes its write position) is checked by its range (`_Hoisted.where`), or computed there too, before
    any write, and becomes an input of the graph (`_Hoisted`): the function returns the values of those inputs, to
    pass after the call's own. `autograd`: for a
    functional graph AOTAutograd compiles (fused_autograd.py): its scatters are AOTAutograd's to run, its version
    bumps stay in it (where they happen is observable there), and only index reads are checked."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    hoisted = _Hoisted(gm, placeholders)
    reads = reads_of(gm)
    checks: list[tuple[Any, int, tuple[Any, ...]]] = []  # (check, index input, (size, dim))
    sized: list[tuple[Any, int, tuple[int, int | None], int]] = []  # (check, index input, (input, its dim), dim)
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and is_scatter(n.target) and not autograd and not _into_fresh_memory(n, reads):
            # Inductor re-inplaces a functional scatter into its base and may read the base elsewhere in the
            # same kernel (`v.addcmul_(v.flip(0), ..)` over a scattered base read the flipped elements already
            # written). Only writes dealias lowered in place (checked by the hazard rule) are handed over, and
            # scatters into memory the graph made from nothing of the caller's (`out = torch.zeros(..);
            # out[idx] = x`): inductor's own buffers, which it re-inplaces as it does torch.compile's.
            raise Unfusable(f"{n.target} writes a region functionally (a write not lowered in place)")
        if n.op == "call_function" and may_raise(n.target) and not indexed_write(n.target):
            # Inductor checks indices inside its kernels, after earlier kernels wrote the caller's memory, and
            # raises its own error. An index read from a graph input (`embedding(w, token)`, `x[idx]`) is checked
            # here instead, with eager's error, before anything runs; other value checks keep the graph unfused.
            if autograd and not index_args(n):
                continue  # (other value checks, nll_loss's target, stay inductor's: they would need rules of their own)
            for fn, i, (size, dim) in _read_checks(n, placeholders, hoisted):
                if isinstance(size, tuple):
                    sized.append((fn, i, size, dim))
                else:
                    checks.append((fn, i, (size, dim)))
            continue
        if n.op != "call_function" or not in_prologue(n):
            continue
        if n.target is bump_version:
            if autograd:
                continue
            if n.args[0] not in placeholders:
                raise Unfusable("a version bump of a tensor made inside the graph")
            checks.append((n.target, placeholders.index(n.args[0]), ()))
        else:
            index, size, dim = n.args
            i, of = hoisted.where(index, n), _size_of(size, placeholders)
            if of is None:
                checks.append((n.target, i, (size, dim)))
            else:
                sized.append((n.target, i, of, dim))
        gm.graph.erase_node(n)
    compute = hoisted.finish()
    handed = hoisted.handed
    every = compute is None or len(handed) == len(hoisted.indices)
    # A check of a constant index (`hoisted.constant`) against a static size passes or raises alike on every call:
    # it runs until a call passed it.
    once = [c for c in checks if isinstance(c[1], int) and c[1] - len(placeholders) in hoisted.constant]
    once = [c for c in once if c[0] is not bump_version]
    checks = [c for c in checks if not any(c is o for o in once)]
    if not checks and not sized and not once:
        return None
    examples = [n.meta.get("val") for n in (*placeholders, *hoisted.indices)]
    return _generated(checks, sized, once, compute, None if every else handed, examples, len(placeholders))


def _generated(
    checks: list[tuple[Any, Any, tuple[Any, ...]]],
    sized: list[tuple[Any, Any, tuple[int, int | None], int]],
    once: list[tuple[Any, Any, tuple[Any, ...]]],
    compute: Callable[..., tuple[Any, ...]] | None,
    handed: list[int] | None,
    examples: list[Any],
    passed_inputs: int,
) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """The prologue as one generated Python function of the call's inputs: the hoisted indices computed, then each
    check in graph order (`checks`, then those against symbolic sizes, `sized`; `once`: until a call passed them),
    each read inline where the index is one element or a few (the check function, eager's error, runs only where a
    value may be out of range), version bumps; returns the hoisted indices handed to the graph (`handed`: their
    positions, None for all of them)."""
    env: dict[str, Any] = {"bump_version": bump_version, "compute": compute, "passed": [], "extremes": _extremes}
    body: list[str] = []
    # An index read once per block of lines however many checks compare it (a replay buffer's sampled rows index
    # four buffers of one length: four reductions of the same index, ~5 us each, where one does): (lines, input)
    # -> the names of its least and greatest entries.
    read: dict[tuple[int, Any], tuple[str, str]] = {}
    bumps: list[str] = []
    if compute is not None:
        body += ["extra = compute(*args)", "args = (*args, *extra)"]

    def emit(lines: list[str], fn: Any, where: Any, size: Any, dim: int) -> None:
        """`size`: an int, or the source reading it from the call's inputs."""
        k = len(env)
        if fn is bump_version:
            bumps.append(f"bump_version(args[{where}])")  # (after every check: see below)
            return
        env[f"check{k}"] = fn
        s = repr(size) if isinstance(size, int) else f"s{k}"  # (a static size inline, a symbolic one read once)
        low = f"-{s}" if fn.policy.allow_negative else "0"
        if isinstance(where, Ranged):
            env[f"index{k}"] = where.compute
            slow = f"check{k}(index{k}(*args[:{passed_inputs}]), {s}, {dim})"
            if where.constant and isinstance(size, int):  # (the same outcome on every call: decided now)
                lowest = -size if fn.policy.allow_negative else 0
                if not lowest <= int(where.lo) <= int(where.hi) < size <= where.limit:
                    lines.append(slow)  # (eager's error on every call)
                return
            lines += [f"s{k} = {size}"] if s != repr(size) else []
            bound = f"{s} <= {where.limit}" if not isinstance(size, int) else s  # (static: checked now)
            if isinstance(size, int) and size > where.limit:
                lines.append(slow)
                return
            lines += [*where.lines, f"if not ({low} <= {where.lo} and {where.hi} < {bound}):", f"    {slow}"]
            return
        lines += [f"s{k} = {size}"] if s != repr(size) else []
        slow = f"check{k}(args[{where}], {s}, {dim})"
        if (id(lines), where) not in read:
            bounds = _read_bounds(examples[where], f"args[{where}]", f"r{k}")
            if bounds is None:
                lines.append(slow)
                return
            line, lo, hi = bounds
            lines.append(line)
            read[id(lines), where] = lo, hi
        lo, hi = read[id(lines), where]
        lines += [f"if not ({low} <= {lo} and {hi} < {s}):", f"    {slow}"]

    for fn, where, rest in checks:
        emit(body, fn, where, *(rest or (None, 0)))
    for fn, where, (t, d), dim in sized:  # (against a symbolic size: the call's input `t` has it, or is it)
        emit(body, fn, where, f"args[{t}]" if d is None else f"args[{t}].shape[{d}]", dim)
    if once:
        lines: list[str] = []
        for fn, where, (size, dim) in once:
            emit(lines, fn, where, size, dim)
        body += ["if not passed:", *(f"    {line}" for line in lines), "    passed.append(True)"]
    # The checks raise before anything of the call happened: the error is marked so (`mark_refused`), and the
    # graph's caller runs dynamo's graph eagerly instead, which makes eager's writes before its failing op and
    # raises eager's error there (frontend/backend.py). So the version bumps come after every check.
    body = ["try:", *(f"    {line}" for line in body or ["pass"])]
    body += ["except BaseException as e:", "    mark(e)", "    raise"]
    body += bumps
    if compute is None:
        body.append("return ()")
    else:
        body.append("return extra" if handed is None else f"return ({''.join(f'extra[{k}], ' for k in handed)})")
    env["mark"] = mark_refused
    src = "def prologue(args):\n" + "".join(f"    {line}\n" for line in body)
    exec(compile(src, "<dealias prologue>", "exec"), env)  # noqa: S102 - generated from the checks above only
    prologue = env["prologue"]
    prologue.source = src
    return prologue


def _extremes(index: torch.Tensor) -> tuple[int, int]:
    """The least and the greatest entry of an integer index; (0, -1) for an empty one, which every check passes."""
    if index.numel() == 0:
        return 0, -1
    small, large = torch.aminmax(index)
    return int(small), int(large)


def _read_bounds(example: Any, t: str, r: str) -> tuple[str, str, str] | None:
    """(a line reading the index `t` into `r`, its least value, its greatest) for an integer index: one entry
    (`.item()`), a few of static sizes in at most two dims (`tolist()`, read as it is: a reshape first costs more than
    the read), else by one reduction (`_extremes`); None for other dtypes (the check function reads them)."""
    if not isinstance(example, torch.Tensor) or example.dtype not in (torch.int32, torch.int64):
        return None
    if symbolic_layout(example) or example.numel() > 64 or example.dim() > 2:
        return f"{r} = extremes({t})", f"{r}[0]", f"{r}[1]"
    if example.numel() == 0:
        return None
    if example.numel() == 1:
        return f"{r} = {t}.item()", r, r
    if example.dim() == 1:
        return f"{r} = {t}.tolist()", f"min({r})", f"max({r})"
    return f"{r} = {t}.tolist()", f"min(map(min, {r}))", f"max(map(max, {r}))"


class _Hoisted:
    """Indices computed inside the graph, computed before its call instead, and handed to it as inputs after the
    call's own. Only an index computed by pure ops from memory no earlier write of the graph touched: computed
    first, it has the value the program gives it. A view of a caller's tensor is only checked: the graph takes
    its own view (handed over, it would be a copy, since the graph must not see the caller's memory as two
    inputs: a clone per call, for a `labels.view(-1)` the view costs nothing)."""

    def __init__(self, gm: fx.GraphModule, placeholders: list[fx.Node]) -> None:
        self.gm, self.placeholders = gm, placeholders
        self.indices: list[fx.Node] = []  # in the order the prologue computes them
        self.handed: list[int] = []  # positions in `indices` of those handed to the graph (`finish`)
        # the positions in `indices` of those computed from nothing of the call's (GPT-2's `arange(n)` position ids,
        # n static): the same values on every call, computed once (`finish`)
        self.constant: frozenset[int] = frozenset()

    @functools.cached_property
    def _order(self) -> dict[fx.Node, int]:
        return {n: i for i, n in enumerate(self.gm.graph.nodes)}

    @functools.cached_property
    def _memory(self) -> tuple[list[tuple[fx.Node, fx.Node]], dict[fx.Node, fx.Node]]:
        return memory_of(self.gm)

    def position(self, index: fx.Node, at: fx.Node | None = None) -> int:
        """The input position of `index` in the call's inputs followed by the hoisted ones. An index that is the
        call's input reshaped (`_reshaped_input`) is checked as that input: nothing computed before the call.
        `at`: the node checking it (Unfusable where the graph writes the input before it: `c.add_(1);
        cache.index_copy_(0, c, v)` read c's old value before the call)."""
        if at is not None:
            self._unwritten_before(_reshaped_input(index, self.placeholders) or index, at)
        reshaped = _reshaped_input(index, self.placeholders)
        if reshaped is not None:
            self._cone(index)  # (raises Unfusable where the input's memory is written before the index is read)
            index = reshaped
        if index in self.placeholders:
            return self.placeholders.index(index)
        if index not in self.indices:
            self._cone(index)  # (raises Unfusable)
            self.indices.append(index)
        return len(self.placeholders) + self.indices.index(index)

    def _unwritten_before(self, index: fx.Node, at: fx.Node) -> None:
        if index not in self.placeholders:
            return  # (computed inside the graph: `_cone` asks of each of its nodes)
        writes, root = self._memory
        m = root.get(index)
        if m is not None and any(w_m is m and self._order[w] < self._order[at] for w, w_m in writes):
            raise Unfusable(f"an index checked before any write is {m.name}, written before it is used")

    def where(self, index: fx.Node, at: fx.Node | None = None) -> int | Ranged:
        """`position`, or for an index the graph computes whose range the prologue can follow (index_ranges.py), the
        index left to the graph and checked by its range (`Ranged`, with the function computing it for a range not
        inside the bounds)."""
        if _reshaped_input(index, self.placeholders) is None and index not in self.placeholders:
            cone = self._cone(index)  # (raises Unfusable where the index reads memory written before it)
            ranged = index_range(index, self.placeholders)
            if ranged is not None:
                ranged.compute = _without_grad(self._computing([index], [cone]))
                return ranged
        return self.position(index, at)

    def _cone(self, index: fx.Node) -> list[fx.Node]:
        """The nodes computing `index` (constants included), in graph order."""
        writes, root = self._memory
        seen: set[fx.Node] = set()
        stack = [index]
        while stack:
            n = stack.pop()
            if n in seen or n.op == "placeholder":
                continue
            if n.op != "get_attr" and (n.op != "call_function" or not _pure(n)):
                what = op_name(n.target) if n.op == "call_function" else n.op
                raise Unfusable(f"an index checked before any write is computed inside the graph by {what}")
            for a in n.all_input_nodes:
                m = root.get(a)
                if m is not None and any(w_m is m and self._order[w] < self._order[n] for w, w_m in writes):
                    raise Unfusable(f"an index checked before any write is computed from {m.name} after a write to it")
            seen.add(n)
            stack.extend(n.all_input_nodes)
        return sorted(seen, key=self._order.__getitem__)

    def finish(self) -> Callable[..., tuple[Any, ...]] | None:
        """Make the hoisted indices inputs of the graph; returns the function computing them from the call's."""
        if not self.indices:
            return None
        cones = [self._cone(i) for i in self.indices]
        self.constant = frozenset(
            k for k, (i, cone) in enumerate(zip(self.indices, cones)) if _computed_from_nothing(cone, [i])
        )
        root = self._memory[1]
        self.handed = [k for k, i in enumerate(self.indices) if i not in root]
        # (Aten calls. torch_executor's Tensor methods cost half as much, but choosing them pinned length symbols
        # until executor.py stopped its probe from guarding; HF's Mistral trained at a third length indexed out of
        # bounds inside its kernels. Not taken again here: the gain is a few microseconds a call.)
        # The constant indices are computed once, the others on every call: GPT-2's position ids are constant, its
        # `input_ids.view(-1, n)` (checked) is the call's, and the whole cone ran on every call (~10 us).
        parts = [[k for k in range(len(self.indices)) if (k in self.constant) == once] for once in (True, False)]
        computes = [self._computing([self.indices[k] for k in ks], [cones[k] for k in ks]) for ks in parts]
        for i in (self.indices[k] for k in self.handed):  # (placeholders come first: each new one after the last)
            last = self.gm.graph.find_nodes(op="placeholder")
            where = self.gm.graph.inserting_after(last[-1]) if last else self.gm.graph.inserting_before()
            with where:
                ph = self.gm.graph.placeholder(f"{i.name}_computed_first")
            ph.meta = dict(i.meta)
            i.replace_all_uses_with(ph)
        for n in reversed(sorted(set().union(*cones), key=self._order.__getitem__)):
            if not n.users:
                self.gm.graph.erase_node(n)

        (const_at, const_compute), (call_at, call_compute) = zip(parts, computes)
        combined = [*const_at, *call_at]
        order = [combined.index(k) for k in range(len(self.indices))]  # (where each index is in `values`)
        computed: list[tuple[Any, ...]] = []

        def run(*args: Any) -> tuple[Any, ...]:
            if computed and not call_at:  # (constant indices only, computed: nothing to run)
                return computed[0]
            grad = torch.is_grad_enabled()
            torch._C._set_grad_enabled(False)  # (nothing in the fused graph records autograd: `unfusable`)
            try:
                if not computed:  # (the graph only reads them: nothing writes memory that is not the caller's)
                    computed.append(const_compute(*args) if const_at else ())
                values = (*computed[0], *call_compute(*args)) if call_at else computed[0]
            finally:
                torch._C._set_grad_enabled(grad)
            return values if not call_at or not const_at else tuple(values[k] for k in order)

        return run

    def _computing(self, indices: list[fx.Node], cones: list[list[fx.Node]]) -> Callable[..., tuple[Any, ...]]:
        """A function of the call's inputs computing `indices` (`cones`: the nodes computing each)."""
        graph, env = fx.Graph(), {}
        for ph in self.placeholders:
            env[ph] = graph.placeholder(ph.name)
        for n in sorted(set().union(set(), *cones), key=self._order.__getitem__):
            env[n] = graph.node_copy(n, env.__getitem__)
        graph.output(tuple(env[i] for i in indices))
        return fx.GraphModule(self.gm, graph).forward


def _without_grad(compute: Callable[..., tuple[Any, ...]]) -> Callable[..., torch.Tensor]:
    """The one index `compute` returns, computed without grad (nothing in the fused graph records autograd)."""

    def index(*args: Any) -> torch.Tensor:
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            return compute(*args)[0]
        finally:
            torch._C._set_grad_enabled(grad)

    return index


def _reshaped_input(index: fx.Node, placeholders: list[fx.Node]) -> fx.Node | None:
    """The call's input `index` is a reshaping (index_ranges.RESHAPES) of, through reshapings only, or None. A view
    whose elements, in row-major order, are its input's in row-major order: a bounds check reads only that (its min
    and max, and the first entry out of range, which names eager's error), so checking the input is checking the
    view. GPT-2's `input_ids.view(-1, n)` was computed on every call only to be checked (~10 us a call; 40 us with a
    cold cache between kernels). Not permute/transpose/expand/slices: other orders, or other elements."""
    n = index
    while n.op == "call_function" and n.target in RESHAPES and n.args and isinstance(n.args[0], fx.Node):
        n = n.args[0]
    return n if n is not index and n in placeholders else None


def _computed_from_nothing(cone: list[fx.Node], indices: list[fx.Node]) -> bool:
    """Whether `cone` (the nodes computing `indices`) reads no input of the call, no symbol and no constant tensor
    (whose values a graph could change), so that its values are the same on every call; and no op writes them."""
    for n in cone:
        if any(a.op in ("placeholder", "get_attr") for a in n.all_input_nodes) or n.op == "get_attr":
            return False
        val = n.meta.get("val")
        if isinstance(val, SYMBOLIC) or isinstance(val, torch.Tensor) and symbolic_layout(val):
            return False
    for i in indices:
        # (through its views: a constant index returned, `pos` or `pos.view(..)`, would be the one tensor every call
        # returns, which a caller's write into one call's output changed for the next calls)
        for u in _users_through_views(i):
            if u.op == "output" or isinstance(u.target, torch._ops.OpOverload) and facts(u.target).mutated:
                return False
    return True


def _users_through_views(n: fx.Node) -> list[fx.Node]:
    """The users of `n` and of each view of it, transitively."""
    out, stack = [], [n]
    while stack:
        for u in stack.pop().users:
            out.append(u)
            if is_view_node(u):
                stack.append(u)
    return out


def example_like(val: torch.Tensor, example: list[Any]) -> torch.Tensor:
    """An example for a hoisted input: its fake value in a program over symbols (compiled for fakes), else a real
    tensor of its layout (inductor compiles for the call's tensors; their values are not read)."""
    if any(isinstance(e, FakeTensor) for e in example):
        return val
    return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=val.device)


def _pure(n: fx.Node) -> bool:
    """A node computing its result from its arguments alone: no write, no random draw, no Python effect."""
    if isinstance(n.target, torch._ops.OpOverload):
        f = facts(n.target)
        return not f.mutated and not f.nondeterministic
    return n.target is getitem or sizes_arithmetic(n)


SYMBOLIC = (torch.SymInt, torch.SymBool, torch.SymFloat)


def sizes_arithmetic(n: fx.Node) -> bool:
    """Python arithmetic of symbolic sizes (`s0 - 1`, `s0 // 2`), as dynamo records it."""
    return isinstance(n.meta.get("val"), SYMBOLIC) and not has_effect(n.target)


def _into_fresh_memory(n: fx.Node, reads: dict[fx.Node, frozenset[fx.Node]]) -> bool:
    """Whether the functional scatter `n` writes into a tensor the graph made without reading a caller's memory
    (through views and earlier scatters: `torch.zeros(..)`, `x.new_zeros(..)`), which inductor cannot turn into an
    input by removing a no-op (`x.clone()` may go, and its scatter would run in place into x)."""
    while is_view_node(n) or (n.op == "call_function" and is_scatter(n.target)):
        n = n.args[0]
    return n.op == "call_function" and (not reads[n] or _takes_only_metadata(n.target))


def _takes_only_metadata(op: Any) -> bool:
    """A factory taking a tensor for its dtype, device or sizes only (`x.new_zeros(..)`, `torch.zeros_like(x)`)."""
    name = op._schema.name if isinstance(op, torch._ops.OpOverload) else ""
    tensors = [a for a in op._schema.arguments if a.type.isSubtypeOf(torch._C.TensorType.get())] if name else []
    return len(tensors) == 1 and (name.startswith("aten::new_") or name.endswith("_like"))


def _size_of(size: Any, placeholders: list[fx.Node]) -> tuple[int, int | None] | None:
    """A size a bounds check compares with: None if static; for a symbolic one, where the call has it (`_symbol_in`);
    Unfusable for another (computed inside the graph)."""
    if not isinstance(size, fx.Node):
        return None
    if size.target is aten.sym_size.int and size.args[0] in placeholders:
        return placeholders.index(size.args[0]), size.args[1]
    return _symbol_in(size.meta.get("val"), placeholders)


def _symbol_in(size: Any, placeholders: list[fx.Node]) -> tuple[int, int | None]:
    """Where the call's inputs hold the symbolic size `size`: (input, dim) for a dimension of an input tensor of
    that size, (input, None) for an int input that is it. Unfusable if none is (`s0 - 1`)."""
    expr = size.node.expr if isinstance(size, torch.SymInt) else None
    for i, ph in enumerate(placeholders):
        v = ph.meta.get("val")
        if isinstance(v, torch.SymInt) and v.node.expr == expr:
            return i, None
        if isinstance(v, torch.Tensor):
            for d, n in enumerate(v.shape):
                if isinstance(n, torch.SymInt) and n.node.expr == expr:
                    return i, d
    raise Unfusable(f"an index is checked against a size computed inside the graph ({size})")


def _read_checks(n: fx.Node, placeholders: list[fx.Node], hoisted: _Hoisted) -> list[tuple[Any, int, tuple[Any, ...]]]:
    """Bounds checks of the index arguments of a read that raises on an index out of range (`checks.index_args`),
    each as (check, placeholder position, (size, dim)), the size a symbolic one as (input, dim) of the tensor
    indexed. An index computed inside the graph is computed before it (`_Hoisted`). Raises Unfusable where it
    cannot be, a symbolic size is not an input's, or the op may raise on other values."""
    reads = index_args(n)
    if not reads:
        raise Unfusable(f"{n.target} may raise on values computed inside the graph (eager's error is not kept yet)")
    out = []
    for index, dim, negative in reads:
        indexed = n.args[0].meta["val"]
        size = indexed.shape[dim] if indexed.dim() > 0 else 1
        if not isinstance(size, int):  # (read from the call's inputs)
            size = (placeholders.index(n.args[0]), dim) if n.args[0] in placeholders else _symbol_in(size, placeholders)
        where = with_location(f" ({n.target})", node_location(n))
        out.append((bounds_check(index_policy(n, index, negative), where), hoisted.where(index, n), (size, dim)))
    return out
