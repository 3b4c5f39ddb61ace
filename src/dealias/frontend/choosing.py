"""The choice between tiers of a call recording autograd, from the first call's runs on copies (frontend/copies.py)
to the user's backward, or none (frontend/backward_seen.py): the measures and the pure rules over them that
tiers.Tiered applies.

The runs on copies of the first call time each exact tier's forward and its backward apart (`whole`: the two
together; `forwards`: the forward alone), but the fused tier's forward alone: its backward is inductor's second
compile, seconds of C++ (resnet18: 10 of its 33 kernels, 155 KB of its 398 KB of C++; MultiheadAttention 3 of 14)
that torch.compile makes only at a first backward, and a forward never backpropagated (a training-mode forward
for its outputs' values) never needs it. So the fused tier's `whole` is timed only once a backward through the
first call's outputs is seen (`Choosing.lazy`, by_backward.ByBackward._time_backward, at the end of that backward), each
tier's forward and backward then on copies afresh, side by side; a training step thus compiles the fused backward in
its first backward, as torch.compile's does, and no later call waits for it; the tiers close there are measured on the
user's calls (by_backward.ByBackward._choose_trained). Until then the calls run the exact tier fastest on forward and
backward (a user accumulating gradients is a training step too).
"""

from __future__ import annotations

from collections.abc import Callable

from . import backward_seen

# Tiers whose backward the first call's runs on copies leave untimed (their compile is a first backward's cost).
LAZY = frozenset({"fused"})
# A candidate whose every timed call took this many times another's slowest (2 calls each at least) is dropped
# before its samples: its calls are the slow ones a user sees while the tiers are measured (the torch executor's
# op-by-op step of a foreach optimizer at 2-3x eager, where dynamo's graph runs at 1.2x).
CLEAR_LOSS = 1.5


class Choosing:
    """A call recording autograd whose runs on copies left more than one tier (`drop_on_both`): each one's timed
    runs on copies, forward and backward (`whole`, but for the tiers in `lazy`) and forward alone (`forwards`),
    and the hooks on the first call's outputs (`watch`, backward_seen.Watch, set once that call returned) that tell
    the end of the user's first backward, or a later call, which measure is the user's."""

    def __init__(
        self, tiers: list[str], whole: dict[str, list[float]], forwards: dict[str, list[float]], lazy: set[str]
    ) -> None:
        self.tiers, self.whole, self.forwards = tiers, whole, forwards
        self.lazy = {t for t in tiers if t in lazy}
        self.watch: backward_seen.Watch | None = None
        self.stepwise = True  # (no call came between the first call and its backward: not accumulating gradients)


def fastest_of(samples: list[float]) -> float:
    """What a tier costs by its timed calls `samples`: the mean of the fastest quarter (2 at least, where it has 2).
    Load only adds to a call's time, as much as tiers differ (medians of 5 chose dynamo's graph for GPT-2's forward,
    0.87x eager, over the fused 0.72x); but one lucky call is not what the tier costs (a foreach EMA's torch tier:
    fastest call 576 us, median 657-678 us, chosen over the fused program's 568-593 us)."""
    calls = sorted(samples)
    fastest = calls[: max(2, len(calls) // 4)]
    return sum(fastest) / len(fastest)


def clear_losers(samples: dict[str, list[float]]) -> list[str]:
    """The tiers of `samples` (each tier's timed calls; those with 2 at least count) each of whose calls took
    CLEAR_LOSS times the slowest call of another: clear losers, whatever more calls would say."""
    measured = {t: s for t, s in samples.items() if len(s) >= 2}
    if len(measured) < 2:
        return []
    fastest_worst = min(max(s) for s in measured.values())
    return [t for t, s in measured.items() if min(s) > CLEAR_LOSS * fastest_worst]


def close_to_best(samples: dict[str, list[float]], tiers: list[str], close: float) -> set[str]:
    """The tiers of `tiers` measured in `samples` whose fastest runs are within `close` of the best's."""
    fastest = {t: fastest_of(samples[t]) for t in tiers if t in samples}
    best = min(fastest.values(), default=0.0)
    return {t for t, s in fastest.items() if s <= (1 + close) * best}


def drop_on_both(
    tiers: list[str],
    whole: dict[str, list[float]],
    forwards: dict[str, list[float]],
    close: float,
    enough: Callable[[list[float]], bool],
) -> dict[str, float]:
    """The copies' verdict on a call recording autograd: the tiers of `tiers` to drop, with their time. A tier stays
    where it is close to the best (within `close`) on what its forward and backward took (`whole`), or on what its
    forward alone took (`forwards`), a user's call where the user never runs the backward. A tier without `whole`
    (its backward untimed, LAZY) stays too where its forward alone is within `close` of the best `whole`: its
    backward may be what wins a training step (a fused forward 1.3x the torch executor's, its backward 3x faster);
    one dropped is shown with its forward's time, what it costs at the least. Where some tier has fewer than its
    samples (long runs: not `enough`), only those that lose clearly (`clear_losers`) on both are dropped."""
    complete = all(enough(whole.get(t) or forwards[t]) for t in tiers)

    def kept(samples: dict[str, list[float]]) -> set[str]:
        if complete:
            return close_to_best(samples, tiers, close)
        timed = {t: samples[t] for t in tiers if t in samples}
        return set(timed) - set(clear_losers(timed))

    best_whole = min((fastest_of(whole[t]) for t in tiers if t in whole), default=0.0)
    untimed = {t for t in tiers if t not in whole and fastest_of(forwards[t]) <= (1 + close) * best_whole}
    stay = kept(whole) | kept(forwards) | untimed
    return {t: fastest_of(whole.get(t) or forwards[t]) for t in tiers if t not in stay}


def trained(tiers: list[str], whole: dict[str, list[float]], close: float) -> list[str]:
    """The tiers among `tiers` a training step (forward and backward, `whole` on copies) chooses from where its
    user's calls cannot (before its first backward; gradients accumulated over forwards): the fused tier only where
    its forward and backward were timed and it wins clearly (by `close`) over the exact tiers, its backward on
    copies (into no `.grad`, nothing between) not quite the user's (resnet18's training step: on copies 2-4 %
    faster fused than on the torch executor, three times; on the user's calls 1.10-1.5x eager fused, 1.0x on the
    torch executor)."""
    exact = [fastest_of(whole[t]) for t in tiers if t != "fused"]
    if "fused" in tiers and exact and ("fused" not in whole or min(exact) <= (1 + close) * fastest_of(whole["fused"])):
        return [t for t in tiers if t != "fused"]
    return list(tiers)
