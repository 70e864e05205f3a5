"""pivotrl.sampling.generate: shared-prefix decoding gives the per-sample path's completions (greedy:
identical, and equal to transformers' own generate; sampled: each sample a function of its prompt
and seed only), with left padding over prompts of different lengths; stop rule; window rule."""

from __future__ import annotations

import random

import pytest
import torch

import pivotrl.sampling.generate as gen
from pivotrl.sampling.generate import (
    Generated,
    generate,
    generate_each,
    sample_seeds,
    stop_ids,
)

STOP = 2  # an ordinary token id used as the stop token where a test needs one


def _model(kv_heads: int = 4, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=kv_heads, intermediate_size=128,
                      max_position_embeddings=256, bos_token_id=None, eos_token_id=STOP,
                      pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def _prompts(lengths, seed: int = 0, head: int = 0):
    """Random prompts of `lengths` tokens after a `head` they all share (a system prompt)."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, 300) for _ in range(head)]
    return [shared + [rng.randrange(3, 300) for _ in range(n)] for n in lengths]


LENGTHS = [23, 5, 40, 1, 17]


@pytest.fixture(scope="module")
def model():
    return _model()


def _hf_greedy(model, prompt, steps, stops):
    out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                         dtype=torch.long), max_new_tokens=steps, do_sample=False,
                         eos_token_id=stops, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("kv_heads", [4, 2])  # 2: grouped-query attention (heads share kv heads)
@pytest.mark.parametrize("head", [0, 40])  # 40: the batch's shared prefix is prefilled once
def test_greedy_equals_transformers_generate_on_every_path(monkeypatch, kv_heads, head):
    model = _model(kv_heads)
    prompts = _prompts(LENGTHS, head=head)
    want = [_hf_greedy(model, p, 12, [299]) for p in prompts]
    kw = {"max_new_tokens": 12, "stop_token_ids": [299], "temperature": 0.0}
    got = {"shared": generate(model, prompts, sample_seeds([None] * 5, 3), **kw),
           "per_sample": generate(model, prompts, sample_seeds([None] * 5, 3), share_prefix=False,
                                  **kw),
           "small_batches": generate(model, prompts, sample_seeds([None] * 5, 3), batch_size=3,
                                     **kw)}
    monkeypatch.setattr(gen, "PREFIX_ATTENTION_MODELS", frozenset())  # the copied-cache path
    got["copied_cache"] = generate(model, prompts, sample_seeds([None] * 5, 3), **kw)
    for name, out in got.items():
        for w, samples in zip(want, out):
            assert [s.tokens for s in samples] == [w] * 3, name


def test_shared_prefix_attention_matches_the_copied_cache_numerically(model, monkeypatch):
    """The split softmax is the same attention: the decoding logits agree to float precision."""
    prompts = _prompts(LENGTHS, seed=1)
    seen: dict[str, list[torch.Tensor]] = {"shared": [], "copied": []}
    real = gen.pick_tokens

    def spy(logits, *a, **k):
        seen[mode].append(logits.clone())
        return real(logits, *a, **k)

    monkeypatch.setattr(gen, "pick_tokens", spy)
    for mode in ("shared", "copied"):
        if mode == "copied":
            monkeypatch.setattr(gen, "PREFIX_ATTENTION_MODELS", frozenset())
        generate(model, prompts, sample_seeds(range(5), 4), max_new_tokens=8,
                 stop_token_ids=[299])
    assert len(seen["shared"]) == len(seen["copied"]) == 8
    for a, b in zip(seen["shared"], seen["copied"]):
        assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()


def test_sampled_completions_depend_only_on_prompt_and_seed(model):
    prompts = _prompts(LENGTHS, seed=2)
    kw = {"max_new_tokens": 10, "stop_token_ids": [299], "temperature": 1.0}
    a = generate(model, prompts, sample_seeds([11, 22, 33, 44, 55], 4), **kw)
    per_sample = generate(model, prompts, sample_seeds([11, 22, 33, 44, 55], 4),
                          share_prefix=False, **kw)
    order = [3, 0, 4, 2, 1]
    shuffled = generate(model, [prompts[i] for i in order],
                        sample_seeds([[11, 22, 33, 44, 55][i] for i in order], 4), batch_size=8,
                        **kw)
    alone = generate(model, prompts[2:3], sample_seeds([33], 4), **kw)
    assert a == per_sample
    assert [shuffled[order.index(i)] for i in range(5)] == a
    assert alone[0] == a[2]
    # The samples of a prompt differ (random model, 300 tokens: collisions are ~impossible) …
    assert len({tuple(s.tokens) for s in a[0]}) == 4
    # … and another seed for one prompt changes that prompt's samples only.
    b = generate(model, prompts, sample_seeds([11, 22, 34, 44, 55], 4), **kw)
    assert b[2] != a[2] and b[:2] == a[:2] and b[3:] == a[3:]


def test_generate_each_groups_identical_prompts_keeping_each_seed(model):
    p, q = _prompts([30, 12], seed=3)
    kw = {"max_new_tokens": 10, "stop_token_ids": [299], "temperature": 1.0}
    got = generate_each(model, [p, q, p, p], [5, 6, 7, 8], **kw)
    want = [generate(model, [x], [[s]], **kw)[0][0] for x, s in zip([p, q, p, p], [5, 6, 7, 8])]
    assert got == want
    assert len({tuple(g.tokens) for g in (got[0], got[2], got[3])}) == 3


def test_stop_token_length_and_window(model):
    prompt = _prompts([9], seed=4)[0]
    greedy = generate(model, [prompt], [[None]], max_new_tokens=6, stop_token_ids=[299],
                      temperature=0.0)[0][0]
    first = greedy.tokens[0]
    if first == 299:
        pytest.skip("the random model's first greedy token is the stand-in stop token")
    assert greedy.finish_reason == "length" and len(greedy.tokens) == 6
    # The stop id is never fed to the model (padding uses a valid id): any id works as a stop.
    far = generate(model, [prompt, prompt[:4]], [[None], [None]], max_new_tokens=6,
                   stop_token_ids=[10**6], temperature=0.0)
    assert far[0][0] == greedy
    # Make the greedy second token the stop: it ends the row and is kept.
    stop = greedy.tokens[1]
    got = generate(model, [prompt], [[None, None]], max_new_tokens=6, stop_token_ids=[stop],
                   temperature=0.0)[0]
    assert got == [Generated([first, stop], "stop")] * 2
    # A prompt that leaves no room for max_new_tokens inside the window is not generated.
    window = generate(model, [prompt, prompt + prompt], [[1], [2, 3]], max_new_tokens=6,
                      stop_token_ids=[299], window=20, temperature=0.0)
    assert window[0][0].finish_reason == "length"
    assert window[1] == [Generated([], "overlong")] * 2


def test_errors_and_training_mode_restored(model):
    with pytest.raises(ValueError, match="no tokens"):
        generate(model, [[]], [[1]], max_new_tokens=2, stop_token_ids=[STOP])
    with pytest.raises(ValueError, match="seed lists"):
        generate(model, [[5, 6]], [], max_new_tokens=2, stop_token_ids=[STOP])
    model.train()
    try:
        generate(model, [[5, 6]], [[1]], max_new_tokens=2, stop_token_ids=[STOP])
        assert model.training
        assert model.config._attn_implementation in ("sdpa", "eager")  # the model's own again
    finally:
        model.eval()


def test_stop_ids_reads_tokenizer_and_generation_config(model):
    class Tok:
        eos_token_id = 7

    model.generation_config.eos_token_id = [STOP, 7]
    assert stop_ids(Tok(), model) == [7, STOP]
