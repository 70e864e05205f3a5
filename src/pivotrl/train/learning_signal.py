"""Whether a GRPO run can learn at all, read off its logged steps.

GRPO's advantage is a completion's reward less its group's mean: a group whose G completions all
scored alike (zero reward std) gives every completion advantage 0, so loss and gradient are 0 and
the step changes nothing. Pivots are chosen for mixed outcomes under the reference policy
(`pivotrl select`); a pivot set without any (`--strategy all` on turns the policy always fails or
always passes, a verifier no completion can satisfy) trains for its whole budget and moves no
weight. `NoMixedOutcomesWarning` warns as soon as the first logged steps show it, and
`learning_signal` is the line the run's summary and model card give."""

from __future__ import annotations

import logging
import statistics
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

NO_MIXED_OUTCOMES = "no mixed outcomes: nothing to learn"
HOW_TO_MIX = ("train on pivots with mixed outcomes: `pivotrl select` with its default strategy (not "
              "--strategy all or random), on a profile with more samples per turn (--k) or a higher "
              "--temperature so that mixed turns show; here, more completions per pivot "
              "(--num-generations) or a higher --temperature let a group's completions differ")
# The logged steps watched before warning: a few all-alike steps happen by chance on a hard set,
# every one of the first few rarely does when some pivot has mixed outcomes.
WATCHED_STEPS = 3


def zero_std_fraction(row: dict[str, Any]) -> float | None:
    """The share of a logged step's groups whose rewards were all alike (pivotrl's frac_zero_std,
    else TRL's frac_reward_zero_std); None when the step did not log it."""
    for key in ("frac_zero_std", "frac_reward_zero_std"):
        value = row.get(key)
        if isinstance(value, (int, float)):
            return float(value)
    return None


def all_alike(fractions: list[float]) -> bool:
    """Some steps, and in every one of them every group scored all its completions alike."""
    return bool(fractions) and all(f >= 1.0 - 1e-9 for f in fractions)


def learning_signal(rows: list[dict[str, Any]]) -> str:
    """The run's learning signal in one line, from its metrics.jsonl rows: NO_MIXED_OUTCOMES and
    the fix when no logged step had a group with mixed outcomes, else the share of groups that had."""
    fractions = [f for f in map(zero_std_fraction, rows) if f is not None]
    if not fractions:
        return "not logged (no step logged frac_zero_std)"
    if all_alike(fractions):
        return (f"{NO_MIXED_OUTCOMES}: in each of {len(fractions)} logged steps every group's "
                "completions scored alike (frac_zero_std 1.0), so every advantage, loss and gradient "
                f"was 0; {HOW_TO_MIX}")
    mixed = statistics.fmean(1.0 - f for f in fractions)
    return f"groups with mixed outcomes: {mixed:.0%} (mean over {len(fractions)} logged steps)"


class NoMixedOutcomesWarning(TrainerCallback):
    """Warns (the `pivotrl.train.learning_signal` logger, and a line in the run's log file) when
    each of the first WATCHED_STEPS logged steps, or of all of them in a shorter run, had every
    group's rewards alike. Once per run, on the main process; it changes nothing in training."""

    def __init__(self, log_file: str | Path | None = None, watched: int = WATCHED_STEPS):
        self.log_file, self.watched = log_file, watched
        self.fractions: list[float] = []
        self.warned = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self.warned or len(self.fractions) >= self.watched:
            return
        fraction = zero_std_fraction(logs or {})
        if fraction is not None:
            self.fractions.append(fraction)
            if len(self.fractions) == self.watched:
                self._check()

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and len(self.fractions) < self.watched:
            self._check()

    def _check(self) -> None:
        if self.warned or not all_alike(self.fractions):
            return
        self.warned = True
        message = (f"warning: {NO_MIXED_OUTCOMES}. In each of the first {len(self.fractions)} logged "
                   "steps every group's completions scored alike (frac_zero_std 1.0): every advantage "
                   f"is 0, so the loss and gradient are 0 and the weights do not move. Fix: {HOW_TO_MIX}")
        logger.warning(message)
        if self.log_file is not None:
            with Path(self.log_file).open("a") as f:
                f.write(message + "\n")
