"""What a trained model's config.json may say differently from its base's: one list, with why.

TRL and transformers change the model's config for training (MoE router logits on for the
load-balancing loss, the KV cache off, special tokens aligned with the tokenizer), and
`save_pretrained` writes the config as training left it. A checkpoint saved with training
settings behaves differently from its base wherever it is loaded next: an MoE config with
`output_router_logits: true` makes every forward compute the load-balancing loss, generation
included. So the trainers' final save (`train.grpo.save_final`, for `train` and `sft`) puts the
base's value back for the keys marked "base" below; a key marked "trained" keeps what training
wrote; every other key must equal the base's (tests/test_moe_verbs.py diffs them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# key -> ("base": the base's value is saved | "trained": training's value is saved, why)
SAVED_CONFIG_KEYS: dict[str, tuple[str, str]] = {
    "output_router_logits": ("base", "TRL's SFTTrainer turns it on for the MoE load-balancing loss; "
                             "GRPO asks for router logits per call, so the setting is a training one"),
    "router_aux_loss_coef": ("base", "TRL's SFTTrainer copies its own coefficient (trl_overrides) into "
                             "the config for the loss it adds"),
    "use_cache": ("base", "the trainers turn the KV cache off for training forwards; the saved model "
                  "generates with its base's setting"),
    "eos_token_id": ("trained", "TRL aligns the model's end token with the tokenizer it trained with, "
                     "which is saved beside it"),
    "pad_token_id": ("trained", "TRL aligns the model's pad token with the tokenizer, likewise"),
    "bos_token_id": ("trained", "aligned with the tokenizer, likewise"),
    "dtype": ("trained", "the weights are saved in the precision they were trained in (precision: bf16)"),
    "transformers_version": ("trained", "the transformers version that wrote the file"),
}
RESTORED_KEYS = tuple(k for k, (rule, _) in SAVED_CONFIG_KEYS.items() if rule == "base")


def restore_base_settings(model: Any, base_model: str | Path | None) -> None:
    """Set `model`'s config keys marked "base" (in its text config too) back to `base_model`'s
    values before it is saved."""
    if base_model is None:
        return
    from transformers import AutoConfig

    base = AutoConfig.from_pretrained(str(base_model))
    config = model.config
    for target, source in ((config, base), (config.get_text_config(), base.get_text_config())):
        for key in RESTORED_KEYS:
            if hasattr(source, key) and hasattr(target, key):
                setattr(target, key, getattr(source, key))


def config_differences(base_dir: str | Path, saved_dir: str | Path) -> dict[str, tuple[Any, Any]]:
    """{key: (base value, saved value)} for every key of config.json that differs."""
    base = json.loads((Path(base_dir) / "config.json").read_text())
    saved = json.loads((Path(saved_dir) / "config.json").read_text())
    return {k: (base.get(k), saved.get(k)) for k in sorted(set(base) | set(saved)) if base.get(k) != saved.get(k)}
