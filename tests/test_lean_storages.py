"""The lean check's storage part (frontend/guards.py `lean_check`): where every passed leaf is a tensor, the storages of
`args` and of the held tensors are taken with one `map` each, not a call written out per tensor (issue 38: a
mobilenet's training forward passes 142 tensors). Whatever the form, a call whose tensors now share a storage (a view,
another offset of one storage, a parameter moved into another's memory with `.data`, a subclass) fails it, and the
compiled function gives eager's results."""

from __future__ import annotations

import pytest
import torch
from harness import compare_call

import dealias
from dealias.frontend.guards import lean_check, lookup_key


class Sub(torch.Tensor):
    pass


def _plain(n):
    return [torch.randn(4) for _ in range(n)]


def test_all_tensor_args_are_counted_in_one_map():
    holds = lean_check(_plain(3), frozenset(), None)
    assert "len({*map(storage, args)}) == 3" in holds.source, holds.source
    assert "storage(a" not in holds.source, holds.source


def test_a_scalar_among_the_args_keeps_the_call_per_tensor():
    holds = lean_check([torch.randn(4), 2, torch.randn(4)], frozenset(), None)
    assert "len({storage(a0), storage(a2)}) == 2" in holds.source, holds.source
    assert holds((torch.randn(4), 2, torch.randn(4)))
    b = torch.randn(8)
    assert not holds((b[:4], 2, b[4:]))


def test_held_tensors_are_counted_in_a_map_of_their_own():
    p = torch.nn.Parameter(torch.randn(4))
    x = torch.randn(4)
    holds = lean_check([x, p], frozenset(), None, held=1)
    assert "len({*map(storage, args), *map(storage, held)}) == 2" in holds.source, holds.source
    assert holds((torch.randn(4),))
    assert not holds((p.detach(),))  # (the held parameter's own storage, passed)
    other = torch.randn(4)
    with torch.no_grad():
        p.data = other  # (the held parameter moved into a passed tensor's memory)
    assert not holds((other,)) and not holds((other[:],))
    assert holds((torch.randn(4),))


def test_a_subclass_counts_storage_ids_in_one_map():
    holds = lean_check([torch.randn(4).as_subclass(Sub), torch.randn(4)], frozenset(), None)
    assert "len({*map(sid, args)}) == 2" in holds.source, holds.source
    b = torch.randn(8)
    assert holds((torch.randn(4).as_subclass(Sub), torch.randn(4)))
    assert not holds((b[:4].as_subclass(Sub), b[4:]))


def _layouts():
    """Ways the second of three inputs shares the first's storage (dynamo guards none of them)."""
    b = torch.randn(12)
    p, q = torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(4))
    with torch.no_grad():
        q.data = p.data  # (another Parameter object, the first's memory)
    return {
        "view": (b[:4], b[:4].view(2, 2).view(4), torch.randn(4)),
        "other offset": (b[:4], b[4:8], torch.randn(4)),
        "overlap": (b[:4], b[2:6], torch.randn(4)),
        "detached": (b[4:8], b[4:8].detach(), torch.randn(4)),
        ".data": (p.detach(), q.detach(), torch.randn(4)),
        "third": (torch.randn(4), b[:4], b[8:]),
    }


@pytest.mark.parametrize("layout", list(_layouts()))
def test_the_map_form_refuses_what_the_lookup_key_refuses(layout):
    first = _plain(3)
    holds = lean_check(first, frozenset(), None)
    key = lookup_key(first, 3)[0]
    call = _layouts()[layout]
    assert lookup_key(list(call), 3)[0] != key
    assert not holds(call)
    assert holds(tuple(_plain(3)))


def write_and_read(a, b, c):
    a.add_(1)
    return b * 2 + c


@pytest.mark.parametrize("layout", list(_layouts()))
def test_compiled_calls_whose_inputs_now_share_a_storage_give_eagers_results(layout):
    jf = dealias.jit(write_and_read)
    for args in [tuple(_plain(3)), _layouts()[layout], tuple(_plain(3)), _layouts()[layout]]:
        assert compare_call(write_and_read, jf, args) is None, layout
    graph = jf.stats.graphs[0]
    assert graph.lean is not None and "map(storage, args)" in graph.lean[0].source, graph.lean[0].source
