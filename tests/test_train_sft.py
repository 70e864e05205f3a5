"""`pivotrl sft`: TRL SFTTrainer on the same trajectories, loss on assistant tokens only."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

from pivotrl.io.records import Trajectory

TOOLS = [{"type": "function", "function": {"name": "get_order", "parameters": {
    "type": "object", "properties": {"order_id": {"type": "string"}, "verbose": {"type": "boolean"}}}}}]


def trajectory(i: int) -> dict:
    # Two calls with differently keyed arguments: Arrow would merge them into one struct.
    args = {"order_id": f"O-{i}"} if i % 2 else {"order_id": f"O-{i}", "verbose": True}
    return {"id": f"tr{i}", "tools": TOOLS, "messages": [
        {"role": "user", "content": f"Where is O-{i}?"},
        {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function", "function": {
            "name": "get_order", "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": "c0", "content": '{"status": "shipped"}'},
        {"role": "assistant", "content": "It has shipped."}]}


def write_trajectories(path: Path, n: int, bad_line: bool = False) -> Path:
    lines = [json.dumps(trajectory(i)) for i in range(n)] + (["{not json"] if bad_line else [])
    path.write_text("\n".join(lines) + "\n")
    return path


def test_labels_mask_everything_but_assistant_tokens(tiny_model_dir):
    from transformers import AutoTokenizer

    from pivotrl.train.sft import tokenize_trajectory

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    row = tokenize_trajectory(tok, Trajectory.model_validate(trajectory(2)))
    trained = tok.decode([t for t in row["labels"] if t != -100])
    assert '"name": "get_order"' in trained and "It has shipped." in trained
    assert '"verbose": true' in trained  # arguments exactly as the expert sent them
    assert "Where is O-2" not in trained and "shipped\"}" not in trained and "get_order\", \"parameters" not in trained
    assert trained.count("<|im_end|>") == 2  # the model learns to end both of its turns
    odd = tokenize_trajectory(tok, Trajectory.model_validate(trajectory(1)))
    assert "verbose" not in tok.decode([t for t in odd["labels"] if t != -100])  # no merged null keys


def test_sft_lowers_the_loss_and_reports_rejects(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    data = write_trajectories(tmp_path / "trajectories.jsonl", 6, bad_line=True)
    run_yaml = tmp_path / "sft.yaml"
    run_yaml.write_text(yaml.safe_dump({
        "model": str(tiny_model_dir), "data": str(data), "output_dir": "sft",
        "learning_rate": 3e-3, "max_steps": 12, "per_device_train_batch_size": 6, "save_steps": 6,
        "lr_scheduler_type": "constant"}))
    result = CliRunner().invoke(app, ["sft", "--config", str(run_yaml)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "sft"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert rows[-1]["loss"] < 0.7 * rows[0]["loss"], rows
    rejects = [json.loads(line) for line in (out / "sft_data.rejects.jsonl").read_text().splitlines()]
    assert rejects[0]["where"].endswith("trajectories.jsonl:7")
    assert (out / "checkpoint-6" / "trainer_state.json").exists()
    # Every step runs all 6 trajectories forward and backward: their tokens, by hand, once a step
    # (padding not counted), and a resumed run goes on counting from its checkpoint's count.
    from transformers import AutoTokenizer

    from pivotrl.train.sft import tokenize_trajectory

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    per_step = sum(len(tokenize_trajectory(tok, Trajectory.model_validate(trajectory(i)))["input_ids"])
                   for i in range(6))
    assert [r["train_tokens"] for r in rows] == [per_step * (k + 1) for k in range(12)]
    result = CliRunner().invoke(app, ["sft", "--config", str(run_yaml), "--resume", "--max-steps", "13"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 14)) and rows[-1]["train_tokens"] == 13 * per_step
    # The final model written to output_dir is the trained one, not the starting weights.
    from transformers import AutoModelForCausalLM

    trained, start = AutoModelForCausalLM.from_pretrained(out), AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), start.parameters()))


def test_a_resumed_sft_run_is_the_uninterrupted_run(tmp_path, tiny_model_dir):
    """2 steps, then --resume to 4 (mid-epoch: 6 trajectories, 2 a step): the same batches in the
    same order as 4 straight steps, so the same metrics rows and the same weights."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from pivotrl.cli import app

    data = write_trajectories(tmp_path / "trajectories.jsonl", 6)

    def run(name: str, *flags: str) -> Path:
        run_yaml = tmp_path / f"{name}.yaml"
        run_yaml.write_text(yaml.safe_dump({
            "model": str(tiny_model_dir), "data": str(data), "output_dir": str(tmp_path / name),
            "learning_rate": 3e-3, "max_steps": 4, "per_device_train_batch_size": 2, "save_steps": 2,
            "lr_scheduler_type": "constant"}))
        result = CliRunner().invoke(app, ["sft", "--config", str(run_yaml), *flags])
        assert result.exit_code == 0, result.output
        return tmp_path / name

    def rows(run: Path) -> list[dict]:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if "time" not in k and "second" not in k} for line in lines]

    straight = run("straight")
    run("resumed", "--max-steps", "2")
    resumed = run("resumed", "--resume")
    assert rows(resumed) == rows(straight)
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
