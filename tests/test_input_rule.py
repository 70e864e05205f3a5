"""The input rule, through the command line: a verb never deletes or overwrites what it was given as
input (the same path, a folder holding it, a folder it lies in, a symlink or a hard link to it);
`--overwrite` clears only what a run wrote; `select` and `evaluate` never replace a used output
silently; a resumed run refuses inputs that changed since it started; a crashed run's leftovers
never block `--overwrite`."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.extract import extract_file

BASE = Path(__file__).resolve().parents[1] / "src/pivotrl_testbed/testbed/shipped_base/base"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples/trajectories.jsonl"
TINY_TRAIN = ["--max-steps", "1", "--save-steps", "1", "--num-generations", "2",
              "--per-device-train-batch-size", "2", "--max-completion-length", "4"]


def run(*args) -> tuple[int, str]:
    res = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})
    return res.exit_code, " ".join(res.output.split())


def tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` (links as their targets) → its sha256: what byte-identical means."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def data(tmp_path) -> Path:
    """Two example trajectories and their turns (the turns serve as pivots: train reads Turns)."""
    trajectories = tmp_path / "trajectories.jsonl"
    trajectories.write_text("".join(EXAMPLES.read_text().splitlines(keepends=True)[:2]))
    extract_file(trajectories, tmp_path / "pivots.jsonl")
    return tmp_path


def finished_run(folder: Path) -> Path:
    """A folder as a finished run leaves it: a model folder (config.json, weights, tokenizer) with
    the run's metrics and checkpoint: what a user continues from with `--model`."""
    shutil.copytree(BASE, folder)
    shutil.copytree(BASE, folder / "checkpoint-1")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    return folder


