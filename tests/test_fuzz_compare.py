"""The fuzz runner's gradient comparison (tools/fuzz/runner.py compare_grads): a false mismatch sends a reader
after a bug that is not there, a missed one hides a wrong gradient."""

import torch

from dealias.tools.fuzz.runner import compare_grads


def nan_where_input_is_negative(x):
    return (x.sqrt() * 2,)


def nan_and_doubled(x):
    return (x.sqrt() * 4,)


def make_args():
    leaf = torch.tensor([-1.0, 4.0, 9.0], requires_grad=True)
    return (leaf * 1,)


def test_nan_gradients_in_the_same_places_match():
    # (seed 880352: eager's own gradient is NaN there, and dealias's the same)
    assert compare_grads(nan_where_input_is_negative, nan_where_input_is_negative, make_args) is None


def test_gradients_that_differ_beside_a_nan_still_mismatch():
    assert compare_grads(nan_where_input_is_negative, nan_and_doubled, make_args) == "grad of leaf 0 differs"
