"""The hook dicts saying which hooks take keyword arguments (`_forward_hooks_with_kwargs`,
`_forward_pre_hooks_with_kwargs`) are left unguarded where the module's own hooks of that kind are guarded empty
(compat/dynamo_guards.py `hook_kwargs_guards`): four hook guards a module on every call instead of six, and the hooks
registered later, with keyword arguments or not, still seen as eager sees them."""

from __future__ import annotations

import torch
from harness import same
from torch import nn

import dealias
from dealias import compat


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))


def _guards(fn) -> str:
    entries = torch._dynamo.eval_frame._debug_get_cache_entry_list(fn.__code__)
    return "\n".join(str(e.guard_manager) for e in entries)


def _own(fn):
    return type(fn)(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _forward(net, x):
    return net(x) * 2


def test_four_hook_guards_a_module_not_six():
    assert compat.active("hook_kwargs_guards"), compat.report()
    net, x = _net(), torch.randn(4, 3)
    counts = {}
    for on in (True, False):
        fn = _own(_forward)
        if on:
            same(dealias.jit(fn, executor="torch")(net, x), _forward(net, x))
        else:
            with compat.forced_off("hook_kwargs_guards"):
                same(dealias.jit(fn, executor="torch")(net, x), _forward(net, x))
        guards = _guards(fn)
        lines = [line for line in guards.splitlines() if "DICT_LENGTH: not" in line]
        counts[on] = (guards.count("with_kwargs"), sum("_global_" not in line for line in lines))
    # four modules (the Sequential and its three layers): 4 x 4 hook dicts guarded empty, 4 x 6 out of force (and
    # torch's four global hook dicts, global_hook_guards, not counted)
    assert counts[True] == (0, 16) and counts[False][0] > 0 and counts[False][1] == 24, counts


def test_hooks_registered_later_with_and_without_keyword_arguments_run_as_in_eager():
    net_e, net_c, x = _net(), _net(), torch.randn(4, 3)
    jf = dealias.jit(_own(_forward), executor="torch")

    def check():
        same(jf(net_c, x), _forward(net_e, x))

    check()
    handles = []
    for steps in (
        lambda n: n[0].register_forward_hook(lambda m, a, k, o: o * 3, with_kwargs=True),
        lambda n: n[2].register_forward_pre_hook(lambda m, a, k: ((a[0] + 1,), k), with_kwargs=True),
        lambda n: n[1].register_forward_hook(lambda m, a, o: o - 0.5),
        lambda n: n.register_forward_pre_hook(lambda m, a: (a[0] * 0.5,)),
    ):
        handles.append((steps(net_e), steps(net_c)))
        check()
    for he, hc in handles:
        he.remove()
        hc.remove()
        check()


def test_a_hook_put_into_the_kwargs_dict_alone_changes_nothing_eager_does():
    # eager reads the dict only for the ids of hooks it runs: an entry there with no hook changes no call
    net_e, net_c, x = _net(), _net(), torch.randn(4, 3)
    jf = dealias.jit(_own(_forward), executor="torch")
    same(jf(net_c, x), _forward(net_e, x))
    for n in (net_e, net_c):
        n[0]._forward_hooks_with_kwargs[12345] = True
        n[0]._forward_pre_hooks_with_kwargs[12345] = True
    same(jf(net_c, x), _forward(net_e, x))
    # and a hook put by hand into the module's own dict afterwards is seen, taking the keyword arguments
    for n in (net_e, net_c):
        n[0]._forward_hooks[12345] = lambda m, a, k, o: o + 10
    same(jf(net_c, x), _forward(net_e, x))


def test_with_a_global_forward_hook_the_kwargs_dicts_stay_guarded():
    net, x = _net(), torch.randn(4, 3)
    fn = _own(_forward)
    handle = nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
    try:
        same(dealias.jit(fn, executor="torch")(net, x), _forward(net, x))
    finally:
        handle.remove()
    assert "_forward_hooks_with_kwargs" in _guards(fn)
