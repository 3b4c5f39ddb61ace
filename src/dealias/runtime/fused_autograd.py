"""The fused executor for a graph autograd records (BatchNorm training with parameters that require grad).

Such a graph (`fused_autograd_executor`) is not lowered: its functional graph, write-backs done by the epilogue
after it as on the torch executor, goes to inductor through AOTAutograd, which partitions it into a forward and a
backward. The partition is inductor's min-cut one (inputs eager does not save saved as copies), or AOTAutograd's
default one (the forward saves what the graph computed, nothing is recomputed from inputs) if the min-cut one
saves an input the epilogue then writes into, and the graph is refused if both do: eager saved the value before
its write, and a saved caller tensor written afterwards would make backward raise "modified by an inplace
operation" where eager does not.

AOTAutograd's compiled graph has one backward node for all its results, where eager has one per op, and its
backward is not differentiable again; the rules below give eager's behaviour at backward anyway: which inputs
get no gradient, which saved results make backward raise after a write, how a backward with create_graph=True
is recomputed with eager's ops (double_backward.py).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from operator import attrgetter, getitem
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

from ..compat.graph_cache import graph_cache, key_config
from ..compat.inductor import dealias_compile, layout_options, no_donated_buffers, size_asserts
from ..compat.internals import function_apply
from ..compat.vec_isa import vec_isa_config
from ..errors import InternalError, node_location, with_location
from ..ir.checks import is_bounds_check
from ..ir.gradops import overwritten, rewritten
from ..ir.opfacts import bind_args, is_view_node, may_raise, op_name
from ..ir.viewops import same_layout, surely
from ..passes.writeback_autograd import eager_updates_in_place
from .conv_layout import channels_last, one_by_one_as_matmuls
from .double_backward import (
    TwiceDifferentiable,
    double_backward_of_its_own,
    on_backward_node,
    separate_parts,
    version_positions,
    written_inputs_read,
)
from .fused import made_by_the_graph, picker, runner
from .grad_modes import switch_grad_modes
from .graph_order import views_after_their_source
from .hazards import SNAPSHOT, Unfusable
from .inductor_fixes import decompositions
from .kernel_checks import refuse_raising
from .partition import partition_saving_no_written_input
from .prologue import make_prologue, sizes_arithmetic

aten = torch.ops.aten


def _clones_of_inputs_kept(gm: fx.GraphModule) -> fx.GraphModule:
    """The copy of `gm` handed to AOTAutograd: its clones of inputs (or of views of them) are `dealias::snapshot`s,
    which AOTAutograd and inductor keep. Inductor removes a clone as a no-op, and an op that saves its argument for
    backward then saves the caller's tensor where eager's saves the clone (`v = x.clone(); v.sin_()`): a write of x
    after the call made backward raise where eager's does not (fuzz seed 996264)."""
    out = copy.deepcopy(gm)
    _overwrites_as_where(out.graph)
    # An intermediate eager updated in place is updated in place again, so that AOTAutograd records eager's op
    # (`leaky_relu_`'s backward reads its result, `leaky_relu`'s its input: a GAN discriminator's forward saved each
    # pre-activation beside its activation). Only here: the prologue and the double backward read the graph as is.
    eager_updates_in_place(out.graph)
    for n in out.graph.nodes:
        if n.op != "call_function" or n.target is not aten.clone.default:
            continue
        if n.kwargs.get("memory_format") not in (None, torch.preserve_format):
            continue  # (a layout change: not a plain copy, and inductor keeps it)
        source = n.args[0]
        while is_view_node(source) and isinstance(source.args[0], fx.Node):
            source = source.args[0]
        if source.op == "placeholder":
            n.target, n.kwargs = SNAPSHOT, {}
    _views_of_intermediates_as_reshapes(out)
    _input_views_per_use(out)
    views_after_their_source(out)  # (inductor lowers in graph order: graph_order.py)
    out.recompile()
    return out


