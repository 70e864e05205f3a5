"""Shared-prefix GRPO log-probs: encode each pivot's prompt once per group, not once per completion.

A pivot is a long context and a short action: the G completions of one prompt repeat the same
~400 prompt tokens (thousands in real data) before their ~12-60 action tokens. TRL's log-prob
forward runs all G copies of the prompt through the model, forward and backward. Here the prompt
runs once per group (Prefix Grouper, arXiv 2506.05433), with gradients, and every completion
attends to that single copy of its keys and values:

1. stage 1: the distinct prompts of the micro-batch, minus their last token, go through the
   backbone into a cache (per-layer keys/values or recurrent states, still attached to the graph);
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

Distributed training: both stages run inside ONE call of the (DDP- or ZeRO-1/2-wrapped) model:
`enable_shared_prefix_forward` wraps the model's own `forward` (the fused-LM-head forward TRL
installed), and the prefix tensors travel as keyword arguments of that call. DDP's reducer
therefore sees one forward and one backward per micro-step, exactly as in TRL's path; parameters
used in both stages get one summed gradient before any all-reduce hook fires (2-process test).
Sharded parameters (FSDP, ZeRO-3) keep TRL's path (`sharding_reason`).

Architectures: stage 1 fills a cache with one layer of the model's own kind per layer
(`DynamicCache(config=...)`): keys/values for attention, the window for sliding-window attention,
conv and recurrent states for linear attention (Qwen3.5), Mamba-2 (Nemotron-H, Granite
4) and short convolutions (LFM2). The state after the prompt is what every completion starts from:
the gather copies it per completion (`reorder_cache`, differentiable), and stage 2 continues from
it as a chunked forward (the models' own cache-continuation path). MoE layers route each token by
its own hidden state, so routing is unchanged. Per-architecture equality tests (log-probs,
entropies, every gradient; MoE routing; recurrent state = the prompt's alone):
tests/test_shared_prefix.py. `unsupported_reason` names what remains (multimodal models, layer
kinds not listed in SUPPORTED_LAYER_TYPES) and the trainer logs it once, at start.

Gradient checkpointing: transformers' checkpointed layers drop `past_key_values`, so with it on each
stage is checkpointed whole instead (`torch.utils.checkpoint`, non-reentrant), per-layer
checkpointing off inside: backward recomputes stage 2 from the distinct prompts' cache (the
gathered per-completion copy is not kept) and stage 1 from the prompt ids. Peak memory is then one
stage's activations (stage 1: the distinct prompts, 1/G of the prompt rows TRL runs), not one
layer's as with per-layer checkpointing: at long prompts x many distinct prompts per micro-batch
that can be more than TRL's checkpointed path holds.

Costs: the gathered keys/values hold B x P entries per layer (TRL's path keeps those and every
other activation of the G prompt copies); stage 1 also runs the last layer's MLP on the prompt,
which nothing reads.

Groups are found, not assumed: TRL shuffles each generation batch before splitting it into
micro-batches, so a micro-batch holds whatever completions it holds; rows with the same prompt
(tokens and mask) share one stage-1 row, and a group split over micro-batches (or devices) is
simply encoded once in each.
"""

from __future__ import annotations

import copy
import functools
import logging
import types
from contextlib import contextmanager, nullcontext

import torch

logger = logging.getLogger(__name__)
_MARK = "_pivotrl_shared_prefix"
# Layer kinds whose cache, filled by the prompt, is exactly what the completion's forward continues
# from: full attention (keys/values), sliding-window attention (the window's keys/values and the
# token count), linear attention / Mamba (conv and recurrent states), short convolutions (LFM2's
# "conv": conv states); "moe" and "mlp" layers hold none. tests/test_shared_prefix.py checks each.
SUPPORTED_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "linear_attention", "conv",
                                   "moe", "mlp", "attention", "mamba"})


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
    other = sorted({str(t) for t in getattr(config, "layer_types", None) or ()} - SUPPORTED_LAYER_TYPES)
    if other:
        return (f"layer types {other}: their cache cannot carry a prompt's state into the "
                f"completion's forward (supported: {sorted(SUPPORTED_LAYER_TYPES)})")
    return None


