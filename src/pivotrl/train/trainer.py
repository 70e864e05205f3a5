"""TRL's GRPOTrainer plus what PivotRL needs: the per-group reward statistics it logs (the GRPO
signal at a state scales with the reward's std there), rollout turns counted, and a faster log-prob
forward with the same numbers: a completion-only LM head on CPU, and each distinct prompt encoded
once per group instead of once per completion (train/shared_prefix.py)."""

from __future__ import annotations

import logging

import torch
from trl import GRPOTrainer

from pivotrl.formats.chat import prompt_token_ids
from pivotrl.sampling.generate import router_logits_off
from pivotrl.train.resume import Resumable
from pivotrl.train.reward import group_stats
from pivotrl.train.saved_config import SavesBaseSettings
from pivotrl.train.shared_prefix import (enable_shared_prefix_forward, has_shared_prefix_forward,
                                         rollout_fallback_reason, shared_prefill_rollouts,
                                         shared_prefix_logps, shared_prefix_tokens, sharding_reason,
                                         unsupported_reason)
from pivotrl.train.tokens import TOKEN_COUNTERS, CountsTokens

logger = logging.getLogger(__name__)


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


class PivotGRPOTrainer(Resumable, SavesBaseSettings, CountsTokens, GRPOTrainer):
    """GRPOTrainer plus the metrics PivotRL reports: per-group reward std, fraction of zero-std
    groups, rollout turns spent (one completion = one model turn), counted over all processes,
    and the tokens trained on and generated (train/tokens.py)."""

    rollout_turns: int = 0
    counted = TOKEN_COUNTERS

    def __init__(self, *args, shared_prefix: bool = True, shared_rollouts: bool = False, **kwargs):
        score_only_completions_on_cpu()
        super().__init__(*args, **kwargs)
        # Rollouts through pivotrl's generation loop (one prefill per prompt for its G samples).
        self.shared_rollouts = shared_rollouts and rollout_fallback_reason(self) is None
        # After TRL added its fused LM head to the same (PEFT base) model, and before any wrapping.
        sharded = sharding_reason(self)
        if shared_prefix and sharded:
            logger.warning("shared-prefix loss falls back to TRL's repeated-prompt path: %s", sharded)
        self.shared_prefix = shared_prefix and not sharded and enable_shared_prefix_forward(self._causal_lm(self.model))
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
        trained = model.training and torch.is_grad_enabled()  # the loss forward: a backward follows
        if (self.shared_prefix and all(v is None for v in extra.values())
                and input_ids.size(1) - logits_to_keep >= 2 and has_shared_prefix_forward(lm)
                and unsupported_reason(lm) is None):
            if trained:
                self.count_tokens("train_tokens", shared_prefix_tokens(input_ids, attention_mask,
                                                                       logits_to_keep, batch_size))
            return shared_prefix_logps(model, input_ids, attention_mask, logits_to_keep, batch_size,
                                       compute_entropy, autocast=self.accelerator.autocast,
                                       compute_aux_loss=compute_aux_loss)
        if trained:
            self.count_tokens("train_tokens", int(attention_mask.sum()))
        return super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
            compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **extra)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self.shared_rollouts and images is None and not multimodal_fields and not has_tool_images:
            return shared_prefill_rollouts(self, prompt_ids), None
        # TRL's generate reads `output_router_logits` from the config, and an MoE checkpoint that
        # has it on cannot compute the load-balancing loss over a padded, cached batch: off while
        # sampling (the loss forward asks for the router logits itself).
        with router_logits_off(self._causal_lm(self.model)):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)

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
            self.count_tokens("rollout_tokens", sum(len(ids) for ids in completion_ids_list))
            self.rollout_turns += int(rewards_per_func.shape[0])
            self._metrics[mode]["rollout_turns"] = [float(self.rollout_turns)]  # a counter, not averaged
        return rewards_per_func
