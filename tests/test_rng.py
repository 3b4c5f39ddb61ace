"""Random state calls and generators inside a compiled function (issue 39, item 4; compat/dynamo_rng.py): each
construct against eager on fresh copies of the arguments, on the first and on cached calls. Compared: the values
drawn, the arguments after the call, the default generator's state and every generator's state after the call (so
a following eager draw is eager's too), the compile counts, and no FallbackWarning where the construct compiles."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from harness import fallback_messages
from torch.utils import _pytree as pytree

import dealias
from dealias import compat


def _state_after(fn: Callable[..., Any], args: tuple[Any, ...], seed: int) -> dict[str, Any]:
    """Run `fn(*args)` from global seed `seed`; what the call leaves behind."""
    torch.manual_seed(seed)
    out = fn(*args)
    gens = [a for a in args if isinstance(a, torch.Generator)]
    return {
        "out": [t.clone() if isinstance(t, torch.Tensor) else t for t in pytree.tree_leaves(out)],
        "args": [a.clone() for a in args if isinstance(a, torch.Tensor)],
        "rng": torch.get_rng_state(),
        "gens": [g.get_state() for g in gens],
        # the draws of a following eager call
        "next": [torch.randn(5), *(torch.randn(5, generator=g) for g in gens)],
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    for key in a:
        x, y = a[key], b[key]
        if len(x) != len(y):
            return f"{key}: {len(x)} values against {len(y)}"
        for i, (u, v) in enumerate(zip(x, y)):
            if isinstance(u, torch.Tensor):
                if u.dtype != v.dtype or u.shape != v.shape or u.stride() != v.stride() or not torch.equal(u, v):
                    return f"{key}[{i}]: eager {u!r:.120}, dealias {v!r:.120}"
            elif u != v:
                return f"{key}[{i}]: eager {u!r}, dealias {v!r}"
    return None


def check_rng(
    fn: Callable[..., Any],
    make: Callable[[int], tuple[Any, ...]],
    calls: int = 3,
    compiles: int = 1,
    warns: bool = False,
    **jit: Any,
) -> Any:
    """`fn` jitted against eager on `calls` calls, call i on `make(i)` (a generator argument is one object across the
    jitted calls, as a caller keeps it, set to the same state as eager's own). Returns the jitted function."""
    jf = dealias.jit(fn, **jit)
    kept: dict[int, torch.Generator] = {}
    for i in range(calls):
        eager_args = make(i)
        jit_args = list(make(i))
        for k, a in enumerate(jit_args):
            if isinstance(a, torch.Generator):
                g = kept.setdefault(k, torch.Generator())
                g.set_state(a.get_state())
                jit_args[k] = g
        expected = _state_after(fn, eager_args, 1000 + i)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            got = _state_after(jf, tuple(jit_args), 1000 + i)
        diff = _same(expected, got)
        assert diff is None, f"call {i + 1}: {diff}"
        messages = fallback_messages(record)
        assert bool(messages) == warns or (warns and i > 0), f"call {i + 1}: {messages}"
    info = dealias.cache_info(jf)
    assert info.misses == compiles and info.hits == calls - compiles, info
    return jf


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- the default generator's state ------------------------------------------------------------------------------


def test_manual_seed_inside():
    def f(x):
        torch.manual_seed(3)
        return x + torch.randn(3)

    check_rng(f, lambda i: (torch.zeros(3),))


def test_draw_manual_seed_draw():
    def f(x):
        a = torch.randn(3)
        torch.manual_seed(5)
        x.uniform_()
        return a + torch.rand(3), x

    check_rng(f, lambda i: (torch.zeros(4, 3).t(),))


def test_manual_seed_of_a_changing_int_compiles_twice():
    def f(x, seed):
        torch.manual_seed(seed)
        return x + torch.randn(3)

    # (dynamo specializes the first value, then makes the seed a symbol: one program for every later seed)
    check_rng(f, lambda i: (torch.zeros(3), 11 + i), calls=5, compiles=2)


def test_manual_seed_returns_the_default_generator():
    def f(x):
        g = torch.manual_seed(7)
        return x + torch.randn(3, generator=g) + torch.randn(3)

    check_rng(f, lambda i: (torch.zeros(3),))


def test_get_rng_state_then_set_rng_state_replays():
    def f(x):
        s = torch.get_rng_state()
        a = torch.randn(3)
        torch.set_rng_state(s)
        b = torch.randn(3)
        x.normal_()
        return a, b, s

    check_rng(f, lambda i: (torch.zeros(3),))


def test_set_rng_state_from_an_argument():
    states = []
    for seed in range(3):
        torch.manual_seed(seed)
        states.append(torch.get_rng_state())

    def f(x, state):
        a = torch.rand(2)
        torch.set_rng_state(state)
        return x * torch.rand(2) + a

    check_rng(f, lambda i: (torch.ones(2), states[i].clone()))


def test_rng_state_written_after_it_is_set():
    def f(x, state):
        torch.set_rng_state(state)
        state.zero_()  # (the state was read before: the functional graph reads the old version)
        return x + torch.randn(2)

    torch.manual_seed(9)
    s = torch.get_rng_state()
    check_rng(f, lambda i: (torch.ones(2), s.clone()))


# -- generators ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "draw",
    [
        lambda x, g: x + torch.randn(3, generator=g),
        lambda x, g: x.normal_(generator=g),
        lambda x, g: x.uniform_(-2, 2, generator=g),
        lambda x, g: torch.randint(0, 10, (3,), generator=g) + x,
        lambda x, g: torch.randperm(3, generator=g) + x,
        lambda x, g: x.t().bernoulli_(0.3, generator=g),
    ],
    ids=["randn", "normal_", "uniform_", "randint", "randperm", "bernoulli_ of a view"],
)
def test_generator_argument(draw):
    def f(x, g):
        return draw(x, g)

    check_rng(f, lambda i: (torch.zeros(3), gen(i)))


