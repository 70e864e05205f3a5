"""NVIDIA's released pivot sets (`Nemotron-RL-Agentic-*-Pivot-v1`) as a starting point: their rows
(tests/fixtures/nemo_gym/nvidia_pivot.jsonl, written in the published schema: top-level
`trajectory_id`, `meta_info`, `<model>_info` rewards, `pass_rate*`, `agent_ref`) go `import` →
`select` → `train` through the CLI with no profiling, split by trajectory."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.export.pass_rates import UNNAMED_MODEL, imported_profile
from pivotrl.io.records import Profile, Turn, iter_valid

ROWS = Path(__file__).resolve().parent / "fixtures" / "nemo_gym" / "nvidia_pivot.jsonl"


def _rows() -> list[dict]:
    return [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]


def test_nvidia_rows_import_select_train_without_profiling(tmp_path, tiny_model_dir, caplog):
    runner = CliRunner()
    turns = tmp_path / "turns.jsonl"
    r = runner.invoke(app, ["import", "nemo-gym", str(ROWS), "--out", str(turns), "--eval-fraction", "0.5"])
    assert r.exit_code == 0, r.output
    # split by the rows' own trajectory_id: each trajectory wholly on one side
    split = json.loads((tmp_path / "turns.split.json").read_text())
    assert sorted(split["train"] + split["eval"]) == ["146", "992"] and len(split["eval"]) == 1
    train_side = list(iter_valid(turns, Profile))
    eval_side = list(iter_valid(tmp_path / "turns.eval.jsonl", Profile))
    rows_of = Counter(str(row["trajectory_id"]) for row in _rows())
    assert {t.trajectory_id for t in train_side} == set(split["train"])
    assert {t.trajectory_id for t in eval_side} == set(split["eval"])
    assert len(train_side) == rows_of[split["train"][0]] and len(eval_side) == rows_of[split["eval"][0]]
    # the turn is the row's assistant ordinal; the K outcomes are the rewards list
    by_row = {(str(row["trajectory_id"]), row["meta_info"]["assistant_depth"]): row for row in _rows()}
    for profile in train_side + eval_side:
        row = by_row[profile.trajectory_id, profile.turn]
        assert [s.reward for s in profile.samples] == row["qwen_235b_info"]["rewards"]
        assert profile.k == 16 and abs(profile.reward_mean - row["qwen_235b_info"]["reward_mean"]) < 1e-9
    stats = json.loads((tmp_path / "turns.stats.json").read_text())
    assert stats["settings"]["model"] == "qwen_235b" and stats["profiles"] == 4

    pivots = tmp_path / "pivots.jsonl"
    r = runner.invoke(app, ["select", str(turns), "--out", str(pivots), "--no-plot"])
    assert r.exit_code == 0, r.output
    assert "profiled by" in r.output and "qwen_235b" in r.output
    kept = list(iter_valid(pivots, Profile))
    # NeMo-Gym's (and the paper's) guidance: mixed outcomes, not too easy; all-pass dropped
    mixed = [t for t in train_side if 0 < t.reward_mean < 0.75]
    assert [t.id for t in kept] == [t.id for t in mixed] and len(kept) < len(train_side)
    assert json.loads((tmp_path / "pivots.stats.json").read_text())["profile_settings"]["model"] == "qwen_235b"

    with caplog.at_level(logging.WARNING):
        r = runner.invoke(app, ["train", "--pivots", str(pivots), "--model", str(tiny_model_dir),
                                "--output-dir", str(tmp_path / "run"), "--max-steps", "1",
                                "--num-generations", "2", "--per-device-train-batch-size", "2",
                                "--max-completion-length", "8", "--save-steps", "10"])
    assert r.exit_code == 0, r.output
    assert any("qwen_235b" in m and "re-profile" in m for m in caplog.messages), caplog.messages
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in metrics] == [1]


def test_pass_rates_without_a_rewards_list_and_which_wins():
    row = _rows()[1]  # rewards 1 of 16, pass_rate 13 of 32: they disagree
    turn = Turn(id="x", trajectory_id="146", turn=2, context=[{"role": "user", "content": "hi"}],
                expected={"role": "assistant", "content": "hello"})
    notes: Counter = Counter()
    profile = imported_profile(turn, row, notes)
    assert profile.k == 16 and sum(s.reward for s in profile.samples) == 1  # the rewards list wins
    assert profile.metadata["imported_profile"] == {"model": "qwen_235b", "source": "qwen_235b_info.rewards"}
    assert any("differs" in note for note in notes)
    del row["qwen_235b_info"]
    profile = imported_profile(turn, row, Counter())
    assert (profile.k, sum(s.reward for s in profile.samples)) == (32, 13)
    assert profile.metadata["imported_profile"]["model"] == UNNAMED_MODEL
    for key in ("pass_rate_total", "pass_rate_passed"):
        del row[key]
    assert imported_profile(turn, row, Counter()) is turn  # no pass rates: a plain Turn
