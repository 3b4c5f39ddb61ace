"""A write autograd does not see (under no_grad, through detach() or a dtype view) of a tensor autograd recorded a
write of (or that the program made), after a read of it with grad on (passes/hidden_writes.py): eager's tensor
keeps the grad_fn the read's gradient went through, dealias's gets its history at its write-back or return.

Where nothing can tell (the read carries no history, its result reaches nothing the caller holds, a recorded write
follows) the graph compiles; where a hook registered after the call would see another gradient, it runs eagerly.
Compared with eager on cloned inputs: outputs, inputs after the call, gradients of the leaves, and what hooks
registered after the call on every argument and result see; first and cached call."""

from __future__ import annotations

import warnings

import pytest
import torch

import dealias
from dealias.runtime.verify import compare_call
from dealias.tools.fuzz import _compare_grads
from dealias.tools.fuzz.runner import _grad_leaves


def _non_leaf(*shapes):
    def make():
        g = torch.Generator().manual_seed(0)
        return tuple(torch.randn(*s, generator=g, requires_grad=True) * 1 for s in shapes)

    return make


def hooked(fn, make_args):
    """What hooks registered after the call see, on each argument and result requiring grad, and the leaves'
    gradients, for a backward of a weighted sum of the results and the arguments."""
    args = make_args()
    leaves = _grad_leaves(args)  # (what `b * 1` was computed from, or the argument itself)
    out = fn(*args)
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor)]
    seen = {}
    for i, t in enumerate([*args, *outs]):
        # (not on an argument that is a view: torch 2.13 and 2.14 crash registering one on `a[1:]` written
        # through its base after the grad_fns were walked to the leaves; the base's hook sees its gradient)
        if t.requires_grad and not (i < len(args) and t._is_view()):
            t.register_hook(lambda g, i=i: seen.setdefault(i, []).append(g.clone()))
    total = sum((t * (2 + i + torch.arange(t.numel()).view(t.shape) % 3)).sum() for i, t in enumerate([*args, *outs]))
    try:
        grads = torch.autograd.grad(total, leaves)
    except RuntimeError as e:  # eager's error at backward (a saved tensor written since) is compared too
        return seen, str(e).split("Hint")[0]
    return seen, grads


def assert_hooks_like_eager(fn, make_args, compiled):
    jf = dealias.jit(fn, executor="torch")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dealias.FallbackWarning)
        for call in range(2):
            assert compare_call(fn, jf, make_args()) is None, call
            assert _compare_grads(fn, jf, make_args) is None, call
            expected, got = hooked(fn, make_args), hooked(jf, make_args)
            assert isinstance(got[1], str) == isinstance(expected[1], str), (call, got[1], expected[1])
            if isinstance(expected[1], str):
                assert got[1] == expected[1], call
                got, expected = got[0], expected[0]
            torch.testing.assert_close(got, expected, msg=lambda m, call=call: f"call {call + 1}: {m}")
    told = [str(w.message) for w in caught if issubclass(w.category, dealias.FallbackWarning)]
    if compiled:
        assert not told, told
        assert dealias.cache_info(jf).entries == 1 and dealias.cache_info(jf).eager_entries == 0
    else:
        assert told and all("invisibly to autograd after a read" in m for m in told), told


# -- compiled: nothing a hook after the call sees differs --------------------------------------------------------
def read_through_detach(x):
    x.sin_()
    m = x.detach() > 0  # reads no history (fuzz seed 1200697)
    x.detach().masked_fill_(m, 3.0)
    return x * 2


def non_differentiable_reads(x):
    x.sin_()
    z = torch.zeros_like(x)  # a fresh leaf (fuzz seed 1200591)
    n = (x > 0).sum()  # an integer result
    with torch.no_grad():
        x.mul_(1.5)
    return z, n


def dead_read(x):
    x.sin_()
    v = x.exp()  # nothing computed from it survives the call: no gradient ever flows through it
    v.mul_(2)
    with torch.no_grad():
        x.mul_(1.5)
    return x.cos()


def recorded_write_after(x):
    x.sin_()
    v = x * 2
    with torch.no_grad():
        x.mul_(1.5)
    x.add_(1)  # eager's x gets a new grad_fn that v's gradient does not pass, as dealias's write-back does
    return v


def returned_intermediate_read_dead(a):
    y = a * 2
    y.sin_()
    r = y * 3  # dead
    del r
    y.detach().add_(1)
    return y


