"""Review (review15) of the session's changes against eager (warns.py, hook_kwargs_guards, skip_frames,
REJECTED_CALLS, the `always` shape guard): the cases where a compiled program did otherwise than eager.
(tests/test_review15.py is an earlier review's, of firstcall3.)"""

from __future__ import annotations

import warnings

import torch

import dealias


def _tensordot_into(a, b, o):
    torch.tensordot(a, b, dims=1, out=o)  # (torch.functional's Python: eager's warning is at its line)
    return o + 1


def _resized(caught) -> int:
    return sum("elements was resized" in str(w.message) for w in caught)


def test_an_out_resize_warning_shown_once_before_the_compile_is_still_given_by_the_program():
    # The probe of an out= op's resize (compat/dynamo_out.py `_eager_fills`) records eager's warnings: where the
    # user's own eager call had shown the warning once, at torch.functional's line, that module's registry held it,
    # Python looked there before any filter, and the probe saw no warning: the program never warned again (eager
    # warns on each call where warnings are shown "always").
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    dealias.jit(lambda x: x.add_(1))(torch.randn(3))  # (torch's first compile's imports move the filters)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("default")
        _tensordot_into(a, b, torch.empty(4, 4))  # eager, shown once: recorded in torch.functional's registry
        jf = dealias.jit(_tensordot_into)
        torch.testing.assert_close(jf(a, b, torch.empty(4, 4)), _tensordot_into(a, b, torch.empty(4, 4)))
    for fn in (_tensordot_into, jf):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn(a, b, torch.empty(4, 4))
        assert _resized(caught) == 1, (fn, [str(w.message) for w in caught])
