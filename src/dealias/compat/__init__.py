"""Everything dealias changes in torch's behaviour, in one place: dynamo's settings for dealias's frames and the
corrections to dynamo's tracing, each checked against this torch when installed and each in force only while
dynamo traces for a dealias backend (registry.py). `dealias doctor` lists which are in force here."""

from . import (  # noqa: F401
    dynamo_autograd,
    dynamo_checkpoint,
    dynamo_guards,
    dynamo_hook_split,
    dynamo_hooks,
    dynamo_indexing,
    dynamo_inputs,
    dynamo_leaf,
    dynamo_lerp,
    dynamo_out,
    dynamo_reads,
    dynamo_resize,
    dynamo_resume,
    dynamo_rng,
    dynamo_tensor,
    settings,
    tensor_scalars,
)
from .dynamo_hooks import EARLY as HOOK_EARLY
from .dynamo_inputs import INPUT_ALIAS, fold_input_aliases
from .dynamo_out import keep_out_overlaps
from .dynamo_tensor import HOOKED_AFTER, REFRESHED, hooks_of_frame, inplace_view_node, is_inplace_view
from .registry import Correction, Missing, active, corrections, forced_off, install_all, report
from .settings import for_dealias, in_dealias_frame, settings_in_force

__all__ = [
    "HOOKED_AFTER",
    "HOOK_EARLY",
    "INPUT_ALIAS",
    "REFRESHED",
    "Correction",
    "Missing",
    "active",
    "corrections",
    "fold_input_aliases",
    "for_dealias",
    "forced_off",
    "hooks_of_frame",
    "in_dealias_frame",
    "inplace_view_node",
    "install_all",
    "is_inplace_view",
    "keep_out_overlaps",
    "report",
    "settings_in_force",
]
