"""The architectures people fine-tune for tool use, through every path: tiny random models of each
(pivotrl_testbed.testbed.architectures: dense, MoE, linear-attention hybrid, Mamba-2 hybrids,
sliding window, short-conv hybrid), built from transformers' own config classes.

Generation: the shared prefill (one prefill per prompt; recurrent/conv states copied per sample,
attention keys shared or copied) gives the per-sample path's tokens, greedy and sampled, and the
same logits at every step."""

from __future__ import annotations

import random

import pytest
import torch

import pivotrl.sampling.generate as gen
from pivotrl_testbed.testbed.architectures import ARCHITECTURES, build_tiny
from pivotrl.sampling.generate import generate, sample_seeds

VOCAB = 300
NAMES = sorted(ARCHITECTURES)
# Mixed lengths, left padded in one batch; longer than gemma3's 8-token window.
LENGTHS = [23, 5, 40]
# TRL 1.16's MoE load-balancing loss reads `config.num_experts`, which Granite 4 names
# `num_local_experts` (AttributeError in SFT and GRPO); with the aux loss off the steps run.
TRL_OVERRIDES = {"granite4": {"router_aux_loss_coef": 0.0}}
# Architectures tests/test_journey.py runs `pivotrl sft` on (through the CLI, saved model loaded).
SFT_RUN_BY_THE_JOURNEY = {"qwen3", "qwen3_moe", "qwen3_5"}


@pytest.fixture(scope="module")
def models():
    """One random model per architecture; its weights scaled up so that its next-token
    distribution is far from uniform (a wrong state then changes tokens, not just decimals)."""
    out = {}
    for name in NAMES:
        out[name] = build_tiny(name, VOCAB, seed=1, initializer_range=0.2)
    return out


def _prompts(seed: int = 0, head: int = 0):
    """Prompts of LENGTHS tokens after a `head` of tokens they all share (a system prompt)."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, VOCAB) for _ in range(head)]
    return [shared + [rng.randrange(3, VOCAB) for _ in range(n)] for n in LENGTHS]


def _run(model, temperature: float, share_prefix: bool = True, steps: int = 10, head: int = 0):
    """Tokens per (prompt, sample) and the logits of every decoding step, in row order."""
    seen: list[torch.Tensor] = []
    out = generate(model, _prompts(head=head), sample_seeds([7, 8, 9], 3), max_new_tokens=steps,
                   stop_token_ids=[VOCAB + 1], temperature=temperature, share_prefix=share_prefix,
                   on_step=lambda step: seen.append(step.logits.clone()))
    return [[g.tokens for g in gens] for gens in out], seen


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("head", [0, 2 * gen.MIN_BATCH_PREFIX])  # with a prefix shared by the batch
def test_shared_prefill_gives_the_per_sample_tokens_and_logits(models, name, head, monkeypatch):
    model = models[name]
    for temperature in (0.0, 1.0):
        with monkeypatch.context() as m:  # the reference: every sample prefills its whole prompt
            m.setattr(gen, "MIN_BATCH_PREFIX", 10**9)
            want, want_logits = _run(model, temperature, share_prefix=False, head=head)
        runs = {"shared": _run(model, temperature, head=head)}
        if gen._prefix_attention_supported(model):  # and with every layer's cache copied instead
            with monkeypatch.context() as m:
                m.setattr(gen, "PREFIX_ATTENTION_MODELS", frozenset())
                runs["copied"] = _run(model, temperature, head=head)
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


def test_which_architectures_prefill_a_batch_prefix_once(models):
    """Attention-only models (dense and MoE); a recurrent or windowed layer would read the padding
    between the shared prefix and each prompt's rest as input."""
    once = {name for name in NAMES if gen._batch_prefix_supported(models[name])}
    assert once == {n for n in NAMES if models[n].config.model_type in gen.ATTENTION_ONLY_MODELS}
    assert once and not once & {"qwen3_5", "nemotron_h", "gemma3"}


def test_recurrent_state_is_copied_per_sample_not_shared(models):
    """Each sample advances its own copy of the prompt's recurrent state: samples drawn together
    equal samples drawn one at a time (a shared state would be advanced by every sample's token)."""
    model = models["qwen3_5"]
    prompt = _prompts()[2]
    kw = dict(max_new_tokens=6, stop_token_ids=[VOCAB + 1], temperature=1.0)
    together = generate(model, [prompt], [[1, 2, 3]], **kw)[0]
    alone = [generate(model, [prompt], [[s]], **kw)[0][0] for s in (1, 2, 3)]
    assert together == alone


# ---------------------------------------------------------------- every path, every architecture


@pytest.fixture(scope="module")
def data():
    """Two toolshop tasks, their expert trajectories and assistant turns (testbed, no model)."""
    from pivotrl_testbed.episodes import expert_turns
    from pivotrl_testbed.testbed.experts import generate_trajectories
    from pivotrl_testbed.testbed.tasks import make_tasks

    trajectories = generate_trajectories("toolshop", "eval", 2, seed=0)
    return {"tasks": make_tasks("toolshop", "eval", 2), "trajectories": trajectories,
            "turns": expert_turns(trajectories)[:2]}


