"""autograd.Function, tensor hooks and checkpointing inside a jitted function: the pieces around them are
compiled, the operators run with eager's autograd. Compared with eager: outputs, inputs after the call,
requires_grad and grad_fn presence, gradients of every leaf, eager's errors; first and cached call."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import grads_like_eager
from torch.utils.checkpoint import checkpoint

import dealias
from dealias import compat
from dealias.runtime.verify import compare_call
from dealias.tools.fuzz import _compare_grads


class Half(torch.autograd.Function):  # the identity, with half the gradient
    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, g):
        return g * 0.5


class ScaledBySaved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w * 3, g * x


class CountsItsBackward(torch.autograd.Function):
    calls = torch.zeros(())

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        CountsItsBackward.calls.add_(1)  # a write done by the custom backward
        return g


class InPlaceForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


class TwoOutputs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        idx = x.argmax().reshape(1)
        ctx.mark_non_differentiable(idx)
        return x.exp(), idx

    @staticmethod
    def backward(ctx, g, gi):
        return g * 2


def half(x):
    return Half.apply(x * 2).sum()


def function_between_writes(x, w):
    x.mul_(2)  # compiled before the Function
    y = ScaledBySaved.apply(x.sin(), w)
    w.add_(1)  # compiled after it; the Function saved w: eager's backward raises
    return y


def function_between_writes_of_others(x, w):
    x.mul_(2)
    y = ScaledBySaved.apply(x * 2, w * 1)
    x.add_(y)
    return y + x


def custom_backward_writes(x):
    return CountsItsBackward.apply(x * 3).sum()


def in_place_forward(x):
    y = x * 1
    z = InPlaceForward.apply(y)
    return z + y


def two_outputs(x):
    e, idx = TwoOutputs.apply(x + 1)
    return e * 2, idx


def hook_with_earlier_use(x):
    y = x * 2
    z = y * 3  # uses y before the hook: eager's hook sees this gradient too
    y.register_hook(lambda g: g * 10)
    return y.sum() + z.sum()


def hook_on_input(x):
    z = x * 3
    x.register_hook(lambda g: g + 1)
    return z * x


def two_hooks_then_write(x):
    y = x.exp()
    y.register_hook(lambda g: g * 2)
    y.register_hook(lambda g: g - 1)
    y.mul_(3)  # after the hooks: they apply to the gradient of y before the write
    return y


def checkpointed(x, w):
    h = x.mul(2)
    h.add_(1)
    y = checkpoint(lambda a: (a @ w).relu(), h, use_reentrant=False)
    h.zero_()
    return y, h


def assert_matches_eager(fn, make_args, fallback="ignore"):
    """Values, inputs after the call and gradients of every leaf as eager's, first and cached call; `fallback`
    is what FallbackWarning does ("error": the program must compile)."""
    jf = dealias.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter(fallback, dealias.FallbackWarning)
        for _ in range(2):
            assert compare_call(fn, jf, make_args()) is None
            assert _compare_grads(fn, jf, make_args) is None


def _args(*shapes):
    def make():
        g = torch.Generator().manual_seed(0)
        return tuple(torch.randn(*s, generator=g, requires_grad=True) * 1 for s in shapes)

    return make


CASES = [
    (half, _args((3,))),
    (function_between_writes, _args((3,), (3,))),
    (function_between_writes_of_others, _args((3,), (3,))),
    (custom_backward_writes, _args((3,))),
    (in_place_forward, _args((3,))),
    (two_outputs, _args((4,))),
    (hook_with_earlier_use, _args((3,))),
    (hook_on_input, _args((3,))),
    (two_hooks_then_write, _args((2, 3))),
    (checkpointed, _args((2, 3), (3, 3))),
]


@pytest.mark.parametrize("fn, make_args", CASES, ids=[c[0].__name__ for c in CASES])
def test_like_eager_with_the_pieces_around_compiled(fn, make_args):
    jf = dealias.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dealias.FallbackWarning)
        for call in range(2):
            CountsItsBackward.calls.zero_()
            assert compare_call(fn, jf, make_args()) is None, call
            assert _compare_grads(fn, jf, make_args) is None, call
    fell_back = [str(w.message) for w in caught if issubclass(w.category, dealias.FallbackWarning)]
    assert not any("runs eagerly" in m and "a graph of" in m for m in fell_back), fell_back
    assert dealias.cache_info(jf).misses == 1  # compiled once, cached after


def test_custom_backward_runs_and_its_writes_happen():
    x = torch.randn(3, requires_grad=True)
    jf = dealias.jit(half)
    jf(x).backward()
    assert torch.equal(x.grad, torch.full((3,), 1.0))  # 2 * 0.5: the Function's backward, not the forward's
    CountsItsBackward.calls.zero_()
    dealias.jit(custom_backward_writes)(x).backward()
    assert CountsItsBackward.calls.item() == 1


def test_pieces_are_compiled_by_dealias():
    jf = dealias.jit(function_between_writes_of_others)
    jf(*_args((3,), (3,))())
    graphs = jf.stats.graphs
    assert len(graphs) == 2  # before and after the Function; the Function runs eagerly between them
    assert all(g.entries == 1 for g in graphs)


def hook_after_a_write(x):
    y = x * 2
    z = y * 3
    y.add_(1)
    y.register_hook(lambda g: g * 10)  # hooks y after the write: z's gradient does not go through it
    return y * 3 + z


def test_hook_after_a_write_hooks_the_written_tensor():
    assert_matches_eager(hook_after_a_write, _args((3,)), fallback="error")


def hook_after_a_write_through_a_view(x):
    y = x * 2
    z = y * 3
    y[:1].add_(5.0)  # dynamo's graph: the hook's tensor is still the node that made y
    w = y * 4  # a use of the written y before the hook: its gradient goes through the hook
    y.register_hook(lambda g: g * 10)
    return y * 3 + z + w


def test_hook_after_a_write_through_a_view_hooks_the_written_tensor():
    assert_matches_eager(hook_after_a_write_through_a_view, _args((3,)), fallback="error")


def hook_on_an_input_then_written(x):
    x.register_hook(lambda g: g + 1)  # eager: hooks x's version before the write
    x.mul_(0.25)
    return x


def _breaks_before_the_write(fn, make_args, graphs):
    """`fn` compiles as `graphs` graphs, dynamo breaking before the write that follows a hook on an input (with a
    GraphBreakWarning, and no other fallback); values and gradients as eager's, first and cached call. (Where compat's
    hook_split is not in force: with it, the graph splits at the registration instead, test_hooks_split.py.)"""
    jf = dealias.jit(fn)
    with compat.forced_off("hook_split"):
        told = grads_like_eager(fn, jf, make_args)
    assert told and all(w.category is dealias.GraphBreakWarning for w in told), [str(w.message) for w in told]
    assert "a write after a hook on a graph input" in str(told[0].message)
    assert len(jf.stats.graphs) == graphs
    assert dealias.cache_info(jf).misses == 1


def test_hook_on_an_input_written_later_breaks_the_graph_before_the_write():
    # Dynamo registers a hook on a graph input after the graph ran (a side effect it replays), so it would hook
    # the written version: the gradient came out (w + 1) * 0.25 where eager's is w * 0.25 + 1, with dynamo's own
    # eager backend too. For dealias, dynamo breaks the graph before the write: the hook is registered in between
    # (where compat's hook_early, which registers it before the graph, is not in force: test_hooks_early.py).
    with compat.forced_off("hook_early"):
        _breaks_before_the_write(hook_on_an_input_then_written, _args((3,)), graphs=0)  # (no op but the write)


def hook_then_write_through_a_view_then_more(x, w):
    x.register_hook(lambda g: g * 3)
    y = x * w
    x[1:].mul_(2.0)  # through a view of x: breaks here
    x.register_hook(lambda g: g + 1)  # a second hook, after the break: on the written version, as eager's
    x.add_(w)
    return x * y


def test_hook_then_write_through_a_view_compiles_around_the_break():
    with compat.forced_off("hook_early"):
        _breaks_before_the_write(hook_then_write_through_a_view_then_more, _args((4,), (4,)), graphs=2)


def test_hook_then_write_runs_eagerly_without_the_break(monkeypatch):
    # Should compat's hook_write_break not apply (dynamo's internals moved), the backend still refuses the graph:
    # the frame runs eagerly, exact.
    monkeypatch.setattr(compat.registry._CORRECTIONS["hook_write_break"], "off", True)
    jf = dealias.jit(hook_on_an_input_then_written)
    with pytest.warns(dealias.FallbackWarning, match="registered after the graph by dynamo"):
        jf(*_args((3,))())
    for _ in range(2):
        assert compare_call(hook_on_an_input_then_written, jf, _args((3,))()) is None
        assert _compare_grads(hook_on_an_input_then_written, jf, _args((3,))) is None


def hook_on_an_input_after_its_writes(x):
    x.mul_(0.25)
    x[1:].add_(1.0)
    x.register_hook(lambda g: g + 1)  # eager hooks the written version, as dynamo's registration after the graph
    return x * 3


def hook_on_an_input_between_writes(x):
    x.mul_(0.25)
    x.register_hook(lambda g: g + 1)
    x[1:].add_(1.0)  # written after the registration: eager's hook is on the version before this write
    return x * 3


def hook_then_metadata_change_of_a_view(x):  # fuzz seed 996004
    x.register_hook(lambda g: g + 1)
    v = x.permute(1, 0)
    v.unsqueeze_(0)
    return v * 2, x


def test_hook_on_an_input_after_its_writes_compiles():
    assert_matches_eager(hook_then_metadata_change_of_a_view, _args((2, 3)), fallback="error")
    # compat's hook_record records the graph's nodes at the registration: only writes after it run the frame eagerly.
    assert_matches_eager(hook_on_an_input_after_its_writes, _args((3,)), fallback="error")
    _breaks_before_the_write(hook_on_an_input_between_writes, _args((3,)), graphs=2)


def hook_after_a_no_grad_region(x):  # fuzz seed 5167
    x += x
    with torch.no_grad():
        x.sin_()
    x.register_hook(lambda g: g + 1)
    return x


def test_pieces_ending_inside_a_no_grad_region_keep_grad_mode():
    # The piece before the hook ends inside the no_grad region (the next piece leaves it): compiling it left grad
    # mode off after tracing, and running it restored the caller's mode where the region was still open; the
    # write-back then lost its history and the hook saw a gradient of 1 instead of 2.
    jf = dealias.jit(hook_after_a_no_grad_region)
    for _ in range(2):
        assert compare_call(hook_after_a_no_grad_region, jf, _args((3,))()) is None
        assert torch.is_grad_enabled()
        assert _compare_grads(hook_after_a_no_grad_region, jf, _args((3,))) is None


# Found by the autograd fuzzer (seeds 400305, 400553, 401537, 400884).
def hook_between_a_no_grad_write_and_a_grad_write(x):  # seed 400305
    v = x.cumsum(0)
    with torch.no_grad():
        v.relu_()
    v.register_hook(lambda g: g + 1)
    v.clamp_(-1, 1)  # the piece after the hook starts inside the no_grad region and leaves it
    return v


def hook_on_a_tensor_whose_view_is_written(x, y):  # seed 400553: y is a view of x
    x.register_hook(lambda g: g + 1)  # dynamo registers it after the graph, which writes x through y
    y.zero_()
    return x * 2


def same_tensor_twice_into_a_piece(x):  # seed 401537: the piece after the hook gets x twice, under no_grad
    with torch.no_grad():
        v = x.flatten()  # x itself (1-D)
    v.register_hook(lambda g: g + 1)
    with torch.no_grad():
        v.index_fill_(0, torch.tensor([3]), 0.25)
    v.neg_()
    x.sub_(v, alpha=0.25)
    return x


def indexing_the_hooked_tensor(x):  # seed 400884: `v[1:]` of the hook's result is not a result of the hook
    v = x * 1
    with torch.no_grad():
        v[:1].neg_()
    v.register_hook(lambda g: g + 1)
    w = v[1:]
    w.mul_(-2.0)
    return v


def function_result_transposed_then_relu(x):  # fuzz seed 978719 (autograd run)
    v = Half.apply(x)
    v.t_()  # moves v's version counter, and so did dealias's replay of it after the graph: relu saved v at the
    v.relu_()  # version before that, and backward raised "modified by an inplace operation" where eager's does not
    return torch.where(v > 0, v, v)


def function_of_a_view_whose_base_comes_to_require_grad(x):  # fuzz seed 1220114
    t = torch.linspace(-1, 1, 24).view(2, 3, 4)
    v = t.diagonal()  # made before t requires grad: dynamo kept v's requires_grad False after the write below,
    t.mul_(x)  # so the branch took 3 and Half.apply(v) was traced as its forward alone (x's gradient not halved)
    return Half.apply(v) * (2 if v.requires_grad else 3)


FUZZ_CASES = [
    (function_of_a_view_whose_base_comes_to_require_grad, _args((1, 3, 4))),
    (function_result_transposed_then_relu, _args((5, 5))),
    (hook_between_a_no_grad_write_and_a_grad_write, _args((4, 3))),
    (hook_on_a_tensor_whose_view_is_written, lambda: (lambda x: (x, x[::2]))(torch.randn(6, requires_grad=True) * 1)),
    (same_tensor_twice_into_a_piece, _args((6,))),
    (indexing_the_hooked_tensor, _args((4,))),
]


@pytest.mark.parametrize("fn, make_args", FUZZ_CASES, ids=[c[0].__name__ for c in FUZZ_CASES])
def test_found_by_the_autograd_fuzzer(fn, make_args):
    jf = dealias.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dealias.FallbackWarning)
        for _ in range(2):
            torch.manual_seed(0)
            assert compare_call(fn, jf, make_args()) is None
            assert torch.is_grad_enabled()
            assert _compare_grads(fn, jf, make_args) is None


# Found by review.
def hook_closing_over_a_later_tensor(x):
    y = x * 2
    s = x.sum().detach()  # made after y: the hook cannot move above it
    y.register_hook(lambda g: g * s)
    return y * 3


def hook_after_a_functional_inplace(x):
    y = x * 2
    z = y * 3
    torch.nn.functional.relu(y, inplace=True)  # a write without a trailing underscore
    y.register_hook(lambda g: g * 10)
    return y * 3 + z


def hook_on_an_input_then_functional_inplace(x):
    x.register_hook(lambda g: g + 1)
    torch.nn.functional.relu(x, inplace=True)
    return x


REVIEW_CASES = [
    hook_closing_over_a_later_tensor,
    hook_after_a_functional_inplace,
    hook_on_an_input_then_functional_inplace,
]


@pytest.mark.parametrize("fn", REVIEW_CASES, ids=[f.__name__ for f in REVIEW_CASES])
def test_hooks_found_by_review(fn):
    assert_matches_eager(fn, lambda: (torch.tensor([1.0, -2.0, 3.0], requires_grad=True) * 1,))


def hook_on_one_of_two_equal_tensors(x):  # fuzz seed 601996
    a = torch.where(x > 0, x, x)
    b = torch.where(x > 0, x, x)  # equal to a, another tensor: its hook must not see a's gradient
    b.register_hook(lambda g: g + 1)
    return a.unsqueeze(0).clone()


def test_hook_on_one_of_two_equal_tensors():
    # The piece before the hook returned a and b; CSE merged them and made one a clone of the other, so the hook
    # on b also changed a's gradient. Returned tensors are no longer merged.
    fn = hook_on_one_of_two_equal_tensors
    jf = dealias.jit(fn)
    for _ in range(2):
        assert compare_call(fn, jf, _args((5, 5))()) is None
        assert _compare_grads(fn, jf, _args((5, 5))) is None


def write_hook_then_metadata_change_of_a_view(x):
    x.mul_(2)
    x.register_hook(lambda g: g + 1)
    v = x[1:]
    v.t_()  # moves the version counter, but is no write of x's data: x's last write is still mul_
    return v.sin()


def test_metadata_change_after_the_last_write_keeps_the_write_back_there():
    # Review finding: counting t_ as x's last write left x unwritten where autograd reads it: the hook never fired
    # (row 0 of the gradient 0 where eager's is 2), and autograd.grad w.r.t. x found x unused.
    assert_matches_eager(write_hook_then_metadata_change_of_a_view, _args((3, 4)), fallback="error")
    jf = dealias.jit(write_hook_then_metadata_change_of_a_view)
    for fn in (write_hook_then_metadata_change_of_a_view, jf):
        x = torch.ones(3, 4, requires_grad=True) * 1
        (g,) = torch.autograd.grad(fn(x).sum(), x)
        assert g[0].eq(1).all()  # the hook's +1 on row 0, which the output does not read


def self_copy_then_read_then_hook(x):  # fuzz seed 986087, shrunk
    x[4] = 3.0
    x.copy_(x)  # the last write: eager's x has the copy's grad_fn from here
    y = x * 1
    x.register_hook(lambda g: g + 1)  # on that grad_fn: y's gradient goes through it
    return y


def self_copy_then_function_then_hook(x):
    x[4] = 3.0
    x.copy_(x)
    y = Half.apply(x * 1)
    x.register_hook(lambda g: g + 1)
    return y


def read_then_self_copy_then_hook(x):  # fuzz seed 988167
    y = torch.where(x > 0, x, x)  # reads the version before the copy: its gradient does not go through the hook
    x.copy_(x)
    x.register_hook(lambda g: g * 2)  # on the copy's grad_fn, eager's x from here
    return y


@pytest.mark.parametrize(
    "fn", [self_copy_then_read_then_hook, self_copy_then_function_then_hook, read_then_self_copy_then_hook]
)
def test_self_copy_as_the_last_write_writes_back_there(fn):
    # `x.copy_(x)` was the last write but wrote nothing back: the read after it read the program's value, outside
    # the caller's history, and the hook dynamo registers on x after the graph never saw its gradient (every
    # element's gradient 1 where eager's is 2).
    assert_matches_eager(fn, _args((6,)))  # (the Function runs eagerly between two compiled pieces)


def backward_inside(w):
    z = InPlaceForward.apply(w * 1)  # (writes its input and marks it dirty)
    z.add_(1)
    z.sum().backward()  # (the Function's backward runs while the jitted function does)
    return z


def test_a_functions_backward_run_inside_the_program_compiles_once():
    # The operator's Function class is made per call; dynamo traced its backward when the program ran it, guarded
    # on that class: a recompile at every call, until dynamo's limit (found in review of real code).
    jf = dealias.jit(backward_inside)
    for _ in range(6):
        w, w2 = torch.ones(4, requires_grad=True), torch.ones(4, requires_grad=True)
        expected, got = backward_inside(w), jf(w2)
        assert torch.equal(got, expected) and torch.equal(w2.grad, w.grad)
    info = dealias.cache_info(jf)
    assert info.misses == 1 and info.hits == 5, info


class ViewOf(torch.autograd.Function):  # returns a view of its input: eager forbids writing it in place
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def view_of_then_use(x):
    y = ViewOf.apply(x)
    return y.mul(2), y, TwoOutputs.apply(x)[0]


@pytest.mark.filterwarnings("ignore::dealias.FallbackWarning")  # (the piece after ViewOf runs eagerly)
def test_backward_node_named_after_the_users_function():
    # eager's grad_fn is `ViewOfBackward`, and autograd's errors quote that name ("Output 0 of ViewOf is a view
    # and is being modified inplace"): dealias's outputs have the same, on the first call and the cached one
    jf = dealias.jit(view_of_then_use)
    for _ in range(2):
        results, x = [], torch.randn(3)
        for fn in (view_of_then_use, jf):
            outs = fn(x.clone().requires_grad_() * 1)
            with pytest.raises(RuntimeError) as raised:
                outs[1].add_(1)
            results.append((outs, [type(o.grad_fn).__name__ for o in outs], str(raised.value)))
        (expected, names, error), (got, got_names, got_error) = results
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        assert got_names == names == ["MulBackward0", "ViewOfBackward", "TwoOutputsBackward"]
        assert got_error == error and "Output 0 of ViewOf" in error
    assert dealias.cache_info(jf).misses == 1
