"""verl's custom reward function: loaded by file path as verl does, it pays the expert's own action
1 and a wrong one less, on rows of a parquet written by `pivotrl export --format verl`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import pivotrl.export.verl_reward as verl_reward
from pivotrl.formats.actions import render_action
from pivotrl.export import export_file
from pivotrl.extract import ExtractOptions, extract_file
from pivotrl.io.records import Message
from test_export import sample_turns

ROOT = Path(__file__).resolve().parents[1]


def _load_like_verl():
    """verl's load_extern_object: import the file at custom_reward_function.path by location."""
    spec = importlib.util.spec_from_file_location("custom_module", verl_reward.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    import pyarrow.parquet as pq

    tmp = tmp_path_factory.mktemp("verl")
    turns = tmp / "turns.jsonl"
    extract_file(ROOT / "examples" / "trajectories.jsonl", turns, ExtractOptions())
    with turns.open("a") as fh:
        for t in sample_turns():
            fh.write(t.model_dump_json(exclude_none=True) + "\n")
    out = tmp / "train.parquet"
    assert export_file(turns, out, "verl").written >= 8
    return pq.read_table(out).to_pylist()


def test_the_experts_action_scores_one(rows):
    compute_score = _load_like_verl()
    for row in rows:
        expert = Message.model_validate(json.loads(row["reward_model"]["ground_truth"]))
        score = compute_score(row["data_source"], render_action(expert),
                              row["reward_model"]["ground_truth"], row["extra_info"])
        assert score == 1.0, row["extra_info"]["id"]


def test_wrong_and_unparseable_actions_score_less(rows):
    compute_score = _load_like_verl()
    call_rows = [r for r in rows if "tool_calls" in json.loads(r["reward_model"]["ground_truth"])]
    assert call_rows
    for row in call_rows:
        expert = Message.model_validate(json.loads(row["reward_model"]["ground_truth"]))
        call = expert.tool_calls[0]
        wrong = Message(role="assistant", tool_calls=[{
            "id": "x", "type": "function",
            "function": {"name": call.function.name, "arguments": {"zzz_not_a_param": 12345}}}])
        gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
        assert compute_score(row["data_source"], render_action(wrong), gt, info) < 1.0
        assert compute_score(row["data_source"], "<tool_call>\n{not json", gt, info) == 0.0
        assert compute_score(row["data_source"], "", gt, info) == 0.0


def test_unknown_data_source_and_missing_extra_info(rows):
    """verl's default scorer raises for an unknown data_source; ours reads the row instead, and
    without extra_info it still scores from ground_truth alone."""
    row = rows[0]
    expert = Message.model_validate(json.loads(row["reward_model"]["ground_truth"]))
    gt = row["reward_model"]["ground_truth"]
    assert verl_reward.compute_score("no-such-source", render_action(expert), gt, None) == 1.0
    assert verl_reward.compute_score("x", render_action(expert), gt, row["extra_info"],
                                     verifier="exact") == 1.0
    with pytest.raises(ValueError, match="ground_truth"):
        verl_reward.compute_score("x", "hi", "", {})


def test_the_rollout_is_read_in_the_named_format(rows):
    """With response_format, text in another family's format (Qwen3-Coder XML) is read as that
    family writes it; the Hermes default reads no call in it and pays nothing."""
    row = next(r for r in rows if json.loads(r["reward_model"]["ground_truth"]).get("tool_calls")
               and r["extra_info"]["domain"] == "weather")
    expert = json.loads(row["reward_model"]["ground_truth"])["tool_calls"][0]["function"]
    city = json.loads(expert["arguments"])["city"]
    text = (f"<tool_call>\n<function={expert['name']}>\n<parameter=city>\n{city}\n</parameter>\n"
            "</function>\n</tool_call>")
    gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
    assert verl_reward.compute_score("x", text, gt, info, response_format="qwen-xml") == 1.0
    assert verl_reward.compute_score("x", text, gt, info) == 0.0
