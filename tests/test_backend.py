"""The dynamo backend itself: what dealias checks that dynamo does not (memory shared between graph inputs),
what it refuses (dynamo's stale metadata), its registration, options and limits."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from harness import compare_call

import dealias
from dealias import compat


def write_first_read_second(x, y):
    x.add_(1)
    return y * 2


@pytest.mark.parametrize(
    "layouts",
    [
        # Two views of one storage are separate graph inputs for dynamo; whether they overlap is dealias's to check,
        # on every call: each order of first calls must give eager's values.
        ("same", "disjoint"),
        ("disjoint", "same"),
        ("view", "rows"),
        ("rows", "view"),
    ],
)
def test_sharing_pattern_checked_on_every_call(layouts):
    jf = dealias.jit(write_first_read_second)

    def make(kind):
        b = torch.arange(8.0)
        return {
            "same": (b, b.view(8)),
            "disjoint": (b[:4], b[4:]),
            "view": (b, b.view(2, 4)[1]),
            "rows": (b.view(2, 4)[0], b.view(2, 4)[0]),
        }[kind]

    for round in range(3):
        for kind in layouts:
            with warnings.catch_warnings():
                warnings.simplefilter("error", dealias.FallbackWarning)
                assert compare_call(write_first_read_second, jf, make(kind)) is None, kind
        if round == 1:
            settled = dealias.cache_info(jf).misses
    # One program per layout and dynamo graph (a size change makes dynamo's graph symbolic, and dynamo tries its
    # newest graph first: a layout seen by the static graph compiles once more), then every call is a hit.
    assert dealias.cache_info(jf).misses == settled <= 4, dealias.cache_info(jf)


def stale_shape(a):
    v = a[0]
    v.unsqueeze_(0)
    v.add_(1)
    w = a.t()
    torch.Tensor.t_(w)
    return a, v.shape, v.view(v.shape[1], -1), w.stride()


def test_in_place_metadata_change_inside_a_graph_compiles():
    # Dynamo alone reports v.shape as it was before unsqueeze_ (torch.Size([3])), baked into the graph as a
    # constant, with every backend (torch 2.13); compat refreshes dynamo's view of v while tracing for dealias.
    for jf in (dealias.jit(stale_shape), torch.compile(stale_shape, backend="dealias")):
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            for _ in range(2):
                assert compare_call(stale_shape, jf, (torch.zeros(2, 3),)) is None
                a = torch.zeros(2, 3)
                out, shape, flat, stride = jf(a)
                assert out is a and shape == torch.Size([1, 3]) and flat.shape == (3, 1) and stride == (3, 1)
    assert not compat.for_dealias(torch._dynamo.lookup_backend("eager"))


def stale_shape_small(a):
    v = a[0]
    v.unsqueeze_(0)
    v.add_(1)
    return a, v.shape


def test_in_place_metadata_change_unrefreshed_runs_its_frame_eagerly(monkeypatch):
    # Where the fix does not apply (dynamo's internals moved), the frame runs eagerly, every call, and says so once.
    monkeypatch.setattr(compat.registry._CORRECTIONS["inplace_view_refresh"], "off", True)
    jf = dealias.jit(stale_shape_small)
    with pytest.warns(dealias.FallbackWarning, match=r"unsqueeze_.*stale"):
        assert compare_call(stale_shape_small, jf, (torch.zeros(2, 3),)) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        a = torch.zeros(2, 3)
        out, shape = jf(a)
        assert out is a and shape == torch.Size([1, 3]) and a[0].eq(1).all()
    with pytest.raises(dealias.UnsupportedError, match=r"unsqueeze_[\s\S]*test_backend.py:\d+"):
        dealias.jit(stale_shape_small, strict=True)(torch.zeros(2, 3))


def test_registered_backend_with_options():
    def f(cache, k):
        cache[:, 1] = k
        return cache.sum()

    for options in (None, {"verify": True}, {"executor": "torch", "cache_limit": 2}):
        torch._dynamo.reset()
        cf = torch.compile(f, backend="dealias", options=options)
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            assert compare_call(f, cf, (torch.zeros(3, 4), torch.ones(3))) is None
    with pytest.raises(Exception, match="no_such_option"):  # dynamo wraps it in BackendCompilerFailed
        torch.compile(f, backend="dealias", options={"no_such_option": 1})(torch.zeros(3, 4), torch.ones(3))


def test_backend_layout_limit_runs_the_graph_eagerly():
    # Dynamo sees one graph (shapes dynamic after the first change); dealias compiles per concrete layout up to
    # cache_limit, then runs the graph eagerly, with a warning, still exact.
    def f(x):
        x.mul_(2)
        return x + 1

    torch._dynamo.reset()
    cf = torch.compile(f, backend="dealias", options={"cache_limit": 2}, dynamic=True)
    with pytest.warns(dealias.FallbackWarning, match="cache_limit"):
        for step in range(1, 6):  # a new stride each call: dynamo's graph is symbolic, dealias's layout is not
            assert compare_call(f, cf, (torch.ones(6 * step)[::step],)) is None


def test_recompile_limit_warns_and_stays_exact():
    def f(x, n):
        x.add_(1)
        return getattr(torch, n)(x)

    jf = dealias.jit(f, cache_limit=3)
    with pytest.warns(dealias.FallbackWarning, match="cache_limit"):
        for n in ("sin", "cos", "exp", "neg", "abs", "tanh"):  # a string: specialized (ints and floats go symbolic)
            assert compare_call(f, jf, (torch.ones(2), n)) is None
    assert dealias.cache_info(jf).entries == 3
    assert "n == " in dealias.cache_info(jf).last_miss_reason


def test_traces_start_with_dynamos_graph_and_name_inputs_as_the_user_does():
    def cache_write(cache, k):
        cache[:, 2] = k
        return cache

    jf = dealias.jit(cache_write)
    jf(torch.zeros(2, 5), torch.ones(2))
    names = [t.name for t in dealias.last_traces(jf)]
    assert names == ["dynamo", "captured", "functional", "execution"]
    (report,) = dealias.explain(jf)
    assert report.target == "cache" and report.mode == "in place" and report.nbytes == 8
    assert "cache[:, 2] = k" in str(dealias.last_traces(jf)[1])  # the user's line beside the captured op


def test_eager_error_from_tracing_is_eagers_own():
    def f(x):
        x.add_(1.5)  # int tensor: eager raises "result type Float can't be cast"
        return x

    x = torch.ones(3, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="can't be cast") as info:
        dealias.jit(f)(x)
    assert not isinstance(info.value, torch._dynamo.exc.TorchDynamoException)
    assert torch.equal(x, torch.ones(3, dtype=torch.int64))


def inference_region(x):
    with torch.inference_mode():
        y = x * 2
    return y


def test_inference_mode_region_makes_inference_tensors():
    jf = dealias.jit(inference_region)
    with pytest.warns(dealias.FallbackWarning, match="_enter_inference_mode"):
        out = jf(torch.ones(2))
    assert out.is_inference()
    with pytest.raises(RuntimeError, match="inference tensor"):
        out.add_(1)  # as in eager: an inference tensor cannot be updated outside inference mode


def test_tensor_check_takes_the_same_tensor_twice():
    # dynamo's TensorGuards refuses a repeated tensor; a graph split around a hook passes one (`f(y, y)`), and
    # each call compiled again.
    from dealias.frontend.guards import tensor_check

    a = torch.randn(3, requires_grad=True) * 1
    check = tensor_check([a, a])
    b = torch.randn(3, requires_grad=True) * 1
    assert check(b, b)
    assert not check(b, b * 1) and not check(b, b.view(3))  # another tensor, even an alias: not this program's


def test_train_step_with_backward_inside():
    # loss.backward() and the optimizer's own breaks run eagerly; the forward and the update compile.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(inplace=True), torch.nn.Linear(4, 2))
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)

    def train_step(model, opt, x):
        loss = model(x).pow(2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    jstep = dealias.jit(train_step)
    for i in range(3):
        x = torch.randn(5, 3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            got = jstep(model, opt, x)
        assert torch.equal(got, train_step(ref, ref_opt, x)), i
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.equal(p, q) and type(p) is torch.nn.Parameter
    # The second step recompiles once: the momentum buffers exist from then on (a guard on the optimizer state).
    assert dealias.cache_info(jstep).misses == 2 and len(jstep.stats.graphs) >= 2


def add_to_first_read_both(a, b):
    a.add_(1)
    return a + b


@pytest.mark.parametrize("detached", [None, 0, 1])
def test_gradients_through_overlapping_inputs(detached):
    # f(x[0], x): one alias group. Compiled when both are differentiable views of x (gradients reach x through
    # the group's base, taken from x, not from x[0] whose as_strided would drop row 1's gradient); a detached
    # member runs the graph eagerly, since its writes and reads are invisible to autograd.
    weights = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    results = []
    for f in (add_to_first_read_both, dealias.jit(add_to_first_read_both)):
        leaf = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
        x = leaf * 1
        args = [x[0], x]
        if detached is not None:
            args[detached] = args[detached].detach()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", dealias.FallbackWarning)
            out = f(*args)
        (out * weights).sum().backward()
        results.append((out.detach(), leaf.grad, x.detach()))
        fell_back = any("share memory" in str(w.message) for w in caught)
        assert f is add_to_first_read_both or fell_back == (detached is not None), [str(w.message) for w in caught]
    (eo, eg, ex), (do, dg, dx) = results
    assert torch.equal(eo, do) and torch.equal(eg, dg) and torch.equal(ex, dx), (eg, dg)


def grad_write_then_no_grad_write(x0):  # fuzz seed 51343, shrunk
    x0.index_fill_(0, torch.tensor([1]), 0.25)
    with torch.no_grad():
        x0.zero_()
    return (x0,)


def view_made_under_no_grad(x0):  # a view made under no_grad is not differentiable in eager
    with torch.no_grad():
        v = x0.t()
    return x0 * 2 + v.t()


@pytest.mark.parametrize("fn", [grad_write_then_no_grad_write, view_made_under_no_grad])
def test_no_grad_regions_match_eager(fn):
    # Found by the fuzzer once it put statements under no_grad: the write-back gave the caller's tensor the
    # no_grad values' (missing) history, and a no_grad view was replayed as a differentiable one. Both are
    # compiled now (see test_autograd_writes.py) and match eager.
    results = []
    for f in (fn, dealias.jit(fn)):
        leaf = torch.arange(6.0).reshape(2, 3).requires_grad_()
        x = leaf * 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)
            out = f(x)
        out = out[0] if isinstance(out, tuple) else out
        (out * torch.arange(6.0).reshape(2, 3)).sum().backward()
        results.append((out.detach(), leaf.grad, out.requires_grad))
    (eo, eg, er), (do, dg, dr) = results
    assert torch.equal(eo, do) and torch.equal(eg, dg) and er == dr, results


def test_cache_hit_of_the_first_layout_takes_the_lean_lookup(monkeypatch):
    jf = dealias.jit(write_first_read_second)
    assert compare_call(write_first_read_second, jf, (torch.randn(4), torch.randn(4))) is None
    graph = jf.stats.graphs[0]
    assert graph.lean is not None

    def no_general_lookup(*args, **kwargs):
        raise AssertionError("the general lookup ran on a hit of the first layout")

    monkeypatch.setattr("dealias.frontend.backend.lookup_key", no_general_lookup)
    assert compare_call(write_first_read_second, jf, (torch.randn(4), torch.randn(4))) is None
    assert dealias.cache_info(jf).misses == 1


@pytest.mark.parametrize("shared", ["same", "overlap", "disjoint"])
def test_lean_lookup_refuses_inputs_that_now_share_memory(shared):
    # Dynamo guards neither case: the lean lookup of the first layout (separate storages) must not take it.
    jf = dealias.jit(write_first_read_second)
    b = torch.arange(8.0)
    views = {"same": (b[:4], b[:4]), "overlap": (b[:4], b[2:6]), "disjoint": (b[:4], b[4:])}[shared]
    for args in [(torch.randn(4), torch.randn(4)), views, (torch.randn(4), torch.randn(4)), views]:
        assert compare_call(write_first_read_second, jf, args) is None, shared
    assert dealias.cache_info(jf).misses == 2


def test_lean_check_agrees_with_the_lookup_key():
    # The lean check is the lookup key's equality written out for one layout: on every variation dynamo does not
    # guard (storage sharing, grad mode, inference mode, autograd kind of an input, a scalar's value), both agree.
    # (Every variant has the same types, shapes and requires_grad: those dynamo guards.)
    from dealias.frontend.guards import lean_check, lookup_key

    def args(kind):
        r = torch.randn(8, requires_grad=True)
        with torch.no_grad():
            no_grad_view = r[:4]
        b = r * 1
        variants = {
            "separate": (torch.randn(4), torch.randn(4, requires_grad=True) * 1, 3),
            "leaf": (torch.randn(4), torch.randn(4, requires_grad=True), 3),
            "split": (torch.randn(4), (r * 1).split(4)[0], 3),
            "no_grad view": (torch.randn(4), no_grad_view, 3),
            "shared": (b.detach()[:4], b[4:], 3),
            "value": (torch.randn(4), torch.randn(4, requires_grad=True) * 1, 4),
        }
        return list(variants[kind])

    kinds = ["separate", "leaf", "split", "no_grad view", "shared", "value"]
    for first in kinds:
        leaves = args(first)
        key = lookup_key(leaves, 3)[0]
        check = lean_check(leaves, frozenset(), None)
        if first == "shared":
            assert check is None  # only layouts of separate storages get one
            continue
        for kind in kinds:
            for grad, inference in [(True, False), (False, False), (False, True), (True, True)]:
                with (
                    torch.inference_mode(inference),
                    torch.set_grad_enabled(grad),
                ):  # this order: inference_mode(False) turns grad on
                    call = (
                        args(kind) if not inference else [x.detach() if torch.is_tensor(x) else x for x in args(kind)]
                    )
                    assert check(tuple(call)) == (lookup_key(call, 3)[0] == key), (first, kind, grad, inference)


def scale_(x, w):
    w.mul_(2)  # eager raises on a leaf that requires grad (with grad on), not on a non-leaf
    return (x * w).sum()


@pytest.mark.parametrize("grad", [True, False])
def test_lean_lookup_refuses_a_change_of_grad_mode_or_leafness(grad):
    jf = dealias.jit(scale_)
    non_leaf = lambda: (torch.randn(4), torch.randn(4, requires_grad=True) * 1)  # noqa: E731
    leaf = lambda: (torch.randn(4), torch.randn(4, requires_grad=True))  # noqa: E731
    for mode, make in [(grad, non_leaf), (grad, non_leaf), (not grad, non_leaf), (grad, leaf), (grad, non_leaf)]:
        with torch.set_grad_enabled(mode):
            assert compare_call(scale_, jf, make()) is None, (mode, make)


def returns_mixed(x, y):
    x.add_(1)
    z = y * 2
    return x, z, z, None, 3


@pytest.mark.parametrize("fn", [returns_mixed, write_first_read_second])
def test_program_whose_epilogue_only_picks_outputs_runs_as_one_generated_call(fn):
    jf = dealias.jit(fn)
    for _ in range(3):
        assert compare_call(fn, jf, (torch.randn(4), torch.randn(4))) is None
    program = jf.last
    # (dynamo returns the input itself, the repeated output and the constants: the call only picks the graph's result)
    assert program.source.splitlines()[-1] == "    return (mul,)", program.source
    out = jf(*(torch.randn(4), torch.randn(4)))
    if fn is returns_mixed:
        assert out[1] is out[2] and out[3:] == (None, 3)


def count_and_scale(n, w):
    # in a graph autograd records, a value that requires grad: written back after it, a whole copy (eager's add_
    # of a value requiring none, 1, runs in place again: writeback_autograd.eager_input_updates_in_place)
    n.add_(w.sum() * 0 + 1)
    return w * 2


def test_whole_write_backs_are_copies_in_the_generated_call():
    make = lambda: (torch.zeros(2), torch.randn(3, requires_grad=True))  # noqa: E731
    jf = dealias.jit(count_and_scale)
    for _ in range(3):
        assert compare_call(count_and_scale, jf, make()) is None
    program = jf.last
    assert program.functional.writebacks and "    n.copy_(add_2)" in program.source.splitlines(), program.source
    n, w = make()
    with torch.no_grad():  # another grad mode than the write-back's: the general call does the copy
        out = program.lean_call([n, w])
    assert n.eq(1).all() and torch.equal(out[0], w * 2)


def sgd_pair():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4)) for _ in range(2)]
    for p in params:
        p.grad = torch.randn(4)
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=False)
    opt.step()  # (eagerly: the momentum buffers exist before the compiled steps)
    return params, opt


def _share_first_buffer(opt, params):
    a, b = (opt.state[p]["momentum_buffer"] for p in params)
    b.set_(a.untyped_storage(), a.storage_offset(), a.shape, a.stride())


def _double_first_buffer(opt, params):
    buf = opt.state[params[0]]["momentum_buffer"]
    buf.data = buf.data.double()


def _gap_first_buffer(opt, params):
    buf = opt.state[params[0]]["momentum_buffer"]
    buf.data = torch.empty_strided((4,), (2,)).copy_(buf.data)  # the same values in a gapped layout


def _gap_first_grad(opt, params):
    # (dynamo guards an optimizer's gradients as not None only: a gradient of another layout passes its guards)
    params[0].grad = torch.empty_strided((4,), (2,)).copy_(params[0].grad)


@pytest.mark.parametrize(
    "change", [None, _share_first_buffer, _double_first_buffer, _gap_first_buffer, _gap_first_grad]
)
def test_lean_lookup_of_an_optimizer_step_checks_the_state_it_holds(change, monkeypatch):
    # Dynamo holds a non-foreach optimizer's state as graph attributes, guarded by identity only: the lean lookup
    # checks their layouts, dtypes and storages itself. A change dynamo does not see (a buffer now sharing another's
    # memory, another dtype or layout behind the same tensor object) must not take the first layout's program.
    (params, opt), (ref_params, ref_opt) = sgd_pair(), sgd_pair()
    jstep = dealias.jit(lambda: opt.step())
    for call in range(4):
        if call == 2 and change is not None:
            change(opt, params)
            change(ref_opt, ref_params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dealias.FallbackWarning)  # (the optimizer's own graph break)
            jstep()
        ref_opt.step()
        for p, q in zip(params, ref_params):
            assert torch.equal(p, q), (call, change)
            assert torch.equal(opt.state[p]["momentum_buffer"], ref_opt.state[q]["momentum_buffer"]), (call, change)
        if call == 1:
            (graph,) = [g for g in jstep.stats.graphs if g.attributes]
            assert graph.lean is not None
    assert graph.entries == (1 if change is None else 2), change  # (each change compiled anew)
    if change is None:  # every hit took the lean lookup
        monkeypatch.setattr("dealias.frontend.backend.lookup_key", lambda *a, **k: pytest.fail("general lookup"))
        jstep()
        ref_opt.step()
        assert all(torch.equal(p, q) for p, q in zip(params, ref_params))


def switches_grad_off(x):
    torch.set_grad_enabled(False)  # (called, not entered: the caller goes on with grad off, as after eager's call)
    return x * 2


@pytest.mark.parametrize("executor", ["torch", "inductor"])
def test_grad_mode_a_program_leaves_switched_stays_switched(executor):
    jf = dealias.jit(switches_grad_off, executor=executor)
    try:
        for f in (switches_grad_off, jf, jf):
            torch.set_grad_enabled(True)
            x = torch.randn(3, requires_grad=True)
            y = f(x)
            assert not torch.is_grad_enabled() and not y.requires_grad and not (x * 3).requires_grad, f
    finally:
        torch.set_grad_enabled(True)
