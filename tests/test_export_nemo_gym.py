"""NeMo-Gym accepts what we export, and we read what NeMo-Gym writes.

The contract (row models, ExpectedAction, the pivot-dataset validator) is re-implemented in
tests/nemo_gym_contract.py from NeMo-Gym's sources; tests/fixtures/nemo_gym/ holds rows written in
the shapes of NeMo-Gym's own example files (full Responses dumps with ids and annotations,
function_call_batch, SWE rows keyed by uuid, ordered batches with extra row fields)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym_contract import model_errors, validator_problem
from pivotrl.export import export_file, import_nemo_gym, turn_to_nemo_gym
from pivotrl.export.gym_config import gym_config_path
from pivotrl.export.nemo_gym import items_to_messages
from pivotrl.extract import ExtractOptions, extract_file
from pivotrl.io.records import Turn, iter_valid, rejects_path, write_atomic
from test_export import _semantic, sample_turns

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "nemo_gym"
# terminus_judge rows hold `expected_answer`, not `expected_action`, and are not exported back
# (tests/test_terminus_import.py).
GYM_FILES = sorted(p for p in FIXTURES.glob("*.jsonl") if p.stem != "terminus_judge")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_contract_refuses_the_shapes_nemo_gym_refuses():
    """The re-implemented contract is not vacuous: each known-bad shape fails it."""
    good = turn_to_nemo_gym(sample_turns()[1])
    assert model_errors(good) == [] and validator_problem(good) is None
    bad_action = dict(good, expected_action={"type": "message", "output": [{"content": "x"}]})
    assert model_errors(bad_action) and validator_problem(bad_action)
    no_ref = {k: v for k, v in good.items() if k != "agent_ref"}
    assert validator_problem(no_ref) == "missing required key 'agent_ref'"
    no_id = json.loads(json.dumps(turn_to_nemo_gym(sample_turns()[0])))
    del next(i for i in no_id["responses_create_params"]["input"] if i["type"] == "reasoning")["id"]
    assert model_errors(no_id)
    extra = json.loads(json.dumps(good))
    extra["responses_create_params"]["metadata"] = {"turn": 3}  # not str -> str, and extra key
    extra["responses_create_params"]["unknown"] = 1
    assert model_errors(extra)


def test_exported_example_trajectories_pass_nemo_gym(tmp_path):
    turns = tmp_path / "turns.jsonl"
    extract_file(ROOT / "examples" / "trajectories.jsonl", turns, ExtractOptions())
    rows = tmp_path / "rows.jsonl"
    summary = export_file(turns, rows, "nemo-gym")
    assert summary.written == summary.read >= 6 and not summary.rejects
    for row in _rows(rows):
        assert model_errors(row) == [], row["id"]
        assert validator_problem(row) is None, row["id"]
    kinds = {row["expected_action"]["type"] for row in _rows(rows)}
    assert kinds == {"function_call", "message"}
    # the Gym config next to the rows: the agent block the rows name reads them and routes to an
    # argument-comparison resources server defined in the same file
    import yaml

    config = yaml.safe_load(gym_config_path(rows).read_text())
    assert summary.files == [gym_config_path(rows)]
    agent = _rows(rows)[0]["agent_ref"]["name"]
    block = config[agent]["responses_api_agents"]["tool_simulation_agent"]
    assert block["datasets"][0]["jsonl_fpath"] == str(rows.resolve())
    server = config[block["resources_server"]["name"]]["resources_servers"]
    assert "single_step_tool_use_with_argument_comparison" in server


def test_parallel_calls_are_a_batch_or_rejected(tmp_path):
    turn = sample_turns()[0].model_copy(deep=True)
    turn.expected = turn.context[4].model_copy(update={"content": None})  # two get_order calls
    row = turn_to_nemo_gym(turn)
    assert row["expected_action"]["type"] == "function_call_batch"
    assert [c["arguments"] for c in row["expected_action"]["calls"]] == [
        '{"order_id": "O-8"}', '{"order_id": "O-9"}']
    assert row["responses_create_params"]["parallel_tool_calls"] is True
    assert model_errors(row) == []
    # NeMo-Gym's validator script holds single-call datasets to one call per row:
    assert "function_call_batch" in validator_problem(row)
    src = tmp_path / "turns.jsonl"
    write_atomic(src, [turn, sample_turns()[1]])
    export_file(src, tmp_path / "batch.jsonl", "nemo-gym")
    import yaml

    config = yaml.safe_load(gym_config_path(tmp_path / "batch.jsonl").read_text())
    server = next(v for k, v in config.items() if k.endswith("_resources_server"))
    comparator = server["resources_servers"]["single_step_tool_use_with_argument_comparison"][
        "tool_call_comparator_config"]
    assert comparator["parallel_tool_call_rewarding"] is True  # else batches score as one call
    summary = export_file(src, tmp_path / "rows.jsonl", "nemo-gym", parallel_calls="reject")
    assert summary.written == 1 and summary.rejects[0].field == "expected.tool_calls"
    assert all(validator_problem(r) is None for r in _rows(tmp_path / "rows.jsonl"))


@pytest.mark.parametrize("path", GYM_FILES, ids=lambda p: p.stem)
def test_import_reads_every_nemo_gym_row(tmp_path, path):
    out = tmp_path / "turns.jsonl"
    summary = import_nemo_gym(path, out)
    assert summary.read == len(_rows(path)) and summary.written == summary.read, [
        (r.line, r.field, r.reason) for r in summary.rejects]
    assert not rejects_path(out).exists()
    turns = list(iter_valid(out, Turn))
    for row, turn in zip(_rows(path), turns):
        action = row["expected_action"]
        calls = action.get("calls") or ([action] if action["type"] == "function_call" else [])
        assert [(c.function.name, json.loads(c.function.arguments))
                for c in turn.expected.tool_calls or []] == [
            (c["name"], json.loads(c["arguments"])) for c in calls]
        if action["type"] == "message":
            assert turn.expected.content == action["content"]
        assert turn.id == row.get("uuid", turn.id)
    assert len({t.id for t in turns}) == len(turns)  # rows without ids get distinct ones


def test_nemo_gym_items_become_the_right_messages(tmp_path):
    out = tmp_path / "turns.jsonl"
    import_nemo_gym(FIXTURES / "single_step.jsonl", out)
    turns = list(iter_valid(out, Turn))
    ctx = turns[1].context  # system, user, reasoning + call, tool result
    assert [m.role for m in ctx] == ["system", "user", "assistant", "tool"]
    assert ctx[2].reasoning_content == "\nLook it up."
    assert ctx[2].tool_calls[0].id == ctx[3].tool_call_id and ctx[3].name == "find_book"
    ctx = turns[2].context  # reasoning + output message (ids, annotations) = one assistant message
    assert ctx[2].role == "assistant" and ctx[2].reasoning_content == "\nNeed ids."
    assert ctx[2].content == "\n\nSure, what are your member id and loan id?"
    assert turns[2].tools[1]["function"]["name"] == "renew_loan"


@pytest.mark.parametrize("path", GYM_FILES, ids=lambda p: p.stem)
def test_nemo_gym_to_pivotrl_to_nemo_gym(tmp_path, path):
    """What NeMo-Gym wrote comes back: the action exactly, the input as the same messages, and
    the row's own fields (agent_ref, uuid, tags, request settings)."""
    turns, rows = tmp_path / "turns.jsonl", tmp_path / "rows.jsonl"
    import_nemo_gym(path, turns)
    summary = export_file(turns, rows, "nemo-gym")
    assert summary.written == len(_rows(path))
    for before, after in zip(_rows(path), _rows(rows)):
        assert after["expected_action"] == before["expected_action"]
        assert model_errors(after) == []
        for key in ("agent_ref", "uuid", "pivot_tags", "harness", "declared_tools"):
            assert after.get(key) == before.get(key, after.get(key))
        old, new = before["responses_create_params"], after["responses_create_params"]
        msgs = [m.model_dump(exclude_none=True) for m in items_to_messages(old["input"], "a")]
        assert [m.model_dump(exclude_none=True) for m in items_to_messages(new["input"], "b")] == msgs
        for key, value in old.items():
            if key not in ("input", "tools", "parallel_tool_calls") and value is not None:
                assert new[key] == value, key
        assert [t["name"] for t in new["tools"]] == [t["name"] for t in old.get("tools", [])]


