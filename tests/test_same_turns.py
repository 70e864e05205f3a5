"""SFT and PivotRL train on the same turns: one length rule for both (the model's context), each
plan counts the train turns it keeps, past 5% set aside it warns and past half it refuses."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from pivotrl.cli import app
from test_train_grpo import make_turn

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trajectories.jsonl"


def run(*argv):
    return CliRunner().invoke(app, list(map(str, argv)), env={"COLUMNS": "400", "NO_COLOR": "1"})


def test_sft_caps_a_trajectory_at_the_models_context_by_default(tiny_model_dir, tmp_path):
    """The tiny model has 2,048 positions (its tokenizer says 4,096): SFT's default cap is 2,048,
    the rule `train`'s prompt cap follows, and the plan counts the train turns kept."""
    from transformers import AutoConfig, AutoTokenizer

    from pivotrl.sampling.pipeline import context_length
    from pivotrl.train.sft import build_rows

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert context_length(AutoConfig.from_pretrained(tiny_model_dir), tok) == 2048
    rows = build_rows(str(EXAMPLE), tok, 2048)
    assert rows.turns_dropped > 0 and rows.turns > 0  # the example data holds longer trajectories
    result = run("sft", "--data", EXAMPLE, "--model", tiny_model_dir, "--output-dir", tmp_path / "s", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "token budget: max_length 2048" in result.output
    assert f"train turns: {rows.turns} of {rows.turns + rows.turns_dropped} ({rows.turns_dropped} set aside)" \
        in result.output


def test_a_plan_that_sets_aside_turns_warns_and_past_half_refuses(tiny_model_dir, tmp_path):
    sft = ["sft", "--data", EXAMPLE, "--model", tiny_model_dir, "--output-dir", tmp_path / "s", "--dry-run",
           "--max-length", "1000"]
    refused = run(*sft)
    assert refused.exit_code == 2, refused.output
    assert "of the train turns would be set aside" in refused.output and "--max-dropped-fraction" in refused.output
    allowed = run(*sft, "--max-dropped-fraction", "1")
    assert allowed.exit_code == 0, allowed.output
    assert "train turns (94%) are set aside" in allowed.output

    # train: 1 pivot in 10 has a prompt past the cap — warned, not refused; 6 in 10 — refused
    for long_every, code in ((10, 0), (2, 2)):
        pivots = tmp_path / f"pivots{long_every}.jsonl"
        rows = [make_turn(i) for i in range(20)]
        for i, row in enumerate(rows):
            if i % long_every == 0 or (long_every == 2 and i == 1):
                row["context"][0]["content"] += " and where is everything else" * 40
        pivots.write_text("".join(json.dumps(r) + "\n" for r in rows))
        result = run("train", "--pivots", pivots, "--model", tiny_model_dir, "--output-dir", tmp_path / f"t{long_every}",
                     "--max-prompt-length", "400", "--max-completion-length", "8", "--num-generations", "2",
                     "--dry-run")
        assert result.exit_code == code, result.output
        kept = 18 if long_every == 10 else 9
        if code == 0:
            assert f"train turns: {kept} of 20 (2 set aside)" in result.output
            assert "2 of 20 train turns (10%) are set aside" in result.output
        else:
            assert "55% of the train turns would be set aside" in result.output


def test_the_demos_sft_rows_are_what_they_were(tmp_path):
    """The demo's model has 2,048 positions and its trajectories fit: the default cap changes none
    of its SFT rows (the cap before was 4,096)."""
    from transformers import AutoTokenizer

    from pivotrl.io.records import write_atomic
    from pivotrl.train.config import SFTRunConfig
    from pivotrl.train.sft import build_rows, with_length_cap
    from pivotrl_testbed.demo_config import DemoConfig
    from pivotrl_testbed.testbed.build import load_testbed_config
    from pivotrl_testbed.testbed.mixture import trajectories
    from pivotrl_testbed.testbed.shipped import SHIPPED

    base = SHIPPED / "base"
    tok = AutoTokenizer.from_pretrained(base)
    cap = with_length_cap(SFTRunConfig(model=str(base), data=str(EXAMPLE), output_dir=str(tmp_path / "o")),
                          tok).max_length
    assert cap == 2048
    testbed, n = load_testbed_config(None), DemoConfig().profile_trajectories
    for world in testbed.worlds:
        path = tmp_path / f"{world}.jsonl"
        write_atomic(path, trajectories(world, "train", n, testbed.expert_seed, None, 0, 1))
        # A cap only drops rows, never changes one: none dropped at 2,048 is the rows of 4,096.
        now = build_rows(str(path), tok, cap)
        assert len(now.rows) == n and not now.dropped
