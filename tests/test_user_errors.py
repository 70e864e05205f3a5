"""A user's mistake is one line that names the fix, never a traceback; Ctrl-C says how to resume.
Each case runs the real command line."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pivotrl.cli import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "trajectories.jsonl"


def run(*argv: str):
    return CliRunner().invoke(app, list(map(str, argv)), env={"COLUMNS": "400", "NO_COLOR": "1"})


def one_line_error(result, code: int, *needles: str) -> str:
    """The command exited with `code` through typer (no exception escaped) and said `needles`."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    text = " ".join(result.output.split())
    assert "Traceback" not in text
    for needle in needles:
        assert needle in text, text
    return text


@pytest.fixture(scope="module")
def pivots(tmp_path_factory):
    from pivotrl.extract import extract_file

    path = tmp_path_factory.mktemp("errors") / "pivots.jsonl"
    extract_file(EXAMPLE, path)
    return path


def test_a_mistyped_model_path(pivots, tmp_path):
    typo = "runs/pivotrl-typo/final"  # the Hub's "Repo id must be in the form…" before
    one_line_error(run("train", "--pivots", pivots, "--model", typo, "--output-dir", tmp_path / "o"),
                   2, typo, "no such folder")
    one_line_error(run("sft", "--data", EXAMPLE, "--model", typo, "--output-dir", tmp_path / "o"),
                   2, "no such folder")
    one_line_error(run("profile", pivots, "--model", typo, "--out", tmp_path / "p.jsonl"),
                   2, "no such folder")
    one_line_error(run("serve", "--model", typo), 2, "no such folder")
    one_line_error(run("evaluate", "--model", typo, "--turns", pivots, "--out", tmp_path / "r.json"),
                   2, "no such folder")


def test_a_folder_that_is_not_a_model(pivots, tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    one_line_error(run("train", "--pivots", pivots, "--model", folder, "--output-dir", tmp_path / "o"),
                   2, "not a model", "config.json")


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed")
def test_a_tracker_without_its_package_is_named_when_the_config_is_read(pivots, tmp_path):
    one_line_error(run("train", "--pivots", pivots, "--model", "m", "--output-dir", tmp_path / "o",
                       "--report-to", "tensorboard"), 2, "pip install 'pivotrl[tensorboard]'")


def test_a_model_without_a_chat_template(pivots, tiny_model_dir, tmp_path):
    bare = tmp_path / "base_model"
    shutil.copytree(tiny_model_dir, bare)
    (bare / "chat_template.jinja").unlink()
    text = one_line_error(run("profile", pivots, "--model", bare, "--k", "2", "--out", tmp_path / "p.jsonl"),
                          1, "no chat template", "chat_template.jinja")
    assert "--response-format" not in text  # setting a format renders no prompt
    one_line_error(run("train", "--pivots", pivots, "--model", bare, "--output-dir", tmp_path / "o"),
                   2, "no chat template")


def test_extract_on_a_directory_and_missing_inputs(pivots, tmp_path):
    one_line_error(run("extract", tmp_path, "--out", tmp_path / "t.jsonl"), 2, "a folder", "JSONL file")
    one_line_error(run("train", "--pivots", tmp_path / "nope.jsonl", "--model", "m",
                       "--output-dir", tmp_path / "o"), 2, "no such file", "pivotrl select")
    one_line_error(run("sft", "--data", tmp_path / "nope.jsonl", "--model", "m",
                       "--output-dir", tmp_path / "o"), 2, "no such file")
    one_line_error(run("profile", tmp_path, "--model", "m", "--out", tmp_path / "p.jsonl"), 2, "a folder")


def test_ctrl_c_in_profile_and_evaluate_says_what_to_rerun(pivots, tiny_model_dir, tmp_path, monkeypatch):
    import pivotrl.evaluate.turns
    import pivotrl.profile.runs

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pivotrl.profile.runs, "profile_file", interrupted)
    monkeypatch.setattr(pivotrl.evaluate.turns, "evaluate_turns_file", interrupted)
    one_line_error(run("profile", pivots, "--model", tiny_model_dir, "--out", tmp_path / "p.jsonl"),
                   130, f"Continue the run with: pivotrl profile {pivots}", f"--model {tiny_model_dir}", "--resume")
    one_line_error(run("evaluate", "--model", tiny_model_dir, "--turns", pivots, "--out", tmp_path / "r.json"),
                   130, "rerun the same command")