def test_generator_argument_written_view():
    def f(x, g):
        x.t().bernoulli_(0.3, generator=g)
        return x.sum(0)

    check_rng(f, lambda i: (torch.zeros(4, 3), gen(i)))


def test_generator_and_global_draws_interleaved():
    def f(x, g):
        a = torch.randn(3)
        b = torch.randn(3, generator=g)
        x.uniform_(generator=g)
        c = torch.rand(3)
        torch.manual_seed(4)
        return a + b + c + torch.randn(3, generator=g) + torch.randn(3), x

    check_rng(f, lambda i: (torch.zeros(3), gen(i)))


def test_unused_draws_still_move_the_generators():
    def f(x, g):
        torch.randn(3, generator=g)
        torch.rand(2)
        torch.get_rng_state()
        return x + 1

    check_rng(f, lambda i: (torch.zeros(3), gen(i)))


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_draws_around_a_custom_function():
    # (the graph is split around the Function, which runs eagerly: the pieces keep the draws' order)
    def f(x, g):
        a = torch.randn(3, generator=g) + torch.randn(3)
        b = _Double.apply(x + a)
        torch.manual_seed(3)
        return b * torch.rand(3, generator=g) + torch.rand(3)

    check_rng(f, lambda i: (torch.ones(3, requires_grad=True), gen(i)))


def test_checkpointed_draws_recompute_eagers_numbers():
    # Dynamo's checkpoint operator, run eagerly, recomputed without restoring the random state: backward drew new
    # numbers (other gradients than eager's) and moved the default generator.
    from torch.utils.checkpoint import checkpoint

    def f(x, g):
        y = checkpoint(lambda t: t * torch.randn(3) * torch.rand(3, generator=g), x, use_reentrant=False)
        return y.sum()

    jf = dealias.jit(f)
    jit_gen = gen(0)
    for i in range(2):
        x, xj = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
        g = gen(i)
        jit_gen.set_state(g.get_state())
        torch.manual_seed(i)
        f(x, g).backward()
        expected = torch.get_rng_state(), g.get_state()
        torch.manual_seed(i)
        with warnings.catch_warnings():
            warnings.simplefilter("error", dealias.FallbackWarning)
            jf(xj, jit_gen).backward()
        assert torch.equal(xj.grad, x.grad), (xj.grad, x.grad)
        assert torch.equal(torch.get_rng_state(), expected[0]) and torch.equal(jit_gen.get_state(), expected[1])


def test_two_generators():
    def f(x, g, h):
        return x + torch.randn(3, generator=g) + torch.randn(3, generator=h) * torch.randn(3, generator=g)

    check_rng(f, lambda i: (torch.zeros(3), gen(i), gen(50 + i)))


def test_generator_state_calls():
    def f(x, g):
        g.manual_seed(4)
        a = torch.randn(3, generator=g)
        s = g.get_state()
        b = torch.randn(3, generator=g)
        g.set_state(s)
        return x + a + b + torch.randn(3, generator=g), s

    check_rng(f, lambda i: (torch.zeros(3), gen(i)))


def test_generator_manual_seed_returns_the_generator():
    def f(x, g):
        return x + torch.rand(2, generator=g.manual_seed(5)) + torch.rand(2, generator=g)

    check_rng(f, lambda i: (torch.zeros(2), gen(i)))


