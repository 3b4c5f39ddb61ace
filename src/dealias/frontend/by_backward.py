"""The choice of a tier by the user's backward, for a call recording autograd whose runs on copies left more than one
tier (choosing.Choosing): the hooks on the first call's outputs (backward_seen.py) set when that call returns, the
choice at the end of the user's first backward or at a later call (by forward and backward where a backward through
the first call's outputs ran, by the forward alone where none can come), and the lazy tiers' forward and backward
then timed on copies. The part of tiers.Tiered that runs after the first call, as a base class of it: it reads and
sets the entry's measures (`candidates`, `samples`, `notes`...) under the entry's lock, as Tiered's own methods do."""

from __future__ import annotations

from typing import Any

from . import backward_seen, choosing

# Timed runs per tier on copies after the first backward of a training step whose user's calls then measure every
# tier within choosing.CLEAR_LOSS of the best (`_choose_trained`, `stepwise`): the copies only drop clear losers there,
# which two runs each show, and each run is a forward and backward of the first call's cost (resnet18's step: 15 runs
# of 55 ms, 0.9 CPU s of its first backward beside the fused backward's compile, torch.compile's at that backward).
FILTER_SAMPLES = 2


class ByBackward:
    """Tiered's methods for the choice by the user's backward (module docstring)."""

    def _watch(self, out: Any, leaves: list[Any]) -> None:
        """Hooks on the first call's outputs' autograd nodes tell whether the user runs their backward (backward_seen,
        choosing.Choosing); where none can be set, the tiers are timed on the user's calls, each up to the next."""
        made = self.choosing
        watch, why = backward_seen.watch(out, leaves, self._after_first_backward if made.lazy else None)
        if watch is None:
            self.choosing = None
            self.notes.append(f"tiers measured on the calls: no hook on the outputs' autograd nodes ({why})")
            self.candidates, self.measured_on_copies = made.tiers, ""
            return
        made.watch = watch

    def _choose_by_backward(self) -> choosing.Choosing | None:
        """A later call, or the end of the first backward (choosing.Choosing): by forward and backward where a
        backward through the first call's outputs ran; by the forward alone where none can come (their graph freed)
        or none came in WATCH_CALLS calls; else not yet (gradients accumulated over forwards): the call runs the tier
        a training step would (choosing.trained: a slower forward costs a forward-only user a little, a slower
        backward an accumulating user much, resnet18's fused one 1.3x eager's). Returns the Choosing whose lazy
        tiers' backward is now to be timed on copies (`_time_backward`), else None."""
        from .tiers import WATCH_CALLS

        watch = self.choosing.watch
        if watch.seen:
            samples, why = self.choosing.whole, "forward and backward: the first call's outputs were backpropagated"
        elif watch.freed or self.calls > WATCH_CALLS:
            samples, why = self.choosing.forwards, "the forward alone: the first call's outputs were not backpropagated"
        else:
            self.choosing.stepwise = False  # (a call before the first backward: gradients accumulated)
            return None
        watch.remove()
        made, self.choosing = self.choosing, None
        if watch.seen and made.lazy:  # (the calls meanwhile run the exact tier fastest on both: `current`)
            self.timing_backward = True
            return made
        self.notes.append(f"chosen by {why}")
        if watch.seen:
            self._choose_trained(samples, made.tiers, made.stepwise)
            return None
        # (forwards close on copies measured on the user's calls, `_sift`: each alone, no backward comes)
        self.candidates, self.forward_only = list(made.tiers), True
        self._sift({t: samples[t] for t in self.candidates})
        return None

    def _choose_trained(self, whole: dict[str, list[float]], tiers: list[str], stepwise: bool) -> None:
        """A training step's choice from each tier's forward and backward on copies (`whole`): those within CLEAR_LOSS
        of the best there measured on the user's calls, each up to the next (`_sift`; on copies, into no `.grad`,
        resnet18's step ran 2-4 % faster fused, on the calls 1.5x slower; a GAN discriminator's 0-33 % slower fused,
        on the calls 7 % faster), where all `tiers` were timed there and the first backward came before a second call
        (`stepwise`; else the calls' times would be forwards'): else choosing.trained on copies."""
        from .tiers import CLOSE

        if stepwise and all(whole.get(t) for t in tiers):
            self.candidates = list(tiers)
            self._sift({t: whole[t] for t in tiers}, choosing.CLEAR_LOSS - 1)
            return
        self.candidates = choosing.trained(list(whole), whole, CLOSE)
        self.samples = {t: whole[t] for t in self.candidates}
        self.dropped.update({t: choosing.fastest_of(s) for t, s in whole.items() if t not in self.candidates})
        self._choose()

    def _after_first_backward(self, leaves: list[Any]) -> None:
        """`_time_backward` at the end of the user's first backward through the first call's outputs (the first
        call's tensors, its state: backward_seen), where torch.compile's first backward compiles its own: no later
        call waits for the fused backward's compile (at the second call, resnet18's training step waited 14 CPU s)."""
        with self.lock:
            ready = self.choosing is not None and self.choosing.watch is not None and self.choosing.watch.seen
            made = self._choose_by_backward() if ready else None
        if made is not None:
            self._time_backward(leaves, made, "the first backward")

    def _time_backward(self, leaves: list[Any], made: choosing.Choosing, where: str) -> None:
        """After a backward through the first call's outputs, where some tier's backward was left untimed
        (`made.lazy`, the fused one's: choosing.py): each tier's forward and backward on copies of `leaves`, side by
        side (the fused backward compiled in its first run), and the training step's choice from them. Tensors the
        fused program's guard rejects leave it to the next call it accepts; where the copies cannot time them all
        (or are interrupted), the exact tiers' times of the first call choose (never a slower backward on the user's
        calls for its measure). Where the user's calls then measure the tiers close there (`made.stepwise`), each is
        timed FILTER_SAMPLES times, the tiers warm from the first call without another warm-up run."""
        from .tiers import SAMPLES

        if "fused" in made.tiers and self.narrower is not None and not self.narrower(leaves):
            with self.lock:
                self.timing_backward, self.choosing = False, made  # (the watch's `seen` stays: the next call)
            return
        whole, notes, forwards = {}, [], None
        with self.lock:  # (the tiers whose forward and backward ran on copies in the first call: not warmed again)
            warm = frozenset(self.warm)
        try:
            runs = FILTER_SAMPLES if made.stepwise else SAMPLES
            whole, _, notes, forwards = self._copies(leaves, made.tiers, warm=warm, samples=runs)
        finally:  # (KeyboardInterrupt in the compile: settled on the exact tiers all the same, then raised)
            with self.lock:
                self.timing_backward = False
                if not whole or forwards is None or not all(whole.get(t) for t in made.tiers):
                    why = "; ".join(n.removeprefix("tiers measured on the calls: ") for n in notes) or "not run"
                    self.notes.append(f"{', '.join(sorted(made.lazy))} not chosen: its backward not timed ({why})")
                    whole = {t: s for t, s in made.whole.items() if t in made.tiers and t not in made.lazy}
                else:
                    self.notes += notes
                    self.measured_on_copies = where
                self.notes.append("chosen by forward and backward: the first call's outputs were backpropagated")
                self._choose_trained(whole, made.tiers, made.stepwise)