def test_empty_results_are_errors_on_the_command_line(tmp_path, tiny_model_dir):
    """Every data verb: nothing produced is exit 1 with the reason (and the flag where empty can make
    sense), never a silent 0; the flag makes a legitimately empty filter pass."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n{\"id\": 3}\n")
    one_line_error(run("extract", bad, "--out", tmp_path / "t.jsonl"), 1, "pivotrl extract:", "bad.jsonl")
    # tool-free data with --only-tool-calls: 0 turns, allowed only with --allow-empty
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"id": "c1", "messages": [{"role": "user", "content": "hi"}, '
                    '{"role": "assistant", "content": "hello"}]}\n')
    one_line_error(run("extract", chat, "--out", tmp_path / "c.jsonl", "--only-tool-calls"), 1, "--allow-empty")
    assert run("extract", chat, "--out", tmp_path / "c2.jsonl", "--only-tool-calls", "--allow-empty").exit_code == 0
    # a profile where every turn is all-fail: 0 pivots
    profile = tmp_path / "profile.jsonl"
    turn = {"id": "c1/1", "trajectory_id": "c1", "turn": 1, "context": [{"role": "user", "content": "hi"}],
            "expected": {"role": "assistant", "content": "hello"}, "k": 2,
            "samples": [{"completion": "x", "reward": 0.0, "valid": True}] * 2, "reward_mean": 0.0, "reward_std": 0.0}
    import json
    profile.write_text(json.dumps(turn) + "\n")
    one_line_error(run("select", profile, "--out", tmp_path / "p.jsonl", "--no-plot"), 1, "pivotrl select:", "--allow-empty")
    assert run("select", profile, "--out", tmp_path / "p2.jsonl", "--no-plot", "--allow-empty").exit_code == 0
    # profiling the raw trajectory file instead of its turns names the step that was skipped
    one_line_error(run("profile", EXAMPLE, "--model", tiny_model_dir, "--out", tmp_path / "prof.jsonl",
                       "--no-progress"), 1, "extract")


def test_a_mistyped_verifier_is_one_line_naming_the_known_ones(pivots, tiny_model_dir, tmp_path):
    # (every example turn as a pivot: most are longer than the tiny model's context allows)
    for args in (("train", "--pivots", pivots, "--model", tiny_model_dir, "--output-dir", tmp_path / "o",
                  "--max-dropped-fraction", "1"),
                 ("profile", pivots, "--model", tiny_model_dir, "--out", tmp_path / "p.jsonl")):
        result = run(*args, "--verifier", "toolcal")
        one_line_error(result, 1, "unknown verifier 'toolcal'", "toolcall")
        assert len(result.output.strip().splitlines()[-1]) < 200  # after the run's plan, one short line


def test_sft_without_a_split_says_it_trains_on_every_trajectory(tmp_path, monkeypatch):
    import pivotrl.train.sft as sft

    monkeypatch.setattr(sft, "train_sft", lambda cfg, **_: {"held_out": "none"})
    result = run("sft", "--data", EXAMPLE, "--model", "m", "--output-dir", tmp_path / "o")
    text = " ".join(result.output.split())
    assert result.exit_code == 0 and "no split (--split): every trajectory" in text
    split = tmp_path / "turns.split.json"
    split.write_text(json.dumps({"fraction": 0.2, "seed": 0, "train": [], "eval": []}))
    given = run("sft", "--data", EXAMPLE, "--model", "m", "--output-dir", tmp_path / "o", "--split", split)
    assert given.exit_code == 0 and "no split" not in given.output
