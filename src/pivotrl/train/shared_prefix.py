"""Shared-prefix GRPO log-probs: encode each pivot's prompt once per group, not once per completion.

A pivot is a long context and a short action: the G completions of one prompt repeat the same
~400 prompt tokens (thousands in real data) before their ~12-60 action tokens. TRL's log-prob
forward runs all G copies of the prompt through the model, forward and backward. Here the prompt
runs once per group (Prefix Grouper, arXiv 2506.05433), with gradients, and every completion
attends to that single copy of its keys and values:

1. stage 1: the distinct prompts of the micro-batch, minus their last token, go through the
   backbone into a `DynamicCache` (the per-layer keys/values, still attached to the graph);
2. the cache rows are gathered to one row per completion (`index_select`, differentiable), so
   the completions' gradients are summed back into the one prompt encoding;
3. stage 2: each row's last prompt token plus its completion runs against that cache through
   TRL's fused LM head, whose log-prob/entropy kernel then scores the completion tokens exactly as
   TRL's own call does (the last prompt token's output predicts the first completion token).

Identical maths, fewer tokens: causal attention means a prompt's keys/values never depend on the
completion, and the sum over a group of the gradients through G copies equals the gradient through
one copy that all G read. tests/test_shared_prefix.py checks log-probs, entropies and every
parameter's gradient against TRL's path (left-padded mixed-length prompts, right-padded
completions, groups in shuffled order, LoRA).

Positions: TRL's call passes no `position_ids`, so a Llama-style model numbers the columns of the
left-padded [prompt | completion] batch 0..P+C-1 (left padding included). Both stages pass those
same column numbers explicitly (prefix 0..P-2, then P-1..P+C-1), so absolute-position models see
what TRL feeds them too; RoPE models depend only on differences, so padding never shifts a result.

Distributed training: both stages run inside ONE call of the (DDP/DeepSpeed/FSDP-wrapped) model:
`enable_shared_prefix_forward` wraps the model's own `forward` (the fused-LM-head forward TRL
installed), and the prefix tensors travel as keyword arguments of that call. DDP's reducer
therefore sees one forward and one backward per micro-step, exactly as in TRL's path; parameters
used in both stages get one summed gradient before any all-reduce hook fires (2-process test).

Costs and limits: the gathered keys/values hold B x P entries per layer (TRL's path keeps those and
every other activation of the G prompt copies); stage 1 also runs the last layer's MLP on the
prompt, which nothing reads. Gradient checkpointing drops caches inside transformers' layers, so
with it (and for multimodal or non-full-attention models) the trainer keeps TRL's path.

Groups are found, not assumed: TRL shuffles each generation batch before splitting it into
micro-batches, so a micro-batch holds whatever completions it holds; rows with the same prompt
(tokens and mask) share one stage-1 row, and a group split over micro-batches (or devices) is
simply encoded once in each.
"""

from __future__ import annotations

import functools
import types
from contextlib import nullcontext

import torch

_MARK = "_pivotrl_shared_prefix"


def prefix_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows with the same prompt (same tokens at the same mask): (`first`, `inverse`), where
    `first[u]` is a row holding distinct prompt u and `inverse[b]` the distinct prompt of row b.
    The mask is part of the key: a real token equal to the pad id is not padding."""
    key = torch.cat([prompt_ids.masked_fill(prompt_mask == 0, -1), prompt_mask.long()], dim=1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    rows = torch.arange(prompt_ids.size(0), device=prompt_ids.device)
    first = torch.full((int(inverse.max()) + 1,), prompt_ids.size(0), device=prompt_ids.device, dtype=torch.long)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    return first, inverse


def unsupported_reason(model) -> str | None:
    """Why the shared-prefix forward cannot run on `model` (a transformers model, PEFT's base), or None."""
    config = getattr(model, "config", None)
    if config is None or getattr(model, "base_model", model) is model:
        return "not a transformers model with a separate backbone"
    if config.get_text_config() is not config:
        return "multimodal model (images ride along with the prompt)"
    if getattr(model, "is_gradient_checkpointing", False):
        # transformers' checkpointed layers drop `past_key_values`, which stage 2 needs.
        return "gradient checkpointing is on"
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in layer_types):
        return f"layer types {sorted(set(layer_types))} (only full-attention caches are gathered here)"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    return None


