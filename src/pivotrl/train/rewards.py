"""The GRPO reward (parse → verify against the pivot's expert action), the per-step metrics
PivotRL needs that TRL does not log, and the trainer subclass that logs them. The subclass also
speeds up TRL's log-prob forward without changing its numbers: a completion-only LM head on CPU,
and each distinct prompt encoded once per group instead of once per completion (shared_prefix.py).

Each dataset row carries its Turn as a JSON string column `turn` (Arrow would merge differently
keyed argument dicts, docs/DESIGN.md); TRL repeats it for each of the G completions and hands it to the
reward function as a keyword argument.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from pivotrl.formats.actions import parse_completion
from pivotrl.formats.chat import completion_text, prompt_token_ids
from pivotrl.io.records import Turn
from pivotrl.scoring import score_completions
from pivotrl.train.shared_prefix import (enable_shared_prefix_forward, has_shared_prefix_forward,
                                         shared_prefix_logps, unsupported_reason)
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


def score_only_completions_on_cpu(enabled: bool = True) -> bool:
    """Make TRL 1.16's fused LM head project only the labelled (completion) positions on CPU.

    Off Triton devices TRL projects EVERY position through the LM head (a fixed tile shape avoids
    recompiles on Neuron) and masks afterwards; on CPU nothing is compiled, and a one-turn pivot
    prompt is ~400 tokens against ~12 completion tokens, so that projection was about half of a
    CPU GRPO step (bench/bench_grpo_step.py). The numbers are the same either way
    (tests/test_train_grpo.py). `enabled=False` restores TRL's own rule. Returns whether TRL has
    this seam at all."""
    import trl.trainer.utils as trl_utils

    current = getattr(trl_utils, "_use_triton", None)
    if current is None:
        return False
    original = getattr(current, "_original", current)
    if not enabled:
        trl_utils._use_triton = original
        return True

    def compact_on_cpu(device: torch.device) -> bool:
        return device.type == "cpu" or original(device)

    compact_on_cpu._original = original
    trl_utils._use_triton = compact_on_cpu
    return True


class PivotGRPOTrainer(GRPOTrainer):
    """GRPOTrainer plus the metrics PivotRL reports: per-group reward std, fraction of zero-std
    groups, and rollout turns spent (one completion = one model turn), counted over all processes."""

    rollout_turns: int = 0

    def __init__(self, *args, shared_prefix: bool = True, **kwargs):
        score_only_completions_on_cpu()
        super().__init__(*args, **kwargs)
        # After TRL added its fused LM head to the same (PEFT base) model, and before any wrapping.
        self.shared_prefix = shared_prefix and enable_shared_prefix_forward(self._causal_lm(self.model))
        if self.shared_prefix and self.ref_model is not None:  # beta > 0: the KL reference's log-probs
            enable_shared_prefix_forward(self._causal_lm(self.ref_model))

    def _causal_lm(self, model):
        """The transformers model under a DDP/DeepSpeed/FSDP wrapper and a PEFT adapter."""
        model = self.accelerator.unwrap_model(model)
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                           **extra):
        """TRL's log-probs, with each distinct prompt encoded once (train/shared_prefix.py) when the
        switch is on and the call is a plain text one on the policy; otherwise TRL's own path."""
        lm = self._causal_lm(model)
        if (self.shared_prefix and all(v is None for v in extra.values())
                and input_ids.size(1) - logits_to_keep >= 2 and has_shared_prefix_forward(lm)
                and unsupported_reason(lm) is None):
            return shared_prefix_logps(model, input_ids, attention_mask, logits_to_keep, batch_size,
                                       compute_entropy, autocast=self.accelerator.autocast,
                                       compute_aux_loss=compute_aux_loss)
        return super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
            compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **extra)

    def _tokenize_prompts(self, prompts: list):
        """Text prompts under the one tokenization rule (pivotrl.formats.chat): the template's text is the
        whole prompt, no special tokens added. TRL's own path adds them, which gives a double BOS
        for Llama 3-style templates that write their BOS. Chat-message prompts stay TRL's."""
        if prompts and isinstance(prompts[0], str):
            return [prompt_token_ids(self.processing_class, p) for p in prompts], None, {}
        return super()._tokenize_prompts(prompts)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # After TRL's gather: every process holds the whole generation batch, groups contiguous.
        mode = "train" if self.model.training else "eval"
        rewards = torch.nansum(rewards_per_func * self.reward_weights.to(rewards_per_func.device), dim=1)
        group = self.num_generations if mode == "train" else self.num_generations_eval
        for key, value in group_stats(rewards.cpu(), group).items():
            self._metrics[mode][key].append(value)
        if mode == "train":
            self.rollout_turns += int(rewards_per_func.shape[0])
            self._metrics[mode]["rollout_turns"] = [float(self.rollout_turns)]  # a counter, not averaged
        return rewards_per_func


METRIC_KEYS = {  # metrics.jsonl key ← TRL log key
    "reward_mean": "reward", "reward_std": "reward_std", "frac_zero_std": "frac_zero_std",
    "frac_reward_zero_std": "frac_reward_zero_std", "group_std_mean": "group_std_mean",
    "invalid_rate": "invalid_rate", "rollout_turns": "rollout_turns", "loss": "loss",
    "learning_rate": "learning_rate", "grad_norm": "grad_norm", "step_time": "step_time",
    "completion_length": "completions/mean_length", "entropy": "entropy", "kl": "kl",
    "truncated_rate": "completions/clipped_ratio",  # cut at max_completion_length (a thinking budget too small)
}


class MetricsJSONL(TrainerCallback):
    """Appends one JSON line per log event to `path` on the main process: {step, reward_mean, …}.

    On resume, lines past the checkpoint's step are dropped first (they belong to the lost run), and
    the trainer's rollout-turn counter is restored from the checkpoint's log history."""

    def __init__(self, path: str | Path, keys: dict[str, str] | None = None, trainer=None):
        self.path = Path(path)
        self.keys = keys or METRIC_KEYS
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer is not None and hasattr(self.trainer, "rollout_turns"):
            seen = [e["rollout_turns"] for e in state.log_history if "rollout_turns" in e]
            self.trainer.rollout_turns = int(max(seen)) if seen else 0
        if state.is_world_process_zero and self.path.exists():
            kept = []
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= state.global_step:
                        kept.append(line)
                except ValueError:
                    pass  # a torn last line of a killed run
            self.path.write_text("".join(k + "\n" for k in kept))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        row: dict[str, Any] = {"step": state.global_step}
        for out_key, log_key in self.keys.items():
            value = logs.get(log_key)
            if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
                row[out_key] = value
        if len(row) == 1:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
