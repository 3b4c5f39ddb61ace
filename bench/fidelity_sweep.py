"""Sweep of eager's observable details: per common user op (BatchNorm1d/2d/3d training and eval, norms, dropout,
views, in-place ops on clones and on inputs, a checkpointed BatchNorm), the last call's grad_fn chain, the output's
`_version`, how far each input's (and buffer's) counter moved, and backward's error, eager against dealias.

    PYTHONPATH=src python bench/fidelity_sweep.py eager,torch,torchdyn,tiered [NAME-SUBSTRING]

Modes: torch (executor="torch"), torchdyn (the same, dynamic=True), tiered (the default), aot_eager, beager
(backend="eager"). Each case runs on a code object of its own, but dynamo's automatic dynamic shapes are keyed by
file and line, so "torch" cases after others of other sizes trace with symbols too. Prints each difference."""

import copy
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp

import dealias

warnings.simplefilter("ignore")
torch.manual_seed(0)


def chain(t):
    names, fn = [], t.grad_fn
    while fn is not None and len(names) < 4:
        names.append(type(fn).__name__)
        fn = next((f for f, _ in fn.next_functions if f is not None and "AccumulateGrad" not in type(f).__name__), None)
    return names


def leaf(*s):
    return torch.randn(*s, requires_grad=True)


# each case: (name, make() -> (fn, args, state)), fn(*args) -> output(s)
def mod_case(m, shape, train=True, pre=None):
    def make():
        mm = copy.deepcopy(m).train(train)
        x = torch.randn(*shape, requires_grad=True)

        def fn(mod, x):
            if pre:
                pre(mod)
            return mod(x)

        return fn, [mm, x]

    return make


def read_stats_first(mod):
    return None


cases = {}
for d, shape in [(1, (4, 3)), (1, (4, 3, 5)), (2, (2, 3, 4, 4)), (3, (2, 3, 2, 3, 3))]:
    for train in (True, False):
        cls = getattr(nn, f"BatchNorm{d}d")
        cases[f"BN{d}d{'' if len(shape) != 3 else '-3D'} {'train' if train else 'eval'}"] = mod_case(
            cls(3), shape, train
        )
cases["BN2d train no-track"] = mod_case(nn.BatchNorm2d(3, track_running_stats=False), (2, 3, 4, 4))
cases["BN2d train momentum=None"] = mod_case(nn.BatchNorm2d(3, momentum=None), (2, 3, 4, 4))


def fn_case(f, *shapes, clone_first=False):
    def make():
        args = [torch.randn(*s, requires_grad=True) for s in shapes]
        return f, args

    return make


def bn_read_stats_before(mod, x):
    m = mod.running_mean.sum()
    return mod(x) + m


