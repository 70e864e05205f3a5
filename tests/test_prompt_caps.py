"""Every path caps prompt length from the model's context and sets the over-long aside, counted:
the one context rule (sampling.pipeline.context_length), the HF sampler's limit, `evaluate --turns`,
and GRPO's default max_prompt_length."""

from __future__ import annotations

import pytest

from pivotrl.evaluate.turns import TurnEvalConfig, evaluate_turns_file
from test_turn_eval import turn, write_turns


def test_the_context_is_the_smallest_the_model_states(tiny_model_dir):
    from types import SimpleNamespace as NS

    from pivotrl.sampling.hf import HFSampler
    from pivotrl.sampling.pipeline import context_length

    unset = NS(model_max_length=int(1e30))  # transformers' "no limit" sentinel
    assert context_length(NS(max_position_embeddings=2048), unset) == 2048
    assert context_length(NS(n_positions=1024), NS(model_max_length=512)) == 512
    assert context_length(NS(), unset) is None and context_length() is None
    # the tiny model: 2048 positions, a tokenizer that says 4096
    assert HFSampler(tiny_model_dir).max_prompt_tokens() == 2047


def test_prompts_longer_than_the_context_are_set_aside_and_counted(tmp_path, tiny_model_dir):
    from pivotrl.sampling.hf import HFSampler
    from pivotrl.verifiers import get_verifier

    long = turn(9, 0)
    long["context"] = [{"role": "user", "content": "notes " * 2500 + "Where is order O-90?"}]
    path = write_turns(tmp_path / "eval.jsonl", [turn(0, 0), long, turn(0, 1)])
    sampler = HFSampler(tiny_model_dir)
    res = evaluate_turns_file(path, tmp_path / "r.json", sampler, get_verifier("toolcall"),
                              sampler.tokenizer, TurnEvalConfig(max_new_tokens=4))
    assert list(res["too_long"]) == ["tr9/0"] and res["too_long"]["tr9/0"] > 2047
    assert res["prompt_limit"] == 2047 and res["turns"] == 2 and res["clusters"] == 1
    only_long = write_turns(tmp_path / "long.jsonl", [long])
    with pytest.raises(ValueError, match="longer than the engine takes"):
        evaluate_turns_file(only_long, tmp_path / "r2.json", sampler, get_verifier("toolcall"),
                            sampler.tokenizer, TurnEvalConfig(max_new_tokens=4))


def test_the_hf_profiler_sets_an_over_long_prompt_aside(tmp_path, tiny_model_dir):
    from pivotrl.io.records import Profile, iter_valid, rejects_path
    from pivotrl.profile.loop import ProfileConfig
    from pivotrl.profile.runs import profile_file
    from pivotrl.sampling.hf import HFSampler
    from pivotrl.verifiers import get_verifier

    long = turn(9, 0)
    long["context"] = [{"role": "user", "content": "notes " * 2500 + "Where is order O-90?"}]
    path = write_turns(tmp_path / "turns.jsonl", [turn(0, 0), long])
    sampler, out = HFSampler(tiny_model_dir), tmp_path / "profile.jsonl"
    doc = profile_file(path, out, sampler, get_verifier("toolcall"), sampler.tokenizer,
                       ProfileConfig(k=1, max_new_tokens=2), progress=False)
    assert [p.id for p in iter_valid(out, Profile)] == ["tr0/0"]
    assert list(doc["runs"][-1]["too_long"]) == ["tr9/0"]
    assert "longer than the engine takes (2047)" in rejects_path(out).read_text()


def test_grpo_prompt_cap_defaults_to_the_context_less_the_completion_budget(tmp_path, tiny_model_dir):
    from pivotrl.train.grpo import build_prompts, prepare
    from test_train_grpo import small_config

    cfg, tok = prepare(small_config(tmp_path, tiny_model_dir, max_completion_length=48))
    assert cfg.max_prompt_length == 2048 - 48  # the tiny model's 2048 positions
    assert prepare(small_config(tmp_path, tiny_model_dir, max_prompt_length=300))[0].max_prompt_length == 300
    with pytest.raises(ValueError, match="no room for a prompt"):
        prepare(small_config(tmp_path, tiny_model_dir, max_completion_length=2048))
    from pivotrl.io.records import Turn

    long = turn(9, 0)
    long["context"] = [{"role": "user", "content": "notes " * 2500 + "Where is order O-90?"}]
    rows = build_prompts([Turn.model_validate(turn(0, 0)), Turn.model_validate(long)], tok,
                         cfg.max_prompt_length, cfg.chat_template_kwargs)
    assert [r["id"] for r in rows.rows] == ["tr0/0"]
    assert rows.dropped[0][0] == "tr9/0" and "max_prompt_length 2000" in rows.dropped[0][1]


@pytest.mark.gpu
def test_evaluate_turns_with_vllm_sets_over_long_prompts_aside(tmp_path, tiny_model_dir):
    pytest.importorskip("vllm")
    import json

    from typer.testing import CliRunner

    from pivotrl.cli import app

    long = turn(9, 0)
    long["context"] = [{"role": "user", "content": "notes " * 400 + "Where is order O-90?"}]
    path = write_turns(tmp_path / "eval.jsonl", [turn(0, 0), long, turn(1, 0)])
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["evaluate", "--turns", str(path), "--model", str(tiny_model_dir), "--out",
                                   str(out), "--backend", "vllm", "--max-model-len", "256"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert list(doc["too_long"]) == ["tr9/0"] and doc["turns"] == 2 and doc["prompt_limit"] == 255
