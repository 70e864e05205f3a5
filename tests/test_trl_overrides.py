"""`trl_overrides` are applied last: each field pivotrl derives for TRL's GRPOConfig and SFTConfig
can be overridden (one test per field, the list read from the code that derives them), and a key
TRL does not have is an error naming it."""

from __future__ import annotations

import enum

import pytest

from pivotrl.train.config import GRPORunConfig, SFTRunConfig
from pivotrl.train.grpo import grpo_config, grpo_kwargs
from pivotrl.train.sft import sft_config, sft_kwargs

STEPS = 10
# The base run uses vLLM with a prompt cap, so that every field grpo_kwargs can derive is derived.
GRPO_BASE = dict(model="m", output_dir="/tmp/pivotrl-overrides", pivots="p", max_completion_length=64,
                 max_prompt_length=100, use_vllm=True)
SFT_BASE = dict(model="m", output_dir="/tmp/pivotrl-overrides", data="d")

# A value other than the derived one for every field pivotrl derives (TRL must accept it on CPU).
COMMON = {"output_dir": "/tmp/pivotrl-overrides-elsewhere", "learning_rate": 3e-4,
          "lr_scheduler_type": "linear", "warmup_steps": 3, "weight_decay": 0.1, "max_grad_norm": 0.5,
          "per_device_train_batch_size": 32, "gradient_accumulation_steps": 2, "max_steps": 7,
          "save_strategy": "no", "save_steps": 5, "save_total_limit": 2, "logging_steps": 3,
          "report_to": ["tensorboard"], "seed": 5, "bf16": True, "gradient_checkpointing": True,
          "use_cpu": False, "disable_tqdm": False, "ignore_data_skip": False}
GRPO_VALUES = {**COMMON, "num_generations": 8, "max_completion_length": 32, "temperature": 0.7,
               "top_p": 0.9, "epsilon": 0.1, "epsilon_high": 0.3, "beta": 0.04, "loss_type": "grpo",
               "scale_rewards": "batch", "num_iterations": 2, "use_vllm": False, "vllm_mode": "server",
               "vllm_gpu_memory_utilization": 0.5, "log_completions": True, "vllm_max_model_length": 512}
SFT_VALUES = {**COMMON, "max_length": 256, "packing": True, "assistant_only_loss": True,
              "completion_only_loss": True}


def plain(value):
    return value.value if isinstance(value, enum.Enum) else value


def derived_grpo() -> list[str]:
    return sorted(grpo_kwargs(GRPORunConfig(**GRPO_BASE), STEPS))


def derived_sft() -> list[str]:
    return sorted(sft_kwargs(SFTRunConfig(**SFT_BASE), STEPS))


def test_every_derived_field_has_an_override_test():
    assert set(derived_grpo()) == set(GRPO_VALUES)
    assert set(derived_sft()) == set(SFT_VALUES)


@pytest.mark.parametrize("field", derived_grpo())
def test_trl_overrides_win_over_each_derived_grpo_field(field):
    value = GRPO_VALUES[field]
    cfg = GRPORunConfig(**GRPO_BASE, trl_overrides={field: value})
    assert grpo_kwargs(cfg, STEPS)[field] != value  # the override changes what pivotrl derives
    assert plain(getattr(grpo_config(cfg, STEPS), field)) == value


@pytest.mark.parametrize("field", derived_sft())
def test_trl_overrides_win_over_each_derived_sft_field(field):
    value = SFT_VALUES[field]
    cfg = SFTRunConfig(**SFT_BASE, trl_overrides={field: value})
    assert sft_kwargs(cfg, STEPS)[field] != value
    assert plain(getattr(sft_config(cfg, STEPS), field)) == value


def test_an_unknown_override_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"'betta' is not a field of TRL's GRPOConfig"):
        grpo_config(GRPORunConfig(**GRPO_BASE, trl_overrides={"betta": 0.1, "beta": 0.1}), STEPS)
    with pytest.raises(ValueError, match=r"'pakking', 'seeed' are not fields of TRL's SFTConfig"):
        sft_config(SFTRunConfig(**SFT_BASE, trl_overrides={"seeed": 1, "pakking": True}), STEPS)
