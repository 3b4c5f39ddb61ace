"""The fused executor with autograd on training steps (runtime/fused_autograd.py): constants and indices of the
graph, loss targets checked with eager's errors, lengths that change between calls, retained graphs, autocast,
weights written between the call and backward, gradient penalties, MultiheadAttention. Compared with eager; few
and small: each compile costs seconds."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from harness import check, grads_like_eager

import dealias
from dealias.ir.opfacts import is_view_node
from dealias.runtime import double_backward

aten = torch.ops.aten


def weighted_by_a_constant(x, w, count):
    c = torch.tensor([1.0, -2.0, 3.0])  # a constant of the graph (AOTAutograd would lift it before the inputs)
    count.add_(1)
    return (x * w * c).sum(), torch.tensor([]).numel() + w * c


@pytest.mark.parametrize("dynamic", [None, True])
def test_constants_of_a_graph_autograd_records_are_inputs_after_the_calls(dynamic):
    # HF's training forward makes `torch.tensor([])` (its cache's empty keys): the constants are handed to
    # AOTAutograd as inputs after the call's, and the graph stays fused.
    def make_args(n=3):
        return torch.randn(4, n), torch.randn(n, requires_grad=True), torch.zeros(())

    jf = dealias.jit(weighted_by_a_constant, executor="inductor", dynamic=dynamic)
    assert grads_like_eager(weighted_by_a_constant, jf, make_args, calls=3) == []
    assert dealias.cache_info(jf).tiers == ("fused",)
    assert "fused with autograd" in str(dealias.last_traces(jf)[3])


def embed_and_store(w, tok, cache, x):
    h = torch.embedding(w, tok) * x
    cache.index_copy_(0, tok % 4, h.detach())
    return h


def test_indices_of_a_graph_autograd_records_are_checked_before_the_call():
    # Inductor checks them inside its kernels, with its own error (a RuntimeError naming its kernel's source):
    # they are checked before the call, with eager's error, and nothing is written.
    def make_args(tok=(1, 2)):
        return torch.randn(10, 3, requires_grad=True), torch.tensor(tok), torch.zeros(4, 3), torch.randn(2, 3)

    jf = dealias.jit(embed_and_store, executor="inductor")
    assert grads_like_eager(embed_and_store, jf, make_args) == []
    assert "fused with autograd" in str(dealias.last_traces(jf)[3])
    for tok in ((1, 10), (-1, 2)):
        args = make_args(tok)
        with pytest.raises(IndexError) as expected:
            embed_and_store(*args)
        with pytest.raises(IndexError, match=rf"{expected.value}.*\(aten.embedding.default\)\n.*test_fused_autograd"):
            jf(*args)
        assert not args[2].any()
    assert dealias.cache_info(jf).misses == 1


def cross_entropy(x, target):
    return torch.nn.functional.cross_entropy(x, target)


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("shape", [(4, 5), (2, 5, 3, 3)])
def test_targets_of_a_loss_are_checked_with_eagers_error(grad, shape):
    # nll_loss's targets address its classes, except ignore_index (-100) wherever it is; inductor checks them in
    # its kernel with its own error. Both paths (with autograd and without) check them before the call.
    def make_args(bad=None):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(*shape, generator=g, requires_grad=grad)
        target = torch.randint(0, 5, (shape[0], *shape[2:]), generator=g)
        target.view(-1)[1] = -100
        if bad is not None:
            target.view(-1)[2] = bad
        return x, target

    torch._dynamo.reset()  # (another shape's compile of this function would make this one's sizes symbolic)
    jf = dealias.jit(cross_entropy, executor="inductor")
    if grad:
        assert grads_like_eager(cross_entropy, jf, make_args) == []
    else:
        check(cross_entropy, *make_args(), executor="inductor")
        jf(*make_args())
    assert dealias.last_traces(jf)[3].text.startswith("# execution trace (fused")
    for bad in (5, -1):
        with pytest.raises(IndexError) as expected:
            cross_entropy(*make_args(bad))
        with pytest.raises(IndexError, match=rf"{expected.value} \(aten.nll_loss"):
            jf(*make_args(bad))


def shifted_loss(h, w, labels):
    logits = (h @ w)[:, torch.arange(labels.shape[1])]  # an index into a tensor the graph made, at its length
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 6), labels[:, 1:].reshape(-1))


def test_a_training_step_over_changing_lengths_is_fused_with_eagers_errors():
    # A causal LM's loss over sequence lengths that change between calls (HF's training forward, in small): over
    # the length symbol, an index into a tensor the graph made is checked against the call's own length, and the
    # graph computes `length - 1` (Python arithmetic of sizes, which AOTAutograd traces through).
    torch._dynamo.reset()
    jf = dealias.jit(shifted_loss, executor="inductor")
    for length in (5, 8, 6, 7):

        def make_args(length=length):
            g = torch.Generator().manual_seed(length)
            labels = torch.randint(0, 6, (2, length), generator=g)
            labels[0, 2] = -100
            return torch.randn(2, length, 4, generator=g), torch.randn(4, 6, generator=g, requires_grad=True), labels

        assert grads_like_eager(shifted_loss, jf, make_args, calls=1) == []
        assert jf.last.tier == "fused", dealias.last_traces(jf)[3].text.splitlines()[0]
    assert dealias.cache_info(jf).misses == 2  # (the second length makes it symbolic)
    h, w, labels = make_args()
    labels[1, 3] = 6
    with pytest.raises(IndexError) as expected:
        shifted_loss(h, w, labels)
    with pytest.raises(IndexError, match=rf"{expected.value} \(aten.nll_loss"):
        jf(h, w, labels)


def add_into_a_copy(v2, v1):
    v2 += v1  # (v2 requires no grad before: it comes to, through v1)
    return v2, v1


def test_a_gradient_through_a_written_input_reaches_a_view_over_symbols():
    # Over symbols the call passes ints after its tensors, and the backward node's gradient inputs are the tensors'
    # only: the hook giving None where no gradient reaches matched them by count, shifted by one, so v1 lost the
    # gradient that comes through v2 (fuzz --dynamic seed 1610117, silently; a helper found it).
    def make_args():
        v1 = (torch.randn(4, 6, requires_grad=True) * 1)[:, 0]
        return v1.detach().sin(), v1

    jf = dealias.jit(add_into_a_copy, executor="inductor", dynamic=True)
    assert grads_like_eager(add_into_a_copy, jf, make_args) == []
    assert dealias.cache_info(jf).tiers == ("fused",)


def mlp_loss(net, x):
    h = net(x).softmax(-1)
    return (h * h).sum() / x.shape[0]


def test_backward_with_retain_graph_twice_over_changing_lengths():
    # AOTAutograd's donated buffers (saved tensors its backward frees) made the second backward of a graph over
    # symbols raise "compiled with non-empty donated buffers"; eager computes both, and so does dealias.
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 8))
    ours = copy.deepcopy(net)
    jf = dealias.jit(mlp_loss, executor="inductor")
    for n in (3, 5, 7):
        x = torch.randn(n, 8)
        expected, got = mlp_loss(net, x), jf(ours, x)
        for loss in (expected, got):
            loss.backward(retain_graph=True)
            loss.backward()
            with pytest.raises(RuntimeError, match="backward through the graph a second time"):
                loss.backward()
        assert jf.last.tier == "fused"
        for (name, a), b in zip(net.named_parameters(), ours.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert dealias.cache_info(jf).dynamic == ("x.size(0)",)


def matmul_under_autocast(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
    return y


def test_casts_of_autocast_record_autograd():
    # autocast's `_to_copy` casts have a factory's arguments (layout, pin_memory) and were taken for fresh leaves:
    # the fused program ran without autograd, and its result did not require grad.
    torch.manual_seed(0)
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    w2 = w.detach().clone().requires_grad_()
    jf = dealias.jit(matmul_under_autocast, executor="inductor")
    expected, got = matmul_under_autocast(x, w), jf(x, w2)
    assert got.requires_grad and got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected)
    expected.float().sum().backward()
    got.float().sum().backward()
    torch.testing.assert_close(w2.grad, w.grad)
    assert jf.last.tier == "fused"


def token_loss(head, h, labels):
    logits = head(h)
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def test_a_loss_over_flattened_symbolic_labels_trains_fused():
    # AOTAutograd's backward held only tensors of size s0*s1 (the flattened logits; and the prologue's copy of
    # `labels.view(-1)`, an index it checks) and no input giving s0 and s1 apart: inductor refused to compile it
    # ("expected [s0, s1] to have been codegen-ed"; HF's GPT-2 and BERT losses with dynamic=True). The size
    # symbols are now inputs of the graph, as in dynamo's graphs.
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11)
    ours = copy.deepcopy(head)
    jf = dealias.jit(token_loss, executor="inductor", dynamic=True)
    for t in (5, 7):
        h, labels = torch.randn(2, t, 8), torch.randint(0, 11, (2, t))
        expected, got = token_loss(head, h, labels), jf(ours, h, labels)
        torch.testing.assert_close(got, expected)
        expected.backward()
        got.backward()
        assert jf.last.tier == "fused"
        for a, b in zip(head.parameters(), ours.parameters()):
            torch.testing.assert_close(b.grad, a.grad)
    with pytest.raises(IndexError, match="Target 11 is out of bounds"):
        token_loss(head, h, torch.full((2, 7), 11))
    with pytest.raises(IndexError, match="out of bounds"):
        jf(ours, h, torch.full((2, 7), 11))
    assert dealias.cache_info(jf).misses == 1


def tanh_matmul(w, x):
    return (torch.tanh(x) @ w).sum()  # the backward saves w.t()


def mse_of_an_mlp(net, x, y):
    return torch.nn.functional.mse_loss(net(x), y)  # nn.Linear's backward saves its weight's transpose


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_write_of_an_input_saved_as_a_view_makes_backward_raise(dynamic):
    # Inductor returned the saved `w.t()` as a tensor of its own, with a version counter of its own: an update
    # of w between the call and backward (an optimizer step, an EMA write) went unseen and backward used the new
    # weights (helper review; torch.compile does the same), where eager's raises. The forward saves w itself now.
    torch.manual_seed(0)
    jf = dealias.jit(tanh_matmul, executor="inductor", dynamic=dynamic)
    for n in (4, 6):

        def make_args(n=n):
            return torch.randn(n, 3, requires_grad=True), torch.randn(5, n)

        assert grads_like_eager(tanh_matmul, jf, make_args) == []
        for f in (tanh_matmul, jf):
            w = torch.randn(n, 3, requires_grad=True)
            loss = f(w, torch.randn(5, n, requires_grad=True))
            with torch.no_grad():
                w.mul_(2)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                loss.backward()
        assert jf.last.tier == "fused"
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    jf = dealias.jit(mse_of_an_mlp, executor="inductor", dynamic=dynamic)
    for f in (mse_of_an_mlp, jf):
        loss = f(net, torch.randn(5, 4), torch.randn(5, 2))
        with torch.no_grad():
            net[2].weight.mul_(0.5)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def gradient_penalty(net, x):
    x = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(net(x).sum(), x, create_graph=True)  # (a graph break: runs between two graphs)
    return net(x).square().mean() + (g.norm(2, dim=1) - 1).pow(2).mean()


def test_a_gradient_penalty_recomputes_without_compiling_again():
    # The double backward's recompute ran in a frame dynamo traces (the user's code between two graphs), so each
    # call compiled the recomputed graph anew, with inductor: 61 programs for a WGAN-GP step (helper review).
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    ours = copy.deepcopy(net)
    jf = dealias.jit(gradient_penalty, executor="inductor")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dealias.FallbackWarning)
        for _ in range(3):
            x = torch.randn(5, 4)
            expected, got = gradient_penalty(net, x), jf(ours, x)
            torch.testing.assert_close(got, expected)
            expected.backward()
            got.backward()
            for a, b in zip(net.parameters(), ours.parameters()):
                torch.testing.assert_close(b.grad, a.grad)
    info = dealias.cache_info(jf)
    assert info.entries <= 3 and info.misses <= 2, info


def test_a_fused_backward_inside_a_frame_dynamo_evaluates_is_not_converted():
    # The backward of AOTAutograd's Function for a fused graph is dealias's (double_backward.takes_double_backward),
    # which dynamo must not convert where it runs inside a frame dynamo evaluates (`loss.backward()` between two
    # graphs): it reads dynamo's hook and runs under `disable` there; elsewhere it skips the disable's frame. Dynamo
    # converts no frame of it (none is counted) and the gradients are eager's.
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    ours = copy.deepcopy(net)
    inner = dealias.jit(lambda net, x: net(x).square().mean(), executor="inductor")
    fused_call = torch._dynamo.disable(lambda net, x: inner(net, x))

    def step(net, x, f):
        loss = f(net, x)
        loss.backward()  # (a graph break: runs in the frame dynamo evaluates)
        return loss * 2

    outer = torch.compile(step, backend="eager")
    xs = [torch.randn(5, 4) for _ in range(4)]
    outer(ours, xs[0], fused_call)
    step(net, xs[0], lambda net, x: net(x).square().mean())
    frames = counters["frames"]["total"]
    for x in xs[1:]:
        torch.testing.assert_close(outer(ours, x, fused_call), step(net, x, lambda net, x: net(x).square().mean()))
    assert counters["frames"]["total"] == frames  # (each frame dynamo met once, at the first call)
    for a, b in zip(net.parameters(), ours.parameters()):
        torch.testing.assert_close(b.grad, a.grad)
    backward = type(inner(ours, xs[0]).grad_fn)._forward_cls.backward
    assert dealias.cache_info(inner).tiers == ("fused",)
    assert not _debug_get_cache_entry_list(backward.__code__)


def scale_a_column_block(x, v):
    v.mul_(0.25)
    return x.sum(0)


def test_the_run_on_copies_of_the_inputs_keeps_their_strides(monkeypatch):
    # The compile runs the graph once on copies of its inputs (double_backward_of_its_own). A copy by clone() of a
    # column block of a 5x5 tensor is dense (strides (2, 1)) while the kernels write it with the traced (5, 1), past
    # its memory: fuzz seed 2110098 corrupted the heap and aborted. The copies keep each input's strides.
    seen = []
    original = double_backward._copy_strided
    monkeypatch.setattr(double_backward, "_copy_strided", lambda a: seen.append(original(a)) or seen[-1])
    check(scale_a_column_block, torch.randn(5, 5, requires_grad=True), torch.randn(5, 5)[:, :2], executor="inductor")
    assert [t.stride() for t in seen] == [(5, 1), (5, 1)]
    assert all(t.untyped_storage().nbytes() >= 22 * 4 for t in seen)


def test_multihead_attention_views_reach_inductor_next_to_their_source(monkeypatch):
    # The packed q/k/v buffer's three views come right after it in the graph inductor lowers, as in dynamo's graph:
    # with the views of k and v after q's scaling, inductor computed the scaled q again from the projection and its
    # bias, in a loop it could not vectorize (runtime/graph_order.py). Values and gradients as eager's.
    import torch._inductor.compile_fx as inductor_compile

    handed, compile_fx = [], inductor_compile.compile_fx
    monkeypatch.setattr(
        inductor_compile, "compile_fx", lambda gm, *a, **k: handed.append(gm) or compile_fx(gm, *a, **k)
    )

    def attention(x, w_in, b_in, w_out, b_out):  # (nn.MultiheadAttention's forward, its parameters passed)
        return torch.nn.functional.multi_head_attention_forward(
            x, x, x, 8, 2, w_in, b_in, None, None, False, 0.0, w_out, b_out, training=True, need_weights=True
        )

    shapes = ((3, 2, 8), (24, 8), (24,), (8, 8), (8,))
    make = lambda: tuple(torch.randn(*s, requires_grad=True) for s in shapes)  # noqa: E731
    grads_like_eager(attention, dealias.jit(attention, executor="inductor"), make)
    gm = handed[0]  # (the first program: the call with grad on)
    nodes = list(gm.graph.nodes)
    packed = next(n for n in nodes if n.target is aten.clone.default and len(n.users) == 3)
    selects = [n for n in nodes if n.target is aten.select.int and n.args[0] is packed]
    first_compute = next(n for n in nodes[nodes.index(packed) + 1 :] if not is_view_node(n))
    assert all(nodes.index(s) < nodes.index(first_compute) for s in selects), gm.code


def leaky_layers(x, w1, w2):
    h = x @ w1
    torch.nn.functional.leaky_relu_(h, 0.2)  # (a GAN discriminator's LeakyReLU(inplace=True))
    return (h @ w2).sum()


def test_an_intermediate_eager_updates_in_place_is_updated_in_place_for_aotautograd():
    # Eager's `leaky_relu_` on the product records LeakyReluBackward1, which reads the result: the forward saves the
    # activation only (which the second product's gradient reads anyway). Handed over functional, AOTAutograd
    # recorded `leaky_relu`'s backward, which reads the product: its partitions saved the product beside the
    # activation (a 64x256 store more per layer of a GAN discriminator, 3-4 % of its step) or its boolean mask.
    from dealias.runtime.fused_autograd import _clones_of_inputs_kept

    def make_args():
        torch.manual_seed(0)
        return torch.randn(8, 16), torch.randn(16, 32, requires_grad=True), torch.randn(32, 4, requires_grad=True)

    jf = dealias.jit(leaky_layers, executor="inductor")
    assert grads_like_eager(leaky_layers, jf, make_args) == []
    assert dealias.cache_info(jf).tiers == ("fused",)
    handed = _clones_of_inputs_kept(jf.last.run_graph.graph)  # (what AOTAutograd gets)
    assert [n.target for n in handed.graph.nodes if "leaky" in str(n.target)] == [aten.leaky_relu_.default]
    saved = jf(*make_args()).grad_fn.saved_tensors
    assert sum(tuple(t.shape) == (8, 32) for t in saved) == 1, [(t.shape, t.dtype) for t in saved]  # (h's size)


@pytest.mark.parametrize(
    "activation",
    [
        lambda h: torch.nn.functional.leaky_relu_(h, -0.1),
        lambda h: torch.nn.functional.elu_(h, alpha=-0.5),
        lambda h: torch.nn.functional.celu_(h, alpha=-0.5),
    ],
)
def test_an_in_place_activation_whose_backward_raises_in_eager_raises(activation):
    # Eager's backward of leaky_relu_ / elu_ reads the result, and refuses a negative slope; inductor's decomposition
    # of that backward computed a gradient instead: the graph runs on the torch executor, with eager's error.
    def fn(x, w):
        h = x @ w
        activation(h)
        return h.sum()

    x, w = torch.randn(4, 3), torch.randn(3, 5, requires_grad=True)
    with pytest.raises(RuntimeError, match="negative slope"):
        fn(x, w).backward()
    jf = dealias.jit(fn, executor="inductor")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dealias.NotFusedWarning)
        out = jf(x, w)
    with pytest.raises(RuntimeError, match="negative slope"):
        out.backward()
    assert dealias.cache_info(jf).tiers == ("torch",)


def shared_weight(x, y, w):
    return (torch.nn.functional.linear(x, w).tanh() + torch.nn.functional.linear(y, w)).sum()


def test_a_weight_two_ops_read_gets_a_view_per_op_for_aotautograd():
    # The capture's common-subexpression pass makes one `t(w)` for the two linears; AOTAutograd gets one per
    # linear again (as eager makes them), so that inductor computes w's gradient as one addmm of the two products,
    # not a sum through the shared view transposed after.
    from dealias.runtime.fused_autograd import _clones_of_inputs_kept

    def make_args():
        torch.manual_seed(0)
        return torch.randn(8, 16), torch.randn(8, 16), torch.randn(32, 16, requires_grad=True)

    jf = dealias.jit(shared_weight, executor="inductor")
    assert grads_like_eager(shared_weight, jf, make_args) == []
    assert dealias.cache_info(jf).tiers == ("fused",)
    handed = _clones_of_inputs_kept(jf.last.run_graph.graph)
    (w,) = [p for p in handed.graph.find_nodes(op="placeholder") if p.name == "w"]
    views = [u for u in w.users if is_view_node(u)]
    assert len(views) == 2 and all(len(v.users) == 1 for v in views), handed.code
