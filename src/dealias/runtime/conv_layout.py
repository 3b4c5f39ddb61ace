"""Whether inductor lays out a fused graph's convolutions channels-last (its CPU default) or as eager does, measured
on this host.

On CPU inductor always converts a graph with convolutions to channels-last (`layout_optimization`): activations,
and at every call each weight, which is a graph input it cannot fold (the caller's parameter, trained in place).
Which layout runs faster depends on the convolutions, by large factors both ways. One thread here: a
resnet18-like net's eval forward ran at 1.58x eager channels-last (its 3x3 convolutions slower in oneDNN's
channels-last kernels, plus the weights' conversions) and 0.89x in eager's layout; a mobilenet-like one (depthwise
convolutions, faster channels-last) at 0.68x channels-last and 0.79x in eager's layout. So each convolution is
timed here, on the first graph that has it: ATen's kernel on eager's layout against the same kernel on a
channels-last input with its weight converted (inductor's conversion per call), for the node's own sizes, dtype,
strides, padding and groups, at the current thread count; the graph goes channels-last only if that sums to less
over its convolutions, for a graph autograd records too (see `channels_last`). Verdicts are kept on disk with
keep_aten.py's (per host).

`DEALIAS_CONV_LAYOUT` overrides the measurement: `contiguous` (eager's layout) or `channels_last`, for
reproducible graphs.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..ir.viewops import symbolic_layout
from .keep_aten import best_of, measured

aten = torch.ops.aten


def channels_last(gm: fx.GraphModule) -> bool | None:
    """Whether inductor should lay `gm`'s convolutions out channels-last: None (inductor's own choice) for a graph
    without convolutions or with one that is not measured here (symbolic sizes, not on CPU, not floating). A graph
    autograd records is measured the same way, by its forward's convolutions: with min-cut's partition
    (fused_autograd.py) a mobilenet-like training forward ran 0.58x eager channels-last where eager's layout ran
    0.70x, its training step 0.89x either way (it ran 1.10x channels-last when the forward stored what the default
    partition saves), a conv + BatchNorm2d + ReLU training forward 0.84x against 0.98x, and a resnet-like one
    keeps eager's layout, measured faster for its 3x3 convolutions (torch 2.13, one thread)."""
    convs = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.convolution.default]
    if not convs:
        return None
    setting = os.environ.get("DEALIAS_CONV_LAYOUT", "measure").strip()
    if setting in ("contiguous", "channels_last"):
        return setting == "channels_last"
    eager_s = channels_last_s = 0.0
    for n in convs:
        x, w, bias = (a.meta.get("val") if isinstance(a, fx.Node) else a for a in n.args[:3])
        rest = tuple(n.args[3:])
        tensors = [t for t in (x, w, bias) if t is not None]
        if (
            not all(isinstance(t, torch.Tensor) for t in tensors)
            or any(symbolic_layout(t) or t.device.type != "cpu" or not t.is_floating_point() for t in tensors)
            or x.dim() != 4
            or any(isinstance(a, (fx.Node, torch.SymInt)) for a in _leaves(rest))
        ):
            return None
        sizes = [(tuple(t.shape), tuple(t.stride())) for t in tensors]
        key = f"convolution layout|{sizes}|{rest!r}|{x.dtype}|threads={torch.get_num_threads()}"
        e, c = measured(key, lambda args=(x, w, bias, rest): measure(*args))
        eager_s, channels_last_s = eager_s + e, channels_last_s + c
    return channels_last_s < eager_s


def _leaves(args: Any) -> list[Any]:
    return torch.utils._pytree.tree_leaves(args)


def measure(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, rest: tuple[Any, ...]) -> tuple[float, float]:
    """Seconds per call of the convolution `(x, w, bias, *rest)` on eager's layout of the tensors like the fake
    `x, w, bias`, and channels-last with the weight converted in the call. Best of interleaved rounds."""
    with unset_fake_temporarily(), torch.no_grad(), torch.random.fork_rng(devices=[]):

        def real(t: torch.Tensor) -> torch.Tensor:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).normal_()

        xr, wr = real(x), real(w)
        br = real(bias) if bias is not None else None
        x_cl = xr.contiguous(memory_format=torch.channels_last)
        cl = torch.channels_last
        return best_of(
            lambda: aten.convolution(xr, wr, br, *rest),
            lambda: aten.convolution(x_cl, wr.contiguous(memory_format=cl), br, *rest),
            rounds=5,
            seconds=0.005,
        )
