"""`pivotrl import nemo-gym` reads NeMo-Gym's terminus_judge rows (tests/fixtures/nemo_gym/
terminus_judge.jsonl; terminus_judge.md says where each field comes from) as Terminus-2 turns,
with the source trajectory's id for the split; such turns are not exported back as message rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.export import export_file, import_nemo_gym
from pivotrl.io.empty import EmptyResultError
from pivotrl.io.records import Turn, iter_valid, rejects_path, write_atomic
from pivotrl.io.split import split_path
from pivotrl.formats.actions import parse_completion
from pivotrl.scoring import score_completions
from pivotrl.verifiers import get_verifier

ROWS = Path(__file__).resolve().parent / "fixtures" / "nemo_gym" / "terminus_judge.jsonl"


def _rows() -> list[dict]:
    return [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]


def test_cli_import_gives_terminus_turns_with_their_ids(tmp_path):
    out = tmp_path / "turns.jsonl"
    result = CliRunner().invoke(app, ["import", "nemo-gym", str(ROWS), "--out", str(out)])
    assert result.exit_code == 0, result.output
    turns = {t.id: t for t in iter_valid(out, Turn)}
    assert sorted(turns) == ["tj-example-1", "tp-a-0", "tp-a-2", "tp-b-1"]
    # every row is a turn or a reject with its reason: the terminus_1 row names its field
    rejects = [json.loads(line) for line in rejects_path(out).open()]
    assert [(r["line"], r["field"]) for r in rejects] == [(2, "metadata.harness")]
    assert "'terminus_1'" in rejects[0]["reason"]
    # a NeMo-Gym example row: its own trajectory; the Terminal-Pivot fields place the others
    assert (turns["tj-example-1"].trajectory_id, turns["tj-example-1"].turn) == ("tj-example-1", 0)
    assert [(turns[i].trajectory_id, turns[i].turn) for i in ("tp-a-0", "tp-a-2", "tp-b-1")] == [
        ("traj-a", 0), ("traj-a", 2), ("traj-b", 1)]
    for row in _rows():
        if row["uuid"] in turns:
            turn = turns[row["uuid"]]
            assert turn.metadata["action_format"] == "terminus_2"
            assert turn.expected.role == "assistant" and turn.expected.content == row["expected_answer"]
            assert [m.content for m in turn.context] == [
                m["content"] for m in row["responses_create_params"]["input"]]
            assert turn.metadata["nemo_gym"]["agent_ref"] == row["agent_ref"]
    assert turns["tp-a-2"].metadata["nemo_gym"]["row"]["task_name"] == "count-lines-a"


def test_the_split_keeps_a_source_trajectory_together(tmp_path):
    out = tmp_path / "turns.jsonl"
    result = CliRunner().invoke(app, ["import", "nemo-gym", str(ROWS), "--out", str(out),
                                      "--eval-fraction", "0.34", "--seed", "3"])
    assert result.exit_code == 0, result.output
    split = json.loads(split_path(out).read_text())
    assert sorted(split["train"] + split["eval"]) == ["tj-example-1", "traj-a", "traj-b"]
    assert len(split["eval"]) == 1
    train = list(iter_valid(out, Turn))
    held = list(iter_valid(out.with_name("turns.eval.jsonl"), Turn))
    assert {t.trajectory_id for t in held} == set(split["eval"])
    assert not {t.trajectory_id for t in train} & set(split["eval"])
    assert sum(t.trajectory_id == "traj-a" for t in train + held) == 2


def test_bad_terminus_rows_are_rejected_naming_the_field(tmp_path):
    good = _rows()[0]

    def variant(**changes):
        row = json.loads(json.dumps(good))
        for path, value in changes.items():
            *parents, key = path.split("__")
            target = row
            for p in parents:
                target = target[p]
            if value is None:
                del target[key]
            else:
                target[key] = value
        return row

    bad = [variant(expected_answer=good["expected_answer"] + "\nextra text"),
           variant(expected_answer=json.dumps({"analysis": "", "plan": "",
                                               "commands": [{"keystrokes": 1}]})),
           variant(expected_answer={"analysis": ""}),
           variant(metadata__harness=None),
           variant(metadata__source_trajectory_uid={"id": 1}),
           variant(metadata__pivot_agent_turn_index=-1),
           variant(responses_create_params__input=[])]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in [good, *bad]))
    out = tmp_path / "turns.jsonl"
    summary = import_nemo_gym(rows, out)
    assert (summary.read, summary.written) == (8, 1)
    fields = [r.field for r in summary.rejects]
    assert fields == ["expected_answer", "expected_answer", "expected_answer", "metadata.harness",
                      "metadata.source_trajectory_uid", "metadata.pivot_agent_turn_index",
                      "responses_create_params.input"]
    assert "text after the JSON object" in summary.rejects[0].reason
    assert "keystrokes" in summary.rejects[1].reason


def test_imported_turns_are_scored_by_identity_and_not_exported_as_messages(tmp_path):
    out = tmp_path / "turns.jsonl"
    import_nemo_gym(ROWS, out)
    turn = next(t for t in iter_valid(out, Turn) if t.id == "tj-example-1")
    expert = json.loads(turn.expected.content)
    surplus = {**expert, "commands": expert["commands"] + [{"keystrokes": "rm -rf /app\n"}]}
    scores = score_completions(get_verifier("toolcall"), [turn] * 2,
                               [json.dumps(expert), json.dumps(surplus)], parse_completion)
    assert [s.reward for s in scores] == [1.0, 0.0]
    # NeMo-Gym's argument-comparison server pays any chat message: no such row is written
    src = tmp_path / "one.jsonl"
    write_atomic(src, [turn])
    with pytest.raises(EmptyResultError):  # no row written; the rejects file says why
        export_file(src, tmp_path / "rows.jsonl", "nemo-gym")
    rejects = [json.loads(line) for line in rejects_path(tmp_path / "rows.jsonl").open()]
    assert rejects[0]["field"] == "metadata.action_format"
    assert "any message scores 1" in rejects[0]["reason"]
