"""Exactness against eager on the classes of bugs an OpInfo sweep and PyTorch's own mutation tests found
(issue 13): each test is one root cause, run on a first and on cached calls."""

from __future__ import annotations

import torch

from harness import check


def write_through_own_as_strided(x):
    y = torch.zeros(4)
    y.as_strided((2,), (2,), 0).add_(1)  # a tensor made inside the program, written through a view
    return x + y


def write_through_split_element(x):
    y = torch.zeros(4)
    a, _ = y.split(2)
    a.add_(1)  # an element of a multi-output view
    return x + y


def test_created_tensor_written_through_a_view_is_not_folded():
    # "Is this a view" was decided in several places; constant folding missed dealias's own as_strided_rel and
    # folded a tensor the program writes: [1,0,1,0], then [2,0,2,0], ... on successive calls.
    check(write_through_own_as_strided, torch.zeros(4), calls=3)
    check(write_through_split_element, torch.zeros(4), calls=3)
