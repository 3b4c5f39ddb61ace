"""In-place metadata changes (t_, transpose_, unsqueeze_, squeeze_, swapdims_, as_strided_, detach_) of inputs,
intermediates and views of inputs, resize_ and writes through `.data`, compared with eager."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import captured_targets, check, grads_like_eager, same

import dealias
from dealias import compat


def t_input(x):
    x.t_()
    return x.shape[0], x + 1


def transpose_then_write(x):
    x.transpose_(0, 1)
    x[0] = 1.0
    return x


def unsqueeze_transpose_squeeze_input(x):
    x.unsqueeze_(0).transpose_(0, 1)
    x.squeeze_(1)
    return x.shape, x


def squeeze_all_and_dim(x):
    x.squeeze_()
    y = x.clone()
    y.unsqueeze_(1).squeeze_(1)
    return y


def swapdims_input(x):
    x.swapdims_(0, 1)
    return x.stride()


def as_strided_input(x):
    x.as_strided_((2, 2), (1, 2))
    return x * 1


def detach_input(x):
    x.detach_()
    return x


def metadata_then_view_output(x):
    x.t_()
    return x[0]


def t_as_a_function(x):
    r = torch.Tensor.t_(x)  # the method called as a function (OpInfo's in-place variants): dynamo's function path
    return r, x.shape[0]


def unsqueeze_as_a_function_then_write(x):
    torch.Tensor.unsqueeze_(x, 1)
    x[:, 0] = 2.0
    return x * 1


def as_strided_as_a_function(x):
    return torch.Tensor.as_strided_(x, (2, 2), (1, 2))


META_PROGRAMS = [
    (t_input, lambda: (torch.randn(2, 3),)),
    (transpose_then_write, lambda: (torch.randn(2, 3),)),
    (unsqueeze_transpose_squeeze_input, lambda: (torch.randn(2, 3),)),
    (squeeze_all_and_dim, lambda: (torch.randn(1, 3, 1),)),
    (swapdims_input, lambda: (torch.randn(2, 3),)),
    (as_strided_input, lambda: (torch.randn(6),)),
    (metadata_then_view_output, lambda: (torch.randn(2, 3),)),
    (t_as_a_function, lambda: (torch.randn(2, 3),)),
    (unsqueeze_as_a_function_then_write, lambda: (torch.randn(3),)),
    (as_strided_as_a_function, lambda: (torch.randn(6),)),
]


@pytest.mark.parametrize("fn,make", META_PROGRAMS, ids=[p[0].__name__ for p in META_PROGRAMS])
def test_metadata_mutation(fn, make):
    # Dynamo breaks the graph at an in-place metadata change of a graph input; for dealias's compiles it is traced
    # (compat/dynamo_inputs.py) and written back to the caller's tensor: no fallback, eager's layouts.
    check(fn, *make())


@pytest.mark.parametrize("fn,make", META_PROGRAMS, ids=[p[0].__name__ for p in META_PROGRAMS])
def test_metadata_mutation_of_an_input_out_of_force_is_dynamos_break(fn, make):
    with compat.forced_off("input_metadata"):
        check(fn, *make(), allow_fallback=True)


def test_detach_of_an_input_keeps_dynamos_break():
    jf = check(detach_input, torch.randn(3).requires_grad_().clone(), allow_fallback=True)
    assert dealias.graph_breaks(jf)


def neg_squeeze_mul(x):  # fuzz seed 1100373: an input autograd made (`b * 1`), written, then its layout changed
    x.neg_()
    x.squeeze_()
    x.mul_(3.0)
    return x * 2, x.shape


def t_then_write_from_a_leaf(x, y):
    x.t_()
    x.add_(y)
    return x.sum(0)


NON_LEAF_PROGRAMS = [
    (neg_squeeze_mul, lambda: ((torch.randn(1, 3, 4, requires_grad=True) * 1),)),
    (t_then_write_from_a_leaf, lambda: (torch.randn(2, 3, requires_grad=True) * 1, torch.randn(3, 2))),
]


@pytest.mark.parametrize("fn,make", NON_LEAF_PROGRAMS, ids=[p[0].__name__ for p in NON_LEAF_PROGRAMS])
def test_metadata_change_of_an_input_autograd_made(fn, make):
    # (The input's alias in dynamo's trace is a tensor autograd made too: compat/dynamo_inputs.py.) Results requiring
    # grad computed from the changed tensor run eagerly: eager's go through its new grad_fn, where a hook registered
    # after the call lands (tests/test_fuzz20.py, fuzz seed 2090444); the graph's would not.
    jf = dealias.jit(fn)
    warned = grads_like_eager(fn, jf, make, calls=2)
    assert warned and all("changes layout in place with grad on" in str(w.message) for w in warned)
    assert dealias.graph_breaks(jf) == [] and dealias.cache_info(jf).entries == 1


def t_of_a_leaf_requiring_grad(x):
    x.t_()  # eager: a leaf requiring grad used in an in-place operation
    return x


def test_what_eager_refuses_on_an_input_is_refused():
    with pytest.raises(RuntimeError, match="leaf Variable"):
        t_of_a_leaf_requiring_grad(torch.randn(2, 3, requires_grad=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="leaf Variable"):
            dealias.jit(t_of_a_leaf_requiring_grad)(torch.randn(2, 3, requires_grad=True))


def add_then_unsqueeze(x0, x1):  # fuzz seed 1100076: after `+=`, dynamo's variable is the op's, on x1's fake value
    x1 += x1
    x1.unsqueeze_(0)
    x0[0] = 0.25
    return x1, x0


def test_a_metadata_change_after_an_inplace_op_on_the_input():
    check(add_then_unsqueeze, torch.randn(2, 3, 4), torch.randn(3))


def t_and_write(x, y):
    x.t_()
    x[0] += y
    return x.sum(1)


def test_an_inputs_metadata_change_over_dynamic_sizes():
    # The input's entry sizes stay the record dynamo's shape guards are made from (a wrong record would let one
    # size's program serve another). The metadata write-back holds the sizes static: one compile per size.
    jf = dealias.jit(t_and_write, dynamic=True)
    for n, m in ((2, 3), (4, 5), (3, 7), (4, 5)):
        x, y = torch.randn(n, m), torch.randn(n)
        ex, ey = x.clone(), y.clone()
        same(jf(x, y), t_and_write(ex, ey))
        assert x.shape == ex.shape and x.stride() == ex.stride() and torch.equal(x, ex)
    assert dealias.cache_info(jf).misses == 3


def test_the_same_input_again_after_its_change():
    jf = dealias.jit(t_input)
    x, ex = torch.randn(2, 3), torch.randn(2, 3)
    ex.copy_(x)
    for _ in range(3):  # (transposed each call: the guards see each call's layout)
        got, expected = jf(x), t_input(ex)
        assert got[0] == expected[0]
        same(got[1], expected[1])
        assert x.shape == ex.shape and x.stride() == ex.stride()


def t_then_break(x):
    x.t_()
    torch._dynamo.graph_break()
    return x + 1, x.shape


def test_an_inputs_metadata_change_before_a_graph_break():
    check(t_then_break, torch.randn(2, 3), allow_fallback=True)


class Buffered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.randn(2, 3))

    def forward(self, x):
        self.buf.t_()
        return self.buf + x


def test_a_module_buffers_metadata_change():
    m, em = Buffered(), Buffered()
    em.load_state_dict(m.state_dict())
    jm = dealias.jit(m)
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x = torch.randn(3, 2) if m.buf.shape == (2, 3) else torch.randn(2, 3)
            same(jm(x), em(x))
        assert m.buf.shape == em.buf.shape and m.buf.stride() == em.buf.stride()


def test_other_backends_keep_their_break():
    targets = captured_targets(t_input, torch.randn(2, 3))
    assert not any(t == "t_" or t is torch.ops.aten.alias.default for t in targets)


# The same ops inside a graph, on intermediates and on views of inputs: compiled (compat keeps dynamo's
# view of the tensor's shape fresh), with no fallback. A tensor that made its own storage and then changed its
# metadata is returned as that tensor, not a view of it, and views taken before and after stay its views.
def unsqueeze_squeeze_clone(x):
    y = x.clone()
    y.unsqueeze_(1).squeeze_(1)
    return y


def t_between_views(x):
    y = x * 2
    z = y[0]
    y.t_()
    w = y[1]
    return y, z, w, y.shape[0]


def t_then_write(x):
    y = x + 1
    y.t_()
    y.add_(1)
    return y.sum(), y


def t_returned_twice(x):
    y = x + 1
    y.t_()
    return y, y


def write_flat_view_after_t_(x):
    y = x + 1
    v = y.view(-1)
    y.t_()
    v.mul_(2)
    return v, y


def as_strided_intermediate(x):
    y = x.exp()
    y.as_strided_((2, 2), (1, 3), 1)
    return y


def unsqueeze_view_of_input(x):
    v = x[1:]
    v.unsqueeze_(0)
    v.mul_(2)
    return x, v, v.view(v.shape[1], -1)


def t_on_constant_then_input_write(x):  # fuzz seed 5084: the metadata write's result index moved in lowering
    v = torch.full((2, 3, 4), 3.0).sin()
    v.transpose_(0, 1)
    x.permute(0, 1, 2).copy_(x)
    return (v,)


def squeeze_reshape_copy(x0, x1):  # fuzz seed 990013: reshape of a transposed tensor copies (`_unsafe_view`)
    v2 = x1.reshape(-1)
    v2.squeeze_()
    return (v2,)


def unsqueeze_reshape_copy_and_view(x):
    v = x.t().reshape(-1)
    w = v[2:]
    v.unsqueeze_(0)
    return v, w, v[0, 1:]


def t_of_detached(x):  # review finding: a detach() result is no view; re-strided in place it stays none
    y = x.detach()
    y.t_()
    z = (x * 2).detach()
    z.unsqueeze_(0)
    return y, z


INTERMEDIATE_META_PROGRAMS = [
    (unsqueeze_squeeze_clone, lambda: (torch.randn(3, 4),)),
    (t_between_views, lambda: (torch.randn(3, 4),)),
    (t_then_write, lambda: (torch.randn(3, 4),)),
    (t_returned_twice, lambda: (torch.randn(3, 4),)),
    (write_flat_view_after_t_, lambda: (torch.randn(3, 4),)),
    (as_strided_intermediate, lambda: (torch.randn(2, 3),)),
    (unsqueeze_view_of_input, lambda: (torch.randn(3, 4),)),
    (t_on_constant_then_input_write, lambda: (torch.randn(2, 3, 4),)),
    (squeeze_reshape_copy, lambda: (lambda b: (b, b.t()))(torch.randn(5, 5))),
    (unsqueeze_reshape_copy_and_view, lambda: (torch.randn(3, 4),)),
    (t_of_detached, lambda: (torch.randn(2, 3),)),
]


@pytest.mark.parametrize("fn,make", INTERMEDIATE_META_PROGRAMS, ids=[p[0].__name__ for p in INTERMEDIATE_META_PROGRAMS])
def test_metadata_mutation_inside_graph(fn, make):
    check(fn, *make())


def resize_shrink_input(x):
    x.resize_(2, 3)
    return x * 1


def resize_shrink_intermediate(x):
    y = x * 2
    y.resize_(5)
    y.add_(1)
    return y


def resize_same_numel_write(x):
    y = x.clone()
    y.resize_(3, 4)
    y[0] = 7.0
    return y


def resize_transposed_view_of_input(xb):
    x = xb.transpose(0, 1)
    r = torch.Tensor.resize_(x, (25, 5))  # (OpInfo's form) the same elements, now contiguous
    return r, xb


def resize_as_same_sizes(xb, o):
    x = xb.transpose(0, 1)
    x.resize_as_(o)  # the same sizes: eager changes nothing, the strides stay transposed
    return x.stride(), x * 1


@pytest.mark.parametrize(
    "fn, make",
    [
        (resize_shrink_input, lambda: (torch.randn(4, 3),)),
        (resize_shrink_intermediate, lambda: (torch.randn(4, 3),)),
        (resize_same_numel_write, lambda: (torch.randn(4, 3),)),
        (resize_transposed_view_of_input, lambda: (torch.randn(5, 5, 5),)),
        (resize_as_same_sizes, lambda: (torch.randn(5, 5, 5), torch.randn(5, 5, 5))),
    ],
)
def test_resize_within_memory(fn, make):
    # Dynamo traces no resize_ (a graph break); within the tensor's own elements it is traced as as_strided_
    # (compat/dynamo_resize.py): no fallback, eager's layouts, first and cached call.
    jf = check(fn, *make(), calls=3)
    assert dealias.graph_breaks(jf) == []


def test_resize_out_of_force_is_dynamos_break():
    with compat.forced_off("resize_within_memory"):
        jf = check(resize_shrink_input, torch.randn(4, 3), allow_fallback=True)
    assert dealias.graph_breaks(jf)


def resize_input_beyond_its_elements(xb):
    x = xb[:2]
    x.resize_(3, 3)  # within xb's storage, but x spans 6 elements: a later call's storage may be smaller
    return x * 1


def test_a_resize_beyond_the_tensors_own_elements_keeps_dynamos_break():
    jf = check(resize_input_beyond_its_elements, torch.randn(4, 3), allow_fallback=True)
    assert dealias.graph_breaks(jf)


def test_resize_growing_falls_back():
    def grow(x):
        y = x * 1
        y.resize_(100)
        y[:12].fill_(1.0)
        return y[:12] * 1

    with pytest.warns(dealias.FallbackWarning, match="resize_"):
        dealias.jit(grow)(torch.randn(4, 3))


def test_data_mutations():
    def write_through_data(x):
        x.data.add_(1)
        return x * 2

    def assign_data(x, y):
        x.data = y
        return x + 1

    check(write_through_data, torch.randn(3))
    # (`x.data = y` traces to aten.set_ on torch 2.13, to aten.shallow_copy_data_ on 2.14: either runs eagerly.)
    with pytest.warns(dealias.FallbackWarning, match=r"set_|shallow_copy_data_"):
        dealias.jit(assign_data)(torch.randn(3), torch.randn(3))
    check(assign_data, torch.randn(3), torch.randn(3), allow_fallback=True)
    check(write_through_data, torch.randn(3, requires_grad=True), allow_fallback=True)


def ema_codebook(x, embed):
    d = x @ embed.t()  # mm saves embed (x requires grad)
    embed.data.copy_(embed * 0.5)  # (VQ-VAE's EMA update): embed's own counter does not move
    return d


def test_a_saved_tensor_written_through_data_runs_eagerly_saying_eager_does_not_raise():
    # Eager's backward does not raise, and reads the halved codebook; the graph runs eagerly, and says why.
    x = torch.randn(4, 3, requires_grad=True)
    embed = torch.randn(5, 3)
    expected_embed = embed.clone()
    ema_codebook(x, expected_embed).sum().backward()
    expected_grad, x.grad = x.grad, None
    with pytest.warns(dealias.FallbackWarning, match="version counter of its own") as caught:
        dealias.jit(ema_codebook)(x, embed).sum().backward()
    assert not any(issubclass(w.category, dealias.EagerRaisesFallbackWarning) for w in caught)
    assert torch.equal(x.grad, expected_grad) and torch.equal(embed, expected_embed)
