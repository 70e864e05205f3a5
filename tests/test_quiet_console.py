"""A quiet console: the verbs show pivotrl's own progress lines; TRL's and transformers' log dicts
go to the run's log file and the libraries' progress bars (loading, saving, dataset building) are
off, through the CLI on the tiny model."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from pivotrl.cli import app
from tests.test_train_grpo import write_pivots
from tests.test_train_sft import write_trajectories

LIBRARY_NOISE = ("{'loss'", "'learning_rate'", "Writing model shards", "Generating train split",
                 "Loading weights", "it/s]")


def invoke(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "300"})
    assert result.exit_code == 0, (args[0], result.output, result.exception)
    return result.output


def assert_quiet(output: str) -> None:
    noise = [n for n in LIBRARY_NOISE if n in output]
    assert not noise, (noise, output)


def test_train_sft_and_evaluate_show_pivotrl_lines_only(tmp_path, tiny_model_dir):
    common = ("--model", tiny_model_dir, "--max-steps", 3, "--logging-steps", 1, "--progress-seconds", 0)
    out = invoke("sft", "--data", write_trajectories(tmp_path / "t.jsonl", 4), "--output-dir", tmp_path / "sft",
                 "--per-device-train-batch-size", 2, *common)
    assert_quiet(out)
    assert "step 3/3 · " in out and "loss" in out.split("step 3/3 · ")[1].splitlines()[0]
    log = (tmp_path / "sft" / "train.log").read_text()
    assert log.count('"loss"') >= 3  # every logged step's dict, in the log file

    pivots = write_pivots(tmp_path / "pivots.jsonl", 4)
    out = invoke("train", "--pivots", pivots, "--output-dir", tmp_path / "grpo", "--num-generations", 2,
                 "--max-completion-length", 4, *common)
    assert_quiet(out)
    assert "step 3/3 · " in out and "reward" in out.split("step 3/3 · ")[1].splitlines()[0]
    dicts = [line for line in (tmp_path / "grpo" / "train.log").read_text().splitlines() if '"reward"' in line]
    assert len(dicts) >= 3 and json.loads(dicts[0].split(" ", 4)[4])["reward"] is not None

    out = invoke("evaluate", "--model", tmp_path / "grpo", "--turns", pivots, "--out", tmp_path / "e.json")
    assert_quiet(out)
    assert "turn acc" in out
