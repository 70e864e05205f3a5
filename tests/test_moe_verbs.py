"""A Qwen3-MoE whose config asks for router logits (`output_router_logits: true`, as MoE checkpoints
ship) through every verb that loads a model, in-process through the CLI: generation runs with the
router logits off (the load-balancing loss cannot be computed over a padded, cached batch), the
loss keeps TRL's load-balancing term (`aux_loss` in metrics.jsonl), and every trained model's
config.json is its base's except for the keys train/saved_config.py lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.train.saved_config import SAVED_CONFIG_KEYS, config_differences

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "trajectories.jsonl"
TRAINED_KEYS = {k for k, (rule, _) in SAVED_CONFIG_KEYS.items() if rule == "trained"}


def tiny_moe(tokenizer_dir: Path, out: Path, router_logits: bool) -> Path:
    from transformers import AutoConfig, AutoTokenizer

    from pivotrl_testbed.testbed.architectures import save_tiny_arch

    path = save_tiny_arch("qwen3_moe", AutoTokenizer.from_pretrained(tokenizer_dir), out)
    config = AutoConfig.from_pretrained(path)
    config.output_router_logits = router_logits
    config.save_pretrained(path)
    return path


def invoke(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (args[0], result.output, result.exception)
    return result.output


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_config_is_the_bases(base: Path, run: Path) -> None:
    changed = config_differences(base, run)
    assert set(changed) <= TRAINED_KEYS, changed


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Four example toolshop trajectories of 3 turns, one held out: their turns, the split and the
    raw file. One world's prompts share a long prefix (its system prompt and tools), which the
    sampler prefills once for the batch: the cached path that met the router logits."""
    root = tmp_path_factory.mktemp("moe_data")
    keep = {"toolshop-0.0", "toolshop-4.0", "toolshop-7.0", "toolshop-12.0"}
    lines = [line for line in EXAMPLES.read_text().splitlines(True) if json.loads(line)["id"] in keep]
    (root / "trajectories.jsonl").write_text("".join(lines))
    invoke("extract", root / "trajectories.jsonl", "--out", root / "turns.jsonl", "--eval-fraction", "0.25")
    return root


def test_moe_with_router_logits_on_runs_every_verb(tmp_path, tiny_model_dir, data):
    base = tiny_moe(tiny_model_dir, tmp_path / "base", router_logits=True)
    budget = ("--max-new-tokens", 6)
    invoke("profile", data / "turns.jsonl", "--model", base, "--k", 2, *budget, "--out", tmp_path / "p.jsonl")
    profiles = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert profiles and all(len(p["samples"]) == 2 for p in profiles)
    invoke("select", tmp_path / "p.jsonl", "--out", tmp_path / "pivots.jsonl", "--strategy", "all")
    runs = {}
    for mode in ("--shared-rollouts", "--no-shared-rollouts"):
        runs[mode] = tmp_path / mode.strip("-")
        invoke("train", "--pivots", tmp_path / "pivots.jsonl", "--model", base, "--output-dir", runs[mode],
               "--max-steps", 1, "--num-generations", 2, "--max-completion-length", 6, mode)
        (row,) = metrics(runs[mode])
        assert row["aux_loss"] > 0  # the load-balancing loss is still in the GRPO loss
        assert_config_is_the_bases(base, runs[mode])
    invoke("sft", "--data", data / "trajectories.jsonl", "--split", data / "turns.split.json", "--model", base,
           "--output-dir", tmp_path / "sft", "--max-steps", 1, "--per-device-train-batch-size", 2)
    assert metrics(tmp_path / "sft")[0]["aux_loss"] > 0
    assert_config_is_the_bases(base, tmp_path / "sft")
    invoke("e2e", "--tasks", data / "trajectories.jsonl", "--split", data / "turns.split.json", "--model", base,
           "--output-dir", tmp_path / "e2e", "--max-steps", 1, "--tasks-per-step", 1, "--num-generations", 2,
           "--max-turns", 1, "--max-completion-length", 6)
    assert_config_is_the_bases(base, tmp_path / "e2e")
    eval_turns = data / "turns.eval.jsonl"
    invoke("evaluate", "--model", tmp_path / "sft", "--turns", eval_turns, "--out", tmp_path / "sft.json", *budget)
    assert json.loads((tmp_path / "sft.json").read_text())["turns"] == 3
    invoke("compare", "--model", base, "--model", runs["--shared-rollouts"], "--turns", eval_turns,
           "--out", tmp_path / "compare.json", *budget)
    assert (tmp_path / "compare.json").exists()


def test_sft_saves_the_bases_router_setting(tmp_path, tiny_model_dir, data):
    """TRL's SFTTrainer turns `output_router_logits` on for its loss; the saved model and its
    checkpoints keep the base's `false`, and the load-balancing loss it trained with is in
    metrics.jsonl."""
    base = tiny_moe(tiny_model_dir, tmp_path / "base", router_logits=False)
    invoke("sft", "--data", data / "trajectories.jsonl", "--split", data / "turns.split.json", "--model", base,
           "--output-dir", tmp_path / "sft", "--max-steps", 1, "--per-device-train-batch-size", 2)
    for saved in (tmp_path / "sft", tmp_path / "sft" / "checkpoint-1"):  # the final model and a checkpoint
        assert json.loads((saved / "config.json").read_text())["output_router_logits"] is False
        assert_config_is_the_bases(base, saved)
    assert metrics(tmp_path / "sft")[0]["aux_loss"] > 0