def _as_where(n: fx.Node) -> bool:
    """Whether the node `n`, `gradops.overwritten(old, new)` or `rewritten(old, new)`, computes what
    `where(False, old, new)` does (a 0-d False condition), which the graph handed to AOTAutograd then computes
    instead: AOTAutograd cannot trace the Python Function. `where`'s values are new's bit for bit, its backward
    gives old `where(False, grad, 0)`, zeros of +0.0 as the Function's `zeros_like(grad)`, and new `grad` itself,
    as the Function does where it is applied: with grad on at the node, old requiring grad, and new requiring grad
    for `rewritten`, not for `overwritten` (elsewhere the Function returns new, and old gets no zero gradient).
    Its result must also have the node's layout: `where` lays it out by old's strides first (TensorIterator), the
    Function as new (a view of it), and later views and the results are made for that one."""
    if n.op != "call_function" or (n.target is not overwritten and n.target is not rewritten):
        return False
    if len(n.args) != 2 or n.kwargs or not all(isinstance(a, fx.Node) for a in n.args):
        return False
    old, new = n.args
    new_rg = n.target is rewritten  # (whether new requires grad where the Function is applied)
    if n.meta.get("grad") is not True or not old.meta.get("rg") or bool(new.meta.get("rg")) != new_rg:
        return False  # (the mode the node is traced in: grad_modes.py, from meta "grad")
    o, w, v = old.meta.get("val"), new.meta.get("val"), n.meta.get("val")
    if not all(isinstance(t, FakeTensor) for t in (o, w, v)) or o.fake_mode is not w.fake_mode:
        return False
    if o.dtype != w.dtype or o.device != w.device or o.dim() != w.dim():
        return False
    if not all(surely(a == b) for a, b in zip(o.shape, w.shape)):
        return False
    with o.fake_mode:
        out = aten.where.self(aten.full.default([], False, dtype=torch.bool, device=w.device), o, w)
    return same_layout(out, v)


def _overwrites_as_where(graph: fx.Graph) -> None:
    """Each `overwritten` / `rewritten` node that `where(False, old, new)` computes (_as_where) replaced by it."""
    for n in list(graph.nodes):
        if n.op != "call_function" or not _as_where(n):
            continue
        old, new = n.args
        device = new.meta["val"].device
        with graph.inserting_before(n):
            false = graph.call_function(aten.full.default, ([], False), {"dtype": torch.bool, "device": device})
            where = graph.call_function(aten.where.self, (false, old, new))
        with new.meta["val"].fake_mode:
            false.meta = {"val": aten.full.default([], False, dtype=torch.bool, device=device), "rg": False}
        false.meta["grad"] = True
        where.meta = dict(n.meta)  # (its value, grad mode and requires_grad: _as_where checked they are where's)
        n.replace_all_uses_with(where)
        graph.erase_node(n)


def _input_views_per_use(gm: fx.GraphModule) -> None:
    """A view of an input read by several ops becomes one view per op, as eager makes them (a weight two `linear`s
    read: one `t` each; the capture's common-subexpression pass made one of them). Autograd then sums the ops'
    gradients of the input itself, where inductor computes each weight gradient's product into one `addmm`, rather
    than summing them through the shared view and transposing the sum (a GAN discriminator's backward)."""
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or not is_view_node(n) or not isinstance(n.args[0], fx.Node):
            continue
        if n.args[0].op != "placeholder" or len(n.users) < 2:
            continue
        for user in list(n.users)[1:]:
            with gm.graph.inserting_before(user):
                twin = gm.graph.call_function(n.target, n.args, dict(n.kwargs))
            twin.meta = dict(n.meta)
            user.replace_input_with(n, twin)


def _views_of_intermediates_as_reshapes(gm: fx.GraphModule) -> None:
    """`view` of a tensor the graph computed becomes `reshape`. The capture chose a view where eager's layout of
    that tensor allowed one; AOTAutograd traces the graph again with inductor's decompositions, which may lay it
    out otherwise (HF's T5 attention: `view` of a transposed product, 'Cannot view a tensor with shape ...'), and
    a reshape is that view wherever one exists. Nothing writes through an intermediate's view in a functional
    graph, so a copy changes no value; views of inputs, whose layouts are the caller's, stay views."""
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not aten.view.default:
            continue
        source = n.args[0]
        while is_view_node(source) and isinstance(source.args[0], fx.Node):
            source = source.args[0]
        if source.op != "placeholder":
            n.target = aten.reshape.default