VERBS = {  # verb → its data flag and the data file (in `data`)
    "train": ("--pivots", "pivots.jsonl"),
    "sft": ("--data", "trajectories.jsonl"),
    "e2e": ("--tasks", "trajectories.jsonl"),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_overwrite_onto_the_model_folder_leaves_it_byte_identical(verb, data):
    flag, name = VERBS[verb]
    model = finished_run(data / "run")
    before = tree(model)
    code, out = run(verb, flag, data / name, "--model", model, "--output-dir", model, "--overwrite")
    assert code == 2 and "same file as input" in out and str(model) in out, out
    assert tree(model) == before


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_an_input_inside_the_output_folder_survives_overwrite(verb, data):
    flag, name = VERBS[verb]
    run_dir = finished_run(data / "run")
    inside = run_dir / name
    shutil.copy(data / name, inside)  # the data file kept beside the run, as users do
    before = tree(run_dir)
    code, out = run(verb, flag, inside, "--model", BASE, "--output-dir", run_dir, "--overwrite")
    assert code == 2 and f"output folder {run_dir} holds the input {inside}" in out, out
    assert tree(run_dir) == before
    # a checkpoint of the run as the model: inside the output folder too
    code, out = run(verb, flag, data / name, "--model", run_dir / "checkpoint-1", "--output-dir", run_dir,
                    "--overwrite")
    assert code == 2 and "holds the input" in out, out
    assert tree(run_dir) == before


def test_train_into_its_model_folder_or_a_link_to_it_is_refused(data):
    model = finished_run(data / "model")
    before = tree(model)
    code, out = run("train", "--pivots", data / "pivots.jsonl", "--model", model,
                    "--output-dir", model / "continued", *TINY_TRAIN)
    assert code == 2 and f"inside the input folder {model}" in out, out
    link = data / "link"
    link.symlink_to(model, target_is_directory=True)
    code, out = run("train", "--pivots", data / "pivots.jsonl", "--model", model, "--output-dir", link,
                    "--overwrite")
    assert code == 2 and "same file as input" in out, out
    assert tree(model) == before and not (model / "continued").exists()


@pytest.mark.parametrize("argv", [
    ["select", "{d}/p.jsonl", "--out", "{d}"],                    # an output folder holding the input
    ["extract", "{d}/p.jsonl", "--out", "{d}"],
    ["export", "{d}/p.jsonl", "--format", "nemo-gym", "--out", "{d}"],
    ["import", "nemo-gym", "{d}/p.jsonl", "--out", "{d}"],
    ["evaluate", "--model", "{m}", "--turns", "{d}/p.jsonl", "--out", "{m}/result.json"],  # inside the model
    ["profile", "{d}/p.jsonl", "--model", "{m}", "--out", "{m}/profile.jsonl"],
    ["compare", "--model", "{m}", "--model", "{m}", "--turns", "{d}/p.jsonl", "--out", "{m}/c.json"],
    ["testbed", "evaluate", "--model", "{m}", "--testbed", "{d}", "--out", "{d}/r.json"],
    ["evaluate", "--model", "{m}", "--turns", "{d}/r.log", "--out", "{d}/r.json", "--overwrite"],  # its log
])
def test_no_file_verb_writes_where_its_inputs_are(tmp_path, argv):
    d, m = tmp_path / "in", tmp_path / "model"
    shutil.copytree(BASE, m)
    d.mkdir()
    for name in ("p.jsonl", "r.log"):
        (d / name).write_text('{"id": "keep me"}\n')
    before = {**tree(d), **tree(m)}
    code, out = run(*[a.format(d=d, m=m) for a in argv])
    assert code == 2 and any(w in out for w in ("holds the input", "inside the input folder", "same file")), out
    assert {**tree(d), **tree(m)} == before


# ---------------------------------------------------------------- used outputs: select, evaluate


def profiles(path: Path, outcomes: list[list[float]]) -> Path:
    from pivotrl.io.records import Sample, Turn
    from pivotrl.profile.loop import make_profile

    rows = [make_profile(Turn.model_validate({"id": f"t{i}/1", "trajectory_id": f"t{i}", "turn": 1,
                                              "context": [{"role": "user", "content": f"q{i}"}],
                                              "expected": {"role": "assistant", "content": f"a{i}"}}),
                         [Sample(completion="", reward=r, valid=True) for r in rewards])
            for i, rewards in enumerate(outcomes)]
    path.write_text("".join(json.dumps(p.model_dump(mode="json")) + "\n" for p in rows))
    return path


def test_select_refuses_to_replace_a_used_pivots_file(tmp_path):
    profile = profiles(tmp_path / "profile.jsonl", [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    pivots = tmp_path / "pivots.jsonl"
    assert run("select", profile, "--out", pivots, "--no-plot")[0] == 0
    kept = pivots.read_text()
    code, out = run("select", profile, "--out", pivots, "--no-plot", "--strategy", "all")
    assert code == 1 and f"{pivots} already holds 2 lines" in out and "--overwrite" in out, out
    assert "--resume" not in out and pivots.read_text() == kept
    assert run("select", profile, "--out", pivots, "--no-plot", "--strategy", "all", "--overwrite")[0] == 0
    assert len(pivots.read_text().splitlines()) == 4


def test_evaluate_refuses_to_replace_a_used_result(data):
    turns = data / "pivots.jsonl"
    result = data / "result.json"
    result.write_text('{"accuracy": 0.5}\n')
    stale = data / "result.items.jsonl"
    stale.write_text('{"id": "from the earlier run"}\n')
    base = ["evaluate", "--model", BASE, "--turns", turns, "--out", result, "--max-new-tokens", "2"]
    code, out = run(*base)
    assert code == 1 and "already holds 1 lines" in out and "--overwrite" in out, out
    assert result.read_text() == '{"accuracy": 0.5}\n' and stale.exists()
    code, out = run(*base, "--overwrite")
    assert code == 0, out
    assert json.loads(result.read_text())["turns"] == len(turns.read_text().splitlines())
    assert "from the earlier run" not in stale.read_text()


# ---------------------------------------------------------------- a run's folder: resume, overwrite


def test_resume_refuses_changed_pivots_and_overwrite_keeps_what_no_run_wrote(data):
    """A real 1-step run: --resume on a changed pivots file is refused naming it; --overwrite
    then replaces the run's files and keeps the user's note beside them."""
    pivots, run_dir = data / "pivots.jsonl", data / "run"
    train = ["train", "--pivots", pivots, "--model", BASE, "--output-dir", run_dir, *TINY_TRAIN]
    code, out = run(*train)
    assert code == 0, out
    record = json.loads((run_dir / "pivotrl_run.json").read_text())
    assert record["inputs"]["pivots"][0]["sha256"] == hashlib.sha256(pivots.read_bytes()).hexdigest()
    assert {"checkpoint-1", "metrics.jsonl", "model.safetensors", "config.json"} <= set(record["wrote"])
    (run_dir / "notes.md").write_text("my notes\n")
    pivots.write_text("".join(pivots.read_text().splitlines(keepends=True)[:-1]))  # a pivot fewer
    before = tree(run_dir)
    code, out = run(*train, "--resume", "--max-steps", "2")
    assert code == 2 and f"pivots {pivots} is not the file this run started on" in out, out
    assert tree(run_dir) == before
    code, out = run(*train, "--overwrite")
    assert code == 0, out
    assert (run_dir / "notes.md").read_text() == "my notes\n"
    record = json.loads((run_dir / "pivotrl_run.json").read_text())
    assert record["inputs"]["pivots"][0]["sha256"] == hashlib.sha256(pivots.read_bytes()).hexdigest()
    assert "notes.md" not in record["wrote"]


@pytest.mark.parametrize("verb", ["sft", "e2e"])
def test_resume_refuses_changed_data_or_split(verb, data):
    """The run's start is recorded as the verb records it (`start_run`); the resume is refused
    before any model is loaded."""
    from pivotrl.io.run_folder import start_run

    flag, name = VERBS[verb]
    given, run_dir = data / name, data / "run"
    label = {"sft": "data", "e2e": "tasks"}[verb]
    start_run(run_dir, verb, {label: [given], "split": None}, resume=False)
    (run_dir / "checkpoint-1").mkdir()
    args = [verb, flag, given, "--model", BASE, "--output-dir", run_dir, "--resume",
            *(["--world", "toolshop"] if verb == "e2e" else [])]
    given.write_text("".join(given.read_text().splitlines(keepends=True)[:1]))
    code, out = run(*args)
    assert code == 2 and f"{label} {given} is not the file this run started on" in out, out
    start_run(run_dir, verb, {label: [given], "split": None}, resume=False)
    split = data / "trajectories.split.json"
    split.write_text(json.dumps({"fraction": 0.5, "seed": 0, "train": [], "eval": ["another-id"]}))
    code, out = run(*args, "--split", split)
    assert code == 2 and f"split {split} is not the file this run started on (the run started without it)" in out, out


def test_overwrite_clears_a_crashed_profile(data, monkeypatch):
    """A profile killed before its first record leaves an empty output beside its stats; a restart
    with other settings and --overwrite starts over instead of refusing."""
    import pivotrl.profile.runs as runs

    turns, out = data / "pivots.jsonl", data / "profile.jsonl"
    base = ["profile", turns, "--model", BASE, "--max-new-tokens", "2", "--out", out, "--no-progress"]

    def crash(*_, **__):
        raise KeyboardInterrupt  # the run stops before its first record
        yield

    with monkeypatch.context() as patch:
        patch.setattr(runs, "profile_stream", crash)
        assert run(*base, "--k", "1")[0] == 130
    assert out.read_text() == "" and (data / "profile.stats.json").exists()
    code, msg = run(*base, "--k", "2")
    assert code == 1 and "other settings" in msg and "--overwrite" in msg, msg
    code, msg = run(*base, "--k", "2", "--overwrite")
    assert code == 0, msg
    assert len(out.read_text().splitlines()) == len(turns.read_text().splitlines())
    stats = json.loads((data / "profile.stats.json").read_text())
    assert stats["settings"]["k"] == 2 and len(stats["runs"]) == 1


def test_overwrite_never_clears_a_folder_no_run_wrote(data):
    """A model folder given as the output (not as an input) is no run: --overwrite refuses it
    rather than delete the model because it holds config.json."""
    model = data / "model"
    shutil.copytree(BASE, model)
    before = tree(model)
    code, out = run("train", "--pivots", data / "pivots.jsonl", "--model", BASE, "--output-dir", model,
                    "--overwrite")
    assert code == 1 and "no run" in out and "deletes only what a run wrote" in out, out
    assert tree(model) == before
