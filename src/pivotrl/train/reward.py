"""The GRPO reward: parse each completion and verify it against the pivot's expert action, through
the one scoring path (`pivotrl.scoring`).

Each dataset row carries its Turn as a JSON string column `turn` (Arrow would merge differently
keyed argument dicts, docs/DESIGN.md); TRL repeats it for each of the G completions and hands it to
the reward function as a keyword argument."""

from __future__ import annotations

from typing import Any

import torch

from pivotrl.formats.actions import parse_completion
from pivotrl.formats.chat import completion_text
from pivotrl.io.records import Turn
from pivotrl.scoring import score_completions
from pivotrl.verifiers import get_verifier


class PivotReward:
    """TRL reward function: one float per completion. Unparseable → `invalid_action_penalty`.

    It logs `invalid_rate` through TRL's `log_metric` (averaged over processes by TRL)."""

    def __init__(self, verifier: str = "toolcall", verifier_config: dict[str, Any] | None = None,
                 invalid_action_penalty: float = 0.0, parse: Any = None, tokenizer: Any = None):
        """parse: the model's parser (`formats.parser_for`; default: Hermes/JSON). tokenizer: when
        given, completions are re-decoded from TRL's `completion_ids` with special tokens kept
        (`chat.completion_text`): TRL's text drops them, and with them gpt-oss's and DeepSeek's
        call delimiters."""
        self.verifier = get_verifier(verifier, **(verifier_config or {}))
        self.parse = parse or parse_completion
        self.tokenizer = tokenizer
        self.invalid_action_penalty = invalid_action_penalty
        self.__name__ = f"pivot_{verifier}"  # TRL names the reward metric after the function
        self._turns: dict[str, Turn] = {}  # each Turn arrives G times: parse it once

    def _turn(self, raw: str) -> Turn:
        turn = self._turns.get(raw)
        if turn is None:
            if len(self._turns) > 4096:
                self._turns.clear()
            turn = self._turns[raw] = Turn.model_validate_json(raw)
        return turn

    def __call__(self, prompts: list[Any], completions: list[Any], turn: list[str], log_metric=None,
                 completion_ids: list[list[int]] | None = None, **_: Any) -> list[float]:
        if self.tokenizer is not None and completion_ids is not None:
            texts = [completion_text(self.tokenizer, ids) for ids in completion_ids]
        else:  # conversational completions arrive as [{"role", "content"}]: score the last content
            texts = [c if isinstance(c, str) else (c[-1].get("content") or "" if c else "")
                     for c in completions]
        scores = score_completions(self.verifier, [self._turn(raw) for raw in turn], texts, self.parse)
        rewards = [s.reward if s.valid else float(self.invalid_action_penalty) for s in scores]
        invalid = sum(not s.valid for s in scores)
        if log_metric is not None and completions:
            log_metric("invalid_rate", invalid / len(completions))
        return rewards


def group_stats(rewards: torch.Tensor, group_size: int) -> dict[str, float]:
    """Per-group reward statistics of a flat reward vector laid out group after group (TRL's order).

    The GRPO signal at a state scales with the reward's std there (paper Thm 3.2), so the mean of
    the per-group std is the "learning signal" a step had; zero-std groups teach nothing."""
    if rewards.numel() == 0 or rewards.numel() % group_size:
        return {}
    groups = rewards.float().view(-1, group_size)
    std = groups.std(dim=1, unbiased=False) if group_size > 1 else torch.zeros(groups.shape[0])
    return {"group_std_mean": std.mean().item(), "frac_zero_std": (std < 1e-6).float().mean().item()}
