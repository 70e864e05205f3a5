"""The architectures people fine-tune for tool use, through every path: tiny random models of each
(pivotrl.experiment.testbed.architectures: dense, MoE, linear-attention hybrid, Mamba-2 hybrids,
sliding window, short-conv hybrid), built from transformers' own config classes.

Generation: the shared prefill (one prefill per prompt; recurrent/conv states copied per sample,
attention keys shared or copied) gives the per-sample path's tokens, greedy and sampled, and the
same logits at every step."""

from __future__ import annotations

import random

import pytest
import torch

import pivotrl.sampling.generate as gen
from pivotrl.experiment.testbed.architectures import ARCHITECTURES, build_tiny
from pivotrl.sampling.generate import generate, sample_seeds

VOCAB = 300
NAMES = sorted(ARCHITECTURES)
# Mixed lengths, left padded in one batch; longer than gemma3's 8-token window.
LENGTHS = [23, 5, 40]


@pytest.fixture(scope="module")
def models():
    """One random model per architecture; its weights scaled up so that its next-token
    distribution is far from uniform (a wrong state then changes tokens, not just decimals)."""
    out = {}
    for name in NAMES:
        out[name] = build_tiny(name, VOCAB, seed=1, initializer_range=0.2)
    return out


def _prompts(seed: int = 0):
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in LENGTHS]


def _run(model, temperature: float, share_prefix: bool = True, steps: int = 10):
    """Tokens per (prompt, sample) and the logits of every decoding step, in row order."""
    seen: list[torch.Tensor] = []
    out = generate(model, _prompts(), sample_seeds([7, 8, 9], 3), max_new_tokens=steps,
                   stop_token_ids=[VOCAB + 1], temperature=temperature, share_prefix=share_prefix,
                   on_step=lambda step: seen.append(step.logits.clone()))
    return [[g.tokens for g in gens] for gens in out], seen


@pytest.mark.parametrize("name", NAMES)
def test_shared_prefill_gives_the_per_sample_tokens_and_logits(models, name, monkeypatch):
    model = models[name]
    for temperature in (0.0, 1.0):
        want, want_logits = _run(model, temperature, share_prefix=False)
        runs = {"shared": _run(model, temperature)}
        if gen._prefix_attention_supported(model):  # and with every layer's cache copied instead
            with monkeypatch.context() as m:
                m.setattr(gen, "PREFIX_ATTENTION_MODELS", frozenset())
                runs["copied"] = _run(model, temperature)
        for path, (tokens, logits) in runs.items():
            assert tokens == want, (name, path, temperature)
            for step, (a, b) in enumerate(zip(logits, want_logits)):
                assert torch.allclose(a, b, atol=1e-4), (name, path, step, (a - b).abs().max())
    sampled, _ = _run(model, 1.0)
    assert len({tuple(t) for t in sampled[0]}) == 3  # the samples differ: each follows its seed


def test_which_architectures_share_attention_keys(models):
    """Sliding windows keep the copied cache (the split softmax has no window); the rest share."""
    shared = {name for name in NAMES if gen._prefix_attention_supported(models[name])}
    assert shared == set(NAMES) - {"gemma3"}


def test_recurrent_state_is_copied_per_sample_not_shared(models):
    """Each sample advances its own copy of the prompt's recurrent state: samples drawn together
    equal samples drawn one at a time (a shared state would be advanced by every sample's token)."""
    model = models["qwen3_5"]
    prompt = _prompts()[2]
    kw = dict(max_new_tokens=6, stop_token_ids=[VOCAB + 1], temperature=1.0)
    together = generate(model, [prompt], [[1, 2, 3]], **kw)[0]
    alone = [generate(model, [prompt], [[s]], **kw)[0][0] for s in (1, 2, 3)]
    assert together == alone
