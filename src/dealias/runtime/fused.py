"""The fused executor: the lowered graph, its writes into the caller's memory included, compiled by inductor.

Inductor fuses a write's value into its store, so `buf[123] = row` becomes one kernel over the row's bytes and
`p.copy_(p - lr * g)` one kernel updating `p` in place. It is given the graph directly (no functionalization of
its own, which would turn the row write into a copy of the whole buffer).

Inductor alone is not safe on a graph that writes: it may compute a value where it is used rather than where
the program computed it. A value read from memory before a write to that memory and used after the write would
then read the new contents (`t = buf[0].clone(); buf[0] = buf[1]; buf[1] = t` gives two equal rows). The hazard
rule: such a value is materialized by `dealias::snapshot`, an op inductor cannot see into and runs as a kernel of
its own, in program order. `check_hazards` verifies the rule on every graph handed to inductor.

Index bounds are checked in a prologue, before any write: eager's error, the caller's tensors untouched. An index
the graph computes (HF's static cache: `torch.arange(n) + self.cumulative_length`) is computed there too, when its
inputs are memory no earlier write of the graph touched, and handed to the graph as an input.
What this path cannot run exactly stays on the torch executor, with the reason in the execution trace
(`unfusable` before lowering, `Unfusable` after): alias groups, random draws, results of symbolic sizes in a layout
other than a dense one, index checks against sizes computed in the graph, ops that may raise
on their values, functional scatters into memory of the caller's and dtype views and `as_strided` (three things
inductor gets wrong or ties to one placement of the inputs), writes to memory that is not an input. (A functional
scatter into memory the graph made, `out = torch.zeros(..); out[idx] = x`, is inductor's own buffer: fused.)

A program over symbols (a position, a sequence length) is compiled for the capture's fake tensors and symbols:
the guards inductor's decisions add go into the program's ShapeEnv, and from there into its shape guard; the
decisions taken here hold for every value of the symbols (`surely`), so they add none.

A graph autograd records goes to inductor another way (fused_autograd.py).

A short attention (a decode step: a few queries over at most 1,024 keys) is computed by matmuls and softmax
that inductor fuses, not by ATen's flash kernel, which is faster only on longer ones (measured).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from operator import getitem
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import make_fx

from ..errors import InternalError, node_location, with_location
from ..ir.checks import bounds_check, index_args, index_policy, indexed_write
from ..ir.gradops import bump_version
from ..ir.opfacts import OpKind, bind_args, facts, has_effect, is_view_node, may_raise, op_name
from ..ir.plan import alias_group_of
from ..ir.viewops import same_layout, surely, symbolic_layout
from .executor import torch_executor

aten = torch.ops.aten


@torch.library.custom_op("dealias::snapshot", mutates_args=())
def snapshot(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` made where the program made `t`: inductor cannot move it past a later write."""
    return t.clone()


@snapshot.register_fake
def _(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t)


