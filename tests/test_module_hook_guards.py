"""Module hooks registered, removed or replaced after the first call are seen as eager sees them, on whatever module
object the frame finds at each call (dealias's frames guard the hook dicts of every module they call:
compat/settings.py, `skip_nnmodule_hook_guards = False`).

Guardrails for any cheaper form of those guards (the hookguard study, in settings.py's docstring). One check per
frame that passes while `RemovableHandle.next_id` (moved by every hook registration) has not moved since it last
passed ran the first program for another module instance that had its hook before the compile
(`test_another_module_instance_hooked_before_the_first_call`): dynamo checks the class of the module it finds at a
place of the frame, not which object it is. Adding the identity of each module found kept that one exact, and still
missed a hook put in the dict by hand (`test_a_hook_put_in_the_dict_by_hand_after_the_first_calls`)."""

from __future__ import annotations

import copy
import warnings

import torch
from harness import same
from torch import nn

import dealias


def _jit(f):
    return dealias.jit(f, executor="torch")  # (the guards are the subject: no fused compile)


def _lin(seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(3, 3)


def _twice(mod, args, out):
    return out * 2


def _plus_one(mod, args, out):
    return out + 1


def _calls_match(jf, f, *args) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        same(jf(*args), f(*args))


def test_forward_hook_after_the_first_call_on_modules_through_an_attribute_a_closure_and_a_list():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(_lin(0), nn.ReLU())

        def forward(self, x):
            return self.body(x)

    net, inner, layers = Net(), _lin(1), [_lin(2), _lin(3)]

    def f(x, layers):
        x = inner(net(x))
        for layer in layers:
            x = layer(x)
        return x

    jf, x = _jit(f), torch.randn(2, 3)
    _calls_match(jf, f, x, layers)
    for module in (net.body[0], inner, layers[1], net):
        handle = module.register_forward_hook(_twice)
        _calls_match(jf, f, x, layers)
        handle.remove()
        _calls_match(jf, f, x, layers)


def test_pre_hook_backward_hook_and_global_hook_after_the_first_call():
    m = _lin(0)

    def f(m, x):
        return m(x).sum()

    jf = _jit(f)

    def grads(fn):
        x = torch.ones(2, 3, requires_grad=True)
        out = fn(m, x)
        out.backward()
        return out.detach(), x.grad

    same(grads(jf), grads(f))
    handle = m.register_forward_pre_hook(lambda mod, args: (args[0] * 3,))
    same(grads(jf), grads(f))
    handle.remove()
    handle = m.register_full_backward_hook(lambda mod, grad_in, grad_out: (grad_in[0] * 5,))
    same(grads(jf), grads(f))
    handle.remove()
    handle = m.register_full_backward_pre_hook(lambda mod, grad_out: (grad_out[0] * 7,))
    same(grads(jf), grads(f))
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(_plus_one)
    try:
        same(grads(jf), grads(f))
    finally:
        handle.remove()
    same(grads(jf), grads(f))


def test_hook_removed_or_replaced_by_another_after_the_first_call():
    m = _lin(0)

    def f(m, x):
        return m(x)

    jf, x = _jit(f), torch.randn(2, 3)
    handle = m.register_forward_hook(_twice)
    _calls_match(jf, f, m, x)
    handle.remove()
    _calls_match(jf, f, m, x)
    handle = m.register_forward_hook(_twice)
    _calls_match(jf, f, m, x)
    handle.remove()
    handle = m.register_forward_hook(_plus_one)  # as many hooks as before, another one
    _calls_match(jf, f, m, x)
    handle.remove()


def test_hooks_with_kwargs_and_always_call_after_the_first_call():
    m = _lin(0)

    def f(m, x):
        return m(x)

    jf, x = _jit(f), torch.randn(2, 3)
    _calls_match(jf, f, m, x)
    handles = [
        m.register_forward_pre_hook(lambda mod, args, kwargs: ((args[0] - 1,), kwargs), with_kwargs=True),
        m.register_forward_hook(lambda mod, args, kwargs, out: out * 3, with_kwargs=True),
    ]
    _calls_match(jf, f, m, x)
    for h in handles:
        h.remove()
    handle = m.register_forward_hook(_plus_one, always_call=True)
    _calls_match(jf, f, m, x)
    handle.remove()
    _calls_match(jf, f, m, x)


def test_another_module_instance_hooked_before_the_first_call():
    a, b = _lin(0), _lin(1)
    b.register_forward_hook(_twice)  # before the compile: no registration after it

    def f(m, x):
        return m(x)

    jf, x = _jit(f), torch.randn(2, 3)
    _calls_match(jf, f, a, x)
    _calls_match(jf, f, b, x)
    _calls_match(jf, f, a, x)


def test_a_deepcopy_of_a_module_hooked_before_the_first_call_swapped_in():
    hooked = _lin(1)
    hooked.register_forward_hook(_plus_one)
    net = nn.Sequential(_lin(0), nn.ReLU(), _lin(2))

    def f(x):
        return net(x)

    jf, x = _jit(f), torch.randn(2, 3)
    _calls_match(jf, f, x)
    net[2] = copy.deepcopy(hooked)  # its hook dicts copied: no registration
    _calls_match(jf, f, x)


def test_tensor_hooks_registered_every_call_compile_once():
    m = _lin(0)

    def f(m, x):
        return m(x).sum()

    jf = _jit(f)
    for i in range(6):
        grads = []
        for fn in (jf, f):
            x = torch.ones(2, 3, requires_grad=True)
            x.register_hook(lambda g, i=i: g * (i + 1))
            fn(m, x).backward()
            grads.append(x.grad)
        same(grads[0], grads[1])
    assert dealias.cache_info(jf).misses == 1


def test_a_hook_put_in_the_dict_by_hand_after_the_first_calls():
    m = _lin(0)

    def f(m, x):
        return m(x)

    jf, x = _jit(f), torch.randn(2, 3)
    _calls_match(jf, f, m, x)
    _calls_match(jf, f, m, x)
    m._forward_hooks[-1] = _twice  # (no RemovableHandle: no registration counted anywhere)
    _calls_match(jf, f, m, x)
