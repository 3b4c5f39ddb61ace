"""What dealias needs to know of inductor's behaviour that differs between torch releases.

Size asserts: dealias's fused graphs over symbols take each symbol from an input's size (a decode step's cache
length), with no SymInt placeholder of its own. Inductor's wrapper binds such a symbol to the input's size at
each call; torch 2.13 always did, torch 2.14 does it only while it also asserts the inputs' sizes
(`config.size_asserts`), and otherwise calls its kernels with an unbound name (a NameError at the first call).
dealias turns the asserts off where every call's sizes are already guarded (static sizes: dynamo's guards or the
cache entry's check held before the program runs), and keeps them on for graphs over symbols, on every release:
they cost a check per input and call, and they are what binds the symbols.
"""

from __future__ import annotations

import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import free_symbols


def size_asserts(gm: fx.GraphModule) -> bool:
    """Whether inductor must keep its input size asserts for `gm`: some input's sizes or strides are symbolic."""
    for ph in gm.graph.find_nodes(op="placeholder"):
        value = ph.meta.get("val")
        if value is not None and free_symbols(value):
            return True
    return False