@snapshot.register_autograd
def _(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    return grad  # (a copy: fused_autograd keeps a clone of an input as one, for what backward saves)


_SNAPSHOT = torch.ops.dealias.snapshot.default

# Ops inductor generates slower code for than ATen's kernel on this machine (`python bench/keep_aten.py`: each op
# alone on 1M floats; on the list when inductor/ATen >= 1.15 at 1 and 2 threads). Measured 2026-12-02 (an AVX-512
# host, where ATen's transcendental kernels are MKL's and inductor's are Sleef's): tanh 3.4-3.7, atan 2.5-2.6,
# log 2.0-2.3, gelu 1.7-2.1, asin 1.6-1.7, exp 1.4-1.75, softmax 1.16-1.21; every other op measured (unary ops,
# log_softmax, layer_norm, sum) below the threshold at some thread count. The list depends on the host: on the
# previous one only gelu and digamma were on it. Each is handed to inductor as an opaque twin that calls the ATen
# op, so inductor runs ATen's kernel for it (bit-equal to eager) and fuses the ops around it; only on tensors of
# KEEP_ATEN_MIN_NUMEL elements or more: on small ones a kernel of its own costs more than it saves (the
# decoder_step workload, MLP width 1024: 0.99x eager with ATen's gelu, 0.71x with inductor's).
KEEP_ATEN = tuple(getattr(aten, name).default for name in ("tanh", "atan", "log", "gelu", "asin", "exp", "_softmax"))
KEEP_ATEN_MIN_NUMEL = 1 << 16
_LIB = torch.library.Library("dealias", "FRAGMENT")


def _aten_twin(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    """`dealias::aten_<name>`, with `op`'s schema and `op` as its kernel (for fake tensors too)."""
    name = f"aten_{op_name(op)}"
    _LIB.define(f"{name}{str(op._schema)[len(op._schema.name) :]}")
    _LIB.impl(name, op, "CompositeExplicitAutograd")
    return getattr(torch.ops.dealias, name).default


_TWINS = {op: _aten_twin(op) for op in KEEP_ATEN}


def unfusable(gm: fx.GraphModule) -> str | None:
    """Why the fused executor cannot run `gm` exactly, or None. "autograd records the graph" is returned only
    when no other reason holds (`fused_autograd_executor` can run such a graph)."""
    records = False
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            if alias_group_of(n) is not None:
                return "inputs share memory (an alias group)"
            val = n.meta.get("val")
            if not isinstance(val, (torch.Tensor, torch.SymInt)):
                return f"a symbolic {type(val).__name__} input"
        if n.op != "call_function":
            continue
        records = records or bool(n.meta.get("rg"))  # (without it, grad mode switches change nothing)
        op = n.target
        if isinstance(op, torch._ops.OpOverload) and facts(op).nondeterministic and not _no_dropout(n):
            return f"{op} draws random numbers (inductor's generator is not eager's)"
        if not isinstance(op, torch._ops.OpOverload) and has_effect(op) and not _in_prologue(n):
            return f"{op_name(op)} runs in Python"
    return AUTOGRAD if records else None


AUTOGRAD = "autograd records the graph"


def _no_dropout(n: fx.Node) -> bool:
    """An op tagged random only for its dropout, called without it (attention with `dropout_p=0.0`)."""
    p = bind_args(n.target._schema, n.args, n.kwargs, defaults=True).get("dropout_p")
    return p is not None and p == 0


def _scatter(op: Any) -> bool:
    """A functional op computing its first argument with some elements replaced (`slice_scatter`, `index_put`,
    dealias's `as_strided_scatter_rel`), which inductor may run in place."""
    name = op_name(op)
    return name.endswith("scatter") or name.endswith("scatter_rel") or name in ("index_put", "index_copy")


def _in_prologue(n: fx.Node) -> bool:
    """Python steps of a graph that run before its compiled call: index bounds checks, and version bumps
    (`x.copy_(x)`: with no autograd recording in the graph, when the bump happens inside the call is not
    observable)."""
    return _is_bounds_check(n) or n.target is bump_version


def _is_bounds_check(n: fx.Node) -> bool:
    return getattr(n.target, "__name__", "") == "check_index_bounds"


class Unfusable(Exception):
    """The lowered graph holds what the fused executor cannot run exactly; the torch executor runs it."""


def _prologue(gm: fx.GraphModule, autograd: bool = False) -> Callable[[tuple[Any, ...]], tuple[Any, ...]] | None:
    """The graph's Python steps (`_in_prologue`), taken out of it, as one function of the call's inputs (None if
    it has none). An index computed inside the graph (`torch.arange(n) + self.cumulative_length`, as HF's static
    cache computes its write position) is computed there too, before any write, and becomes an input of the graph
    (`_Hoisted`): the function returns the values of those inputs, to pass after the call's own. `autograd`: for a
    functional graph AOTAutograd compiles (fused_autograd.py): its scatters are AOTAutograd's to run, its version
    bumps stay in it (where they happen is observable there), and only index reads are checked."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    hoisted = _Hoisted(gm, placeholders)
    reads = _reads(gm)
    checks: list[tuple[Any, int, tuple[Any, ...]]] = []  # (check, index input, (size, dim))
    sized: list[tuple[Any, int, tuple[int, int | None], int]] = []  # (check, index input, (input, its dim), dim)
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and _scatter(n.target) and not autograd and not _into_fresh_memory(n, reads):
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
        if n.op != "call_function" or not _in_prologue(n):
            continue
        if n.target is bump_version:
            if autograd:
                continue
            if n.args[0] not in placeholders:
                raise Unfusable("a version bump of a tensor made inside the graph")
            checks.append((n.target, placeholders.index(n.args[0]), ()))
        else:
            index, size, dim = n.args
            i, of = hoisted.position(index), _size_of(size, placeholders)
            if of is None:
                checks.append((n.target, i, (size, dim)))
            else:
                sized.append((n.target, i, of, dim))
        gm.graph.erase_node(n)
    compute = hoisted.finish()

    if not checks and not sized:
        return None

    def prologue(args: tuple[Any, ...]) -> tuple[Any, ...]:
        extra = compute(*args) if compute is not None else ()
        args = (*args, *extra)
        for fn, i, rest in checks:
            fn(args[i], *rest)
        for fn, i, (t, d), dim in sized:  # (against a symbolic size: the call's input `t` has it, or is it)
            fn(args[i], args[t] if d is None else args[t].shape[d], dim)
        return extra

    return prologue


class _Hoisted:
    """Indices computed inside the graph, computed before its call instead, and handed to it as inputs after the
    call's own. Only an index computed by pure ops from memory no earlier write of the graph touched: computed
    first, it has the value the program gives it. A view of a caller's tensor is copied (the graph must not see
    the caller's memory as two inputs)."""

    def __init__(self, gm: fx.GraphModule, placeholders: list[fx.Node]) -> None:
        self.gm, self.placeholders = gm, placeholders
        self.indices: list[fx.Node] = []  # in the order of their inputs

    @functools.cached_property
    def _order(self) -> dict[fx.Node, int]:
        return {n: i for i, n in enumerate(self.gm.graph.nodes)}

    @functools.cached_property
    def _memory(self) -> tuple[list[tuple[fx.Node, fx.Node]], dict[fx.Node, fx.Node]]:
        return _memory(self.gm)

    def position(self, index: fx.Node) -> int:
        """The input position of `index` in the call's inputs followed by the hoisted ones."""
        if index in self.placeholders:
            return self.placeholders.index(index)
        if index not in self.indices:
            self._cone(index)  # (raises Unfusable)
            self.indices.append(index)
        return len(self.placeholders) + self.indices.index(index)

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
        graph, env = fx.Graph(), {}
        for ph in self.placeholders:
            env[ph] = graph.placeholder(ph.name)
            env[ph].meta = dict(ph.meta)  # (fake values: what torch_executor checks a method call against)
        cone = sorted(set().union(*(self._cone(i) for i in self.indices)), key=self._order.__getitem__)
        for n in cone:
            env[n] = graph.node_copy(n, env.__getitem__)
        root = self._memory[1]
        outs = [graph.call_function(aten.clone.default, (env[i],)) if i in root else env[i] for i in self.indices]
        graph.output(tuple(outs))
        # (Run as the torch executor runs a graph: Tensor methods where they are the same aten overloads, whose
        # calls cost half of an OpOverload's: HF's four layers' positions took 33 us a call as aten calls.)
        compute = torch_executor(fx.GraphModule(self.gm, graph), grad=False)
        for i in self.indices:  # (placeholders come first: each new one after the last)
            last = self.gm.graph.find_nodes(op="placeholder")
            where = self.gm.graph.inserting_after(last[-1]) if last else self.gm.graph.inserting_before()
            with where:
                ph = self.gm.graph.placeholder(f"{i.name}_computed_first")
            ph.meta = dict(i.meta)
            i.replace_all_uses_with(ph)
        for n in reversed(cone):
            if not n.users:
                self.gm.graph.erase_node(n)

        def run(*args: Any) -> tuple[Any, ...]:
            grad = torch.is_grad_enabled()
            torch._C._set_grad_enabled(False)  # (nothing in the fused graph records autograd: `unfusable`)
            try:
                return compute(*args)
            finally:
                torch._C._set_grad_enabled(grad)

        return run


def _like(val: torch.Tensor, example: list[Any]) -> torch.Tensor:
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
    while is_view_node(n) or (n.op == "call_function" and _scatter(n.target)):
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
        out.append((bounds_check(index_policy(n, index, negative), where), hoisted.position(index), (size, dim)))
    return out


def _reads(gm: fx.GraphModule) -> dict[fx.Node, frozenset[fx.Node]]:
    """For each node, the placeholders whose memory its value may be computed from when inductor recomputes
    it at a use: through views and through values it may inline (anything but a snapshot)."""
    reads: dict[fx.Node, frozenset[fx.Node]] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            reads[n] = frozenset([n])
        elif n.op == "call_function" and n.target is not _SNAPSHOT:
            reads[n] = frozenset().union(*(reads.get(a, frozenset()) for a in n.all_input_nodes))
        else:
            reads[n] = frozenset()
    return reads


def _writes(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node]]:
    """(write, placeholder written) for each op writing a caller's memory, in program order."""
    return _memory(gm)[0]


def _memory(gm: fx.GraphModule) -> tuple[list[tuple[fx.Node, fx.Node]], dict[fx.Node, fx.Node]]:
    """The writes (see `_writes`), and the placeholder whose memory each alias (view, in-place result) is."""
    root: dict[fx.Node, fx.Node] = {}
    out = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            root[n] = n
        elif is_view_node(n) and n.args[0] in root:
            root[n] = root[n.args[0]]
        elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            for name in facts(n.target).mutated:
                arg = _arg(n, name)
                if arg is None:
                    continue
                if arg not in root:  # an attribute (inductor takes those for constants), or a decomposition's buffer
                    raise Unfusable(f"{n.target} writes {arg.name}, not an input of the graph")
                out.append((n, root[arg]))
                if _returns_written(n):
                    root[n] = root[arg]
    return out, root


def _returns_written(n: fx.Node) -> bool:
    """An in-place op returning the tensor it wrote (`copy_`, `index_put_`): its result is that memory."""
    return isinstance(n.target, torch._ops.OpOverload) and facts(n.target).kind is OpKind.INPLACE


def _alias(n: fx.Node) -> bool:
    return is_view_node(n) or _returns_written(n)


def _arg(n: fx.Node, name: str) -> fx.Node | None:
    v = bind_args(n.target._schema, n.args, n.kwargs).get(name)
    return v if isinstance(v, fx.Node) else None


def hazards(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node, bool]]:
    """(value, write, at_write): a value computed, not viewed, from a caller's memory before a write to that memory and
    used after it; or the write's own source, when it reads that memory anywhere but at the elements each
    element of the write receives (`x[1:] = x[:-1]`: one kernel would read what it already wrote; `at_write`)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    reads = _reads(gm)
    writes, root = _memory(gm)
    found = []
    for w, m in writes:
        for n in gm.graph.nodes:
            if order[n] >= order[w]:
                break
            if n.op != "call_function" or _alias(n) or n.target is _SNAPSHOT or m not in reads[n]:
                continue
            if any(order[u] > order[w] for u in n.users):
                found.append((n, w, False))
        written = _arg(w, facts(w.target).mutated[0])
        for a in w.all_input_nodes:
            if a is written or m not in reads[a]:
                continue
            if w.target is not aten.copy_.default or not _aligned(a, written.meta["val"], m, reads, root):
                found.append((a, w, True))
    for n in gm.graph.nodes:  # a functional scatter of a caller's memory from a decomposition: inductor may
        if n.op == "call_function" and _scatter(n.target) and n.args and n.args[0] in root:  # run it in place
            m = root[n.args[0]]
            found += [(a, n, True) for a in n.all_input_nodes if a is not n.args[0] and m in reads[a]]
    return found


# Layouts and shapes are compared for every value of the program's symbols (`surely`): a comparison that held only
# for the compiling call would add a guard to the program, or decide for calls it does not hold for.
def _same_layout(a: fx.Node, b: fx.Node) -> bool:
    return same_layout(a.meta["val"], b.meta["val"])


def _same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dim() == b.dim() and all(surely(x == y) for x, y in zip(a.shape, b.shape))


def _aligned(
    n: fx.Node, layout: torch.Tensor, m: fx.Node, reads: dict[fx.Node, frozenset[fx.Node]], root: dict
) -> bool:
    """Whether each element of `n` reads memory `m` only at the element of `layout` (the written region's value)
    it is stored to: `n` is a view of `m` laid out as the written region, or an elementwise op (no broadcast of
    such a read) of such."""
    if root.get(n) is m:
        return same_layout(n.meta["val"], layout)
    if m not in reads[n]:
        return True
    op = n.target
    if op is aten.copy.default:  # functional setitem: the values of its source, in its first argument's layout
        inputs = [n.args[1]]
    elif op is aten._to_copy.default or (isinstance(op, torch._ops.OpOverload) and torch.Tag.pointwise in op.tags):
        inputs = n.all_input_nodes
    else:
        return False
    return all(
        m not in reads[a] or (_same_shape(a.meta["val"], n.meta["val"]) and _aligned(a, layout, m, reads, root))
        for a in inputs
        if isinstance(a, fx.Node)
    )


def merge_full_writes(gm: fx.GraphModule) -> int:
    """A caller's tensor written whole twice (`v.mul_(b2).addcmul_(g, g)`) gets one store of its final value:
    reads of the memory between the two writes read the first value instead, and the first store goes.
    Only when every such read is of the whole tensor by an op that computes (not a view, not a write).
    Returns how many stores were removed."""
    removed = 0
    changed = True
    while changed:
        changed = False
        writes, root = _memory(gm)
        nodes = list(gm.graph.nodes)
        order = {n: i for i, n in enumerate(nodes)}
        per_memory: dict[fx.Node, list[fx.Node]] = {}
        for w, m in writes:
            per_memory.setdefault(m, []).append(w)
        # Successive writes of one memory (writes of other tensors may come between: an optimizer updates a
        # parameter, then its moments, then the parameter again).
        pairs = [(w1, w2, m) for m, ws in per_memory.items() for w1, w2 in zip(ws, ws[1:])]
        for w1, w2, m1 in pairs:
            if not (_stores_whole(w1, m1) and _stores_whole(w2, m1)):
                continue
            between = nodes[order[w1] + 1 : order[w2]]
            readers = [n for n in between if any(root.get(a) is m1 for a in n.all_input_nodes)]
            if any(_alias(n) or n.op != "call_function" for n in readers):
                continue
            if not all(_same_layout(a, m1) for n in readers for a in n.all_input_nodes if root.get(a) is m1):
                continue
            value = w1.args[1]
            for n in readers:
                for a in [a for a in n.all_input_nodes if root.get(a) is m1]:
                    n.replace_input_with(a, value)
            w1.replace_all_uses_with(w1.args[0])
            gm.graph.erase_node(w1)
            removed += 1
            changed = True
            break
    return removed


def _stores_whole(w: fx.Node, m: fx.Node) -> bool:
    """`w` copies a value of `m`'s dtype and shape over all of `m`."""
    if w.target is not aten.copy_.default:
        return False
    dst, src = w.args[0].meta["val"], w.args[1].meta["val"]
    return _same_layout(w.args[0], m) and src.dtype == dst.dtype and _same_shape(src, dst)


def insert_snapshots(gm: fx.GraphModule) -> int:
    """Remove each hazard: a value stored whole by the write it precedes (`m.copy_(m * b + g)`, then `m * b +
    g` read again) is read back from where it was stored, when nothing writes there later; any other is
    materialized where the program computed it. Returns how many snapshots were inserted."""
    count = 0
    while found := hazards(gm):
        value, write, at_write = found[0]
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        later = [u for u in value.users if order[u] > order[write]]
        if not at_write and _stored_whole(gm, value, write) and all(u.op != "output" for u in later):
            for u in later:
                u.replace_input_with(value, write.args[0])
            continue
        with gm.graph.inserting_after(value):
            snap = gm.graph.call_function(_SNAPSHOT, (value,))
        snap.meta["val"] = value.meta.get("val")
        value.replace_all_uses_with(snap, delete_user_cb=lambda u, s=snap: u is not s)
        count += 1
    return count


def _stored_whole(gm: fx.GraphModule, value: fx.Node, write: fx.Node) -> bool:
    """`write` copies all of `value`, unconverted, into memory no later op writes."""
    if write.target is not aten.copy_.default or write.args[1] is not value:
        return False
    dst, src = write.args[0].meta["val"], value.meta["val"]
    if not _same_shape(dst, src) or dst.dtype != src.dtype:
        return False
    writes = _writes(gm)
    root = next(m for w, m in writes if w is write)
    after = False
    for w, m in writes:
        if after and m is root:
            return False
        after = after or w is write
    return True


def check_hazards(gm: fx.GraphModule) -> None:
    """The invariant the fused executor relies on (see the module's docstring)."""
    found = hazards(gm)
    if found:
        value, write, _ = found[0]
        raise InternalError(f"fused graph reads {value.name} after {write.name} overwrote the memory it came from")


def fused_executor(gm: fx.GraphModule, example: list[Any]) -> Callable[..., Any]:
    """Compile the lowered graph `gm` (called with tensors like `example`) with inductor. Raises Unfusable."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table

    result_layouts(gm)  # (raises Unfusable before inductor's compile, not after)
    prologue = _prologue(gm)
    example = [
        *example,
        *(_like(ph.meta["val"], example) for ph in gm.graph.find_nodes(op="placeholder")[len(example) :]),
    ]
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in _TWINS and surely(n.meta["val"].numel() >= KEEP_ATEN_MIN_NUMEL):
            n.target = _TWINS[n.target]
        if _short_attention(n):
            n.target = _attention_by_matmuls
    gm.recompile()
    # Inductor's own decompositions (index_copy_ -> index_put_, ...), dealias's helpers traced to aten ops; each
    # node keeps the user's source line.
    with fx.traceback.preserve_node_meta(), torch.no_grad():  # nothing records autograd (`unfusable`)
        interpret = lambda *args: fx.Interpreter(gm).run(*args)  # noqa: E731
        traced = make_fx(interpret, decomposition_table=select_decomp_table(), tracing_mode="fake")(*example)
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    for ph, name in zip(traced.graph.find_nodes(op="placeholder"), names):
        ph.name = ph.target = name
    if any(n.target is aten.view.dtype for n in traced.graph.nodes):
        # Inductor writes through an integer view of float memory as a float store of the converted integer.
        raise Unfusable("a dtype view (x.view(torch.int32))")
    if any(n.target is aten.as_strided.default for n in traced.graph.nodes):
        # Its storage offset is absolute: traced from one call's placement, it would be baked into the kernels,
        # while a program serves every placement of its inputs.
        raise Unfusable("an as_strided view (its storage offset is absolute)")
    # Inductor's kernels write the caller's tensors through pointers, which moves no version counter: the call
    # moves each written one itself, or what autograd saved of it before would be read as if unchanged.
    traced_inputs = traced.graph.find_nodes(op="placeholder")
    written = tuple(sorted({traced_inputs.index(ph) for _, ph in _writes(traced)}))  # (only inputs are written)
    merge_full_writes(traced)
    insert_snapshots(traced)
    check_hazards(traced)
    traced.recompile()
    handed = copy.deepcopy(traced)  # inductor's passes rewrite the graph they are given (no-op clones go)
    try:
        # No size/stride asserts in inductor's wrapper: every call's inputs have the traced sizes and strides (dynamo's
        # guards or the cache entry's tensor check held before the program runs).
        with torch._inductor.config.patch(size_asserts=False):
            compiled = compile_fx_inner(traced, list(example))
    except Exception as e:  # noqa: BLE001 - an op inductor cannot compile: the torch executor runs the graph
        raise Unfusable(f"inductor could not compile it: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    run = runner(gm, compiled, prologue, written=written)
    run.graph = handed  # type: ignore[attr-defined]  # what inductor was given: for traces and tests
    return run


# Attention a few queries long over a short key sequence (a decode step) runs faster as inductor's matmuls and
# softmax than as ATen's flash kernel for CPU: 0.89x at 1 query over 1,024 keys, but 1.16-3.2x at 4,096 keys
# (measured: 16 heads of 64, 1 and 2 threads). Longer ones keep the flash kernel.
SHORT_ATTENTION_KEYS = 1024
SHORT_ATTENTION_QUERIES = 16
_FLASH_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default


def _short_attention(n: fx.Node) -> bool:
    """A flash attention call short enough to run by matmuls, whose logsumexp (for backward) nobody reads."""
    if n.op != "call_function" or n.target is not _FLASH_CPU:
        return False
    q, k = n.args[0].meta["val"], n.args[1].meta["val"]
    used = all(u.target is getitem and u.args[1] == 0 for u in n.users)
    return used and surely(q.shape[-2] <= SHORT_ATTENTION_QUERIES) and surely(k.shape[-2] <= SHORT_ATTENTION_KEYS)


def _attention_by_matmuls(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The flash kernel's result computed by torch's own decomposition of it (matmuls, softmax), which make_fx
    traces into the graph inductor fuses. Its second result is not the logsumexp (`_short_attention`: unread)."""
    return torch._decomp.decomposition_table[_FLASH_CPU](*args, **kwargs)


def runner(
    gm: fx.GraphModule,
    compiled: Any,
    prologue: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None,
    autograd: bool = False,
    written: tuple[int, ...] = (),
) -> Callable[..., Any]:
    """The call of a compiled graph: prologue (its checks, and the inputs it computes), inductor's callable (without
    autograd, unless it is AOTAutograd's and records it), the version counters of the inputs it wrote (`written`)
    moved, results in eager's layout and in memory of their own."""
    layouts, dense = result_layouts(gm)
    out_node = gm.graph.output_node()
    # Results the graph computes (not an input or a view of one) that came back in an input's memory are copied too:
    # inductor simplifies `ones * x` to `x`, and AOTAutograd then returns x's memory, as a view of x (fuzz seed
    # 995738: `v = x.new_ones(..); v.mul_(x); return v`; torch.compile returns it so). Learned on the first call
    # (for a result of symbolic sizes, on the first call it is not empty: which memory inductor returns for it is
    # decided when it compiles, not by the sizes).
    made = {i for i, a in enumerate(out_node.args[0]) if isinstance(a, fx.Node) and _made_by_the_graph(a)}
    # call: None until the first call returned; restride: (result, sizes, strides) to copy into; copied: results of
    # symbolic sizes that come back in an input's memory; pending: those not yet seen non-empty.
    state: dict[str, Any] = {"call": None, "restride": layouts, "copied": set(), "pending": made.intersection(dense)}

    def restrided(outs: list[Any]) -> Any:
        fixed = list(outs)
        for i, shape, stride in state["restride"]:  # (only results whose layout differs, since the first call)
            t = fixed[i]
            fixed[i] = torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device).copy_(t)
        for i in dense:
            t = fixed[i]
            if i in state["copied"] or not t.is_contiguous():
                fixed[i] = t.clone(memory_format=torch.contiguous_format)
        return tuple(fixed)

    def inputs_memory(args: Any) -> set[int]:
        return {a.untyped_storage()._cdata for a in args if isinstance(a, torch.Tensor)}

    def first(outs: list[Any], args: Any) -> None:
        inputs = inputs_memory(args)
        state["restride"] = [
            (i, shape, stride)
            for i, shape, stride in layouts
            if any(n > 1 and a != b for n, a, b in zip(shape, outs[i].stride(), stride))
            or i in made
            and outs[i].numel()
            and outs[i].untyped_storage()._cdata in inputs
        ]
        # After its first call (which ends inductor's autotune-cache bundling), the compiled graph's callable is
        # called directly: its wrapper only adds profiler labels and run-time metrics. (A graph without kernels
        # comes back as a plain function.)
        state["call"] = compiled if autograd else getattr(compiled, "current_callable", None) or compiled

    def learn(outs: list[Any], args: Any) -> None:
        inputs = inputs_memory(args)
        for i in [i for i in state["pending"] if outs[i].numel()]:
            state["pending"].discard(i)
            if outs[i].untyped_storage()._cdata in inputs:
                state["copied"].add(i)

    def run(*args: Any) -> Any:
        if autograd:
            outs = compiled(args)
            if state["call"] is None:
                first(outs, args)
            if state["pending"]:
                learn(outs, args)
            return restrided(outs) if state["restride"] or dense else tuple(outs)
        if prologue is not None:
            args = (*args, *prologue(args))
        # Autograd records nothing here (`unfusable`), but the aten kernels inductor falls back to would record
        # on inputs that require grad, through the detach() its decompositions dropped.
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        call = state["call"]
        try:
            outs = (call or compiled)(list(args))
        finally:
            torch._C._set_grad_enabled(grad)
        if written:
            # Once per call, however many writes eager made (what autograd checks is only whether it moved).
            torch._C._increment_version(tuple(args[i] for i in written))
        if call is None:
            first(outs, args)
        if state["pending"]:
            learn(outs, args)
        return restrided(outs) if state["restride"] or dense else tuple(outs)

    return run


