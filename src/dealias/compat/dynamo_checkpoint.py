"""Which inputs of dynamo's checkpoint operator the user gave `torch.utils.checkpoint.checkpoint` as arguments.

Dynamo's `tag_activation_checkpoint(body, *inputs)` takes every tensor its body reads as an input: the user's
arguments and what the checkpointed function reads from outside (a module's parameters and buffers). Eager's
non-reentrant checkpoint saves its tensor arguments for backward (`_NoopSaveInputs`), so one written inside the
checkpointed code makes eager's backward raise "modified by an inplace operation", and what the function reads
from outside is saved by nothing: a training BatchNorm's `num_batches_tracked.add_(1)` inside a checkpoint runs
in eager, and raised with dynamo's operator run as it is (every backend). This records on the body, per input
after it, whether eager's checkpoint was given it as an argument (a tensor among the call's positional arguments),
so that frontend/segments.py calls eager's checkpoint with those and closes over the rest, as the user's code did.

Without this correction: every input is passed as an argument (dynamo's behaviour, `backend="eager"`'s): a write of
state read from outside a checkpointed function (BatchNorm's counter) makes backward raise where eager's does not.
"""

from __future__ import annotations

import functools
from typing import Any

from .registry import correction, replace_method, require, require_module
from .settings import applies

NAME = "checkpoint_arguments"
ARGUMENTS = "dealias_checkpoint_arguments"  # body GraphModule meta: per operator input, given as an argument


@correction(
    NAME,
    corrects="dynamo's checkpoint operator passes what the checkpointed function reads from outside (module "
    "buffers) as arguments of eager's checkpoint, which saves them: a write of one raised at backward",
    without="a buffer written inside a checkpointed function (BatchNorm's num_batches_tracked) makes backward raise",
)
def install() -> None:
    hops = require_module("torch._dynamo.variables.higher_order_ops")
    cls = require(hops, "CheckpointHigherOrderVariable")
    original = require(cls, "create_wrapped_node", "self", "tx", "fn_vt", "fn_args_vt", "kwargs", "description")

    @functools.wraps(original)
    def create_wrapped_node(self: Any, tx: Any, fn_vt: Any, fn_args_vt: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, tx, fn_vt, fn_args_vt, *args, **kwargs)
        if applies(NAME, tx):
            try:
                proxies, body = result[0], result[4]
                given = {a.as_proxy().node for a in fn_args_vt if a.is_tensor()}
                body.meta[ARGUMENTS] = tuple(getattr(p, "node", None) in given for p in proxies[1:])
            except Exception:  # noqa: BLE001 - another shape of dynamo's result: nothing recorded (its behaviour)
                pass
        return result

    replace_method(cls, "create_wrapped_node", original, create_wrapped_node)
