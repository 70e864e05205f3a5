"""One generation loop for every hand-written sampler: prefill, decode, seeds, stop rule.

`generate(model, prompts, seeds, ...)` samples `len(seeds[i])` completions of token prompt i with
a transformers causal LM. Profiling (`sampling.hf`), the episode runner's model policy and the
end-to-end RL baseline all call it, so they share one padding, seeding and stopping rule:

- Padding. Prompts of a batch are left padded; position ids count real tokens only.
- Shared prefix. The n samples of a prompt share one prefill of that prompt (the prompt is
  ~400 tokens on the testbed, a completion 12-60). A prompt's per-layer state that has no
  sequence axis (the recurrent and convolution states of linear-attention, Mamba and short-conv
  layers: Qwen3.5, Nemotron-H, Granite 4, LFM2, ...) is copied to its n samples;
  it is small and each sample then updates its own copy. Its attention keys/values are not
  copied when the model's attention layers are plain scaled dot-product (`PREFIX_ATTENTION_MODELS`,
  no sliding window): an attention function splits every query's softmax over (the prompt's
  cached keys, shared by its group) and (the sample's own generated keys), which is the same
  softmax over their concatenation. Other models (sliding windows, soft-capping, ...) get every
  layer's cache copied n times (`Cache.reorder_cache`, the beam-search contract every cache layer
  type implements) and their own attention. `share_prefix=False` prefills every sample
  separately (the per-sample path; tests compare, per architecture: tests/test_architectures.py).
- Seeds. Row (prompt i, sample j) draws its uniforms from its own `torch.Generator` seeded with
  `seeds[i][j]`, and the token is the inverse CDF of the (temperature, top-p) distribution at that
  uniform. So a sample is a function of (model, prompt, its seed) alone, whichever other prompts
  share its batch, up to floating-point differences of the batched forward (~1e-7, which can flip
  a draw only when it lands that close to a token boundary). Temperature 0 is greedy.
- Router logits off. A mixture-of-experts config may ask every forward for its router logits
  (`output_router_logits: true`, as MoE checkpoints ship and TRL's trainers save): the model then
  computes its load-balancing loss against the attention mask, which during cached decoding covers
  the cache, not the step's tokens (a size mismatch). Generation needs no loss, so every forward
  here runs with them off (`router_logits_off`); training asks for them per call, as TRL does.
- Stop rule. A row stops at its first stop token (kept in `tokens`: training needs it) or after
  `max_new_tokens`. With `window`, a prompt that does not leave room for `max_new_tokens` inside
  it is not generated at all (`finish_reason="overlong"`, no tokens) rather than run past the
  positions the model was trained on.

Observing the loop. `on_step`, when given, is called after every decoding step with a `Step`: the
token each row drew and the logits it was drawn from. `pivotrl serve` streams and reports logprobs
through it, so the tokens it sees are the ones this loop samples (there is no second loop).

`completion_logps` (and `span_logps`, for several turns in one sequence) is the one "LM head on
completion positions only" log-prob helper for code outside training.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from pivotrl.io.seeds import derive_seed

# Families whose attention layers are q/k/v projections (+ RoPE, q/k norms or output gates outside
# the attention function) + plain scaled dot-product softmax over all cached keys (no sliding
# window, soft-capping, ALiBi or attention sinks): for them the split softmax below is exactly
# their attention. Their other layers (MoE MLPs, linear attention, Mamba, short convolutions) do
# not attend, so they run as they are. Anything else takes the copied-cache path.
PREFIX_ATTENTION_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_5_text",
                                     "nemotron_h", "granitemoehybrid", "lfm2"})
_ATTENTION_NAME = "pivotrl_shared_prefix"


@dataclass(frozen=True)
class Generated:
    tokens: list[int]  # generated ids, the stop token included when one was generated
    finish_reason: str  # "stop" (stop token), "length" (max_new_tokens), "overlong" (see window)


@dataclass(frozen=True)
class Step:
    """One decoding step of one batch, as `generate(on_step=...)` reports it. Row r is sample
    `rows[r][1]` of prompt `rows[r][0]` (indices into `generate`'s arguments)."""

    rows: list[tuple[int, int]]
    tokens: torch.Tensor  # [R] the token each row drew at this step
    logits: torch.Tensor  # [R, V] float32 model logits of the draw (before temperature and top-p)
    active: torch.Tensor  # [R] bool: rows still generating (finished rows draw padding)


def stop_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """End tokens: the tokenizer's eos, then the model's generation_config eos (one or a list)."""
    out: list[int] = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for t in [tokenizer.eos_token_id] + (gen_eos if isinstance(gen_eos, list) else [gen_eos]):
        if t is not None and t not in out:
            out.append(int(t))
    return out


def sample_seeds(seeds: Sequence[int | None], n: int) -> list[list[int | None]]:
    """Per-sample seeds from per-prompt seeds: sample j of prompt i gets derive_seed(seeds[i], j)."""
    return [[None if s is None else derive_seed(s, j) for j in range(n)] for s in seeds]


def row_uniforms(seeds: Sequence[int | None], steps: int) -> torch.Tensor:
    """[rows, steps] uniforms, row r from its own generator (None: from torch's global RNG)."""
    out = torch.empty((len(seeds), steps), dtype=torch.float32)
    for r, seed in enumerate(seeds):
        g = None if seed is None else torch.Generator().manual_seed(int(seed))
        out[r] = torch.rand(steps, generator=g)
    return out


def pick_tokens(logits: torch.Tensor, uniforms: torch.Tensor, temperature: float,
                top_p: float = 1.0) -> torch.Tensor:
    """One token per row: argmax at temperature 0, else the inverse CDF of softmax(logits / T),
    restricted to the top-p nucleus, at the row's uniform. The CDF runs in vocabulary order (a
    fixed order: the same uniform maps to the same token); only top-p needs the probabilities
    sorted (the nucleus is a prefix of the sorted order), and sorting the vocabulary is most of a
    decoding step's cost on a small model, so it is done only then."""
    logits = logits.float()
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        cdf = probs.cumsum(dim=-1)
        # The smallest prefix whose mass reaches top_p (the first token always).
        probs = probs * ((cdf - probs) < top_p)
    cdf = probs.cumsum(dim=-1)
    u = uniforms.to(cdf.device).unsqueeze(-1) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u).clamp_(max=cdf.shape[-1] - 1)
    return (idx if order is None else order.gather(-1, idx)).squeeze(-1)