@pytest.mark.parametrize(
    "fn",
    [
        read_through_detach,
        non_differentiable_reads,
        dead_read,
        recorded_write_after,
        returned_intermediate_read_dead,
    ],
)
def test_compiled_where_no_hook_can_tell(fn):
    assert_hooks_like_eager(fn, _non_leaf((3, 4)), compiled=True)


# -- a caller's own tensor: written back at its last recorded write, its hidden writes in place after it -----------
def live_read_then_hidden_write(x):
    x.sin_()
    v = x * 2  # v's gradient goes through sin_'s node, x's grad_fn in eager after the no_grad write too
    with torch.no_grad():
        x.mul_(1.5)
    return v


def live_read_into_another_input(x, y):
    x.sin_()
    y.add_(x * 2)  # the read reaches the caller through y
    x.detach().mul_(1.5)
    return x.sum().detach()


def input_made_to_require_grad(x, w):
    # x requires no grad until add_ records a write (before, compiled silently: a hook on x saw 5 for eager's 8).
    x.add_(w)
    r = x * 3
    x.detach().mul_(2)
    return r


def through_a_dtype_view(x):
    x.sin_()
    r = x * 3
    x.view(torch.int32).bitwise_and_(-65536)
    return r


def reads_around_hidden_writes(x):
    x.sin_()
    a = x * 2
    x.detach().mul_(1.5)
    b = x.exp()  # reads the hidden write's values, its gradient through sin_'s node as well
    with torch.no_grad():
        x[0].zero_()
    return a, b, x.cos()


def hook_registered_in_the_program(x):
    x.sin_()
    v = x * 2
    with torch.no_grad():
        x.mul_(1.5)
    x.register_hook(lambda g: g * 3)  # dynamo registers it after the graph, on the caller's x (fuzz seed 1201609)
    return v


def written_through_data(x):
    x.sin_()
    v = x * 2  # (`x * x` would save x: a .data write of it after runs eagerly, saved.py)
    x.data.mul_(1.5)
    return v


def saved_by_the_anchor(x):
    x.relu_()  # saves its result, x: the no_grad write makes eager's backward through x raise
    v = x * 2
    with torch.no_grad():
        x[1:].fill_(0.5)
    return v


def two_anchors(x):
    x.sin_()
    a = x * 2
    with torch.no_grad():
        x.mul_(1.5)
    x.cos_()  # a recorded write: the first read's gradient no longer reaches x's grad_fn
    b = x * 3
    with torch.no_grad():
        x.add_(1)
    return a, b


def recorded_write_reading_a_detached_alias(x):
    x.sin_()
    v = x * 2
    x.add_(x.detach())  # recorded: what it writes is x itself (a hidden write would have lost this one's value)
    return v


def _plain_and_leaf():
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g, requires_grad=True)


@pytest.mark.parametrize(
    ("fn", "make"),
    [
        (live_read_then_hidden_write, _non_leaf((3, 4))),
        (live_read_into_another_input, _non_leaf((3, 4), (3, 4))),
        (input_made_to_require_grad, _plain_and_leaf),
        (through_a_dtype_view, _non_leaf((3, 4))),
        (reads_around_hidden_writes, _non_leaf((3, 4))),
        (hook_registered_in_the_program, _non_leaf((3, 4))),
        (written_through_data, _non_leaf((3, 4))),
        (saved_by_the_anchor, _non_leaf((3, 4))),
        (two_anchors, _non_leaf((3, 4))),
        (recorded_write_reading_a_detached_alias, _non_leaf((3, 4))),
    ],
)
def test_caller_tensor_keeps_the_grad_fn_the_read_went_through(fn, make):
    assert_hooks_like_eager(fn, make, compiled=True)


def test_caller_tensor_after_the_call_is_eager_s():
    # What the caller reads of x after the call: the gradient into x itself (autograd.grad, retain_grad), its
    # version counter, and its grad_fn still being the node v's gradient went through.
    # (dealias's counter moves once for the writes it makes functional before the anchor, as at any write-back:
    # these have none.)
    for fn in (live_read_then_hidden_write, written_through_data):
        _caller_tensor_like_eager(fn)
    # A hook the caller registers on x after the call, one that changes the gradient: the graph gave x its history
    # only at its write-back, after the no_grad write, a node v's gradient never passes, so the hook never ran
    # (fuzz seed 1940010: the gradient twice eager's, silently). x now receives its value at sin_ and the no_grad
    # write in place.
    _hook_after_the_call_like_eager(live_read_then_hidden_write)