def fused_autograd_executor(
    gm: fx.GraphModule,
    example: list[Any],
    written: frozenset[int],
    call: list[Any] | None = None,
    viewed: frozenset[int] = frozenset(),
) -> Callable[..., Any]:
    """Compile the functional graph `gm`, which autograd records, with AOTAutograd and inductor, for `example`
    (the call's tensors; for a program over symbols, the capture's fake tensors and symbols, and `call` the call's
    own inputs, which a run on copies needs); `written`: the placeholders written, by the epilogue after the graph
    or by a `copy_` at the graph's end (which AOTAutograd keeps in the compiled graph); `viewed`: the results the
    call returns only as views made with grad on (returned_as_views_only). Raises Unfusable."""
    if any(isinstance(example[i], torch.Tensor) and example[i].requires_grad for i in written):
        raise Unfusable("an input that requires grad is written (a double backward could not recompute from it)")
    refuse_raising(gm, example)  # (eager's checks of dtypes, sizes, devices fake tensors skip: kernel_checks.py)
    _refuse_raising_backward(gm)
    symbolic = any(isinstance(a, FakeTensor) for a in example)
    constants: tuple[torch.Tensor, ...] = ()  # passed after the call's inputs on every call
    if gm.graph.find_nodes(op="get_attr"):
        gm, lifted = _constants_as_inputs(gm)
        constants = tuple(c for _, c in lifted)
        example = [*example, *(n.meta["val"] if symbolic else c for n, c in lifted)]
        call = None if call is None else [*call, *constants]
    prologue, hoisted = None, []
    if any(n.op == "call_function" and (may_raise(n.target) or is_bounds_check(n.target)) for n in gm.graph.nodes):
        # Inductor checks indices inside its kernels, with its own error: they are checked before the call
        # instead, with eager's (prologue.py; an index the graph computes is computed there too).
        gm = copy.deepcopy(gm)
        prologue = make_prologue(gm, autograd=True)
        if prologue is not None:
            try:
                computed = prologue(tuple(call if call is not None else example))
            except Exception as e:  # noqa: BLE001 - the compiling call's own error: it raises on the torch executor
                raise Unfusable(f"the compiling call's indices raise {type(e).__name__}") from None
            hoisted = gm.graph.find_nodes(op="placeholder")[len(example) :]
            example = [*example, *(ph.meta["val"] if symbolic else v for ph, v in zip(hoisted, computed))]
            call = None if call is None else [*call, *computed]
    sizes: list[tuple[int, int]] = []  # (input, dim) of each size symbol handed to the graph as an input
    if symbolic:
        gm, sizes = _size_symbols_as_inputs(gm, example)
        example = [*example, *(example[i].shape[d] for i, d in sizes)]
        call = None if call is None else [*call, *(call[i].shape[d] for i, d in sizes)]
    run = _compile(gm, example, written, call, viewed)
    if not constants and prologue is None and not sizes:
        return run
    if not constants and not sizes and not hoisted:
        # Only the prologue's checks, no input computed by it (a gather's index checked, DQN's loss): the call's own
        # arguments are the graph's (no tuple built twice per call, ~0.3 us).

        def checked(*args: Any) -> Any:
            prologue(args)
            return run(*args)

        checked.graph = run.graph  # type: ignore[attr-defined]
        return checked

    def with_inputs(*args: Any) -> Any:
        args = (*args, *constants)
        if prologue is not None:
            args = (*args, *prologue(args))
        return run(*args, *(args[i].shape[d] for i, d in sizes))

    with_inputs.graph = run.graph  # type: ignore[attr-defined]
    return with_inputs