def generate(model: Any, prompts: Sequence[Sequence[int]], seeds: Sequence[Sequence[int | None]],
             *, max_new_tokens: int, stop_token_ids: Sequence[int], temperature: float = 1.0,
             top_p: float = 1.0, batch_size: int = 64, share_prefix: bool = True,
             window: int | None = None,
             on_step: Callable[[Step], None] | None = None) -> list[list[Generated]]:
    """`len(seeds[i])` completions of token prompt `prompts[i]` (see the module docstring).

    batch_size: rows (samples) per forward pass; a batch holds max(1, batch_size // n) prompts of
    n samples each, prompts of similar length together (little padding). on_step: called with
    each decoding step's `Step` (batches run one after another, so are their steps)."""
    if len(seeds) != len(prompts):
        raise ValueError(f"got {len(seeds)} seed lists for {len(prompts)} prompts")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be ≥ 1")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt has no tokens (nothing to condition on)")
    stops = [int(t) for t in stop_token_ids]
    if not stops:
        raise ValueError("no stop tokens")
    results: list[list[Generated]] = [[] for _ in prompts]
    todo = []
    for i, p in enumerate(prompts):
        if window is not None and len(p) + max_new_tokens > window:
            results[i] = [Generated([], "overlong") for _ in seeds[i]]
        elif seeds[i]:
            todo.append(i)
    # Batches hold prompts with the same number of samples; longest first, so that similar
    # lengths share a batch and an out-of-memory shows up at once.
    by_n: dict[int, list[int]] = {}
    for i in sorted(todo, key=lambda i: -len(prompts[i])):
        by_n.setdefault(len(seeds[i]), []).append(i)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), router_logits_off(model):
            for n, group in by_n.items():
                per_batch = max(1, batch_size // n)
                for start in range(0, len(group), per_batch):
                    batch = group[start:start + per_batch]
                    rows = [s for i in batch for s in seeds[i]]
                    ids = [list(prompts[i]) for i in batch]
                    # Rows are prompt-major on both paths: row k·n + j is sample j of batch[k].
                    observe = None if on_step is None else functools.partial(
                        _report_step, on_step, [(i, j) for i in batch for j in range(n)])
                    if share_prefix or n == 1:
                        out = _generate_batch(model, ids, n, rows, max_new_tokens, stops,
                                              temperature, top_p, observe)
                    else:  # the per-sample path: every sample prefills its own prompt copy
                        out = _generate_batch(model, [x for x in ids for _ in range(n)], 1, rows,
                                              max_new_tokens, stops, temperature, top_p, observe)
                    for k, i in enumerate(batch):
                        results[i] = out[k * n:(k + 1) * n]
    finally:
        if was_training:
            model.train()
    return results


@contextmanager
def router_logits_off(model: Any):
    """Run `model` with `output_router_logits` off in its config (and its text config), restoring
    it after: a generating forward never needs the MoE load-balancing loss, and with padding or a
    cache the model cannot compute it (module docstring). Models without the setting: unchanged."""
    config = getattr(model, "config", None)
    configs = [] if config is None else [config] + (
        [config.get_text_config()] if hasattr(config, "get_text_config") else [])
    unique = {id(c): c for c in configs}.values()  # a text-only model's text config is itself
    saved = [(c, c.output_router_logits) for c in unique if getattr(c, "output_router_logits", False)]
    for c, _ in saved:
        c.output_router_logits = False
    try:
        yield
    finally:
        for c, value in saved:
            c.output_router_logits = value


def generate_each(model: Any, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None],
                  **kw: Any) -> list[Generated]:
    """One completion per prompt, prompt i's drawn with seeds[i]. Identical prompts (the G
    episodes of one task at their first turn, say) become one prompt with several samples, so
    they share its prefill; each keeps its own seed. Keywords: those of `generate`."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(tuple(p), []).append(i)
    keys = list(groups)
    outs = generate(model, keys, [[seeds[i] for i in groups[k]] for k in keys], **kw)
    result: list[Generated | None] = [None] * len(prompts)
    for k, gens in zip(keys, outs):
        for i, g in zip(groups[k], gens):
            result[i] = g
    return result  # type: ignore[return-value]


def _report_step(on_step: Callable[[Step], None], rows: list[tuple[int, int]],
                 tokens: torch.Tensor, logits: torch.Tensor, active: torch.Tensor) -> None:
    on_step(Step(rows, tokens, logits, active))


def _left_pad(prompts: list[list[int]], pad: int, device: Any):
    width = max(len(x) for x in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, x in enumerate(prompts):
        ids[r, width - len(x):] = torch.tensor(x, dtype=torch.long)
        mask[r, width - len(x):] = 1
    return ids.to(device), mask.to(device)


def _prefill(model: Any, prompts: list[list[int]], pad: int, device: Any) -> tuple[Any, torch.Tensor]:
    """The batch's prompts run through the model: (output with its cache, attention mask over the
    cache's positions, 1 = a real token). The prefix every prompt of the batch shares (a world's
    system prompt and tool list: ~80% of a testbed prompt) runs once, its cache is copied to
    every row, and only the rest of each prompt is prefilled, left padded after the prefix. Exact
    for attention-only models: every token attends to the same keys at the same positions as in
    one pass (padding is masked; positions count real tokens). A recurrent layer (Mamba, linear
    attention) would read the padding between prefix and rest as input, so hybrids, and batches
    whose shared prefix is short, prefill in one pass."""
    # Only the last position's logits are needed (a vocabulary-wide row per prompt token otherwise).
    keep = ({"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters
            else {})
    common = _common_prefix(prompts) if _batch_prefix_supported(model) else 0
    if common < MIN_BATCH_PREFIX:
        ids, mask = _left_pad(prompts, pad, device)
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                     **keep), mask
    head = model(input_ids=torch.tensor([prompts[0][:common]], device=device),
                 position_ids=torch.arange(common, device=device)[None], use_cache=True, **keep)
    cache = head.past_key_values
    repeat_cache_rows(cache, torch.zeros(len(prompts), dtype=torch.long, device=device))
    ids, rest = _left_pad([p[common:] for p in prompts], pad, device)
    mask = torch.cat([torch.ones(len(prompts), common, dtype=torch.long, device=device), rest], -1)
    positions = (common + rest.cumsum(-1) - 1).clamp_(min=common)
    return model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                 use_cache=True, **keep), mask


# A batch prefix shorter than this is prefilled with the rest: the extra forward pass would cost
# more than it saves.
MIN_BATCH_PREFIX = 32
# Families whose every layer is attention (a MoE MLP does not attend): a batch prefix is exact.
ATTENTION_ONLY_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe"})


def _common_prefix(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one of its own (0 for one prompt)."""
    if len(prompts) < 2:
        return 0
    return min(len(os.path.commonprefix(prompts)), min(len(p) for p in prompts) - 1)