def result_layouts(gm: fx.GraphModule) -> tuple[list[tuple[int, tuple[int, ...], tuple[int, ...]]], list[int]]:
    """Eager's layout of each result, from the lowered graph (inductor's decompositions may change it: a constant
    came back as an expanded tensor, strides (0, 1, 0)): (result, sizes, strides) for those of static sizes, and
    the results of symbolic sizes, each dense. A result of static sizes comes back from inductor in the same
    layout on every call, so whether it must be restrided is learned on its first call; one of symbolic sizes
    (its layout a function of the call's symbols) is checked on each call, which only a dense one can be cheaply:
    Unfusable for any other."""
    layouts, dense = [], []
    for i, a in enumerate(gm.graph.output_node().args[0]):
        if not isinstance(a, fx.Node) or not isinstance(v := a.meta.get("val"), torch.Tensor):
            continue
        if not symbolic_layout(v):
            layouts.append((i, tuple(v.shape), tuple(v.stride())))
        elif _surely_dense(v):
            dense.append(i)
        else:
            raise Unfusable(f"result {i} has symbolic sizes and a layout other than a dense one")
    return layouts, dense


def _surely_dense(t: torch.Tensor) -> bool:
    """Whether `t` is contiguous for every value of its symbols (as `is_contiguous()`: dims of size 1 aside)."""
    expected: Any = 1
    for n, st in reversed(list(zip(t.shape, t.stride()))):
        if not (surely(n == 1) or surely(st == expected)):
            return False
        expected = expected * n
    return True


def _made_by_the_graph(n: fx.Node) -> bool:
    """Whether the graph result `n` is memory the graph makes: not an input nor a view of one."""
    while is_view_node(n) and isinstance(n.args[0], fx.Node):
        n = n.args[0]
    return n.op != "placeholder"
