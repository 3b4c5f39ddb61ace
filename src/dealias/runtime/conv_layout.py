"""Whether inductor lays out a fused graph's convolutions channels-last (its CPU default) or as eager does, measured
on this host.

On CPU inductor always converts a graph with convolutions to channels-last (`layout_optimization`): activations,
and at every call each weight, which is a graph input it cannot fold (the caller's parameter, trained in place);
in a graph autograd records, each weight's gradient is converted back to the parameter's layout too. Which layout
runs faster depends on the convolutions, by large factors both ways. One thread here: a resnet18-like net's eval
forward ran at 1.58x eager channels-last and 0.89x in eager's layout; a mobilenet-like one (depthwise convolutions,
faster channels-last) at 0.68x channels-last and 0.79x in eager's layout. So the graph's cost is measured here in
two parts, each on the first graph that has it:

- its convolutions' kernels: ATen's kernel on eager's layout against the same kernel on a channels-last input and
  weight (converted before the timed calls), for each node's own sizes, dtype, strides, padding and groups;
- its inputs' conversions: the weights whose memory order channels-last changes (not 1x1 nor depthwise ones) and
  the activations the graph takes as inputs (a batch handed to the first convolution), converted one after the other
  as the graph converts them, by ATen's copy and, where that decides the layout, by
  inductor's own code for it (one small compile). Inductor's conversion is what runs, and it is the part a kernel's
  timing on a warm weight missed: resnet18 (1x3x64x64, torch 2.14) measured its 3x3 kernels at 3.8 ms
  channels-last against 9.9 ms, but its 43 MB of weights took 5.2 ms to convert by ATen's copy and 10 ms by
  inductor's, once per call for the forward and once more for the gradients (training forward 1.37x eager
  channels-last, 0.96x in eager's layout; its step 1.62x against 1.05x; mobilenet's weights take microseconds).

The graph goes channels-last only if its kernels plus its conversions (twice for an input autograd records a
gradient of) sum to less than eager's layout's kernels. Verdicts are kept on disk with keep_aten.py's (per host,
thread count). Not counted: the backward's own kernels (resnet18's and mobilenet's steps each took the layout their
forward did: measured as fast or faster that way).

A graph that goes channels-last also asks, per host and sizes, whether its 1x1 convolutions run faster as matrix
products (`one_by_one_as_matmuls`).

`DEALIAS_CONV_LAYOUT` overrides the measurement: `contiguous` (eager's layout) or `channels_last`, for
reproducible graphs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..ir.viewops import symbolic_layout
from .keep_aten import aten_against_inductor, best_of, measured

aten = torch.ops.aten
# Inductor's conversion is measured (a compile) only where ATen's copy, this many times over, would change the
# verdict: inductor's took 0.8-2x ATen's here (per weight warm, and resnet18's weights in a row).
SLACK = 4.0


def channels_last(gm: fx.GraphModule, with_grad: frozenset[fx.Node] = frozenset()) -> bool | None:
    """Whether inductor should lay `gm`'s convolutions out channels-last: None (inductor's own choice) for a graph
    without convolutions or with one that is not measured here (symbolic sizes, not on CPU, not floating). A weight
    among `with_grad` (a graph autograd records: its inputs requiring grad) counts its gradient's conversion too.
    With min-cut's partition (fused_autograd.py) a mobilenet-like training forward ran 0.47x eager channels-last
    where eager's layout ran 0.59x; resnet18's 1.37x against 0.96x (torch 2.14, one thread)."""
    convs = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.convolution.default]
    if not convs:
        return None
    setting = os.environ.get("DEALIAS_CONV_LAYOUT", "measure").strip()
    if setting in ("contiguous", "channels_last"):
        return setting == "channels_last"
    eager_s = channels_last_s = 0.0
    # the inputs converted (weights, and activations the graph takes), each once however many nodes read it
    weights: dict[fx.Node, tuple[torch.Tensor, int]] = {}
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
        key = f"convolution kernel layout|{sizes}|{rest!r}|{x.dtype}|threads={torch.get_num_threads()}"
        e, c = measured(key, lambda args=(x, w, bias, rest): measure(*args))
        eager_s, channels_last_s = eager_s + e, channels_last_s + c
        if isinstance(n.args[1], fx.Node) and not w.is_contiguous(memory_format=torch.channels_last):
            weights[n.args[1]] = (w, 2 if n.args[1] in with_grad else 1)
        # An activation that is an input of the graph is converted at every call too (one computed in the graph is
        # stored channels-last by the kernel computing it): conv + BatchNorm on an 8x3x32x32 batch saved 4 us in
        # its kernel and spent 8.5 us converting the batch.
        source = n.args[0]
        if isinstance(source, fx.Node) and source.op == "placeholder":
            if not x.is_contiguous(memory_format=torch.channels_last):
                weights[source] = (x, 2 if source in with_grad else 1)
    margin = eager_s - channels_last_s  # (what channels-last's kernels save, for the conversions to spend)
    if margin <= 0 or not weights:
        return margin > 0
    # (the conversions in a row, as the graph runs them: the gradients' too, by the same copy the other way)
    converted = [w for w, times in weights.values() for _ in range(times)]
    key = f"channels-last weights|{[(tuple(w.shape), tuple(w.stride())) for w in converted]}|{converted[0].dtype}"
    key += f"|threads={torch.get_num_threads()}"
    by_aten, _ = measured(f"{key}|aten", lambda: measure_conversion(converted, inductor=False))
    if by_aten >= margin or by_aten * SLACK < margin:
        return by_aten < margin
    _, by_inductor = measured(f"{key}|inductor", lambda: measure_conversion(converted, inductor=True))
    return by_inductor < margin


def one_by_one_as_matmuls(gm: fx.GraphModule, channels_last: bool | None) -> bool:
    """Whether inductor should compute the 1x1 convolutions of `gm` (stride 1, no padding, one group) as one matrix
    product each of the channels-last activations by the weight (its `conv_1x1_as_mm`), for a graph whose
    convolutions go `channels_last` (in eager's layout a product would need a copy of the activations first).
    Channels-last, such a convolution is that product over all images at once (bit-equal here); ATen's convolution
    runs it through four dispatched layers and per image. Measured per host and sizes, as the kernels' layout: a
    mobilenet-like net's 1x1 convolutions (twelve sizes) ran 0.69-0.94x their convolution's time as products, 0.82x
    in all (torch 2.14; 2.13: 0.85x; one thread). The graph takes the products where their sum is less."""
    if channels_last is not True:
        return False
    conv_s = matmul_s = 0.0
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is not aten.convolution.default or len(n.args) != 9:
            continue  # (every convolution is static, on CPU and floating: `channels_last` said True)
        x, w, bias = (a.meta.get("val") if isinstance(a, fx.Node) else a for a in n.args[:3])
        stride, padding, dilation, transposed, output_padding, groups = n.args[3:9]
        if not (
            isinstance(w, torch.Tensor)
            and w.dim() == 4
            and tuple(w.shape[2:]) == (1, 1)
            and list(stride) == [1, 1]
            and list(padding) == [0, 0]
            and list(dilation) == [1, 1]
            and not transposed
            and list(output_padding) == [0, 0]
            and groups == 1
        ):
            continue
        sizes = [(tuple(t.shape), tuple(t.stride())) for t in (x, w, bias) if t is not None]
        key = f"1x1 convolution as a product|{sizes}|{x.dtype}|threads={torch.get_num_threads()}"
        c, m = measured(key, lambda args=(x, w, bias): measure_matmul(*args))
        conv_s, matmul_s = conv_s + c, matmul_s + m
    return matmul_s < conv_s


def measure_matmul(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> tuple[float, float]:
    """Seconds per call of the 1x1 convolution of tensors like the fake `x, w, bias` on channels-last ones: by ATen's
    convolution, and as inductor's `conv_1x1_as_mm` computes it (a product of the activations' rows by the weight,
    plus the bias). Best of interleaved rounds."""
    with unset_fake_temporarily(), torch.no_grad(), torch.random.fork_rng(devices=[]):
        xr, wr = (_real(t).contiguous(memory_format=torch.channels_last) for t in (x, w))
        br = _real(bias) if bias is not None else None
        n, c, h, width = x.shape
        rows, weight = xr.permute(0, 2, 3, 1).reshape(n * h * width, c), wr.reshape(wr.shape[0], c).t()

        def conv() -> Any:
            return aten.convolution(xr, wr, br, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)

        def product() -> Any:
            return torch.mm(rows, weight) if br is None else torch.addmm(br, rows, weight)

        return _best(conv, product)


def _leaves(args: Any) -> list[Any]:
    return torch.utils._pytree.tree_leaves(args)


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).normal_()


def measure(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, rest: tuple[Any, ...]) -> tuple[float, float]:
    """Seconds per call of the convolution `(x, w, bias, *rest)` on eager's layout of the tensors like the fake
    `x, w, bias`, and on channels-last ones (converted before: measure_conversion times the weight's conversion).
    Best of interleaved rounds."""
    with unset_fake_temporarily(), torch.no_grad(), torch.random.fork_rng(devices=[]):
        xr, wr = _real(x), _real(w)
        br = _real(bias) if bias is not None else None
        x_cl, w_cl = (t.contiguous(memory_format=torch.channels_last) for t in (xr, wr))
        return _best(lambda: aten.convolution(xr, wr, br, *rest), lambda: aten.convolution(x_cl, w_cl, br, *rest))


def measure_conversion(weights: list[torch.Tensor], inductor: bool) -> tuple[float, float]:
    """Seconds per call of converting tensors like the fake `weights` to channels-last one after the other: (ATen's
    copy, ATen's copy), or (ATen's copy, inductor's code for it) with `inductor` (compiles one kernel)."""

    def inputs() -> tuple[torch.Tensor, ...]:
        return tuple(_real(w) for w in weights)

    def convert(*ws: torch.Tensor) -> list[torch.Tensor]:
        return [w.contiguous(memory_format=torch.channels_last) for w in ws]

    if inductor:
        return aten_against_inductor(inputs, convert, convert)
    with unset_fake_temporarily(), torch.no_grad(), torch.random.fork_rng(devices=[]):
        ws = inputs()
        (seconds,) = _best(lambda: convert(*ws), rounds=3)  # (a copy, memory-bound: steady)
        return seconds, seconds


def _best(*fns: Callable[[], Any], rounds: int = 5, seconds: float = 0.005) -> tuple[float, ...]:
    """keep_aten.best_of on the thread's CPU time at one thread (other processes on a shared machine preempt a round
    of calls, which a wall clock counts: 2-5x under a load of 8 on 2 cores, unevenly between kernels), the wall clock
    at several (the kernels' own threads work for the caller); rounds sized from one warm call."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    return best_of(*fns, rounds=rounds, seconds=seconds, warm_timed=1, clock=clock)