def _hook_after_the_call_like_eager(fn):
    def grad(f):
        b = torch.randn(2, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
        x = b * 1
        out = f(x)
        x.register_hook(lambda g: g * 0.5)
        (g,) = torch.autograd.grad(out.sum(), b)
        return g

    jf = dealias.jit(fn, executor="torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        got = grad(jf)
    torch.testing.assert_close(got, grad(fn))
    torch.testing.assert_close(grad(jf), got)


def _caller_tensor_like_eager(fn):
    jf = dealias.jit(fn, executor="torch")
    for call in range(2):
        got = []
        for f in (fn, jf):
            (x,) = _non_leaf((3, 4))()
            start = x._version
            x.retain_grad()
            out = f(x)
            v = sum(o.sum() for o in (out if isinstance(out, tuple) else (out,)))
            (dx,) = torch.autograd.grad(v * 3 + (x * 5).sum(), x, retain_graph=True)
            (v + x.sum()).backward()
            got.append((dx, x.grad, x._version - start, x.detach().clone()))
        torch.testing.assert_close(got[1], got[0], msg=lambda m, call=call: f"call {call + 1}: {m}")
    assert dealias.cache_info(jf).eager_entries == 0


def saves_what_the_hidden_write_changes(x):
    x.sin_()
    v = x * x  # saves x
    x.detach().add_(1)
    return v


def test_saved_tensor_written_invisibly_raises_as_eager():
    fn = saves_what_the_hidden_write_changes
    jf = dealias.jit(fn, executor="torch")
    for _ in range(2):
        errors = []
        for f in (fn, jf):
            (x,) = _non_leaf((3, 4))()
            v = f(x)
            with pytest.raises(RuntimeError, match="modified by an inplace operation") as e:
                v.sum().backward()
            errors.append(str(e.value).split("Hint")[0])
        assert errors[0] == errors[1]
        assert compare_call(fn, jf, _non_leaf((3, 4))()) is None
    assert dealias.cache_info(jf).eager_entries == 0


# -- run eagerly: memory a hook after the call reaches and dealias cannot write in place ---------------------------
def returned_intermediate(a):
    # The program's own memory, returned: its grad_fn is sin_'s node in eager, keep_history's in dealias (which
    # compiled it, silently: a hook on y saw 3 where eager's sees 6).
    y = a * 2
    y.sin_()
    r = y * 3
    y.detach().add_(1)
    return y, r


def aliased_inputs(x0, x1):
    x0.sin_()
    v = x1 * 2  # x1 = x0[1:]
    with torch.no_grad():
        x0.mul_(1.5)
    return v


def _base_and_view():
    (a,) = _non_leaf((3, 4))()
    return a, a[1:]


@pytest.mark.parametrize(("fn", "make"), [(returned_intermediate, _non_leaf((3, 4))), (aliased_inputs, _base_and_view)])
def test_runs_eagerly_where_a_hook_would_see_the_read(fn, make):
    assert_hooks_like_eager(fn, make, compiled=False)


# -- eager's error at backward where a `.data` write follows the one that made a saved tensor stale ----------------
def saved_then_no_grad_then_data(x):
    x.sin_()
    a = x * 2
    b = x * x  # saves x
    with torch.no_grad():
        x[1].add_(1)  # moves x's counter: b's backward raises
    x.data.mul_(0.5)  # moves none: eager's message names the version before it (found in review: it named one more)
    return a, b


def saved_then_data_after_a_hidden_write(x, y):
    y.add_(x)
    r = y * y  # saves y
    y.detach()[0].zero_()
    y.data.mul_(2)
    return r


def intermediate_saved_then_data(x):
    y = x * 1
    b = y * y  # (the program's own memory: the same message, before this change of the rule too)
    with torch.no_grad():
        y.add_(1)
    y.data.mul_(2)
    return b


@pytest.mark.parametrize(
    ("fn", "make"),
    [
        (saved_then_no_grad_then_data, _non_leaf((3, 4))),
        (saved_then_data_after_a_hidden_write, _non_leaf((3, 4), (3, 4))),
        (intermediate_saved_then_data, _non_leaf((3, 4))),
    ],
)
def test_data_write_after_a_stale_saved_tensor_raises_eager_s_message(fn, make):
    assert_hooks_like_eager(fn, make, compiled=True)
