"""Grad-mode switches in a functional graph handed to AOTAutograd (runtime/fused_autograd.py).

dealias's graphs carry each op's grad mode in `meta["grad"]` (the capture's record of eager's `with torch.no_grad()`
regions), not as calls. AOTAutograd traces a graph in the mode it is called in and records every op it traces
then; dynamo's own graphs carry `torch._C._set_grad_enabled` calls where the mode changes, which AOTAutograd runs
while it traces. The same calls put into dealias's graph make an op eager ran under no_grad unrecorded there too.
"""

from __future__ import annotations

from operator import getitem

import torch
import torch.fx as fx


def switch_grad_modes(gm: fx.GraphModule, mode: bool) -> None:
    """Grad-mode switches (`torch._C._set_grad_enabled`) put into `gm` where its ops' modes change (a DQN target
    computed under no_grad beside a loss recorded), and back to `mode` before its output, as dynamo's own graphs
    carry them: AOTAutograd runs them while it traces, so that an op eager ran under no_grad is not recorded (fuzz
    seed 962133: without them every op was recorded in the call's mode, and a result computed under no_grad
    required grad)."""
    current = mode
    for n in list(gm.graph.nodes):
        if n.op == "output":
            if current != mode:
                with gm.graph.inserting_before(n):
                    gm.graph.call_function(torch._C._set_grad_enabled, (mode,))
            break
        if n.op != "call_function" or n.target is getitem:
            continue
        want = n.meta.get("grad", current)
        if want is None or bool(want) == current:
            continue
        with gm.graph.inserting_before(n):
            gm.graph.call_function(torch._C._set_grad_enabled, (bool(want),))
        current = bool(want)
    gm.recompile()
