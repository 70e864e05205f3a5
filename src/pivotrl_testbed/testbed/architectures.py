"""Tiny random models of the architectures people fine-tune for tool use, from transformers' own
config classes (nothing downloaded; each builds in well under a second on a CPU).

The architecture matrix (tests/test_architectures.py), `bench/bench_grpo_step.py --arch` and the GPU
kit build them here, so each names the same shapes. Each model mixes its layer kinds (a hybrid has
at least one recurrent and one attention layer) so that every cache type a generate or training
path meets is exercised.

| name        | transformers class        | layers                                         |
|-------------|---------------------------|------------------------------------------------|
| qwen3       | Qwen3ForCausalLM          | full attention (dense)                         |
| qwen3_moe   | Qwen3MoeForCausalLM       | full attention, mixture-of-experts MLPs        |
| qwen3_5     | Qwen3_5ForCausalLM        | Gated DeltaNet linear attention + attention    |
| nemotron_h  | NemotronHForCausalLM      | Mamba-2 + attention + MoE (Nemotron 3's mix)   |
| gemma3      | Gemma3ForCausalLM         | sliding-window + full attention                |
| granite4    | GraniteMoeHybridForCausalLM | Mamba-2 + attention, MoE                     |
| lfm2        | Lfm2ForCausalLM           | short gated convolutions + attention           |
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

def _shape(width: int) -> dict[str, Any]:
    """Attention shape shared by every architecture: 4 query heads over 2 key/value heads."""
    return dict(hidden_size=width, num_attention_heads=4, num_key_value_heads=2, head_dim=width // 4,
                max_position_embeddings=4096)


def _qwen3(vocab: int, width: int):
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=vocab, intermediate_size=2 * width, num_hidden_layers=2, **_shape(width))


def _qwen3_moe(vocab: int, width: int):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(vocab_size=vocab, intermediate_size=2 * width, moe_intermediate_size=width // 2,
                          num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                          decoder_sparse_step=1, **_shape(width))


def _qwen3_5(vocab: int, width: int):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(vocab_size=vocab, intermediate_size=2 * width, num_hidden_layers=2,
                             layer_types=["linear_attention", "full_attention"],
                             linear_key_head_dim=width // 4, linear_value_head_dim=width // 4,
                             linear_num_key_heads=2, linear_num_value_heads=4, linear_conv_kernel_dim=4,
                             **_shape(width))


def _nemotron_h(vocab: int, width: int):
    from transformers import NemotronHConfig

    return NemotronHConfig(vocab_size=vocab, layers_block_type=["mamba", "attention", "moe"],
                           intermediate_size=2 * width, ssm_state_size=width // 4, mamba_num_heads=4,
                           mamba_head_dim=width // 2, n_groups=2, conv_kernel=4, chunk_size=16,
                           n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=width // 2,
                           moe_shared_expert_intermediate_size=width // 2, num_experts_per_tok=2,
                           use_mamba_kernels=False, pad_token_id=0, bos_token_id=None,
                           eos_token_id=None, **_shape(width))


def _gemma3(vocab: int, width: int):
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(vocab_size=vocab, intermediate_size=2 * width, num_hidden_layers=2,
                            sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                            pad_token_id=0, bos_token_id=None, eos_token_id=None, **_shape(width))


def _granite4(vocab: int, width: int):
    from transformers import GraniteMoeHybridConfig

    shape = _shape(width)
    shape.pop("head_dim")  # derived from hidden_size / heads
    return GraniteMoeHybridConfig(vocab_size=vocab, intermediate_size=2 * width, num_hidden_layers=2,
                                  layer_types=["mamba", "attention"], num_local_experts=4,
                                  num_experts_per_tok=2, shared_intermediate_size=width,
                                  mamba_n_heads=4, mamba_d_state=width // 4, mamba_d_head=width // 2,
                                  mamba_chunk_size=16, pad_token_id=0, bos_token_id=None,
                                  eos_token_id=None, **shape)


def _lfm2(vocab: int, width: int):
    from transformers import Lfm2Config

    shape = _shape(width)
    shape.pop("head_dim")
    return Lfm2Config(vocab_size=vocab, intermediate_size=2 * width, num_hidden_layers=2,
                      layer_types=["conv", "full_attention"], block_auto_adjust_ff_dim=False,
                      pad_token_id=0, bos_token_id=None, eos_token_id=None, **shape)


ARCHITECTURES = {"qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "qwen3_5": _qwen3_5,
                 "nemotron_h": _nemotron_h, "gemma3": _gemma3, "granite4": _granite4, "lfm2": _lfm2}


def tiny_config(name: str, vocab_size: int, width: int = 32, **overrides: Any):
    """The config of tiny model `name` (one of ARCHITECTURES) with `vocab_size` tokens and hidden
    size `width` (a multiple of 8; 32 in the suite, 128 = the testbed base's width in the bench);
    `overrides` set config attributes that nothing else is derived from (e.g. initializer_range)."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; known: {sorted(ARCHITECTURES)}")
    config = ARCHITECTURES[name](vocab_size, width)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def build_tiny(name: str, vocab_size: int, seed: int = 0, width: int = 32, **overrides: Any):
    """A random tiny causal LM of architecture `name` (float32, eval mode), seeded."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(name, vocab_size, width, **overrides),
                                             dtype=torch.float32)
    return model.eval()


def save_tiny_arch(name: str, tokenizer: Any, path: str | Path, seed: int = 0, width: int = 32) -> Path:
    """`build_tiny(name)` sized to `tokenizer`, saved with it (a checkpoint dir every CLI reads)."""
    path = Path(path)
    model = build_tiny(name, len(tokenizer), seed, width)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