def _batch_prefix_supported(model: Any) -> bool:
    return (getattr(getattr(model, "config", None), "model_type", None) in ATTENTION_ONLY_MODELS
            and _prefix_attention_supported(model))


def _prefix_attention_supported(model: Any) -> bool:
    cfg = getattr(model, "config", None)
    return (getattr(cfg, "model_type", None) in PREFIX_ATTENTION_MODELS
            and not getattr(cfg, "use_sliding_window", False)
            and getattr(cfg, "sliding_window", None) is None
            and not any("sliding" in str(t) for t in getattr(cfg, "layer_types", None) or ())
            and getattr(cfg, "_attn_implementation", None) in ("sdpa", "eager"))


def repeat_cache_rows(cache: Any, index: torch.Tensor, share_attention: bool = False) -> list | None:
    """Row b of `cache` becomes row `index[b]`'s copy, for every layer type (attention
    keys/values, sliding windows, linear-attention and Mamba conv/recurrent states: each layer's
    `reorder_cache`, the beam-search contract). With `share_attention` the full-attention
    keys/values are not copied: they are taken out (returned per layer, None for layers without
    them) and the layer is left empty with len(index) rows, ready for the samples' own tokens."""
    taken: list = []
    for layer in cache.layers:
        kv = None
        if share_attention and _is_attention_layer(layer):
            kv = (layer.keys, layer.values)
            layer.keys, layer.values = layer.keys[:, :, :0], layer.values[:, :, :0]
        layer.reorder_cache(index)
        if kv is not None:  # reorder_cache leaves an empty layer as it is
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        taken.append(kv)
    return taken if share_attention else None