def test_default_generator_methods():
    def f(x):
        torch.default_generator.manual_seed(3)
        s = torch.default_generator.get_state()
        a = torch.randn(3)
        torch.default_generator.set_state(s)
        return x + a - torch.randn(3)

    check_rng(f, lambda i: (torch.zeros(3),))


def test_another_generator_object_compiles_again():
    def f(x, g):
        return x + torch.randn(3, generator=g)

    jf = dealias.jit(f)
    gens = [gen(1), gen(1)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", dealias.FallbackWarning)
        results = [jf(torch.zeros(3), g) for g in (gens[0], gens[1], gens[0])]
    expected = [f(torch.zeros(3), g) for g in (gen(1), gen(1))]
    assert torch.equal(results[0], expected[0]) and torch.equal(results[1], expected[1])
    assert not torch.equal(results[2], results[0])  # (the first generator drew on: its next numbers)
    info = dealias.cache_info(jf)
    assert info.misses == 2 and info.hits == 1, info  # (the graph draws from that very generator: guarded by identity)


def test_generator_argument_verify():
    def f(x, g):
        x.normal_(generator=g)
        return x + torch.rand(3, generator=g) + torch.rand(3)

    check_rng(f, lambda i: (torch.zeros(3), gen(i)), verify=True)


# -- random_ ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize(
    "draw",
    [
        lambda x: x.random_(0, 10),
        lambda x: x.random_(-5, None),
        lambda x: x.random_(7),
        lambda x: x.random_(),
        lambda x: x.t().random_(3, 90),
    ],
    ids=["from-to", "from-None", "to", "default", "from-to of a view"],
)
def test_random_(draw, dtype):
    def f(x):
        draw(x)
        return x * 2

    check_rng(f, lambda i: (torch.zeros(4, 3, dtype=dtype),))


def test_random_with_a_generator_and_bounds_that_change():
    def f(x, g, high):
        x.random_(0, high, generator=g)
        return x.random_(to=high, generator=g) + 1

    check_rng(f, lambda i: (torch.zeros(6), gen(i), 10 + i), calls=4, compiles=2)


# -- what still breaks the graph: exact, with a warning -------------------------------------------------------------


def test_generator_made_inside_breaks_with_a_warning():
    def f(x):
        g = torch.Generator()
        g.manual_seed(3)
        return x + torch.randn(3, generator=g)

    line = inspect.getsourcelines(f)[1] + 1  # (the warning names the line of `torch.Generator()`)
    with pytest.warns(dealias.FallbackWarning, match=f"test_rng.py:{line}"):
        jf = dealias.jit(f)
        assert torch.equal(jf(torch.zeros(3)), f(torch.zeros(3)))


def test_generator_initial_seed_breaks_with_a_warning():
    def f(x, g):
        return x + g.initial_seed()  # (a value of the generator's state at run time: no graph can hold it)

    check_rng(f, lambda i: (torch.zeros(3), gen(7)), warns=True)


def test_random_of_a_tensor_requiring_grad_breaks():
    def f(w):
        y = w * 2
        y.random_(0, 4)
        return y

    w = torch.ones(3, requires_grad=True)
    with pytest.warns(dealias.FallbackWarning, match="random_"):
        torch.manual_seed(0)
        got = dealias.jit(f)(w)
    torch.manual_seed(0)
    assert torch.equal(got, f(w))


def test_without_the_correction_each_breaks_exactly():
    def f(x, g):
        torch.manual_seed(2)
        s = torch.get_rng_state()
        a = torch.randn(3, generator=g)
        torch.set_rng_state(s)
        x.random_(0, 5)
        return a + torch.randn(3) + x

    with compat.forced_off("rng"):
        check_rng(f, lambda i: (torch.zeros(3), gen(i)), warns=True)


def test_no_effect_on_other_backends():
    def f(x, g):
        torch.manual_seed(2)
        a = torch.randn(3, generator=g)
        return x.random_(0, 5) + a

    from harness import captured_targets

    targets = captured_targets(f, torch.zeros(3), gen(0))
    # (dynamo's own breaks: none of these calls is in its graphs, and none of dealias's ops)
    assert not any("dealias" in str(t) or "random" in str(t) or "seed" in str(t) for t in targets), targets


@pytest.mark.inductor
def test_fused_executor_leaves_draws_to_the_torch_executor():
    def f(x, g):
        torch.manual_seed(1)
        x.random_(0, 9, generator=g)
        return x + torch.randn(3)

    jf = check_rng(f, lambda i: (torch.zeros(3), gen(i)), executor="inductor")
    assert "draws random numbers" in "\n".join(str(t) for t in dealias.last_traces(jf))