# The in-place ops whose backward (eager's, reading their result) refuses a negative slope: "In-place leakyReLu
# backward calculation is triggered with a negative slope which is not supported" (elu's likewise), with the name of
# that argument. Inductor's decomposition of the backward computes a gradient instead.
_SLOPE_OF_RESULT_BACKWARD = {"leaky_relu_": "negative_slope", "elu_": "alpha", "celu_": "alpha"}


def _refuse_raising_backward(gm: fx.GraphModule) -> None:
    """Unfusable where eager's backward raises for the arguments of an op eager ran in place (functionalization's
    `eager_in_place`) on a tensor autograd records: the torch executor runs eager's op, whose backward raises."""
    for n in gm.graph.nodes:
        eager = n.meta.get("eager_in_place")
        slope = _SLOPE_OF_RESULT_BACKWARD.get(op_name(eager)) if isinstance(eager, torch._ops.OpOverload) else None
        if slope is None or not n.meta.get("rg", True) or not isinstance(n.target, torch._ops.OpOverload):
            continue
        value = bind_args(n.target._schema, n.args, n.kwargs, defaults=True).get(slope)
        if not isinstance(value, (int, float)) or value < 0:
            raise Unfusable(f"eager's backward of {op_name(eager)} raises for a negative {slope}")


