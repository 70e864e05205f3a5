"""The README's marked shell blocks (`<!-- test: run -->` before a ```bash fence) run as written on
examples/, one after the other, through the same command line, and give a non-empty result: pivots,
a trained PivotRL model, an SFT baseline on the train side of the same split, E2E RL, and turn
accuracy on the held-out turns.

What the test changes, so that the run fits the suite, is written once in FAST: fewer samples and
steps per verb (a flag given again on the command line wins, as in click). Everything else is the
README's text: a new line in a marked block is run, and a line the test cannot run fails it."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- test: run -->"
FAST = {  # verb -> flags appended to every README line of that verb
    "profile": ["--k", "4"],
    "train": ["--num-generations", "4", "--max-completion-length", "48", "--save-steps", "1",
              "--progress-seconds", "0"],
    "sft": ["--save-steps", "1", "--progress-seconds", "0"],
    # No evaluate flags: the PivotRL model is scored with the budget it trained with (48, its
    # template_settings.json) and the README scores the SFT model, which records none, as it was.
    "e2e": ["--num-generations", "2", "--tasks-per-step", "1", "--max-turns", "3", "--save-steps", "1",
            "--progress-seconds", "0"],
}
TRAINERS = ("train", "sft", "e2e")


def marked_blocks(text: str) -> list[list[str]]:
    """The lines of each ```bash block right after a MARK line."""
    blocks, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        assert lines[i + 1].strip() == "```bash", f"README line {i + 2}: {MARK} must precede a ```bash block"
        end = lines.index("```", i + 2)
        blocks.append(lines[i + 2:end])
    return blocks


def fast(argv: list[str]) -> list[str]:
    """README argv -> the test's: FAST flags appended; a trainer's --max-steps N becomes 3 (a
    resume continues past the first run's 2 steps), and is 2 where the README gives none."""
    verb = argv[0]
    out = list(argv)
    if verb in TRAINERS:
        if "--max-steps" in out:
            out[out.index("--max-steps") + 1] = "3"
        else:
            out += ["--max-steps", "2"]
    return out + FAST.get(verb, [])


def commands(blocks: list[list[str]]) -> list[list[str]]:
    """`pivotrl …` lines as argv (without `pivotrl`), `NAME=value` lines expanded into later ones."""
    env: dict[str, str] = {}
    out = []
    for line in (line for block in blocks for line in block):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if len(words) == 1 and re.fullmatch(r"[A-Z_]+=\S+", words[0]):
            name, value = words[0].split("=", 1)
            env[name] = value
            continue
        assert words[0] == "pivotrl", f"a marked README block runs only pivotrl commands: {line!r}"

        def expand(word: str) -> str:
            return re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: env[m.group(1)], word)

        out.append([expand(w) for w in words[1:]])
    return out


def test_the_marked_blocks_are_read_as_the_shell_would():
    blocks = marked_blocks("x\n" + MARK + "\n```bash\nM=a/b  # note\npivotrl train --model $M --x 'y z'"
                           "   # c\n\npivotrl sft --max-steps 9\n```\n```bash\npivotrl never\n```\n")
    assert commands(blocks) == [["train", "--model", "a/b", "--x", "y z"], ["sft", "--max-steps", "9"]]
    assert fast(["sft", "--max-steps", "9"])[:3] == ["sft", "--max-steps", "3"]
    with pytest.raises(AssertionError, match="only pivotrl"):
        commands([["rm -rf runs"]])


def test_readme_pipeline_and_training_run_as_written(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    blocks = marked_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 2, "README: the pipeline and the training blocks are marked to run"
    for name in ("examples", "src"):  # the README runs from the repository root
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for argv in commands(blocks):
        result = runner.invoke(app, fast(argv), env={"COLUMNS": "200"})
        assert result.exit_code == 0, f"pivotrl {' '.join(argv)}\n{result.output}"

    runs = tmp_path / "runs"
    split = json.loads((runs / "turns.split.json").read_text())
    assert split["eval"] and split["train"]
    assert (runs / "pivots.jsonl").read_text().strip(), "the example data yields pivots"
    for model in ("pivotrl", "sft", "pivotrl_random", "e2e"):
        assert (runs / model / "config.json").is_file(), model
        assert (runs / model / "train.log").read_text().strip(), model
    assert (runs / "pivotrl" / "checkpoint-3").is_dir()  # the resume line continued the first run
    assert "profile " in (runs / "profile.log").read_text()  # progress lines off a terminal
    for name in ("pivotrl", "sft"):
        assert "evaluate " in (runs / f"{name}.eval.log").read_text()
        result = json.loads((runs / f"{name}.eval.json").read_text())
        assert result["turns"] > 0 and result["split"]["turns_not_held_out"] == 0
        eval_trajectories = {json.loads(line)["trajectory_id"]
                             for line in (runs / f"{name}.eval.items.jsonl").read_text().splitlines()}
        assert eval_trajectories <= set(split["eval"])