cases["BN1d train, stats read before"] = lambda: (
    bn_read_stats_before,
    [nn.BatchNorm1d(3).train(), torch.randn(4, 3, requires_grad=True)],
)
cases["BN2d train, stats read before"] = lambda: (
    bn_read_stats_before,
    [nn.BatchNorm2d(3).train(), torch.randn(2, 3, 4, 4, requires_grad=True)],
)
cases["F.batch_norm train"] = lambda: (
    (lambda x, rm, rv: F.batch_norm(x, rm, rv, training=True)),
    [torch.randn(4, 3, 5, requires_grad=True), torch.zeros(3), torch.ones(3)],
)
cases["LayerNorm"] = mod_case(nn.LayerNorm(5), (2, 3, 5))
cases["GroupNorm"] = mod_case(nn.GroupNorm(1, 3), (2, 3, 4))
cases["InstanceNorm2d"] = mod_case(nn.InstanceNorm2d(3), (2, 3, 4, 4))
cases["Dropout eval"] = mod_case(nn.Dropout(0.5), (3, 4), train=False)
cases["Linear"] = mod_case(nn.Linear(4, 5), (3, 4))
cases["Conv2d"] = mod_case(nn.Conv2d(3, 4, 3), (1, 3, 5, 5))
cases["softmax"] = fn_case(lambda x: x.softmax(-1), (3, 4))
cases["log_softmax"] = fn_case(lambda x: F.log_softmax(x, -1), (3, 4))
cases["gelu"] = fn_case(lambda x: F.gelu(x), (3, 4))
cases["relu_ on clone"] = fn_case(lambda x: x.clone().relu_(), (3, 4))
cases["add_ on clone"] = fn_case(lambda x: x.clone().add_(1), (3, 4))
cases["mul_ on x*1"] = fn_case(lambda x: (x * 1).mul_(2), (3, 4))
cases["sigmoid_ on clone"] = fn_case(lambda x: x.clone().sigmoid_(), (3, 4))
cases["clamp_ on clone"] = fn_case(lambda x: x.clone().clamp_(0, 1), (3, 4))
cases["index write on clone"] = fn_case(
    lambda x, y: (lambda c: (c.__setitem__(0, y[0]), c)[1])(x.clone()), (3, 4), (3, 4)
)
cases["slice add_ on clone"] = fn_case(lambda x: (lambda c: (c[:, 1].add_(1), c)[1])(x.clone()), (3, 4))
cases["view"] = fn_case(lambda x: x.view(12) * 1, (3, 4))
cases["return view"] = fn_case(lambda x: (x * 2).view(12), (3, 4))
cases["return t"] = fn_case(lambda x: (x * 2).t(), (3, 4))
cases["return slice"] = fn_case(lambda x: (x * 2)[1:], (3, 4))
cases["return transpose of input"] = fn_case(lambda x: x.t(), (3, 4))
cases["reshape"] = fn_case(lambda x: (x * 2).t().reshape(12), (3, 4))
cases["mm"] = fn_case(lambda a, b: a @ b, (3, 4), (4, 5))
cases["matmul 3d"] = fn_case(lambda a, b: a @ b, (2, 3, 4), (4, 5))
cases["sum"] = fn_case(lambda x: x.sum(0), (3, 4))
cases["cat"] = fn_case(lambda a, b: torch.cat([a, b]), (3, 4), (3, 4))
cases["stack"] = fn_case(lambda a, b: torch.stack([a, b]), (3, 4), (3, 4))
cases["where"] = fn_case(lambda a, b: torch.where(a > 0, a, b), (3, 4), (3, 4))
cases["chunk"] = fn_case(lambda a: (a * 1).chunk(2)[0], (4, 4))
cases["unbind"] = fn_case(lambda a: (a * 1).unbind(0)[1], (4, 4))
cases["split"] = fn_case(lambda a: (a * 1).split(2)[1], (4, 4))
cases["expand"] = fn_case(lambda a: (a * 1).expand(2, 3, 4), (3, 4))
cases["embedding"] = lambda: ((lambda e, i: e(i)), [nn.Embedding(5, 3), torch.tensor([0, 2, 4])])
cases["MHA"] = lambda: (
    (lambda m, x: m(x, x, x)[0]),
    [nn.MultiheadAttention(4, 2, batch_first=True), torch.randn(2, 3, 4, requires_grad=True)],
)
cases["sdpa"] = fn_case(
    lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)
)
cases["cross_entropy"] = lambda: (
    (lambda x, t: F.cross_entropy(x, t)),
    [torch.randn(3, 5, requires_grad=True), torch.tensor([1, 0, 4])],
)
cases["mse"] = fn_case(lambda a, b: F.mse_loss(a, b), (3, 4), (3, 4))
cases["input add_ (non-leaf)"] = lambda: ((lambda x: x.add_(1)), [torch.randn(3, 4, requires_grad=True) * 1])
cases["input slice mul_ (non-leaf)"] = lambda: (
    (lambda x: (x[1].mul_(2), x)[1]),
    [torch.randn(3, 4, requires_grad=True) * 1],
)
cases["input copy_ from grad"] = lambda: (
    (lambda x, y: (x.copy_(y), x)[1]),
    [torch.zeros(3, 4), torch.randn(3, 4, requires_grad=True)],
)
cases["input row copy from grad"] = lambda: (
    (lambda x, y: (x[1].copy_(y[0]), x)[1]),
    [torch.zeros(3, 4), torch.randn(3, 4, requires_grad=True)],
)
cases["nograd input add_"] = lambda: (
    (lambda x, y: (x.add_(1), x * y)[1]),
    [torch.zeros(3, 4), torch.randn(3, 4, requires_grad=True)],
)
cases["nograd input 2 writes"] = lambda: (
    (lambda x, y: (x.add_(1), x.mul_(2), x * y)[2]),
    [torch.zeros(3, 4), torch.randn(3, 4, requires_grad=True)],
)
cases["nograd mm"] = lambda: ((lambda a, b: a @ b), [torch.randn(3, 4), torch.randn(4, 5)])
cases["nograd mm+relu"] = lambda: ((lambda a, b: (a @ b).relu()), [torch.randn(3, 4), torch.randn(4, 5)])
cases["nograd linear"] = lambda: ((lambda m, x: m(x)), [nn.Linear(4, 5).requires_grad_(False), torch.randn(3, 4)])
cases["nograd addmm+add_"] = lambda: (
    (lambda m, x: m(x).add_(1)),
    [nn.Linear(4, 5).requires_grad_(False), torch.randn(3, 4)],
)
cases["nograd x add_ 3x"] = lambda: ((lambda x: (x.add_(1), x.add_(1), x.add_(1), x)[3]), [torch.zeros(3, 4)])
cases["nograd x slices 2"] = lambda: ((lambda x: (x[0].add_(1), x[1].add_(1), x)[2]), [torch.zeros(3, 4)])