def enable_shared_prefix_forward(model) -> bool:
    """Wrap `model.forward` (after TRL added its fused LM head) so that a call with `prefix_ids`,
    `prefix_mask` and `prefix_index` runs the two stages. Returns False (and changes nothing) when
    the model is unsupported; idempotent."""
    if getattr(model, _MARK, False):
        return True
    if unsupported_reason(model) is not None:
        return False
    inner = model.forward

    # The class's signature stays visible: `generate` reads it (e.g. `logits_to_keep`, which keeps
    # the prefill from projecting every prompt position through the LM head).
    @functools.wraps(type(model).forward)
    def forward(self, *args, prefix_ids=None, prefix_mask=None, prefix_index=None, **kwargs):
        if prefix_ids is None:
            return inner(*args, **kwargs)
        return _two_stage_forward(self, inner, prefix_ids, prefix_mask, prefix_index, kwargs)

    model.forward = types.MethodType(forward, model)
    setattr(model, _MARK, True)
    return True


def has_shared_prefix_forward(model) -> bool:
    return bool(getattr(model, _MARK, False))


def _two_stage_forward(model, inner, prefix_ids, prefix_mask, prefix_index, kwargs):
    from transformers import DynamicCache

    n_prefix = prefix_ids.size(1)
    cache = DynamicCache()
    columns = torch.arange(n_prefix, device=prefix_ids.device).unsqueeze(0).expand(prefix_ids.size(0), -1)
    model.base_model(input_ids=prefix_ids, attention_mask=prefix_mask, position_ids=columns,
                     past_key_values=cache, use_cache=True)
    if cache.get_seq_length() != n_prefix:  # a layer dropped the cache: never score without the prompt
        raise RuntimeError(f"shared-prefix forward: the cache holds {cache.get_seq_length()} of "
                           f"{n_prefix} prompt positions; turn shared_prefix_loss off for this model")
    _gather_rows(cache, prefix_index)
    ids = kwargs["input_ids"]
    columns = n_prefix + torch.arange(ids.size(1), device=ids.device)
    kwargs["position_ids"] = columns.unsqueeze(0).expand(ids.size(0), -1)
    kwargs["past_key_values"] = cache
    return inner(**kwargs)


def _gather_rows(cache, index: torch.Tensor) -> None:
    """One cache row per completion. `index_select` backpropagates with a plain index_add (the
    cache's own `batch_select_indices` indexes, whose backward is a slower accumulating index_put)."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
        cache.batch_select_indices(index)
        return
    for layer in layers:
        layer.keys = layer.keys.index_select(0, index)
        layer.values = layer.values.index_select(0, index)


def shared_prefix_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                        batch_size: int | None = None, compute_entropy: bool = False, autocast=None):
    """Per-token log-probs (and entropies) of the last `logits_to_keep` columns of
    `input_ids` = [left-padded prompts | right-padded completions], as TRL's
    `_get_per_token_logps_and_entropies` returns them, computed with each distinct prompt encoded
    once per chunk of `batch_size` rows. `model` is whatever TRL would call (possibly wrapped);
    its underlying transformers model must have `enable_shared_prefix_forward` applied."""
    n_completion = logits_to_keep
    n_prompt = input_ids.size(1) - n_completion
    if n_prompt < 2:
        raise ValueError("shared-prefix log-probs need prompts of at least 2 columns")
    batch_size = batch_size or input_ids.size(0)
    all_logps, all_entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids = input_ids[start:start + batch_size]
        mask = attention_mask[start:start + batch_size]
        first, inverse = prefix_groups(ids[:, :n_prompt - 1], mask[:, :n_prompt - 1])
        # Stage 2 input: the last prompt token (it predicts the first completion token) + completion.
        tail = ids[:, n_prompt - 1:]
        labels = tail.masked_fill(mask[:, n_prompt - 1:] == 0, -100)
        labels[:, 0] = -100
        with autocast() if autocast is not None else nullcontext():
            out = model(input_ids=tail, attention_mask=mask, labels=labels, fused_lm_head=True,
                        prefix_ids=ids[first, :n_prompt - 1], prefix_mask=mask[first, :n_prompt - 1],
                        prefix_index=inverse)
        all_logps.append(out.log_probs[:, -n_completion:])
        if compute_entropy:
            all_entropies.append(out.entropy[:, -n_completion:])
    logps = torch.cat(all_logps, dim=0)
    return logps, (torch.cat(all_entropies, dim=0) if compute_entropy else None)