def _compile(
    gm: fx.GraphModule, example: list[Any], written: frozenset[int], call: list[Any] | None, viewed: frozenset[int]
) -> Any:
    """`fused_autograd_executor` for a graph whose inputs are all passed by the caller."""
    from torch._inductor.compile_fx import compile_fx

    mode = torch.is_grad_enabled()  # the mode the program's calls enter with (keyed)
    switch_grad_modes(gm, mode)
    python = (getitem, torch._C._set_grad_enabled)  # (steps AOTAutograd runs as it traces)
    for n in gm.graph.nodes:
        if n.op == "call_function" and not isinstance(n.target, torch._ops.OpOverload) and n.target not in python:
            # (`s0 - 1`, which AOTAutograd traces through; gradops' overwrites, handed over as `where`)
            if not sizes_arithmetic(n) and not _as_where(n):
                raise Unfusable(f"{op_name(n.target)} runs in Python")
    handed = _without_input_writes(gm)  # (what a double backward recomputes, with eager's ops)
    with_grad = frozenset(  # (their gradients are converted back too: conv_layout.py measures the layout)
        ph
        for ph, a in zip(gm.graph.find_nodes(op="placeholder"), example)
        if isinstance(a, torch.Tensor) and a.requires_grad
    )
    layout = channels_last(gm, with_grad)  # (convolutions channels-last, or in eager's layout)
    handed.meta["channels_last"] = layout  # (for traces and tests)
    results = gm.graph.output_node().args[0]
    # (A result the passes did not mark is taken to require grad: an input it reads is then never handed over
    # detached below.)
    rg_results = [i for i, n in enumerate(results) if isinstance(n, fx.Node) and n.meta.get("rg", True)]
    for i in rg_results:
        after = _computed_from(results[i])
        if any(results[j] in after and results[j] is not results[i] for j in rg_results):
            # Eager's gradient of the other result flows through this one's tensor: a hook, retain_grad() or a
            # saved-tensor check on it sees that gradient (fuzz seeds 998771, 997491: `v1.register_hook(h)` after
            # `Ident.apply(v1 * 1)`; `v.sin()` saving v); the compiled graph computes the other result inside.
            raise Unfusable(f"result {i} requires grad and another result requiring grad is computed from it")
    # An input requiring grad that no result requiring grad is computed from is handed over detached: the compiled
    # backward would give it zeros, not nothing, and run the backward of what made it (fuzz seed 964016: a custom
    # Function's `g * 3 + x` for a zero g gave the leaf 31, not eager's 3, whose graph never reaches that node).
    reaching = _results_reaching_inputs(gm, rg_results)
    cut = frozenset(
        i for i, a in enumerate(example) if isinstance(a, torch.Tensor) and a.requires_grad and not reaching[i]
    )
    names = [ph.target for ph in gm.graph.find_nodes(op="placeholder")]
    _refuse_history_only_some_results_read(call if call is not None else example, names, reaching, rg_results, cut)
    example = [a.detach() if i in cut else a for i, a in enumerate(example)]
    call = example if call is None else [a.detach() if i in cut else a for i, a in enumerate(call)]
    try:
        partition = partition_saving_no_written_input(written, copy_saved_results=len(rg_results) > 1)
        options = {
            "size_asserts": size_asserts(gm),
            "custom_partitioner_fn": partition,
            **layout_options(layout, one_by_one_as_matmuls(gm, layout)),
        }
        with (
            torch._inductor.config.patch(options),
            no_donated_buffers(),
            torch.set_grad_enabled(mode),  # (back after a trace stopped between the graph's switches: grad_modes.py)
            dealias_compile(),
            graph_cache(list(example)) as handed_example,  # (AOTAutograd's and inductor's caches: graph_cache.py)
        ):
            compiled = compile_fx(
                _clones_of_inputs_kept(gm),
                handed_example,
                decompositions=decompositions(gm),  # (the host's verdict asked where it decides)
                config_patches={**key_config(), **vec_isa_config()},  # (the backward, compiled later, too)
            )
        # compile_fx hands back AOTAutograd's function inside a `torch._dynamo.disable` of its own (~3 us a call):
        # it is only ever called from a program dynamo already runs under its own disable.
        compiled = getattr(compiled, "_torchdynamo_orig_callable", compiled)
    except Exception as e:  # noqa: BLE001 - an op inductor cannot compile: the torch executor runs the graph
        cause = e
        while cause.__cause__ is not None and not isinstance(cause, Unfusable):
            cause = cause.__cause__
        if isinstance(cause, Unfusable):
            raise cause from None
        raise Unfusable(f"inductor could not compile it: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from e

    # Which inputs require grad is fixed per program (guarded), and so is the grad mode of its calls.
    builds_graph = any(isinstance(a, torch.Tensor) and a.requires_grad for a in example)
    if not builds_graph:  # (every input requiring grad is cut: compiled for them detached, called so)

        def detached(args: Any) -> Any:
            return compiled(*[a.detach() if i in cut else a for i, a in enumerate(args)])

        run = runner(gm, detached, None, autograd=True)
        run.graph = handed  # type: ignore[attr-defined]
        return run
    # The written inputs a result requiring grad is computed from: a double backward recomputes from copies taken
    # before the call writes them. Whether AOTAutograd's own Function takes the double backward (see
    # recompute_double_backward) is learned from a run on copies of the example inputs; else a TwiceDifferentiable.
    reads = written_inputs_read(gm, written)
    kept = tuple(frozenset().union(*(reads[i] for i in rg_results)))
    marked = [i for i in rg_results if results[i].meta.get("rg") is True]  # (a graph of the passes: all marked)
    own, first = double_backward_of_its_own(compiled, call, marked)
    parts = separate_parts(gm, rg_results)  # (their backwards apart, as eager's: a TwiceDifferentiable's)
    own = own and parts is None
    positions = version_positions(example, written)  # (their counters read in C on every call: no frame per call)
    pick, version = picker(positions), attrgetter("_version")
    watched = _results_eager_saves(results, rg_results)
    made = tuple(i for i, n in enumerate(results) if isinstance(n, fx.Node) and made_by_the_graph(n))
    # (every input requiring grad reached by every result: nothing to set to None. An input requiring no grad gets
    # None from the compiled backward already: BatchNorm's running statistics then cost no hook per call.)
    differentiable = [i for i, a in enumerate(example) if isinstance(a, torch.Tensor) and a.requires_grad]
    partly = None if all(reaching[i] == frozenset(rg_results) for i in differentiable) else reaching
    # (made once: a call registers it on its backward node; the tensors among the arguments are fixed per program)
    none_where_none = None if partly is None else _none_where_no_gradient(example, rg_results, partly)
    # The results requiring grad that each get a backward node of their own (_OwnNode), where there are several: not
    # those returned only as views made with grad on, which have nodes of their own already (an _OwnNode costs a
    # custom Function's call, by its C apply: Function.apply's Python checks, which do nothing here, cost ~8 us).
    own_nodes = frozenset(i for i in rg_results if i not in viewed) if len(rg_results) > 1 else frozenset()
    own_node = function_apply(_OwnNode)

    def call(args: Any) -> Any:
        if cut:
            args = [a.detach() if i in cut else a for i, a in enumerate(args)]
        if not torch.is_grad_enabled():
            return compiled(*args)
        copies = {i: args[i].clone() for i in kept} if kept else {}
        if not own:
            # (`handed`: the graph in eager's ops; `made`: the results a copy takes apart from the inputs' memory)
            outs = TwiceDifferentiable.apply(compiled, handed, (copies, written, made, parts), *args)
        else:
            outs = compiled(*args)
        if watched:
            _check_saved_results_at_backward(outs, watched)
        if own:  # (AOTAutograd's node, that of every result requiring grad: read once)
            node, versions = outs[first].grad_fn, (positions, tuple(map(version, pick(args))))
            node.dealias_recompute = (handed, args, copies, written, versions)  # (create_graph=True recomputes)
            if none_where_none is not None:
                node.register_hook(none_where_none)
        elif none_where_none is not None:
            on_backward_node(outs, none_where_none)
        for i in own_nodes:
            if isinstance(outs[i], torch.Tensor) and outs[i].requires_grad:
                outs = (*outs[:i], own_node(outs[i]), *outs[i + 1 :])
        return outs

    run = runner(gm, call, None, autograd=True)
    run.graph = handed  # type: ignore[attr-defined]
    return run


class _OwnNode(torch.autograd.Function):
    """The identity, as a backward node of its own. The compiled graph's results share one backward node, where
    eager's each have their own; a hook the caller registers on one result (dynamo does, for `v.register_hook(h)`
    after the graph) runs whenever that node runs, with None if no gradient came into that result, where eager's
    never runs (fuzz seed 995209: the user's `lambda g: g * -1` raised TypeError). Through this node it runs only
    for a gradient into its result. Its result shares the compiled result's memory and version counter (not a
    view of it: eager's result is a tensor of its own). No gradient passes as None, not as zeros: a later fused
    graph's node that reads this result hands it None when none of that graph's results reading it got a gradient
    (_none_where_no_gradient), and autograd runs this node anyway; zeros from here reached the compiled node that
    made the result, whose input then got zeros where eager's gets None (fuzz seed 2443107, `allow_unused`)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        ctx.set_materialize_grads(False)
        return t.detach()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor | None) -> torch.Tensor | None:
        return g


def _results_eager_saves(results: Any, rg_results: list[int]) -> list[tuple[int, fx.Node, frozenset[int]]]:
    """The results requiring grad (by position) whose memory eager's backward saves: made by an op that saves its
    result (`relu`, `y.relu_()`), or views of one. Eager's backward raises if the caller writes such a result after
    the call and a gradient then flows through the op; AOTAutograd's partition may save something else instead (a
    mask for relu) and would go on. With the op that saves it (for the message), and the results computed from
    it: a gradient into one of them flows through the op in eager."""
    from ..passes.saved import UnknownSaved, saves_its_result

    out = []
    for i in rg_results:
        n = results[i]
        while is_view_node(n) and isinstance(n.args[0], fx.Node):
            n = n.args[0]
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        try:
            saves = saves_its_result(n)
        except UnknownSaved as e:
            raise Unfusable(str(e)) from None
        if saves:
            after = _computed_from(n)
            out.append((i, n, frozenset(j for j in rg_results if results[j] in after)))
    return out


def _check_saved_results_at_backward(outs: Any, watched: list[tuple[int, fx.Node, frozenset[int]]]) -> None:
    """Before the backward of this call's results runs, raise eager's error if a result eager saved (see
    _results_eager_saves) was written in place since and a gradient comes into a result computed from it (the
    backward node is one for the whole graph, where eager's are one per op). A detached alias shares the result's
    version counter without holding its history (no reference cycle through its grad_fn)."""
    if not watched:
        return
    kept = [(i, n, reached, outs[i].detach(), outs[i]._version) for i, n, reached in watched]

    def check(grad_outputs: Any) -> None:
        for i, n, reached, alias, version in kept:
            if alias._version != version and any(grad_outputs[j] is not None for j in reached):
                raise RuntimeError(
                    with_location(
                        "one of the variables needed for gradient computation has been modified by an inplace "
                        f"operation: [{alias.type()} {list(alias.shape)}], which is output {i} of a graph dealias "
                        f"fused, saved for backward by {op_name(n.target)} as in eager, is at version "
                        f"{alias._version}; expected version {version} instead",
                        node_location(n),
                    )
                )

    node = next((o.grad_fn for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None), None)
    if node is not None:  # (one node for every result requiring grad)
        node.register_prehook(check)


def _refuse_history_only_some_results_read(
    call: list[Any], names: list[str], reaching: list[frozenset[int]], rg_results: list[int], cut: frozenset[int]
) -> None:
    """Unfusable where an input requiring grad has autograd history of its own (not a leaf: keyed, so fixed per
    program) and only some of the results requiring grad are computed from it. The compiled graph's one backward
    node runs for a gradient into any result, and autograd then runs the history behind each of its inputs, with
    None where no gradient came, where eager's per-op nodes never reach it: a custom Function there runs with zeros
    (`g * 3 + x` gave the leaf behind it a gradient where eager's is None), a hook there gets None. Behind an input
    every such result reads, eager reaches the history for any of them too; behind a leaf there is none (a None
    into a leaf accumulates nothing; a hook the caller puts on the leaf is still called with None: left open, hooks
    come and go between calls). The exact tiers run eager's nodes."""
    every = frozenset(rg_results)
    for i, a in enumerate(call):
        if i in cut or not isinstance(a, torch.Tensor) or not a.requires_grad or reaching[i] == every:
            continue
        try:
            leaf = a.is_leaf
        except RuntimeError:  # (a stale view: its history is eager's to raise about)
            leaf = False
        if not leaf:
            name = names[i] if i < len(names) else f"{i}"
            raise Unfusable(
                f"input {name} has autograd history and only some results requiring grad are computed from it (the "
                "fused graph's one backward node would run that history where eager's nodes do not reach it)"
            )


def _results_reaching_inputs(gm: fx.GraphModule, rg_results: list[int]) -> list[frozenset[int]]:
    """For each placeholder (by position), the results requiring grad computed from it by a path a gradient flows
    along: not through a node that records no history (`rg` false: a `detach`, an integer or boolean result), where
    eager's graph has no edge (`y + v.detach()` reaches v's history in no backward of y: the fused node's edge to v
    ran a custom Function behind it with zeros, and the leaf behind that got a gradient where eager's is None)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    results = gm.graph.output_node().args[0]
    reached = [_computed_from(p, lambda u: u.meta.get("rg", True)) for p in placeholders]
    return [frozenset(j for j in rg_results if results[j] in after) for after in reached]


def _computed_from(n: fx.Node, along: Callable[[fx.Node], Any] = lambda u: True) -> set[fx.Node]:
    """`n` and every node computed from it (through nodes `along` accepts)."""
    after, todo = {n}, [n]
    while todo:
        for u in todo.pop().users:
            if u not in after and along(u):
                after.add(u)
                todo.append(u)
    return after


def _none_where_no_gradient(args: Any, rg_results: list[int], reaching: Any) -> Callable[..., Any]:
    """An input none of whose results received a gradient gets None from this call's backward node, as from
    eager's: the compiled backward, one node for all results, gives it zeros (fuzz seed 964788: with
    `allow_unused`, a leaf's gradient was zeros where eager's is None). The node has a gradient input for each
    tensor among its arguments only, in order (none for a symbol's value, nor for TwiceDifferentiable's own
    arguments): over symbols the ints after the tensors shifted a count-based match by one, and a leaf lost the
    gradient of a result computed from it (fuzz --dynamic seed 1610117, silently)."""
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def post(grad_inputs: Any, grad_outputs: Any) -> Any:
        if len(grad_inputs) != len(tensors):
            raise InternalError(
                f"fused backward node has {len(grad_inputs)} gradient inputs for {len(tensors)} tensors"
            )
        given = {j for j in rg_results if grad_outputs[j] is not None}
        return tuple(None if not (reaching[i] & given) else g for i, g in zip(tensors, grad_inputs))

    return post


def _size_symbols_as_inputs(gm: fx.GraphModule, example: list[Any]) -> tuple[fx.GraphModule, list[tuple[int, int]]]:
    """A copy of `gm` with each symbol of its inputs' sizes that no input binds (a SymInt placeholder) an input
    after the others, and (input, dim) of each: where the call has its value. AOTAutograd's partitioner hands the
    backward the symbols of the tensors it saves only through such inputs, as dynamo's graphs have them; without
    them a backward holding only `s0*s1`-sized tensors (a loss over `logits.view(-1, V)`) leaves inductor with
    symbols it cannot bind ("expected [s0, s1] to have been codegen-ed")."""
    bound = {e.node.expr for e in example if isinstance(e, torch.SymInt)}
    wanted: dict[Any, tuple[int, int]] = {}
    for i, e in enumerate(example):
        if isinstance(e, torch.Tensor):
            for d, size in enumerate(e.shape):
                expr = size.node.expr if isinstance(size, torch.SymInt) else None
                if isinstance(expr, sympy.Symbol) and expr not in bound and expr not in wanted:
                    wanted[expr] = (i, d)
    if not wanted:
        return gm, []
    gm = copy.deepcopy(gm)
    for expr, (i, d) in wanted.items():
        last = gm.graph.find_nodes(op="placeholder")[-1]
        with gm.graph.inserting_after(last):
            ph = gm.graph.placeholder(f"size_{expr}")
        ph.meta["val"] = example[i].shape[d]
    gm.recompile()
    return gm, list(wanted.values())


def _constants_as_inputs(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[tuple[fx.Node, torch.Tensor]]]:
    """A copy of `gm` with each tensor constant (a `get_attr`: `torch.tensor([])` in the user's code) an input
    after the call's, and (its placeholder, its value) for each. AOTAutograd would lift them itself, before the
    call's inputs, where the positions this module keeps would no longer find them. Unfusable where a result is a
    constant's own memory (each call would return the same tensor)."""
    gm = copy.deepcopy(gm)
    for a in gm.graph.output_node().args[0]:
        while isinstance(a, fx.Node) and is_view_node(a):
            a = a.args[0]
        if isinstance(a, fx.Node) and a.op == "get_attr":
            raise Unfusable("a result is the memory of a constant of the program")
    lifted = []
    for n in list(gm.graph.find_nodes(op="get_attr")):
        value = functools.reduce(getattr, n.target.split("."), gm)
        if not isinstance(value, torch.Tensor) or value.requires_grad:
            raise Unfusable(f"a constant of the program ({type(value).__name__}) AOTAutograd would lift")
        last = gm.graph.find_nodes(op="placeholder")
        with gm.graph.inserting_after(last[-1]) if last else gm.graph.inserting_before():
            ph = gm.graph.placeholder(f"{n.name}_input")
        ph.meta = dict(n.meta)
        n.replace_all_uses_with(ph)
        gm.graph.erase_node(n)
        lifted.append((ph, value))
    gm.recompile()
    return gm, lifted


def _without_input_writes(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of `gm` without its `copy_` into placeholders (see writeback_autograd.whole_writes_in_graph)."""
    out = copy.deepcopy(gm)
    for n in list(out.graph.nodes):
        if n.op == "call_function" and n.target is aten.copy_.default and n.args[0].op == "placeholder":
            out.graph.erase_node(n)
    out.recompile()
    return out
