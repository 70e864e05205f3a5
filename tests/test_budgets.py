"""Budgets a user can see, through the CLI on tiny Qwen3 models with TRL's real chat templates:
`profile` says its token budget and warns a thinking template on CPU, its progress moves while a
chunk is sampled, a sample is told "cut" only when it was, one budget check for `profile`,
`evaluate` and `train`, and `train` / `evaluate` reuse the settings profiling / the model's own run
recorded, saying where each came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pivotrl.cli import app
from tests.test_families import make_tokenizer
from tests.test_train_grpo import write_pivots


def tiny_qwen3(path: Path, template: str, context: int = 8192, stop_at_once: bool = False) -> Path:
    """A random tiny Qwen3 with TRL's `template`; `stop_at_once`: every token ends a sample (the
    generation config names them all), so a sample is one token whatever its budget."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    tok = make_tokenizer(template)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=context))
    model.generation_config.eos_token_id = list(range(len(tok))) if stop_at_once else tok.eos_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def invoke(*args, code: int = 0) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "300"})
    assert result.exit_code == code, (args[0], result.output, result.exception)
    return result.output


def samples(path: Path) -> list[dict]:
    return [s for line in path.read_text().splitlines() for s in json.loads(line)["samples"]]


def test_profile_says_its_budget_and_that_a_thinking_default_will_not_finish_on_cpu(tmp_path):
    model = tiny_qwen3(tmp_path / "m", "qwen3", stop_at_once=True)
    out = invoke("profile", write_pivots(tmp_path / "turns.jsonl", 2), "--model", model, "--k", 2,
                 "--out", tmp_path / "p.jsonl")
    assert "profile: token budget 4096 tokens per sample (the default for a thinking template)" in out
    assert "warning: a thinking template may spend all 4096 tokens" in out and "--max-new-tokens" in out
    plain = invoke("profile", tmp_path / "turns.jsonl", "--model", model, "--k", 2, "--out", tmp_path / "q.jsonl",
                   "--chat-template-kwargs", "{enable_thinking: false}")
    assert "token budget 256 tokens per sample (the default)" in plain and "warning" not in plain


def test_a_sample_is_told_cut_only_when_it_reached_the_budget(tmp_path):
    """Qwen3.5's thinking template opens <think> in the prompt: an empty answer has no </think>.
    Ended by its stop token it was not cut; stopped by the budget it was."""
    turns = write_pivots(tmp_path / "turns.jsonl", 2)
    model = tiny_qwen3(tmp_path / "m", "qwen3_5_think", stop_at_once=True)
    invoke("profile", turns, "--model", model, "--k", 2, "--out", tmp_path / "stopped.jsonl")
    stopped = samples(tmp_path / "stopped.jsonl")
    assert all(s["finish_reason"] == "stop" for s in stopped)
    assert all("raise max_new_tokens" not in s["reason"] and "not cut" in s["reason"] for s in stopped)
    model = tiny_qwen3(tmp_path / "m2", "qwen3_5_think")
    invoke("profile", turns, "--model", model, "--k", 2, "--max-new-tokens", 1, "--out", tmp_path / "cut.jsonl")
    cut = [s for s in samples(tmp_path / "cut.jsonl") if "thinking block" in s["reason"]]
    assert cut and all(s["finish_reason"] == "length" and "raise max_new_tokens" in s["reason"] for s in cut)


def test_profile_lines_move_while_one_chunk_is_sampled(tmp_path):
    model = tiny_qwen3(tmp_path / "m", "qwen3")
    out = invoke("profile", write_pivots(tmp_path / "turns.jsonl", 2), "--model", model, "--k", 2,
                 "--max-new-tokens", 400, "--progress-seconds", 0.05, "--out", tmp_path / "p.jsonl")
    waiting = [line for line in out.splitlines() if line.startswith("profile 0/2 · ")]
    # a tick before the first token (a loaded machine is slow to start) has nothing to count yet
    first = next(i for i, line in enumerate(waiting) if "tokens sampled" in line)
    waiting = waiting[first:]
    assert all("tokens sampled" in line and "– s/turn" not in line for line in waiting)
    counts = [int(line.split(" tokens sampled")[0].split(" · ")[-1].replace(",", "")) for line in waiting]
    assert counts == sorted(counts) and counts[-1] > counts[0]  # by the clock, within the one chunk


def test_profile_evaluate_and_train_share_one_budget_check(tmp_path):
    model = tiny_qwen3(tmp_path / "m", "qwen3", context=2048, stop_at_once=True)
    turns = write_pivots(tmp_path / "turns.jsonl", 2)
    train = ("train", "--pivots", turns, "--model", model, "--num-generations", 2, "--max-steps", 1,
             "--per-device-train-batch-size", 4,
             "--chat-template-kwargs", "{enable_thinking: false}")
    for args in (("profile", turns, "--model", model, "--out", tmp_path / "p.jsonl", "--max-new-tokens", 2100),
                 ("evaluate", "--model", model, "--turns", turns, "--out", tmp_path / "e.json",
                  "--max-new-tokens", 2100),
                 (*train, "--output-dir", tmp_path / "t1", "--max-completion-length", 2100)):
        out = invoke(*args, code=1)
        assert "2100 leaves no room for a prompt in the model's context of 2048 tokens" in out, args[0]
    invoke("profile", turns, "--model", model, "--out", tmp_path / "p.jsonl", "--max-new-tokens", 400, "--k", 2)
    invoke("evaluate", "--model", model, "--turns", turns, "--out", tmp_path / "e.json", "--max-new-tokens", 400)
    invoke(*train, "--output-dir", tmp_path / "t2", "--max-completion-length", 400)


def test_train_and_evaluate_use_the_settings_profiling_and_training_recorded(tmp_path):
    model = tiny_qwen3(tmp_path / "m", "qwen3", stop_at_once=True)
    turns = write_pivots(tmp_path / "turns.jsonl", 2)
    nothink = {"enable_thinking": False}
    invoke("profile", turns, "--model", model, "--k", 2, "--max-new-tokens", 5, "--out", tmp_path / "p.jsonl",
           "--chat-template-kwargs", json.dumps(nothink))
    invoke("select", tmp_path / "p.jsonl", "--out", tmp_path / "pivots.jsonl", "--strategy", "all")
    invoke("train", "--pivots", tmp_path / "pivots.jsonl", "--model", model, "--output-dir", tmp_path / "run",
           "--num-generations", 2, "--per-device-train-batch-size", 4, "--max-steps", 1)
    recorded = json.loads((tmp_path / "run" / "template_settings.json").read_text())
    assert recorded["chat_template_kwargs"] == nothink and recorded["max_new_tokens"] == 5
    assert set(recorded["settings_from"].values()) == {"profiling (the pivots' stats)", "default"}
    out = invoke("evaluate", "--model", tmp_path / "run", "--turns", turns, "--out", tmp_path / "e.json")
    assert "evaluate: token budget 5 tokens per sample (as the model's run recorded it)" in out
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["settings"]["chat_template_kwargs"] == nothink and result["settings"]["max_new_tokens"] == 5
    assert result["settings_from"]["max_new_tokens"] == "the model's template_settings.json"
    assert "warnings" not in result
    invoke("evaluate", "--model", tmp_path / "run", "--turns", turns, "--out", tmp_path / "f.json",
           "--max-new-tokens", 3)
    told = json.loads((tmp_path / "f.json").read_text())
    assert told["settings"]["max_new_tokens"] == 3 and told["settings_from"]["max_new_tokens"] == "flags"
