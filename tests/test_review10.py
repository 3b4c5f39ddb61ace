"""Review of two merges, each program compared with eager (outputs, the caller's tensors the call writes, errors by
type and message, output views' layout, bases and version counters, gradients):

- hotpath: an index the fused graph computes from one-element inputs stays in the graph and is checked by its
  range (runtime/index_ranges.py, prologue.py): negative counts under each op's policy (negative indexing for
  advanced indexing, none for index_copy_/scatter_add_/embedding, nll_loss's ignore_index), ranges at the bounds,
  int32/int64 wraparound, a count the program writes before the index is used, a count that is a view of a larger
  tensor, symbolic sizes, a decode loop reaching the cache's end;
- mhaview: output views replayed as Tensor methods (runtime/generated_call.py) and the fused call's own backward
  node by the Function's C apply (fused_autograd.py): view chains in each grad mode, functorch transforms over a
  fused function, MultiheadAttention with a key padding mask.

Where eager raises after a partial write (its kernels check entry by entry), dealias raises eager's error before any
write with the caller's tensors untouched (docs/architecture.md, the prologue): the tests hold dealias to that."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

import dealias


def _clone(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _run(fn, args):
    try:
        return "ok", fn(*args)
    except Exception as e:  # noqa: BLE001 - the outcome compared with eager's
        return "err", e


def _tensors(out):
    return [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]


def _against_eager(fn, jf, args):
    """One call of `jf` on `args` and of `fn` on copies: the same outcome; where both return, the same outputs and
    writes; where eager raises, the same error (type, first line) and every caller tensor as eager left it (its
    writes before the failing op made: a fused call its prologue refuses runs the graph eagerly)."""
    eager_args = _clone(args)  # (version counters from 0: compared as what the call moved)
    moved_from = [a._version if isinstance(a, torch.Tensor) else None for a in args]
    want, got = _run(fn, eager_args), _run(jf, args)
    assert want[0] == got[0], (want, got)
    if want[0] == "err":
        assert type(got[1]) is type(want[1])
        assert str(got[1]).startswith(str(want[1]).splitlines()[0]), (got[1], want[1])
        for a, b, v in zip(args, eager_args, moved_from):
            if isinstance(a, torch.Tensor):
                assert torch.equal(a, b) and a._version - v == b._version
        return "err"
    for g, w in zip(_tensors(got[1]), _tensors(want[1])):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
    for a, b in zip(args, eager_args):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)
    return "ok"


def _jit(fn, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dealias.jit(fn, **kw)


# ---- hotpath: ranged indices ------------------------------------------------------------------------------------


def policies(x, y, z, u, logp, c1, c2, c3, c4, c5, v):
    a = x.flatten()[torch.arange(2) + c1]  # advanced indexing: negative indices address from the end
    y.view(-1).index_copy_(0, torch.arange(2) + c2, v)  # none
    z.index_fill_(0, torch.arange(2) + c3, 1.0)  # from the end
    u.scatter_add_(0, torch.arange(2) + c4, v)  # none
    loss = nn.functional.nll_loss(logp, torch.arange(2) + c5, ignore_index=-100, reduction="sum")  # -100 skipped
    return a, loss


@pytest.mark.inductor
def test_each_ops_policy_at_its_bounds():
    def make(c):
        counts = [torch.tensor(k) for k in c]
        fixed = (torch.arange(6.0).view(2, 3), torch.zeros(2, 3), torch.zeros(5), torch.zeros(5))
        return [*fixed, torch.randn(2, 4).log_softmax(-1), *counts, torch.tensor([1.0, 2.0])]

    jf = _jit(policies, executor="inductor")
    outcomes = []
    for c in [
        (0, 0, 0, 0, 0),
        (4, 4, 3, 3, 2),  # each range's top at size - 1
        (-6, 0, -5, 0, 0),  # the bottom at -size where allowed
        (5, 0, 0, 0, 0),
        (-7, 0, 0, 0, 0),
        (0, -1, 0, 0, 0),
        (0, 5, 0, 0, 0),
        (0, 0, -6, 0, 0),
        (0, 0, 4, 0, 0),
        (0, 0, 0, -1, 0),
        (0, 0, 0, 4, 0),
        (0, 0, 0, 0, 3),
        (0, 0, 0, 0, -100),  # targets -100 (ignored), -99 (eager's error names it)
        (0, 0, 0, 0, -101),
    ]:
        outcomes.append(_against_eager(policies, jf, make(c)))
    assert outcomes[:3] == ["ok"] * 3 and outcomes[3:] == ["err"] * 11
    assert jf.last.tier == "fused"
    assert ".item()" in jf.last.run_graph.prologue.source
    assert dealias.cache_info(jf).misses == 1


def wrapped(x, e, c32, c64):
    # Entries that wrap around their dtype to a position in range: eager's values, however far the exact ones are.
    i32 = (torch.arange(2, dtype=torch.int32) + c32) * 65536 * 65536 + 1
    i64 = (torch.arange(2) + c64) * 2**32 * 2**32 + 2
    near = torch.arange(2, dtype=torch.int32) + c32  # and one that wraps from 2**31 - 1 to -2**31: out of range
    return x[i32] + x[i64], nn.functional.embedding(i32, e), x[near]


@pytest.mark.inductor
def test_int32_and_int64_wraparound_like_eager():
    jf = _jit(wrapped, executor="inductor")
    outcomes = []
    for c32, c64 in [(0, 0), (1, 3), (-1, -2), (2**31 - 1, 5), (3, 2**62)]:
        args = [torch.arange(5.0), torch.randn(5, 3), torch.tensor(c32, dtype=torch.int32), torch.tensor(c64)]
        outcomes.append(_against_eager(wrapped, jf, args))
    assert outcomes == ["ok", "ok", "ok", "err", "ok"]
    assert jf.last.tier == "fused"


def count_written_first(cache, c, v):
    # Positions from the count as it was; the count written before they are read and written (a view's write, a
    # copy of a value computed from them): every later use reads the positions the count gave before its writes.
    pos = torch.arange(2) + c
    c.view(-1).add_(1)
    c.copy_(pos[-1] + 1)
    old = cache[pos] * 1
    cache.index_copy_(0, pos, v)
    return old + pos, cache.sum()


@pytest.mark.inductor
def test_a_count_written_before_its_positions_are_used():
    jf = _jit(count_written_first, executor="inductor")
    big = torch.zeros(4, dtype=torch.long)  # the count, a view of a larger tensor (offset 2)
    outcomes = []
    for c in (0, 2, 4, 5, -1):
        big.fill_(c)
        outcomes.append(_against_eager(count_written_first, jf, [torch.arange(6.0), big[2], torch.tensor([7.0, 8.0])]))
    assert outcomes == ["ok", "ok", "ok", "err", "err"]
    assert jf.last.tier == "fused"


def cache_step(kc, vc, count, k, v):
    pos = torch.arange(k.shape[0]) + count
    count.add_(k.shape[0])
    kc.index_copy_(0, pos, k)
    vc[pos] = v
    return (kc * vc).sum(-1)


@pytest.mark.inductor
@pytest.mark.parametrize("count", [torch.tensor(0), torch.tensor([0])], ids=["0-dim", "shape-1"])
def test_a_decode_loop_reaching_the_caches_end(count):
    jf = _jit(cache_step, executor="inductor")
    ours = [torch.zeros(12, 2), torch.zeros(12, 2), count.clone()]
    outcomes = [_against_eager(cache_step, jf, [*ours, torch.randn(1, 2), torch.randn(1, 2)]) for _ in range(14)]
    # eager's error from step 12 on (the caches full), the caches as they were, the count moved by each step (eager's
    # code moves it before its write raises; the refused call runs the graph eagerly)
    assert outcomes == ["ok"] * 12 + ["err"] * 2 and int(ours[2].sum()) == 14
    assert dealias.cache_info(jf).misses == 1 and jf.last.tier == "fused"


def positions_over_symbols(cache, c, v, n):
    pos = torch.arange(2) + c + n
    cache.index_copy_(0, pos, v)
    return cache[pos - 1] * 1


@pytest.mark.inductor
def test_a_range_against_a_symbolic_size():
    jf = _jit(positions_over_symbols, executor="inductor", dynamic=True)
    outcomes = []
    for size, c, n in [(6, 0, 1), (8, 2, 4), (9, -1, 1), (12, 3, 7), (12, 3, 8), (7, -2, 1)]:
        args = [torch.zeros(size), torch.tensor(c), torch.tensor([1.0, 2.0]), n]
        outcomes.append(_against_eager(positions_over_symbols, jf, args))
    assert outcomes == ["ok"] * 4 + ["err"] * 2
    assert dealias.cache_info(jf).misses == 1 and jf.last.tier == "fused"
    assert "shape[0]" in jf.last.run_graph.prologue.source


# ---- mhaview: output views as Tensor methods ------------------------------------------------------------------


def _layout(t):
    return (
        tuple(t.shape),
        t.stride(),
        t.storage_offset(),
        t.dtype,
        t._is_view(),
        None if t._base is None else (tuple(t._base.shape), t._base.stride()),
        t.requires_grad,
        type(t.grad_fn).__name__,
        t.is_inference(),
    )


VIEW_PROGRAMS = {
    "view_dtype": (lambda x: ((x * 2).view(torch.int16), x.view(torch.int32)), (3, 4), False),
    "expand": (lambda x: ((x * 2).expand(3, -1, -1), x.expand(2, -1, -1)), (1, 4, 5), True),
    "transpose_1d": (lambda x: ((x * 2).transpose(0, 0), (x * 3).t(), x.T), (5,), True),
    "diagonal": (lambda x: (x * 2).diagonal(1, 0, 1).unsqueeze(-1), (4, 5), True),
    "unflatten": (lambda x: (x * 2).unflatten(1, (2, 3)).permute(2, 0, 1), (4, 6), True),
    "narrow_select": (lambda x: ((x * 2).narrow(1, 1, 3).select(0, -1), x[:, -2]), (4, 6), True),
    "as_strided": (lambda x: ((x * 2).as_strided((2, 2), (1, 2), 1), x.as_strided((2, 2), (1, 2), 1)), (4, 6), True),
    "view_minus_one": (lambda x: ((x * 2).view(-1, 3).t(), x.view(-1)[1:].unflatten(0, (1, -1))), (4, 6), True),
    "reshape_copy": (lambda x: ((x * 2).t().reshape(-1), (x * 2).reshape(2, -1).unsqueeze(0)), (4, 6), True),
    "complex": (lambda z: ((z * 2).real, (z * 3).imag, torch.view_as_real(z * 4), z.real), (3, 4), True),
    "multi_output": (lambda x: ((x * 2).split(2)[1].t(), (x * 3).unbind(1)[2].unsqueeze(0)), (4, 6), True),
    "detach": (lambda x: ((x * 2).detach(), x.detach()), (4, 6), True),
}


@pytest.mark.parametrize("name", list(VIEW_PROGRAMS))
def test_output_views_like_eager_in_each_grad_mode(name):
    fn, shape, grad = VIEW_PROGRAMS[name]
    dtype = torch.cfloat if name == "complex" else torch.float
    jf = _jit(fn, executor="torch")
    for mode in (torch.enable_grad, torch.no_grad, torch.inference_mode):
        for _ in range(2):
            x = torch.randn(*shape, dtype=dtype)
            xe = x.clone()
            if grad:
                x.requires_grad_()
                xe.requires_grad_()
            with mode():
                got, want = jf(x), fn(xe)
            for g, w in zip(_tensors(got), _tensors(want)):
                assert _layout(g) == _layout(w)
                assert torch.equal(g, w)
                assert (g._base is x) == (w._base is xe)
                if w._base is not None:  # one version counter with its base
                    assert (g._version == g._base._version) == (w._version == w._base._version)
            if grad and mode is torch.enable_grad:
                loss = lambda outs: sum(t.real.sum() if t.is_complex() else t.float().sum() for t in outs)  # noqa: E731
                rg = [t for t in _tensors(got) if t.requires_grad]
                rw = [t for t in _tensors(want) if t.requires_grad]
                if rw:
                    loss(rg).backward()
                    loss(rw).backward()
                    torch.testing.assert_close(x.grad, xe.grad)


def two_results(x, w):
    y = x @ w
    return y.softmax(-1), y.relu()


@pytest.mark.inductor
def test_functorch_transforms_over_a_fused_call_with_own_nodes():
    jf = _jit(two_results, executor="inductor")
    x, w, xb = torch.randn(3, 4), torch.randn(4, 4, requires_grad=True), torch.randn(2, 3, 4)
    got = jf(x, w)
    assert type(got[0].grad_fn).__name__ == "_OwnNodeBackward"  # (the fused call's own nodes: several results)
    transforms = {
        "grad": lambda f: torch.func.grad(lambda w: sum(o.sum() for o in f(x, w)))(w.detach()),
        "vmap": lambda f: torch.func.vmap(lambda xx: f(xx, w)[0])(xb),
        "vjp": lambda f: torch.func.vjp(lambda w: f(x, w)[1], w.detach())[1](torch.ones(3, 4))[0],
    }
    for name, apply in transforms.items():
        torch.testing.assert_close(apply(jf), apply(two_results), msg=name)


def attend(m, q, kpm):
    return m(q, q, q, key_padding_mask=kpm, need_weights=True, average_attn_weights=True)


@pytest.mark.inductor
def test_multihead_attention_with_a_padding_mask_hooks_and_double_backward():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    mhe = copy.deepcopy(mha)
    q, kpm = torch.randn(2, 3, 8), torch.tensor([[False, False, True], [False, False, False]])
    jf = _jit(attend, executor="inductor")
    for _ in range(2):
        qg, qe = q.clone().requires_grad_(), q.clone().requires_grad_()
        got, want = jf(mha, qg, kpm), attend(mhe, qe, kpm)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
            assert (g._base is None) == (w._base is None)
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        ran = {"got": 0, "want": 0}
        got[1].register_hook(lambda g, ran=ran: ran.__setitem__("got", ran["got"] + 1))
        want[1].register_hook(lambda g, ran=ran: ran.__setitem__("want", ran["want"] + 1))
        first = torch.autograd.grad(
            got[0].pow(2).sum() + got[1].pow(2).sum(), [qg, *mha.parameters()], create_graph=True
        )
        expected = torch.autograd.grad(
            want[0].pow(2).sum() + want[1].pow(2).sum(), [qe, *mhe.parameters()], create_graph=True
        )
        for g, e in zip(first, expected):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
        assert ran == {"got": 1, "want": 1}
        second = torch.autograd.grad(first[0].sum(), qg)[0]
        torch.testing.assert_close(second, torch.autograd.grad(expected[0].sum(), qe)[0], rtol=1e-4, atol=1e-5)
    assert dealias.cache_info(jf).tiers == ("fused",)


# ---- found: a read's error after the count's write ------------------------------------------------------------


def read_between_writes(x, cache, c, v):
    # The count written first, then a read with the positions (gather: RuntimeError), then a write with them
    # (index_copy_: IndexError). The write's check runs before the first write (nothing written before an error);
    # the read's check ran only at the read, after it: the write's IndexError where eager raised the read's
    # RuntimeError.
    pos = torch.arange(2) + c
    c.add_(2)
    g = x.gather(1, pos.unsqueeze(0).expand(2, 2))
    cache.index_copy_(0, pos, v)
    return g * 1


@pytest.mark.parametrize("executor", ["torch", pytest.param("inductor", marks=pytest.mark.inductor)])
def test_a_read_between_the_first_write_and_a_checked_write_raises_first(executor):
    jf = _jit(read_between_writes, executor=executor)
    outcomes = []
    for c in (0, 4, 3, -1):
        args = [torch.randn(2, 5), torch.zeros(5), torch.tensor(c), torch.tensor([1.0, 2.0])]
        outcomes.append(_against_eager(read_between_writes, jf, args))
    assert outcomes == ["ok", "err", "ok", "err"]
    assert dealias.cache_info(jf).misses == 1


def index_written_first(cache, c, v):
    # The index is the count itself, written before the write it indexes: its check, moved before the first write,
    # read the count's old value (IndexError for c = -1, where eager writes at 0; none for c = 4, where eager
    # raises: inductor's kernel assert then, a RuntimeError naming its C++ source).
    c.add_(1)
    cache.index_copy_(0, c, v)
    cache[c] = v * 2
    return cache * 1


@pytest.mark.parametrize("executor", ["torch", pytest.param("inductor", marks=pytest.mark.inductor)])
def test_an_index_written_before_its_write_is_checked_at_its_value(executor):
    jf = _jit(index_written_first, executor=executor)
    outcomes = []
    for c in (0, -1, 3, 4, -2, 5):
        args = [torch.zeros(5), torch.tensor([c]), torch.tensor([1.0])]
        eager_args = _clone(args)
        want, got = _run(index_written_first, eager_args), _run(jf, args)
        assert want[0] == got[0], (c, want, got)
        if want[0] == "err":  # (checked after the count's write: the count written, as eager's)
            assert type(got[1]) is type(want[1]) and str(got[1]).startswith(str(want[1]).splitlines()[0])
        else:
            torch.testing.assert_close(got[1], want[1])
        for a, b in zip(args, eager_args):
            assert torch.equal(a, b), c
        outcomes.append(want[0])
    assert outcomes == ["ok", "ok", "ok", "err", "err", "err"]


def read_at_a_written_index(x, c):
    # The fused prologue checked the reads' index, the call's input c, before the call: c's old value (IndexError
    # for c = -1, where eager reads x[0]; none for c = 4, inductor's kernel assert then, or a read out of bounds).
    c.add_(1)
    return x[c] * 1, x.index_select(0, c) + 0


@pytest.mark.inductor
def test_a_read_index_written_by_the_graph_is_checked_at_its_value():
    jf = _jit(read_at_a_written_index, executor="inductor")
    outcomes = []
    for c in (0, -1, 3, 4, -6, -7):
        args = [torch.arange(5.0), torch.tensor([c])]
        eager_args = _clone(args)
        want, got = _run(read_at_a_written_index, eager_args), _run(jf, args)
        assert want[0] == got[0], (c, want, got)
        if want[0] == "err":
            assert type(got[1]) is type(want[1]) and str(got[1]).startswith(str(want[1]).splitlines()[0])
        else:
            for g, w in zip(got[1], want[1]):
                torch.testing.assert_close(g, w)
        for a, b in zip(args, eager_args):
            assert torch.equal(a, b), c
        outcomes.append(want[0])
    assert outcomes == ["ok", "ok", "ok", "err", "err", "err"]


def intermediate_index_written(cache, c, d, v):
    t = c * 1  # an index the graph makes, written after the first write into the caller's memory (d)
    d.add_(1)
    t.add_(1)
    cache.index_copy_(0, t, v)
    return cache * 1


def test_an_intermediate_index_written_after_the_first_write():
    jf = _jit(intermediate_index_written, executor="torch")
    outcomes = []
    for c in (0, -1, 3, 4):
        args = [torch.zeros(5), torch.tensor([c]), torch.zeros(1), torch.tensor([1.0])]
        eager_args = _clone(args)
        want, got = _run(intermediate_index_written, eager_args), _run(jf, args)
        assert want[0] == got[0], (c, want, got)
        if want[0] == "ok":
            torch.testing.assert_close(got[1], want[1])
            for a, b in zip(args, eager_args):
                assert torch.equal(a, b), c
        outcomes.append(want[0])
    assert outcomes == ["ok", "ok", "ok", "err"]