def ckpt_bn():
    m = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).train()
    return (lambda m, x: cp.checkpoint(m, x, use_reentrant=False)), [m, torch.randn(5, 4, requires_grad=True)]


cases["checkpoint BN1d train"] = ckpt_bn


def describe(out):
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out


def run(name, make, mode):
    torch.manual_seed(0)
    fn, args = make()
    torch.manual_seed(1)
    import types

    if not isinstance(fn, nn.Module):
        fn = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    if mode == "eager":
        f = fn
    elif mode == "torchdyn":
        f = dealias.jit(fn, executor="torch", dynamic=True)
    elif mode == "aot_eager":
        f = torch.compile(fn, backend="aot_eager")
    elif mode == "beager":
        f = torch.compile(fn, backend="eager")
    elif mode == "torch":
        f = dealias.jit(fn, executor="torch")
    elif mode == "tiered":
        f = dealias.jit(fn)
    elif mode == "inductor":
        f = dealias.jit(fn, executor="inductor")
    res = []
    for call in range(2):
        a2 = [
            copy.deepcopy(a)
            if isinstance(a, nn.Module)
            else (a.detach().clone().requires_grad_(a.requires_grad) if a.is_leaf else a.clone())
            for a in args
        ]
        tens = [a for a in a2 if isinstance(a, torch.Tensor)]
        mods = [a for a in a2 if isinstance(a, nn.Module)]
        bufs = [b for m in mods for b in m.buffers()]
        v0 = [t._version for t in tens + bufs]
        try:
            out = describe(f(*a2))
        except Exception as e:
            res.append(("raise", type(e).__name__))
            continue
        v1 = [t._version - v for t, v in zip(tens + bufs, v0)]
        err = None
        if out.requires_grad:
            try:
                out.float().sum().backward()
            except Exception as e:
                err = str(e)[:60]
        res.append((chain(out), out._version, v1, err))
        if DEBUG and mode != "eager":
            print(
                name,
                mode,
                call,
                chain(out),
                dealias.cache_info(f) if hasattr(f, "_jit") or mode in ("torch", "torchdyn", "tiered") else "",
            )
    return res[-1]


DEBUG = bool(__import__("os").environ.get("DEBUG"))
modes = sys.argv[1].split(",") if len(sys.argv) > 1 else ["eager", "torch", "tiered"]
only = sys.argv[2] if len(sys.argv) > 2 else None
diffs = 0
for name, make in cases.items():
    if only and only not in name:
        continue
    r = {m: run(name, make, m) for m in modes}
    e = r["eager"]
    for m in modes[1:]:
        if r[m] != e:
            diffs += 1
            print(f"DIFF {name:32s} {m:7s} eager={e}\n{'':40s} got  ={r[m]}")
print("diffs", diffs, "of", len(cases))