def _is_attention_layer(layer: Any) -> bool:
    keys = getattr(layer, "keys", None)
    return (isinstance(keys, torch.Tensor) and keys.dim() == 4 and keys.shape[-2] > 0
            and not getattr(layer, "is_sliding", False))


def _generate_batch(model, prompts: list[list[int]], n: int, seeds: list[int | None],
                    max_new_tokens: int, stops: list[int], temperature: float,
                    top_p: float, observe: Callable[..., None] | None = None) -> list[Generated]:
    """P prompts × n samples (rows prompt-major); the prompts are prefilled once."""
    device = next(model.parameters()).device
    pad = 0  # any valid id: masked in the prompt, fed to finished rows, never in a result
    out, mask = _prefill(model, prompts, pad, device)
    lengths = mask.sum(-1)
    logits = out.logits[:, -1].float().repeat_interleave(n, dim=0)
    cache = out.past_key_values
    rows = len(prompts) * n
    next_pos = lengths.repeat_interleave(n)  # each row's next position: its prompt's length
    uniforms = row_uniforms(seeds, max_new_tokens).to(device)
    stop_t = torch.tensor(stops, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    tokens = []
    shared = _prefix_attention_supported(model)
    prefix = None
    step_kwargs: dict[str, Any] = {}
    index = torch.arange(len(prompts), device=device).repeat_interleave(n)  # row -> its prompt
    if shared:
        taken = repeat_cache_rows(cache, index, share_attention=True)
        # Kept in float32 (the attention math runs in float32 whatever the model's dtype: scores
        # rounded to bfloat16 would move the softmax by ~1%), keys transposed once.
        prefix = _SharedPrefix([None if kv is None else (kv[0].float().transpose(-1, -2).contiguous(),
                                                         kv[1].float()) for kv in taken], mask.bool(), n)
    else:
        if n > 1:
            repeat_cache_rows(cache, index)
        full_mask = mask.repeat_interleave(n, dim=0)
    with _attention(model, prefix):
        for t in range(max_new_tokens):
            tok = pick_tokens(logits, uniforms[:, t], temperature, top_p)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            tokens.append(tok)
            if observe is not None:
                observe(tok, logits, ~done)
            done = done | torch.isin(tok, stop_t)
            if t == max_new_tokens - 1 or bool(done.all()):
                break
            pos = (next_pos + t)[:, None]
            if not shared:
                full_mask = torch.cat([full_mask, torch.ones_like(full_mask[:, :1])], dim=-1)
                step_kwargs = {"attention_mask": full_mask}
            out = model(input_ids=tok[:, None], position_ids=pos, past_key_values=cache,
                        use_cache=True, **step_kwargs)
            cache = out.past_key_values
            logits = out.logits[:, -1].float()
    return _finish(torch.stack(tokens, dim=1).tolist(), set(stops))


def _finish(rows: list[list[int]], stops: set[int]) -> list[Generated]:
    out = []
    for row in rows:
        end = next((t for t, tok in enumerate(row) if tok in stops), None)
        out.append(Generated(row, "length") if end is None else Generated(row[:end + 1], "stop"))
    return out


@dataclass
class _SharedPrefix:
    """The prompts' cached keys (transposed: [P, kv_heads, head_dim, L]) and values ([P, kv_heads,
    L, head_dim]) per layer, which positions are real tokens ([P, L]), and how many consecutive
    rows (samples) share each prompt."""

    layers: list[tuple[torch.Tensor, torch.Tensor] | None]  # None: a layer without attention
    mask: torch.Tensor
    group: int


# The prefix of the batch being decoded. A context variable rather than a forward keyword: hybrid
# models hand their forward keywords to recurrent kernels that reject unknown ones.
_ACTIVE_PREFIX: contextvars.ContextVar[_SharedPrefix | None] = contextvars.ContextVar(
    "pivotrl_shared_prefix", default=None)


def _shared_prefix_attention(module, query, key, value, attention_mask, scaling=None,
                             dropout=0.0, **kwargs):
    """Attention of decoding rows over (their prompt's shared cache) ∪ (their own new tokens).

    query [R, H, q, d]; key/value [R, Hkv, S, d]: the row's own generated tokens (all before the
    query, and the query itself). R = P·n rows, rows r·n … r·n+n-1 share prompt r. One softmax
    over both parts (scores concatenated, then normalised), so this equals attending to the
    prompt's keys copied into every row, without the copies."""
    shared_prefix = _ACTIVE_PREFIX.get()
    if shared_prefix is None or query.shape[2] != 1:
        raise RuntimeError("shared-prefix attention is for one-token decoding steps only")
    kp_t, vp = shared_prefix.layers[module.layer_idx]
    rows, heads, _, dim = query.shape
    prompts, kv_heads, length, _ = vp.shape
    n, g = shared_prefix.group, heads // kv_heads
    scaling = dim ** -0.5 if scaling is None else scaling
    # Prefix part: per prompt, all its rows' queries (n samples × g heads sharing a kv head).
    q = query.float().reshape(prompts, n, kv_heads, g, dim).permute(0, 2, 1, 3, 4).reshape(
        prompts, kv_heads, n * g, dim)
    s_pre = torch.matmul(q, kp_t) * scaling  # [P, Hkv, n·g, L]
    s_pre = s_pre.masked_fill(~shared_prefix.mask[:, None, None, :], float("-inf"))
    # Own part: every generated token so far is visible (decoding is one token at a time).
    k_own = (key.repeat_interleave(g, dim=1) if g > 1 else key).float()
    v_own = (value.repeat_interleave(g, dim=1) if g > 1 else value).float()
    s_own = torch.matmul(query.float(), k_own.transpose(-1, -2)) * scaling  # [R, H, 1, S]
    s_own = s_own.reshape(prompts, n, kv_heads, g, -1).permute(0, 2, 1, 3, 4).reshape(
        prompts, kv_heads, n * g, -1)
    weights = torch.softmax(torch.cat([s_pre, s_own], dim=-1), dim=-1)
    out = torch.matmul(weights[..., :length], vp)  # [P, Hkv, n·g, d]
    w_own = weights[..., length:].reshape(prompts, kv_heads, n, g, -1).permute(0, 2, 1, 3, 4)
    out_own = torch.matmul(w_own.reshape(rows, heads, 1, -1), v_own)  # [R, H, 1, d]
    out = out.reshape(prompts, kv_heads, n, g, dim).permute(0, 2, 1, 3, 4).reshape(
        rows, heads, 1, dim) + out_own
    return out.transpose(1, 2).contiguous().to(query.dtype), None


@contextmanager
def _attention(model, prefix: _SharedPrefix | None):
    """Run the model with the shared-prefix attention over `prefix` (None: its own attention),
    restoring it after."""
    if prefix is None:
        yield
        return
    from transformers import AttentionInterface

    if _ATTENTION_NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(_ATTENTION_NAME, _shared_prefix_attention)
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = _ATTENTION_NAME
    token = _ACTIVE_PREFIX.set(prefix)
    try:
        yield
    finally:
        _ACTIVE_PREFIX.reset(token)
        config._attn_implementation = before


def completion_logps(model: Any, batch: Sequence[tuple[Sequence[int], Sequence[int]]],
                     temperature: float = 1.0) -> list[torch.Tensor]:
    """Log-probabilities of each completion token given its prompt (logits / temperature, as TRL
    samples). Gradients flow when called with them enabled."""
    return span_logps(model, [(list(p) + list(c), [(len(p), len(c))]) for p, c in batch], temperature)


def span_logps(model: Any, batch: Sequence[tuple[Sequence[int], Sequence[tuple[int, int]]]],
               temperature: float = 1.0) -> list[torch.Tensor]:
    """Log-probabilities of the tokens in each (start, length) span of each sequence, given
    everything before them: one tensor per span, in order. Several spans of one sequence are the
    turns of an episode whose later prompts extend the earlier turns token for token; a causal
    model reads each span exactly as it would at the end of its own prompt, so one forward pass
    replaces one per turn. The output layer runs on span positions only: prompts are most of the
    sequence, so projecting every position would be mostly wasted work. Right padding (causal:
    padding after a sequence cannot change it)."""
    pad = 0
    batch = [(list(ids), [(int(a), int(n)) for a, n in spans]) for ids, spans in batch]
    for ids, spans in batch:
        if any(a < 1 or n < 0 or a + n > len(ids) for a, n in spans):
            raise ValueError(f"span outside its sequence of {len(ids)} tokens (or at 0: the first "
                             f"token has no context): {spans}")
    device = next(model.parameters()).device
    width = max(len(ids) for ids, _ in batch)
    ids = torch.tensor([s + [pad] * (width - len(s)) for s, _ in batch], device=device)
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s, _ in batch], device=device)
    hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    rows = torch.tensor([i for i, (_, spans) in enumerate(batch) for _, n in spans for _ in range(n)],
                        dtype=torch.long)
    cols = torch.tensor([a - 1 + j for _, spans in batch for a, n in spans for j in range(n)],
                        dtype=torch.long)
    logits = model.get_output_embeddings()(hidden[rows, cols]).float() / temperature
    logps = torch.log_softmax(logits, dim=-1).gather(-1, ids[rows, cols + 1][:, None]).squeeze(-1)
    return list(torch.split(logps, [n for _, spans in batch for _, n in spans]))
