"""Turns ⇄ NeMo-Gym rows, Turns → verl parquet, and bad input going to rejects."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pivotrl.export import (DEFAULT_AGENT_NAME, export_file, import_nemo_gym, nemo_gym_to_turn,
                            tool_config_path, turn_to_nemo_gym)
from pivotrl.io.empty import EmptyResultError
from pivotrl.io.records import Turn, iter_valid, rejects_path, write_atomic

TOOLS = [
    {"type": "function", "function": {"name": "get_order", "description": "Look up an order.",
                                      "parameters": {"type": "object", "properties": {
                                          "order_id": {"type": "string"}}, "required": ["order_id"]}}},
    {"type": "function", "function": {"name": "refund", "description": "Refund an order.",
                                      "parameters": {"type": "object", "properties": {
                                          "order_id": {"type": "string"},
                                          "amount": {"type": "number"}}}}},
]


def sample_turns() -> list[Turn]:
    context = [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": "Refund order O-7, half of it."},
        {"role": "assistant", "reasoning_content": "Look it up first.",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_order", "arguments": {"order_id": "O-7"}}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_order", "content": '{"total": 40}'},
        {"role": "assistant", "content": "Two at once:",
         "tool_calls": [{"id": "c2", "type": "function",
                         "function": {"name": "get_order", "arguments": '{"order_id": "O-8"}'}},
                        {"id": "c3", "type": "function",
                         "function": {"name": "get_order", "arguments": '{"order_id": "O-9"}'}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "{}"},
        {"role": "tool", "tool_call_id": "c3", "content": "{}"},
        {"role": "user", "content": [{"type": "text", "text": "Go on."}], "lang": "en"},
    ]
    a = Turn.model_validate({
        "id": "t1/8", "trajectory_id": "t1", "turn": 8, "domain": "shop", "tools": TOOLS,
        "context": context,
        "expected": {"role": "assistant", "tool_calls": [{"id": "c4", "type": "function", "function": {
            "name": "refund", "arguments": '{"order_id": "O-7", "amount": 20.0}'}}]},
        "metadata": {"world": "shop", "goal": {"refunded": ["O-7"]}},
        # a Profile's fields ride along
        "k": 4, "reward_mean": 0.5, "reward_std": 0.5,
        "samples": [{"completion": "x", "reward": 1.0, "valid": True}]})
    b = Turn.model_validate({
        "id": "t2/1", "trajectory_id": "t2", "turn": 1, "tools": [],
        "context": [{"role": "user", "content": "Hi"}],
        "expected": {"role": "assistant", "content": "Hello! How can I help?",
                     "reasoning_content": "greet"}})
    return [a, b]


def _semantic(turn: Turn) -> dict:
    """Turn as data, with tool-call arguments parsed (JSON string and object are the same)."""
    data = turn.model_dump(mode="json", exclude_none=True)
    for msg in [*data["context"], data["expected"]]:
        for call in msg.get("tool_calls", []):
            args = call["function"]["arguments"]
            call["function"]["arguments"] = json.loads(args) if isinstance(args, str) else args
    return data


def test_nemo_gym_row_shape():
    row = turn_to_nemo_gym(sample_turns()[0])
    params = row["responses_create_params"]
    kinds = [item["type"] + (":" + item["role"] if "role" in item else "") for item in params["input"]]
    assert kinds == ["message:system", "message:user", "reasoning", "function_call",
                     "function_call_output", "message:assistant", "function_call", "function_call",
                     "function_call_output", "function_call_output", "message:user"]
    assert params["input"][2]["id"] and params["input"][2]["summary"][0]["text"] == "Look it up first."
    call = params["input"][3]
    assert call["call_id"] == "c1" and json.loads(call["arguments"]) == {"order_id": "O-7"}
    assert params["input"][-1]["content"] == [{"type": "input_text", "text": "Go on."}]
    assert params["tools"][0] == {"type": "function", "name": "get_order",
                                  "description": "Look up an order.",
                                  "parameters": TOOLS[0]["function"]["parameters"], "strict": False}
    assert (params["tool_choice"], params["parallel_tool_calls"]) == ("auto", False)
    assert row["expected_action"] == {"type": "function_call", "name": "refund",
                                      "arguments": '{"order_id": "O-7", "amount": 20.0}'}
    assert row["agent_ref"] == {"type": "responses_api_agents", "name": DEFAULT_AGENT_NAME}
    assert row["id"] == "t1/8" and row["metadata"]["turn_metadata"]["world"] == "shop"
    text = turn_to_nemo_gym(sample_turns()[1], agent_name="shop_agent")
    assert text["expected_action"] == {"type": "message", "content": "Hello! How can I help?"}
    assert text["agent_ref"]["name"] == "shop_agent"
    assert text["metadata"]["expected_extra"] == {"reasoning_content": "greet"}


def test_round_trip_through_the_cli_gives_back_the_same_turns(tmp_path):
    """Turns → NeMo-Gym rows → Turns is the identity, argument types included: NeMo-Gym's rows
    hold arguments as JSON strings, an object comes back an object, a string a string."""
    from typer.testing import CliRunner

    from pivotrl.cli import app

    turns = sample_turns()
    objects = turns[0].model_copy(deep=True)  # the expected call's arguments as an object too
    objects.id, objects.expected.tool_calls[0].function.arguments = "t1/8b", {"order_id": "O-7", "amount": 20.0}
    turns.append(objects)
    src, rows, back = tmp_path / "turns.jsonl", tmp_path / "rows.jsonl", tmp_path / "back.jsonl"
    write_atomic(src, turns)
    runner = CliRunner()
    assert runner.invoke(app, ["export", str(src), "--format", "nemo-gym", "--out", str(rows)]).exit_code == 0
    r = runner.invoke(app, ["import", "nemo-gym", str(rows), "--out", str(back)])
    assert r.exit_code == 0, r.output
    got = list(iter_valid(back, Turn))
    assert [t.model_dump(mode="json") for t in got] == [t.model_dump(mode="json") for t in turns]
    assert isinstance(got[0].context[2].tool_calls[0].function.arguments, dict)
    assert isinstance(got[0].context[4].tool_calls[0].function.arguments, str)
    assert got[0].model_extra["reward_mean"] == 0.5  # Profile fields survive
    assert got[0].context[3].name == "get_order"


def test_round_trip_bfcl_turns(tmp_path):
    pytest.importorskip("bfcl_eval")
    from pivotrl_testbed.bfcl import build_trajectory, load_category
    from pivotrl.extract import ExtractOptions, extract_turns

    turns = []
    for category in ("miss_func", "long_context"):
        entry, gt = load_category(category)[0]
        turns += extract_turns(build_trajectory(entry, gt, category), ExtractOptions())[0]
    back = [nemo_gym_to_turn(json.loads(json.dumps(turn_to_nemo_gym(t)))) for t in turns]
    assert [_semantic(t) for t in back] == [_semantic(t) for t in turns]
    # the miss_func user message that adds a function keeps its extra `tools`
    assert any("tools" in (m.model_extra or {}) for t in back for m in t.context)


def test_verl_parquet(tmp_path):
    import pyarrow.parquet as pq
    from datasets import load_dataset

    turns = sample_turns()
    src = tmp_path / "turns.jsonl"
    write_atomic(src, turns)
    out = tmp_path / "train.parquet"
    summary = export_file(src, out, "verl", batch_rows=1)  # several row groups
    assert summary.written == 2 and not rejects_path(out).exists()
    table = pq.read_table(out)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info",
                                  "agent_name"]
    rows = table.to_pylist()
    assert {r["agent_name"] for r in rows} == {"single_turn_agent"}
    assert rows[0]["data_source"] == "shop" and rows[1]["data_source"] == "pivotrl"
    assert [m["role"] for m in rows[0]["prompt"]] == [m.role for m in turns[0].context]
    assert "<tool_call>" in rows[0]["prompt"][2]["content"]  # calls rendered as training parses them
    assert rows[0]["reward_model"]["style"] == "rule"
    truth = json.loads(rows[0]["reward_model"]["ground_truth"])
    assert truth["tool_calls"][0]["function"]["name"] == "refund"
    info = rows[0]["extra_info"]
    assert (info["index"], info["id"], info["turn"]) == (0, "t1/8", 8)
    assert json.loads(info["tools"]) == TOOLS
    assert json.loads(info["metadata"])["goal"] == {"refunded": ["O-7"]}

    # verl's agent loops read tool schemas only from the tool config YAML: every row's tools are
    # there, each loadable by verl's tool registry (class_name, native config, OpenAI schema).
    import yaml

    config = yaml.safe_load(tool_config_path(out).read_text())
    assert summary.files == [tool_config_path(out)]
    assert [t["tool_schema"]["function"]["name"] for t in config["tools"]] == ["get_order", "refund"]
    for entry, tool in zip(config["tools"], TOOLS):
        assert entry["class_name"] == "verl.tools.base_tool.BaseTool"
        assert entry["config"] == {"type": "native"}
        fn = entry["tool_schema"]["function"]
        assert fn["description"] == tool["function"]["description"]
        assert fn["parameters"]["properties"] == tool["function"]["parameters"]["properties"]
        assert isinstance(fn["parameters"]["required"], list)  # verl's schema requires the key
    # two tool sets (t2 has none): verl shows the union to every row, and the summary says so
    assert any("different tool sets" in w for w in summary.warnings)

    ds = load_dataset("parquet", data_files=str(out), split="train")
    assert len(ds) == 2
    assert ds[1]["prompt"] == [{"role": "user", "content": "Hi"}]
    assert json.loads(ds[1]["reward_model"]["ground_truth"])["content"] == "Hello! How can I help?"
    assert ds[0]["extra_info"]["trajectory_id"] == "t1"


def _bad_turns_file(tmp_path):
    good = [t.model_dump(mode="json", exclude_none=True) for t in sample_turns()]
    wrong_role = dict(good[1], expected={"role": "user", "content": "hi"})
    bad_args = json.loads(json.dumps(good[0]))
    bad_args["expected"]["tool_calls"][0]["function"]["arguments"] = "{not json"
    lines = [json.dumps(good[0]), "this is not json", json.dumps({"id": "x"}),
             json.dumps(wrong_role), json.dumps(bad_args), json.dumps(good[1])]
    src = tmp_path / "turns.jsonl"
    src.write_text("\n".join(lines) + "\n")
    return src


@pytest.mark.parametrize("fmt,name", [("nemo-gym", "rows.jsonl"), ("verl", "train.parquet")])
def test_bad_turn_lines_go_to_rejects(tmp_path, fmt, name):
    src = _bad_turns_file(tmp_path)
    out = tmp_path / name
    summary = export_file(src, out, fmt)
    assert (summary.read, summary.written) == (6, 2)
    rejects = [json.loads(line) for line in rejects_path(out).open()]
    assert [r["line"] for r in rejects] == [2, 3, 4, 5]
    assert "not JSON" in rejects[0]["reason"]
    assert rejects[2]["field"] == "expected.role"
    assert rejects[3]["field"].startswith("expected.tool_calls[0]")


def test_bad_nemo_gym_rows_go_to_rejects(tmp_path):
    good = turn_to_nemo_gym(sample_turns()[0])
    unknown_item = json.loads(json.dumps(good))
    unknown_item["responses_create_params"]["input"].append({"type": "web_search_call"})
    unknown_action = json.loads(json.dumps(good))
    unknown_action["expected_action"] = {"type": "computer_call"}
    no_name = json.loads(json.dumps(good))
    del no_name["expected_action"]["name"]
    empty_batch = json.loads(json.dumps(good))
    empty_batch["expected_action"] = {"type": "function_call_batch", "calls": []}
    lines = [json.dumps(good), "{", json.dumps({"expected_action": {}}), json.dumps(unknown_item),
             json.dumps(unknown_action), json.dumps(no_name), json.dumps([1, 2]),
             json.dumps(empty_batch)]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(lines) + "\n")
    out = tmp_path / "turns.jsonl"
    summary = import_nemo_gym(rows, out)
    assert (summary.read, summary.written) == (8, 1)
    rejects = [json.loads(line) for line in rejects_path(out).open()]
    assert [r["line"] for r in rejects] == [2, 3, 4, 5, 6, 7, 8]
    assert "unsupported item type" in rejects[2]["reason"]
    assert rejects[3]["field"] == "expected_action.type"
    assert rejects[4]["field"] == "expected_action.name"
    assert rejects[6]["field"] == "expected_action.calls"


def test_export_never_overwrites_its_input(tmp_path):
    src = tmp_path / "turns.jsonl"
    write_atomic(src, sample_turns())
    before = src.read_bytes()
    with pytest.raises(ValueError, match="input file"):
        export_file(src, src, "nemo-gym")
    with pytest.raises(ValueError, match="input file"):
        import_nemo_gym(src, src)
    assert src.read_bytes() == before


def test_cli_export_and_import(tmp_path):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    src = _bad_turns_file(tmp_path)
    runner = CliRunner()
    rows = tmp_path / "rows.jsonl"
    r = runner.invoke(app, ["export", str(src), "--format", "nemo-gym", "--out", str(rows)])
    assert r.exit_code == 0 and r.exception is None, r.output
    assert rejects_path(rows).exists()
    r = runner.invoke(app, ["import", "nemo-gym", str(rows), "--out", str(tmp_path / "t.jsonl")])
    assert r.exit_code == 0 and len(list(iter_valid(tmp_path / "t.jsonl", Turn))) == 2
    r = runner.invoke(app, ["export", str(src), "--format", "csv", "--out", str(rows)])
    assert r.exit_code == 2 and "unknown --format" in " ".join(r.output.split())
    r = runner.invoke(app, ["export", str(tmp_path / "missing.jsonl"), "--format", "verl",
                            "--out", str(tmp_path / "v.parquet")])
    assert r.exit_code == 2 and "no such file" in " ".join(r.output.split())


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                           max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries({"responses_create_params": st.fixed_dictionaries(
    {"input": st.lists(json_values, max_size=4)}), "expected_action": json_values}) | json_values,
    min_size=1, max_size=5))
def test_import_never_crashes_and_accounts_for_every_line(tmp_path, rows):
    src = tmp_path / "fuzz.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        summary = import_nemo_gym(src, tmp_path / "fuzz_out.jsonl")
    except EmptyResultError as exc:  # every row rejected: an error, its accounting still exact
        summary = exc.result
        assert summary.written == 0
    assert summary.written + len(summary.rejects) == summary.read == len(rows)


def test_import_verl_through_the_cli(tmp_path):
    """`pivotrl import verl`: our own parquet gives back the same turns (split by trajectory with
    --eval-fraction); another tool's rows (prompt + the expert message as ground truth) are read
    from the prompt; a row with no expert message goes to the rejects file, naming row and field."""
    from typer.testing import CliRunner

    from pivotrl.cli import app

    turns = sample_turns()
    turns[0] = Turn.model_validate(turns[0].model_dump(exclude=set(turns[0].model_extra)))  # verl keeps Turn fields
    src, parquet, back = tmp_path / "turns.jsonl", tmp_path / "train.parquet", tmp_path / "back.jsonl"
    write_atomic(src, turns)
    runner = CliRunner()
    assert runner.invoke(app, ["export", str(src), "--format", "verl", "--out", str(parquet)]).exit_code == 0
    r = runner.invoke(app, ["import", "verl", str(parquet), "--out", str(back), "--eval-fraction", "0.5"])
    assert r.exit_code == 0, r.output
    got = list(iter_valid(back, Turn)) + list(iter_valid(tmp_path / "back.eval.jsonl", Turn))
    assert sorted((t.model_dump(mode="json") for t in got), key=lambda d: d["id"]) == [
        t.model_dump(mode="json") for t in turns]
    split = json.loads((tmp_path / "back.split.json").read_text())
    assert sorted(split["train"] + split["eval"]) == ["t1", "t2"] and len(split["eval"]) == 1

    expert = {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "get_order", "arguments": '{"order_id": "O-1"}'}}]}
    foreign = [
        {"data_source": "shop", "prompt": [{"role": "user", "content": "Where is O-1?"}], "ability": "agent",
         "reward_model": {"style": "rule", "ground_truth": json.dumps(expert)}, "extra_info": {"index": 0}},
        {"data_source": "math", "prompt": [{"role": "user", "content": "2+2?"}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"index": 1}},
    ]
    rows = tmp_path / "foreign.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in foreign))
    out = tmp_path / "foreign_turns.jsonl"
    r = runner.invoke(app, ["import", "verl", str(rows), "--out", str(out)])
    assert r.exit_code == 0, r.output
    (turn,) = list(iter_valid(out, Turn))
    assert (turn.id, turn.domain, [m.content for m in turn.context]) == ("foreign:1", "shop", ["Where is O-1?"])
    assert turn.expected.tool_calls[0].function.name == "get_order"
    (reject,) = [json.loads(line) for line in rejects_path(out).read_text().splitlines()]
    assert (reject["line"], reject["field"]) == (2, "reward_model.ground_truth")


def test_verl_warnings_are_one_line_a_problem(tmp_path):
    """Forty tools whose schemas verl would trim alike, defined two ways by two rows: two warning
    lines naming a few tools and the count, not eighty near-identical ones."""
    def tool(i, desc):
        return {"type": "function", "function": {"name": f"tool_{i:02d}", "description": desc, "parameters": {
            "type": "object", "properties": {"ids": {"type": "array", "items": {"type": "string"}}}}}}

    turns = []
    for k, desc in enumerate(("first", "second")):
        turns.append(Turn.model_validate({
            "id": f"r{k}/1", "trajectory_id": f"r{k}", "turn": 1, "tools": [tool(i, desc) for i in range(40)],
            "context": [{"role": "user", "content": "go"}],
            "expected": {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
                "name": "tool_00", "arguments": '{"ids": ["a"]}'}}]}}))
    src, out = tmp_path / "t.jsonl", tmp_path / "rows.parquet"
    write_atomic(src, turns)
    summary = export_file(src, out, "verl")
    assert sorted(summary.warnings) == [
        "40 tools ('tool_00', 'tool_01', 'tool_02', … (37 more)) defined differently by different rows; "
        "the tool config keeps the first definition",
        "40 tools ('tool_00', 'tool_01', 'tool_02', … (37 more)): property 'ids': verl keeps only "
        "type/description/enum (drops ['items'])"]