def sharding_reason(trainer) -> str | None:
    """Why a trainer whose parameters are sharded over processes must keep TRL's loss path, or None.
    The two stages call every layer twice in one forward; FSDP2 frees a layer's gathered weights
    after the completion stage's backward through it, and the prompt stage's gradient reaches the
    same weights later, through the cache ("setStorage: ... storage of size 0",
    tests/test_train_distributed.py). ZeRO-3 gathers and releases each module's weights by the
    same kind of hooks; it cannot run here (no DeepSpeed on a CPU), so it keeps TRL's path too."""
    if getattr(trainer, "is_fsdp_enabled", False):
        return "FSDP (a layer's weights are freed before the prompt stage's gradient reaches them)"
    plugin = getattr(getattr(getattr(trainer, "accelerator", None), "state", None), "deepspeed_plugin", None)
    if getattr(trainer, "is_deepspeed_enabled", False) and getattr(plugin, "zero_stage", 0) == 3:
        return "DeepSpeed ZeRO-3 (its weights are gathered per module call, as FSDP's)"
    return None


def shared_prefix_status(model, wanted: bool = True) -> tuple[bool, str]:
    """Whether the shared-prefix loss applies to `model` and one line saying so (why not, when
    not), for the trainer to log once at start. `wanted`: the run config's switch."""
    if not wanted:
        return False, "shared-prefix loss off (shared_prefix_loss: false): TRL's repeated-prompt path"
    reason = unsupported_reason(model)
    if reason is not None:
        return False, f"shared-prefix loss falls back to TRL's repeated-prompt path: {reason}"
    how = ("prompt stage and completion stage each checkpointed as a whole"
           if _checkpointing(model) else "no gradient checkpointing")
    return True, f"shared-prefix loss on (each prompt encoded once per group; {how})"


def enable_shared_prefix_forward(model) -> bool:
    """Wrap `model.forward` (after TRL added its fused LM head) so that a call with `prefix_ids`,
    `prefix_mask` and `prefix_index` runs the two stages. Returns False (and changes nothing) when
    the model is unsupported, logging why (the trainer calls this once, at start); idempotent."""
    if getattr(model, _MARK, False):
        return True
    on, line = shared_prefix_status(model)
    if not on:
        logger.warning(line)
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
    """Stage 1 fills a cache with the distinct prompts; stage 2 gathers it to one row per
    completion and runs the completions against it. With gradient checkpointing on, each stage is
    checkpointed as a whole (transformers' own per-layer checkpointing would drop the cache): its
    activations are recomputed in backward, stage 1's cache included; stage 2 keeps only its
    inputs (the distinct prompts' cache, not the gathered copy)."""
    n_prefix = prefix_ids.size(1)
    aux = bool(kwargs.pop("output_router_logits", False))
    routed = {}  # stage -> per-layer router logits (MoE load-balancing loss), read in forward only

    # Both stages run with transformers' per-layer checkpointing off, the backward's recomputation
    # of a checkpointed stage included (the flag is read when a layer is called).
    def stage1():
        cache = _new_cache(model)
        columns = torch.arange(n_prefix, device=prefix_ids.device).unsqueeze(0).expand(prefix_ids.size(0), -1)
        with _layer_checkpointing_off(model):
            out = model.base_model(input_ids=prefix_ids, attention_mask=prefix_mask, position_ids=columns,
                                   past_key_values=cache, use_cache=True, **({"output_router_logits": True} if aux else {}))
        routed.setdefault(1, getattr(out, "router_logits", None))
        return cache

    def stage2(cache):
        cache = _gathered(cache, prefix_index)
        ids = kwargs["input_ids"]
        columns = n_prefix + torch.arange(ids.size(1), device=ids.device)
        # output_router_logits=False: TRL's fused head would otherwise (config `output_router_logits:
        # true`, as MoE checkpoints ship) compute its own aux loss from the completion stage's router
        # logits against the whole [prompt | completion] mask; the loss is computed below, from both stages.
        with _layer_checkpointing_off(model), _recording_router_logits(model, routed, 2, aux):
            return inner(**{**kwargs, "position_ids": columns.unsqueeze(0).expand(ids.size(0), -1),
                            "past_key_values": cache, "output_router_logits": False})

    if not (_checkpointing(model) and torch.is_grad_enabled()):
        cache = stage1()
        _check_filled(cache, n_prefix)
        out = stage2(cache)
    else:
        from torch.utils.checkpoint import checkpoint

        cache = checkpoint(stage1, use_reentrant=False)
        _check_filled(cache, n_prefix)
        out = checkpoint(stage2, cache, use_reentrant=False)
    if aux:
        out.aux_loss = _load_balancing_loss(model, routed, prefix_mask, prefix_index,
                                            kwargs["attention_mask"][:, n_prefix:])
    return out


