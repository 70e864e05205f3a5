"""Tokens a training run spent, counted where they are spent, cumulative over the run.

- `train_tokens`: over every forward pass that a backward pass follows (the loss forward of each
  micro-batch; each GRPO iteration over a batch is one more pass), the non-padding tokens of what
  the model actually ran, as its attention mask marks them: prompt + completion per GRPO sequence
  (TRL's path), or, with the shared-prefix loss, each distinct prompt once per micro-batch plus
  each row's last prompt token and completion (`shared_prefix.shared_prefix_tokens`); the whole
  trajectory per SFT row. Forwards without gradients (the reference model's log-probs, the old
  policy's, rollouts) are not counted, nor the recomputation of gradient checkpointing.
- `rollout_tokens`: the tokens the policy generated in its training rollouts (completions, the
  end token included; RL trainers only).

Counts are summed over all processes and logged as counters (the value so far, not a per-step
mean), so they land in metrics.jsonl at every logged step. A resumed run restores them from its
checkpoint's log history, when that history logged them at the checkpoint's own step; otherwise
(a checkpoint written before tokens were counted, or at a step `logging_steps` skipped) the count
is unknown from there on and is not logged: never a count short of what was spent, nor one that
starts again from 0.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback

TOKEN_COUNTERS = ("train_tokens", "rollout_tokens")


def batch_tokens(inputs: dict[str, Any]) -> int:
    """Non-padding tokens of one SFT batch: its attention mask's sum (padding-free batches have
    no mask and no padding: every token of the packed row)."""
    if "attention_mask" in inputs:
        return int(inputs["attention_mask"].sum())
    return int(inputs["input_ids"].numel())


class CountsTokens:
    """A Trainer mixin (before the Trainer class in the bases) keeping `token_counts` (the
    counters in `counted`), logged with TRL's metrics and restored on resume (module doc)."""

    counted: tuple[str, ...] = ("train_tokens",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.token_counts: dict[str, int | None] = dict.fromkeys(self.counted, 0)
        self.add_callback(RestoreTokenCounts(self))

    def count_tokens(self, key: str, local: int) -> None:
        """Add this process's `local` tokens, summed over every process (all of them call this at
        the same point of the step), to counter `key`."""
        total = int(self.accelerator.gather(torch.tensor([local], device=self.accelerator.device)).sum())
        if self.token_counts[key] is not None:
            self.token_counts[key] += total
            self._metrics["train"][key] = [float(self.token_counts[key])]  # a counter, not averaged


class RestoreTokenCounts(TrainerCallback):
    """On train begin (after a checkpoint's state is loaded): each counter's value logged at the
    checkpoint's step, None (unknown) when steps were trained but that step did not log it."""

    def __init__(self, trainer: CountsTokens):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        for key in self.trainer.counted:
            at = [e[key] for e in state.log_history if key in e and e.get("step") == state.global_step]
            self.trainer.token_counts[key] = int(at[-1]) if at else (0 if state.global_step == 0 else None)
        # TRL's SFTTrainer counts its own `num_tokens` in the process and never checkpoints it.
        tokens_seen = [e["num_tokens"] for e in state.log_history
                       if "num_tokens" in e and e.get("step") == state.global_step]
        if tokens_seen and hasattr(self.trainer, "_total_train_tokens"):
            self.trainer._total_train_tokens = int(tokens_seen[-1])
