"""Random draws of in-place ops in functional graphs.

Eager's in-place draw (`y.bernoulli_(p)`, `y.uniform_()`) fills `y`'s memory in an order its kernel picks from
`y`'s layout: the default CPU kernels walk memory order (TensorIterator); MKL's bernoulli, on Intel CPUs, draws in
logical order into a contiguous buffer. An out-of-place form may draw into memory laid out otherwise
(`bernoulli.p` allocates its result contiguous), and the same generator state then puts the same numbers on other
elements: `F.dropout(x.t())` or a batch-first TransformerEncoderLayer in training differed from eager.

`draw_like(op, ...)` runs eager's own kernel on fresh memory with the written tensor's sizes and strides, so
the same numbers land on the same elements, whichever kernel the machine has. The strides themselves, not only
their order: kernels choose their algorithm by contiguity too (`normal_` fills a contiguous tensor of 16 elements
or more by vectorized Box-Muller, another one element by element), so a column `x[:, 0]` is drawn into memory of
its row stride, the span of its storage allocated (lowering runs a draw into a caller's region in place instead).
The draw writes only memory it allocated: the graph stays functional. A random op writing another argument
(`rrelu_with_noise`'s noise) runs so too: its functional form's derivative reads the noise before the draw
(PyTorch's `rrelu_with_noise_functional`), where eager's reads the drawn noise, and gradients were garbage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


def draw_like(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """`op(*args, **kwargs)`, a random op, run on fresh copies of the arguments it writes; returns what its
    functional form does: its own results (a written argument it returns standing for its new value), then the
    new values of the written arguments it does not return."""
    schema = op._schema
    written = [
        i for i, a in enumerate(schema.arguments[: len(args)]) if a.alias_info is not None and a.alias_info.is_write
    ]
    # An in-place draw into `self` alone overwrites every element: its old values matter only to autograd. Any
    # other written argument (`rrelu_with_noise`'s noise, left as it was outside training) keeps them.
    overwrites = written == [0] and schema.name.endswith("_")
    args = list(args)
    for i in written:
        old = args[i]
        fresh = torch.empty_strided(old.size(), old.stride(), dtype=old.dtype, device=old.device)
        if not overwrites or (torch.is_grad_enabled() and old.requires_grad):
            fresh.copy_(old)  # (with grad on, the draw's own backward then reaches `old`, as eager's does)
        args[i] = fresh
    out = op(*args, **kwargs)
    returned = list(out) if isinstance(out, (tuple, list)) else [out]
    rest = [args[i] for i in written if not any(r is args[i] for r in returned)]
    results = returned + rest
    return results[0] if len(results) == 1 else tuple(results)


draw_like._dealias_effect = True  # type: ignore[attr-defined]  # a draw: never dropped or merged
draw_like.dealias_draw = True  # type: ignore[attr-defined]  # runtime.fused.unfusable


def generators(*objs: Any) -> list[torch.Generator]:
    """The torch.Generators among `objs`' leaves (arguments, a node's arguments) and the attributes of the graph
    modules among them (a generator a draw takes is a graph attribute: compat/dynamo_rng.py)."""
    found: dict[int, torch.Generator] = {}
    for leaf in torch.utils._pytree.tree_leaves(objs):
        if isinstance(leaf, torch.fx.GraphModule):
            leaf = [v for v in vars(leaf).values() if isinstance(v, torch.Generator)]
        for g in leaf if isinstance(leaf, list) else [leaf]:
            if isinstance(g, torch.Generator):
                found.setdefault(id(g), g)
    return list(found.values())


@contextlib.contextmanager
def kept_rng(*objs: Any) -> Iterator[None]:
    """Run a probe or an eager run on copies without moving the program's random state: the default generator's
    and that of every generator among `objs` (see `generators`) are set back afterwards."""
    gens = generators(*objs)
    saved = torch.get_rng_state(), [g.get_state() for g in gens]
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        for g, state in zip(gens, saved[1]):
            g.set_state(state)
