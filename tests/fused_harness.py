"""Helpers of the fused executor's tests (test_inductor*.py): the fused graph a program ran and its targets, and
the small programs more than one of those files compiles."""

from __future__ import annotations

import torch


def fused_graph(jf) -> torch.fx.GraphModule:
    return jf.last.run_graph.graph


def targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def flip_in_place(x):
    x.copy_(x.flip(0))


def slice_write(buf, row):
    buf[123] = row
    buf[124].add_(row)


def kv_write(kc, vc, k, v, pos):
    kc.index_copy_(2, pos, k)
    vc.index_copy_(2, pos, v)


def double_then_sin(x):
    x.mul_(2)
    return x.sin()
