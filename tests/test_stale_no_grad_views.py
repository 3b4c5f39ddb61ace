"""Views made under no_grad of a tensor that requires grad, and elements of split / unbind made with grad on,
returned after their memory was written: eager's reads of their grad_fn raise (their recorded version is not their
memory's), and dealias makes them so after the graph (OutputSlot.stale), with eager's error text. Views eager's
autograd does not track (`detach()`, a dtype view to or from an integer dtype, and views of those) never go stale
and are no fragile views at all. Against eager on fresh arguments, first and cached call: outputs (requires_grad,
grad_fn or its error, is-view), inputs, aliasing, gradients; and no fallback (held-out fuzz seeds 1200957,
1203366, 1204761, 1200744, 1201589, 1202059, 1201372, 1200258)."""

from __future__ import annotations

import pytest
import torch
from harness import grads_like_eager, no_fallback

import dealias


def _history(t: torch.Tensor) -> str:
    try:
        return "leaf" if t.grad_fn is None else "grad_fn"
    except RuntimeError as e:
        return f"raises: {str(e)[:40]}"


def _one(shape=(5, 5)):
    def make():
        g = torch.Generator().manual_seed(7)
        return (torch.randn(*shape, generator=g, requires_grad=True) * 1,)

    return make


def _two():
    g = torch.Generator().manual_seed(8)
    a = torch.randn(3, 4, 2, generator=g, requires_grad=True) * 1
    b = torch.randn(3, generator=g, requires_grad=True) * 1
    return (a, b)


def of_an_intermediate(x0):  # fuzz seed 1200957
    v1 = x0 + 1
    with torch.no_grad():
        v2 = v1.unsqueeze(0)
    v1.neg_()
    return (v2,)


def written_by_out_under_no_grad(x0):  # fuzz seed 1203366: the write is itself under no_grad
    v1 = x0.cumsum(0)
    with torch.no_grad():
        v2 = v1.narrow(0, 0, 1)
    with torch.no_grad():
        torch.neg(v2, out=v2)
    return (x0, v2)


def of_a_caller_tensor_then_a_view_with_grad(x0, x1):  # fuzz seed 1204761
    x0 += x0
    with torch.no_grad():
        v2 = x1.chunk(2, 0)[-1]
    v7 = v2.reshape(-1)
    x1.sin_()
    x1.mul_(-2.0)
    return (v7,)


def stale_and_fresh_of_one_base(x0):
    # a: made before the write (stale in eager); b: made after it (not stale); v1 itself: a tensor with history.
    v1 = x0 * 2
    with torch.no_grad():
        a = v1[0:2]
    v1.mul_(3)
    with torch.no_grad():
        b = v1[1:3]
    return (a, b, v1)


def detach_under_no_grad(x0):  # fuzz seeds 1200744, 1201955: detach is no autograd view
    with torch.no_grad():
        v7 = x0.detach()
    x0.add_(1.5)
    v9 = v7.squeeze()
    with torch.no_grad():
        v14 = v9.transpose(0, 1)
    return (v14, v7)


def integer_view_chain(x0, x1):  # fuzz seed 1201589: x1.view(int32), its float view under no_grad, a narrow
    v2 = x1.view(torch.int32)
    x0.masked_fill_(x0 > 0, -2.0)
    with torch.no_grad():
        v5 = v2.view(torch.float32)
    v7 = v5.narrow(0, 1, 1)
    v2.bitwise_xor_(5)
    return (v7,)


def write_through_detach_of_a_no_grad_split(x0):  # fuzz seed 1202059: eager does not raise
    with torch.no_grad():
        v3 = x0.split(2, 0)[0]
    v4 = v3.squeeze()
    v3.detach().zero_()
    return (v4,)


def split_of_a_no_grad_view_returned_after_a_write(x0):  # fuzz seed 1201372: eager's error names UnbindBackward0
    with torch.no_grad():
        v4 = x0.diagonal(-1)
    v5 = v4.unbind(0)[0]
    with torch.no_grad():
        v5[1:] = -2.0
    return (v5,)


def view_under_no_grad_of_a_split_of_a_no_grad_view(x0):  # (its error is the no_grad view's again)
    with torch.no_grad():
        v4 = x0.diagonal(-1)
    v5 = v4.unbind(0)[0]
    with torch.no_grad():
        v6 = v5[1:]
    x0.mul_(2)
    return (v6,)


def split_element_of_an_intermediate_returned_after_a_write(x0):  # fuzz seeds 1200258, 1202522, 1204860
    y = x0 * 2
    v = y.split(2, 0)[1]
    y.add_(1)
    return (v,)