@contextmanager
def _recording_router_logits(model, sink: dict, key, on: bool):
    """Keep the backbone's router logits of the next call in `sink[key]` (TRL's fused forward
    scores the completions and drops them)."""
    if not on:
        yield
        return
    backbone = model.base_model
    plain = backbone.forward

    def forward(*args, **kwargs):
        out = plain(*args, **{**kwargs, "output_router_logits": True})
        sink.setdefault(key, getattr(out, "router_logits", None))
        return out

    backbone.forward = forward
    try:
        yield
    finally:
        del backbone.forward  # the class's forward again


def _load_balancing_loss(model, routed: dict, prefix_mask, prefix_index, tail_mask):
    """The MoE load-balancing loss TRL's path computes over every [prompt | completion] token of
    the micro-batch, from the two stages' router logits: a distinct prompt's token stands for the
    rows sharing it (weight = their number), each stage-2 token for itself. Same sums, same loss."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    first, second = routed.get(1), routed.get(2)
    if not first or not second:
        raise RuntimeError("shared-prefix forward: the model returned no router logits for the "
                           "load-balancing loss; turn shared_prefix_loss off for this model")
    copies = torch.bincount(prefix_index, minlength=prefix_mask.size(0)).to(prefix_mask.dtype)
    weights = torch.cat([(prefix_mask * copies[:, None]).reshape(-1), tail_mask.reshape(-1)])
    layers = tuple(torch.cat([a, b], dim=0) for a, b in zip(first, second))
    text = model.config.get_text_config()
    return load_balancing_loss_func(layers, layers[0].size(-1), text.num_experts_per_tok, weights[None])


def _new_cache(model):
    """An empty cache with one layer of the right kind per model layer (a plain `DynamicCache()`
    makes every layer a key/value layer, which linear-attention and Mamba layers cannot write)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _check_filled(cache, n_prefix: int) -> None:
    """Never score without the prompt: a layer that dropped the cache would do so silently."""
    has_attention = any(hasattr(layer, "keys") for layer in cache.layers)
    if has_attention and cache.get_seq_length() != n_prefix:
        raise RuntimeError(f"shared-prefix forward: the cache holds {cache.get_seq_length()} of "
                           f"{n_prefix} prompt positions; turn shared_prefix_loss off for this model")


def _checkpointing(model) -> bool:
    return bool(getattr(model, "is_gradient_checkpointing", False)) and model.training


@contextmanager
def _layer_checkpointing_off(model):
    """transformers' per-layer checkpointing off for the call (the stages are checkpointed whole)."""
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    for m in layers:
        m.gradient_checkpointing = False
    try:
        yield
    finally:
        for m in layers:
            m.gradient_checkpointing = True


def _gathered(cache, index: torch.Tensor):
    """A new cache with row `index[b]` of `cache` as row b, for every layer kind (`reorder_cache`,
    the beam-search contract, backpropagates as index_select). `cache` itself is left as it was, so
    a checkpointed stage 2 recomputes from the same input. The copy's recurrent-state writes
    rebind rather than copy in place: the gathered state is saved by the scan that reads it."""
    out = copy.copy(cache)
    out.layers = []
    for layer in cache.layers:
        layer = copy.copy(layer)
        for name, value in vars(layer).items():
            if isinstance(value, dict):
                setattr(layer, name, dict(value))
        layer.reorder_cache(index)
        if hasattr(layer, "recurrent_states"):
            layer.update_recurrent_state = types.MethodType(_rebind_recurrent_state, layer)
        out.layers.append(layer)
    return out


def _rebind_recurrent_state(layer, recurrent_states, state_idx: int = 0, **kwargs):
    layer.recurrent_states[state_idx] = recurrent_states
    layer.is_recurrent_states_initialized[state_idx] = True
    return recurrent_states


