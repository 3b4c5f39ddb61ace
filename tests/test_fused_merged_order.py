"""fused.runner's check for results of different values returned in one memory (fuzz seed 2441434), where the
result of symbolic sizes that comes first is empty on the first call: on a later call it must still be found in the
memory of the result after it (review17: `merged` keeps the first result it meets as the memory's holder and skips
results seen before, `done`, so a holder seen late and a result seen early are never compared)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from dealias.runtime import fused


def _program(empty_first: bool):
    def f(x):
        a = x * 2
        part, whole = a[: x.shape[0] - 3].clone(), a.clone()
        return (part, whole) if empty_first else (whole, part)

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(8))

    def compiled(args):  # (as inductor may return them: both clones dropped, one buffer)
        (x,) = args
        buf = x * 2
        part = buf[: x.shape[0] - 3]
        return [part, buf] if empty_first else [buf, part]

    return fused.runner(gm, compiled, None)


@pytest.mark.parametrize("empty_first", [False, True])
def test_results_merged_after_an_empty_first_call_come_back_apart(empty_first):
    run = _program(empty_first)
    for n in (3, 5, 6):  # (the first call: the part is empty)
        outs = run(torch.randn(n))
        part, whole = outs if empty_first else outs[::-1]
        assert part.numel() == n - 3
        if part.numel():
            assert part.untyped_storage().data_ptr() != whole.untyped_storage().data_ptr()
