"""The base's pretraining loop: batches mix tasks, and the cheap loss is the model's own loss."""

from __future__ import annotations

import random

import pytest
import torch

from pivotrl_testbed.testbed.pretrain import PretrainConfig, _assistant_loss, _batches, pretrain
from pivotrl_testbed.testbed.tiny import TinyModelConfig, build_model, load_tiny


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_tiny(tiny_model_dir)


def test_batches_mix_examples_of_nearby_lengths():
    # Two "families" whose lengths differ by one token: sorting by exact length would give every
    # batch a single family.
    encoded = [([1] * (30 + i % 2), [1] * (30 + i % 2)) for i in range(256)]
    stream = _batches(encoded, PretrainConfig(tokens_per_batch=1024, bucket_width=64), random.Random(0))
    batches = [next(stream) for _ in range(16)]  # 16 rows of ≤ 64 tokens: one epoch
    assert all(len(b) == 16 for b in batches)
    mixed = sum(len({len(encoded[i][0]) for i in b}) == 2 for b in batches)
    assert mixed >= 12
    assert sorted(i for b in batches for i in b) == list(range(256))  # each example once


def test_batches_respect_the_token_budget_per_bucket():
    encoded = [([1] * n, [1] * n) for n in (10, 20, 300, 310, 600) * 20]
    stream = _batches(encoded, PretrainConfig(tokens_per_batch=1024, bucket_width=64), random.Random(1))
    for _ in range(30):
        b = next(stream)
        longest = max(len(encoded[i][0]) for i in b)
        assert len(b) * -(-longest // 64) * 64 <= 1024 or len(b) == 1
        assert len({-(-len(encoded[i][0]) // 64) for i in b}) == 1  # one bucket per batch


def test_assistant_loss_equals_the_models_loss(tiny):
    _, tokenizer = tiny
    model = build_model(tokenizer, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2,
                                                   intermediate_size=64))
    torch.manual_seed(0)
    ids = torch.randint(3, len(tokenizer), (3, 12))
    attn = torch.ones_like(ids)
    attn[2, 9:] = 0
    labels = torch.full_like(ids, -100)
    labels[:, 6:9] = ids[:, 6:9]
    expected = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    assert torch.allclose(_assistant_loss(model, ids, attn, labels), expected, atol=1e-5)


def test_pretraining_learns_a_copy_task(tiny):
    # The loop end to end: a fresh model learns to answer with the word it was given.
    _, tokenizer = tiny
    model = build_model(tokenizer, TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2,
                                                   intermediate_size=128))
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdef") for _ in range(3)) for _ in range(8)]
    examples = [{"messages": [{"role": "user", "content": f"Say {w}"},
                              {"role": "assistant", "content": w}]} for w in words]
    stats = pretrain(model, tokenizer, examples, PretrainConfig(steps=150, lr=3e-3, warmup=10,
                                                                 threads=1))
    assert stats["final_loss"] < 0.3


def test_a_killed_pretraining_resumes_to_the_same_weights(tiny, tmp_path):
    # A build that outlives a session must not be lost: kill the loop mid-way, rerun it, and the
    # weights equal those of an unbroken run; a checkpoint of another recipe is not resumed.
    _, tokenizer = tiny
    shape = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    examples = [{"messages": [{"role": "user", "content": f"Say {w}"},
                              {"role": "assistant", "content": w}]} for w in ("abc", "de", "fgh")]
    cfg = PretrainConfig(steps=6, lr=3e-3, warmup=2, threads=1, tokens_per_batch=64)
    unbroken = build_model(tokenizer, shape)
    pretrain(unbroken, tokenizer, examples, cfg)

    class Killed(Exception):
        pass

    def kill_at_4(step, loss):
        if step == 4:
            raise Killed

    ckpt = tmp_path / "state.pt"
    with pytest.raises(Killed):
        pretrain(build_model(tokenizer, shape), tokenizer, examples, cfg, kill_at_4,
                 checkpoint=ckpt, checkpoint_every=3, checkpoint_key="r1")
    resumed = build_model(tokenizer, shape)
    stats = pretrain(resumed, tokenizer, examples, cfg, checkpoint=ckpt, checkpoint_every=3,
                     checkpoint_key="r1")
    assert stats["resumed_from"] == 3
    for a, b in zip(unbroken.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    other = pretrain(build_model(tokenizer, shape), tokenizer, examples, cfg, checkpoint=ckpt,
                     checkpoint_key="r2")
    assert other["resumed_from"] == 0