def shared_prefix_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                        batch_size: int | None = None, compute_entropy: bool = False, autocast=None,
                        compute_aux_loss: bool = False):
    """(per-token log-probs, entropies or None, MoE load-balancing loss or None) of the last
    `logits_to_keep` columns of `input_ids` = [left-padded prompts | right-padded completions], as
    TRL's `_get_per_token_logps_and_entropies` returns them, computed with each distinct prompt
    encoded once per chunk of `batch_size` rows. `model` is whatever TRL would call (possibly
    wrapped); its underlying transformers model must have `enable_shared_prefix_forward` applied."""
    n_completion = logits_to_keep
    n_prompt = input_ids.size(1) - n_completion
    if n_prompt < 2:
        raise ValueError("shared-prefix log-probs need prompts of at least 2 columns")
    batch_size = batch_size or input_ids.size(0)
    all_logps, all_entropies, all_aux = [], [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids = input_ids[start:start + batch_size]
        mask = attention_mask[start:start + batch_size]
        first, inverse = prefix_groups(ids[:, :n_prompt - 1], mask[:, :n_prompt - 1])
        # Stage 2 input: the last prompt token (it predicts the first completion token) + completion.
        tail = ids[:, n_prompt - 1:]
        labels = tail.masked_fill(mask[:, n_prompt - 1:] == 0, -100)
        labels[:, 0] = -100
        extra = {"output_router_logits": True} if compute_aux_loss else {}
        with autocast() if autocast is not None else nullcontext():
            out = model(input_ids=tail, attention_mask=mask, labels=labels, fused_lm_head=True,
                        prefix_ids=ids[first, :n_prompt - 1], prefix_mask=mask[first, :n_prompt - 1],
                        prefix_index=inverse, **extra)
        all_logps.append(out.log_probs[:, -n_completion:])
        if compute_entropy:
            all_entropies.append(out.entropy[:, -n_completion:])
        if compute_aux_loss:
            all_aux.append(out.aux_loss)
    logps = torch.cat(all_logps, dim=0)
    return (logps, torch.cat(all_entropies, dim=0) if compute_entropy else None,
            torch.stack(all_aux).mean() if compute_aux_loss else None)


def shared_prefix_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                         batch_size: int | None = None) -> int:
    """The non-padding tokens `shared_prefix_logps` runs through the model for the same call: per
    chunk of `batch_size` rows, each distinct prompt (less its last token) once in stage 1, and
    each row's last prompt token plus its completion in stage 2."""
    n_prompt = input_ids.size(1) - logits_to_keep
    batch_size = batch_size or input_ids.size(0)
    total = 0
    for start in range(0, input_ids.size(0), batch_size):
        ids = input_ids[start:start + batch_size]
        mask = attention_mask[start:start + batch_size]
        first, _ = prefix_groups(ids[:, :n_prompt - 1], mask[:, :n_prompt - 1])
        total += int(mask[first, :n_prompt - 1].sum()) + int(mask[:, n_prompt - 1:].sum())
    return total


# ---------------------------------------------------------------- rollouts


def rollout_fallback_reason(trainer) -> str | None:
    """Why a GRPO trainer's rollouts must stay TRL's own generation, or None when
    `shared_prefill_rollouts` can draw them: the same distribution (softmax(logits / T) within the
    top-p nucleus), with the G completions of a prompt decoding against one prefill of it."""
    args = trainer.args
    if args.use_vllm:
        return "vLLM generation"
    if getattr(args, "use_transformers_continuous_batching", False) or getattr(args, "use_transformers_paged", False):
        return "transformers continuous batching"
    if getattr(trainer, "_is_vlm", False):
        return "multimodal model"
    if getattr(trainer, "is_fsdp_enabled", False):
        return "FSDP (TRL gathers the parameters for its own generation)"
    if (getattr(trainer, "top_k", 0) or 0) > 0 or getattr(trainer, "min_p", None) is not None \
            or getattr(trainer, "repetition_penalty", 1.0) != 1.0 or args.generation_kwargs:
        return "sampling options beyond temperature and top-p (top_k, min_p, repetition_penalty, generation_kwargs)"
    if not trainer.temperature > 0:
        return "temperature 0"
    return None


def shared_prefill_rollouts(trainer, prompt_ids: list[list[int]]) -> list[list[int]]:
    """TRL's `_generate_single_turn` rollouts (completion ids, the end token kept) drawn with
    pivotrl's generation loop: each distinct prompt of the generation batch (TRL repeats a prompt
    G times) is prefilled once, its samples share its keys and copy its recurrent state
    (sampling/generate.py). Row seeds come from torch's global generator, which the trainer seeds,
    so a run is reproducible; a sample is then a function of its prompt and seed."""
    from trl.models import unwrap_model_for_generation

    from pivotrl.sampling.generate import generate_each

    seeds = torch.randint(0, 2**62, (len(prompt_ids),)).tolist()
    with unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator,
            gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs) as model, torch.no_grad():
        gens = generate_each(model, [list(p) for p in prompt_ids], seeds,
                             max_new_tokens=trainer.max_completion_length, stop_token_ids=trainer.eos_token_ids,
                             temperature=trainer.temperature, top_p=trainer.top_p,
                             batch_size=max(1, len(prompt_ids)))
    return [g.tokens for g in gens]
