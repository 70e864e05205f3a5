"""What a trained model's config.json may say differently from its base's: one list, with why.

TRL and transformers change the model's config for training (MoE router logits on for the
load-balancing loss, the KV cache off, special tokens aligned with the tokenizer), and
`save_pretrained` writes the config as training left it. A checkpoint saved with training
settings behaves differently from its base wherever it is loaded next: an MoE config with
`output_router_logits: true` makes every forward compute the load-balancing loss, generation
included. So the trainers' saves (`train.grpo.save_final` and every checkpoint-N/, for `train`
and `sft`) put the base's value back for the keys marked "base" below; a key marked "trained" keeps what training
wrote; every other key must equal the base's (tests/test_moe_verbs.py diffs them).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
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


@contextmanager
def base_settings(model: Any, base_model: str | Path | None):
    """`model`'s config keys marked "base" (in its text config too) set to `base_model`'s values
    while the block saves it, and training's values back after (a checkpoint is saved mid-run)."""
    if base_model is None:
        yield
        return
    from transformers import AutoConfig

    base = AutoConfig.from_pretrained(str(base_model))
    config = model.config
    saved = []
    pairs = ((config, base), (config.get_text_config(), base.get_text_config()))
    for target, source in {id(t): (t, s) for t, s in pairs}.values():
        for key in RESTORED_KEYS:
            if hasattr(source, key) and hasattr(target, key):
                saved.append((target, key, getattr(target, key)))
                setattr(target, key, getattr(source, key))
    try:
        yield
    finally:
        for target, key, value in saved:
            setattr(target, key, value)


class SavesBaseSettings:
    """A Trainer mixin: every checkpoint-N/ is saved with its base's settings (`base_settings`),
    as the final model is (`train.grpo.save_final`)."""

    def _save(self, output_dir=None, state_dict=None):
        model = self.accelerator.unwrap_model(self.model)
        base = getattr(model.config, "_name_or_path", None) or None
        lora = hasattr(model, "merge_and_unload")  # an adapter checkpoint holds no model config
        with base_settings(model, None if lora else base):
            return super()._save(output_dir, state_dict)


def config_differences(base_dir: str | Path, saved_dir: str | Path) -> dict[str, tuple[Any, Any]]:
    """{key: (base value, saved value)} for every key of config.json that differs."""
    base = json.loads((Path(base_dir) / "config.json").read_text())
    saved = json.loads((Path(saved_dir) / "config.json").read_text())
    return {k: (base.get(k), saved.get(k)) for k in sorted(set(base) | set(saved)) if base.get(k) != saved.get(k)}
