"""`out=` into a tensor of another shape, which eager resizes (compat/dynamo_out_resize.py): compiled, the caller's
tensor resized and written as eager leaves it, eager's UserWarning on every call; dynamo's break where eager's
resize would need memory beyond out's own elements."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import check, compare_call

import dealias


def cumsum_into_input(v, x):
    torch.cumsum(v, 0, out=x)  # (2,) into (3, 4, 2): x becomes (2,)
    x.mul_(2)
    return x.shape, x


def exp_into_view_of_input(x, y):
    torch.exp(y, out=x[1:])  # (5,) into a (4, 5) view: the view is resized, x's row 1 written
    return x


def add_transposed_into_view(a, buf):
    v = buf[1:3]
    r = torch.add(a.t(), 1, out=v)  # (2, 3) from a transposed input: eager re-strides v to (1, 2)
    return r is v, v.stride(), buf


def same_numel_other_shape(x, y):
    v = x[1:]
    torch.exp(y, out=v)  # (1, 3, 4) -> (3, 4): resized, same elements
    w = v.view(-1)
    return w.sum(), v.shape


def resize_beyond_out(x, out):
    torch.add(x, 1, out=out)  # 6 elements into 2: eager reallocates out's storage
    return out


def into_a_strided_view(x, buf):  # fuzz seed 1101128
    torch.sin(x, out=buf[::2])  # (3, 5) every other row, resized to (1, 5): a write through as_strided of it
    return buf


def into_empty(x, out):
    torch.mul(x, 3, out=out)  # no elements: eager allocates out's new memory (and gives no warning)
    return out


CASES = [
    (cumsum_into_input, lambda: (torch.randn(2), torch.randn(3, 4, 2))),
    (exp_into_view_of_input, lambda: (torch.randn(5, 5), torch.randn(5))),
    (add_transposed_into_view, lambda: (torch.randn(3, 2), torch.randn(5, 5))),
    (same_numel_other_shape, lambda: (torch.randn(2, 3, 4), torch.randn(3, 4))),
]


def _warnings(fn, args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(*args)
    return [(w.category, str(w.message)) for w in caught if "was resized" in str(w.message)]


@pytest.mark.parametrize("fn, make", CASES)
def test_a_resizing_out_compiles_as_eager(fn, make):
    jf = check(fn, *make(), calls=3)  # (outputs, inputs with their new sizes and strides; no FallbackWarning)
    assert dealias.graph_breaks(jf) == []
    assert dealias.cache_info(jf).entries == 1


@pytest.mark.parametrize("fn, make", CASES)
def test_eagers_resize_warning_on_every_call(fn, make):
    jf = dealias.jit(fn)
    for _ in range(2):  # (first and cached call)
        expected = _warnings(fn, make())
        assert expected and "was resized" in expected[0][1]
        assert _warnings(jf, make()) == expected


def test_the_callers_tensor_has_eagers_new_layout():
    x = torch.randn(3, 4, 2)
    storage = x.untyped_storage().data_ptr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        shape, _ = dealias.jit(cumsum_into_input)(torch.ones(2), x)
    assert shape == (2,) and x.shape == (2,) and x.stride() == (1,) and x.untyped_storage().data_ptr() == storage
    assert x.tolist() == [2.0, 4.0]


@pytest.mark.parametrize(
    "fn, make",
    [
        (resize_beyond_out, lambda: (torch.randn(2, 3), torch.zeros(2))),
        (into_empty, lambda: (torch.randn(2, 3), torch.empty(0))),
        (into_a_strided_view, lambda: (torch.randn(1, 5), torch.randn(5, 5))),
    ],
)
def test_a_resize_beyond_outs_memory_keeps_the_break_and_eagers_result(fn, make):
    jf = dealias.jit(fn)
    for call in range(2):
        expected = _warnings(fn, make())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert compare_call(fn, jf, make()) is None
        resized = [(w.category, str(w.message)) for w in caught if "was resized" in str(w.message)]
        # (compare_call runs eager, then dealias; at the first call dynamo's trace of the `out=` call before its
        # break gives a warning of its own, from torch's Python reference of the op: as with every backend)
        assert resized[: len(expected)] == expected and (call == 0 or resized == expected * 2)
    assert dealias.graph_breaks(jf)
