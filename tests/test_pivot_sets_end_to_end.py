"""The four released pivot sets, each as a fixture in its published schema (tests/fixtures/nemo_gym/;
the .md beside a fixture says where each field comes from), go `pivotrl import nemo-gym` →
`select` (on the rows' pass rates, or refused with "profile first" and then on `pivotrl profile`'s)
→ `train` one step to a model folder, split by trajectory; the import summary names each row
kind, the verifier rule that scores it, and what was rejected.

- Nemotron-RL-Agentic conversational (nvidia_pivot.jsonl): `<model>_info.rewards`, `trajectory_id`.
- Nemotron-RL-Agentic-SWE-Pivot-v1 (swe_pivot_v1.jsonl): `pass_rate_*` of 8, `metadata.instance_id`
  (the trajectory for the split), no trajectory_id.
- Nemotron-RL-Agentic-Terminal-Pivot-v1 (terminus_judge.jsonl): Terminus-2 rows, unprofiled,
  `metadata.source_trajectory_uid`.
- Function-Calling-Pivot-v1 (function_calling_pivot.jsonl): `info{turn,step,depth}`, unprofiled.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.io.records import Profile, Turn, iter_valid

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nemo_gym"
ARGS = "toolcall: argument rules"
MESSAGE = "toolcall: message rules"

SETS = {
    "conversational": dict(
        rows="nvidia_pivot.jsonl", profiled=True, trajectories={"146", "992"},
        kinds={("tool call", ARGS): 3, ("message", MESSAGE): 1}),
    "swe": dict(
        rows="swe_pivot_v1.jsonl", profiled=True,
        # no trajectory_id: the task's `metadata.instance_id` groups its pivots
        trajectories={"acme__util-101", "acme__cfg-7"},
        kinds={("tool call", ARGS): 2, ("editor call", "toolcall: edits by effect"): 2}),
    "terminal": dict(
        rows="terminus_judge.jsonl", profiled=False, trajectories={"tj-example-1", "traj-a", "traj-b"},
        kinds={("terminus_2", "terminus_identity"): 4, ("terminus_judge (terminus_1)", "rejected"): 1}),
    "function_calling": dict(
        rows="function_calling_pivot.jsonl", profiled=False, trajectories={"501", "502"},
        kinds={("tool call", ARGS): 3, ("message", MESSAGE): 1}),
}


def invoke(*args, code: int = 0) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "300"})
    assert result.exit_code == code, (args[:2], result.output, result.exception)
    return result.output


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", list(SETS))
def test_pivot_set_imports_selects_and_trains(name, tmp_path, tiny_model_dir):
    spec = SETS[name]
    rows = FIXTURES / spec["rows"]
    turns = tmp_path / "turns.jsonl"
    out = invoke("import", "nemo-gym", rows, "--out", turns, "--eval-fraction", "0.5")

    # the summary: per row kind, how many were read and which verifier rule scores them
    for (kind, verifier), n in spec["kinds"].items():
        label = f"kind {kind}: rejected" if verifier == "rejected" else f"kind {kind}: verified by {verifier}"
        assert any(label in line and line.rstrip(" │").endswith(f" {n}") for line in out.splitlines()), (label, out)
    from pivotrl.export import import_nemo_gym
    summary = import_nemo_gym(rows, tmp_path / "again.jsonl")
    assert dict(summary.by_kind) == spec["kinds"]
    assert summary.read == len(_rows(spec["rows"])) and summary.written == sum(
        n for (_, v), n in spec["kinds"].items() if v != "rejected")

    # the split is by trajectory: every trajectory wholly on one side
    split = json.loads((tmp_path / "turns.split.json").read_text())
    assert set(split["train"]) | set(split["eval"]) == spec["trajectories"]
    assert not set(split["train"]) & set(split["eval"]) and split["train"] and split["eval"]
    record = Profile if spec["profiled"] else Turn
    train_side = list(iter_valid(turns, record))
    eval_side = list(iter_valid(tmp_path / "turns.eval.jsonl", record))
    assert {t.trajectory_id for t in train_side} == set(split["train"])
    assert {t.trajectory_id for t in eval_side} == set(split["eval"])

    pivots = tmp_path / "pivots.jsonl"
    if spec["profiled"]:  # the rows' own pass rates: select needs no profiling
        out = invoke("select", turns, "--out", pivots, "--no-plot")
        assert "profiled by" in out
        kept = list(iter_valid(pivots, Profile))
        assert kept and [p.id for p in kept] == [p.id for p in train_side if 0 < p.reward_mean < 0.75]
    else:  # no pass rates: select refuses, naming the profiling they need
        out = invoke("select", turns, "--out", pivots, "--no-plot", code=1)
        assert "this is a file of turns, not profiles; run `pivotrl profile` on it first" in out, out
        profile = tmp_path / "profile.jsonl"
        invoke("profile", turns, "--model", tiny_model_dir, "--k", 2, "--max-new-tokens", 4,
               "--out", profile, "--no-progress")
        profiles = list(iter_valid(profile, Profile))
        assert [p.id for p in profiles] == [t.id for t in train_side]
        # the tiny random policy rarely has mixed outcomes: then every profiled turn is kept
        mixed = any(0 < p.reward_mean < 1 for p in profiles)
        invoke("select", profile, "--out", pivots, "--no-plot", *(() if mixed else ("--strategy", "all")))
        assert list(iter_valid(pivots, Profile))

    run = tmp_path / "run"
    invoke("train", "--pivots", pivots, "--model", tiny_model_dir, "--output-dir", run, "--max-steps", 1,
           "--num-generations", 2, "--per-device-train-batch-size", 2, "--max-completion-length", 8,
           "--save-steps", 10)
    metrics = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in metrics] == [1]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(run).config.vocab_size > 0
