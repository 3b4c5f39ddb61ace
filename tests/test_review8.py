"""Review 8: silent wrong results found in the fused executor's hazard rule (runtime/hazards.py), each against
eager. Marked `inductor`: each compiles with inductor (seconds)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fused_harness import fused_graph, targets
from harness import check

from dealias.runtime.hazards import SNAPSHOT, check_hazards

pytestmark = pytest.mark.inductor


def swap_through_a_view(buf):
    # `clone` is read through a view made before the write (`r`, used by `s` there) and after it (`r.neg()`): the
    # hazard rule looked at the clone's own users only (the view), so inductor computed `r.neg()` from the
    # written `buf[0]` (inductor drops the clone)
    a = buf.clone()
    r = a[0]
    s = r * 1
    buf[0] = buf[1]
    buf[1] = r.neg()
    return s


def test_value_read_through_a_view_across_a_write():
    jf = check(swap_through_a_view, torch.randn(4, 3), executor="inductor")
    assert SNAPSHOT in targets(fused_graph(jf))
    check_hazards(fused_graph(jf))


def positions_returned(w):
    # a constant index (GPT-2's position ids) is computed once and handed to every call: returned, it was the one
    # tensor every call returned, and a caller's write into one call's result changed the next calls' embedding
    pos = torch.arange(4)
    return F.embedding(pos, w), pos.view(2, 2)


def test_a_constant_index_returned_is_a_new_tensor_each_call():
    w = torch.randn(6, 3)
    jf = check(positions_returned, w, executor="inductor")
    first = jf(w)
    first[1].fill_(5)  # (the caller's write into a result of its own)
    expected, got = positions_returned(w), jf(w)
    assert got[1].untyped_storage().data_ptr() != first[1].untyped_storage().data_ptr()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