def view_of_a_split_element_returned_after_a_write(x0):
    y = x0.sin()
    v = y.unbind(1)[2].unsqueeze(0)
    y.mul_(y)
    return (v, y)


CASES = [
    (of_an_intermediate, _one()),
    (written_by_out_under_no_grad, _one((6,))),
    (of_a_caller_tensor_then_a_view_with_grad, _two),
    (stale_and_fresh_of_one_base, _one()),
    (detach_under_no_grad, _one()),
    (integer_view_chain, lambda: (_one((2, 3, 4))()[0], _one((3,))()[0])),
    (write_through_detach_of_a_no_grad_split, _one()),
    (split_of_a_no_grad_view_returned_after_a_write, _one((3, 4, 2))),
    (view_under_no_grad_of_a_split_of_a_no_grad_view, _one((3, 4, 2))),
    (split_element_of_an_intermediate_returned_after_a_write, _one()),
    (view_of_a_split_element_returned_after_a_write, _one()),
]


@pytest.mark.parametrize("fn,make", CASES, ids=[f.__name__ for f, _ in CASES])
def test_like_eager_without_fallback(fn, make):
    jf = dealias.jit(fn, executor="torch")
    assert grads_like_eager(fn, jf, make) == []
    eager, got = fn(*make()), jf(*make())  # (a third call: the cached program again)
    for e, g in zip(eager, got):
        assert (_history(g), g.requires_grad, g._is_view()) == (_history(e), e.requires_grad, e._is_view())
    assert dealias.cache_info(jf).entries >= 1


@pytest.mark.parametrize(
    "fn",
    [
        split_of_a_no_grad_view_returned_after_a_write,
        view_under_no_grad_of_a_split_of_a_no_grad_view,
        split_element_of_an_intermediate_returned_after_a_write,
        view_of_a_split_element_returned_after_a_write,
    ],
)
def test_the_error_is_eagers(fn):
    make = _one((3, 4, 2)) if "no_grad" in fn.__name__ else _one()
    with no_fallback():
        got = dealias.jit(fn, executor="torch")(*make())[0]
    messages = []
    for t in (fn(*make())[0], got):
        with pytest.raises(RuntimeError) as e:
            _ = t.grad_fn
        messages.append(str(e.value))
    assert messages[0] == messages[1]


def test_stale_views_raise_as_eager_at_backward():
    # Eager's weighted sum reads the stale view's grad_fn and raises; dealias's must too.
    fn, make = of_an_intermediate, _one()
    with pytest.raises(RuntimeError, match="no_grad mode"):
        (fn(*make())[0] * 2).sum()
    with no_fallback(), pytest.raises(RuntimeError, match="no_grad mode"):
        (dealias.jit(fn, executor="torch")(*make())[0] * 2).sum()


def test_the_counter_is_set_back():
    # The stale view is made with the shared counter one behind, then set back: the fresh view and the base keep
    # eager's counter, and the fresh view made after the write does not raise.
    fn, make = stale_and_fresh_of_one_base, _one()
    with no_fallback():
        e, g = fn(*make()), dealias.jit(fn, executor="torch")(*make())
    assert [t._version for t in g] == [t._version for t in e]
    assert _history(g[0]).startswith("raises") and _history(g[1]) == "leaf"


def _write_the_base(outs, args):
    with torch.no_grad():
        outs[-1].add_(1)


def _write_the_view(outs, args):
    with torch.no_grad():
        outs[0].add_(1)


@pytest.mark.parametrize(
    "fn,write",
    [
        (stale_and_fresh_of_one_base, _write_the_base),
        (of_an_intermediate, _write_the_view),
        (view_of_a_split_element_returned_after_a_write, _write_the_base),
        (split_element_of_an_intermediate_returned_after_a_write, _write_the_view),
    ],
    ids=["base", "view", "split-base", "split-view"],
)
@pytest.mark.parametrize("executor", ["torch", pytest.param("inductor", marks=pytest.mark.inductor)])
def test_a_later_write_leaves_it_stale(fn, write, executor):
    # The caller writes the memory after the call: eager's view stays stale (its recorded version is behind the
    # counter for good), its grad_fn, requires_grad uses and is_leaf still raise. Made with the counter one ahead,
    # the first such write made it current again: grad_fn None (a leaf), or SplitBackward0 for a split's element.
    make = _one()
    with no_fallback():
        jf = dealias.jit(fn, executor=executor)
        runs = [(fn, make()), (jf, make()), (jf, make())]
        seen = []
        for f, args in runs:
            outs = f(*args)
            write(outs, args)
            seen.append([_history(t) for t in outs])
    assert seen[1] == seen[0] and seen[2] == seen[0]
    assert seen[0][0].startswith("raises")