@pytest.fixture(scope="module")
def checkpoints(tiny_model_dir, tmp_path_factory):
    """Each architecture saved with the testbed tokenizer (Qwen/Hermes chat template, tool calls)."""
    from transformers import AutoTokenizer

    from pivotrl_testbed.testbed.architectures import save_tiny_arch

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    root = tmp_path_factory.mktemp("architectures")
    return tok, {name: save_tiny_arch(name, tok, root / name) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_profile_evaluate_and_episode(checkpoints, data, name):
    """profile (HF backend, shared prefill), evaluate --turns and an E2E episode, one model load."""
    from pivotrl.evaluate.turns import TurnEvalConfig, score_turns
    from pivotrl_testbed.episodes import ModelPolicy, run_episodes
    from pivotrl.profile.loop import ProfileConfig, RunStats, profile_stream
    from pivotrl.sampling.hf import HFSampler
    from pivotrl.verifiers import get_verifier

    tok, dirs = checkpoints
    sampler = HFSampler(str(dirs[name]), tokenizer=tok, batch_size=8)
    assert sampler.share_prefix
    verifier = get_verifier("toolcall")
    stats = RunStats()
    profiles = list(profile_stream(data["turns"], sampler, verifier, tok,
                                   ProfileConfig(k=3, max_new_tokens=4), stats))
    assert [p.k for p in profiles] == [3, 3] and stats.rollout_turns == 6
    items = list(score_turns(data["turns"], sampler, verifier, tok, TurnEvalConfig(max_new_tokens=4)))
    assert [i["id"] for i in items] == [t.id for t in data["turns"]]
    assert all(len(i["rewards"]) == 1 for i in items)
    policy = ModelPolicy(sampler.model, tok, max_new_tokens=4, batch_size=4)
    results = run_episodes("toolshop", data["tasks"], policy, max_turns=2)
    assert len(results) == 2 and all(r.model_turns >= 1 for r in results)
    assert policy.generated_tokens > 0


@pytest.mark.parametrize("name", NAMES)
def test_serve_streams_one_request(checkpoints, name):
    import json

    from fastapi.testclient import TestClient

    from pivotrl.sampling.serve import create_app

    _, dirs = checkpoints
    client = TestClient(create_app(str(dirs[name]), batch_size=4))
    body = {"model": str(dirs[name]), "messages": [{"role": "user", "content": "Cancel my order"}],
            "max_completion_tokens": 4, "seed": 3, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    assert len(chunks) >= 2  # a role chunk, then token chunks as they are drawn
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    whole = client.post("/v1/chat/completions", json={**body, "stream": False}).json()
    assert streamed == (whole["choices"][0]["message"]["content"] or "")


@pytest.mark.parametrize("name", [n for n in NAMES if n not in SFT_RUN_BY_THE_JOURNEY])
def test_one_sft_step(checkpoints, data, name, tmp_path):
    import json

    from pivotrl.train.config import SFTRunConfig
    from pivotrl.train.sft import train_sft

    _, dirs = checkpoints
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(t.model_dump_json() + "\n" for t in data["trajectories"]))
    summary = train_sft(SFTRunConfig(model=str(dirs[name]), data=path, output_dir=str(tmp_path / "sft"),
                                     max_steps=1, per_device_train_batch_size=2, save_steps=10,
                                     learning_rate=1e-3, trl_overrides=TRL_OVERRIDES.get(name, {})))
    assert summary["steps"] == 1 and summary["trajectories"] == 2
    rows = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert any("loss" in r for r in rows)


@pytest.mark.parametrize("name,checkpointing", [(n, False) for n in NAMES] + [("nemotron_h", True)])
def test_one_grpo_step(checkpoints, data, name, checkpointing, tmp_path, monkeypatch):
    """One GRPO step; the shared-prefix loss runs where the model supports it (checked by calls),
    and where it does not the reason is the one `shared_prefix_status` gives."""
    import json

    from pivotrl.train import shared_prefix
    from pivotrl.train import trainer as trainer_module
    from pivotrl.train.config import GRPORunConfig
    from pivotrl.train.grpo import build_trainer

    tok, dirs = checkpoints
    cfg = GRPORunConfig(model=str(dirs[name]), pivots=str(tmp_path / "p.jsonl"),
                        output_dir=str(tmp_path / "run"), num_generations=2,
                        per_device_train_batch_size=2, max_completion_length=3, max_steps=1,
                        save_steps=10, learning_rate=1e-3, gradient_checkpointing=checkpointing,
                        trl_overrides=TRL_OVERRIDES.get(name, {}))
    trainer = build_trainer(cfg, data["turns"][:1], tokenizer=tok)
    on, line = shared_prefix.shared_prefix_status(trainer._causal_lm(trainer.model))
    assert trainer.shared_prefix == on, line
    calls = []
    monkeypatch.setattr(trainer_module, "shared_prefix_logps",
                        lambda *a, **k: calls.append(1) or shared_prefix.shared_prefix_logps(*a, **k))
    trainer.train()
    assert bool(calls) == on
    assert trainer._causal_lm(trainer.model).is_gradient_checkpointing == checkpointing
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["rollout_turns"] == 2 and "loss" in rows[-1]