def test_pivotrl_to_nemo_gym_to_pivotrl_is_identity(tmp_path):
    turns = sample_turns()
    turns[1].metadata["nemo_gym"] = {"agent_ref": {"type": "responses_api_agents", "name": "a"}}
    src, rows, back = tmp_path / "t.jsonl", tmp_path / "r.jsonl", tmp_path / "b.jsonl"
    write_atomic(src, turns)
    export_file(src, rows, "nemo-gym")
    assert _rows(rows)[1]["agent_ref"]["name"] == "a"
    import_nemo_gym(rows, back)
    assert [_semantic(t) for t in iter_valid(back, Turn)] == [_semantic(t) for t in turns]


def test_empty_assistant_text_survives_the_round_trip(tmp_path):
    """An assistant message with `content: ""` beside its calls (what OpenAI clients write) comes
    back as "", not null, in the context and in the expert's action; no content stays None."""
    from pivotrl.io.records import Turn

    call = {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "O-1"}'}}
    turn = Turn.model_validate({
        "id": "e/3", "trajectory_id": "e", "turn": 3, "tools": sample_turns()[0].tools,
        "context": [{"role": "user", "content": "O-1?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "c1", "content": "{}"}, {"role": "user", "content": "again"},
                    {"role": "assistant", "tool_calls": [dict(call, id="c2")]},
                    {"role": "tool", "tool_call_id": "c2", "content": "{}"}],
        "expected": {"role": "assistant", "content": "", "tool_calls": [dict(call, id="c3")]}})
    src, rows, back = tmp_path / "t.jsonl", tmp_path / "r.jsonl", tmp_path / "b.jsonl"
    write_atomic(src, [turn])
    export_file(src, rows, "nemo-gym")
    row = _rows(rows)[0]
    assert model_errors(row) == [] and validator_problem(row) is None
    import_nemo_gym(rows, back)
    (again,) = iter_valid(back, Turn)
    assert again.context[1].content == "" and again.context[4].content is None
    assert again.expected.content == ""
    assert _semantic(again) == _semantic(turn)
