"""`pivotrl compare`: models paired on the user's own held-out turns, with the paired cluster
bootstrap (clusters = trajectories) and a verdict (pivotrl.evaluate.compare)."""

from __future__ import annotations

import json

import pytest

from pivotrl.evaluate.compare import compare_models, model_result_path, paired_values, turn_values
from pivotrl.evaluate.turns import TurnEvalConfig
from test_turn_eval import ScriptedSampler, turn, write_turns


def test_the_paired_difference_and_its_interval_by_hand():
    # Two trajectories: a wins both turns of t0 and ties on t1 → diff 2/4; every replicate draws
    # t0 and t1 with replacement, so the replicate diffs lie in {0, 0.5, 1}; the interval spans that.
    a = {(0, "t0/0"): ("t0", 1.0), (0, "t0/1"): ("t0", 1.0), (0, "t1/0"): ("t1", 1.0), (0, "t1/1"): ("t1", 0.0)}
    b = {(0, "t0/0"): ("t0", 0.0), (0, "t0/1"): ("t0", 0.0), (0, "t1/0"): ("t1", 1.0), (0, "t1/1"): ("t1", 0.0),
         (0, "only-b"): ("t2", 1.0)}
    res = paired_values(a, b)
    assert res["diff"] == 0.5 and res["pairs"] == 4 and res["clusters"] == 2
    assert res["a_mean"] == 0.75 and res["b_mean"] == 0.25
    assert res["ci95"] == [0.0, 1.0] and res["verdict"] == "within noise"
    same = paired_values(a, a)
    assert same["diff"] == 0.0 and same["ci95"] == [0.0, 0.0] and same["verdict"] == "within noise"
    assert paired_values(a, {(0, "x"): ("t9", 1.0)}) is None


def test_turn_values_pair_turns_and_cluster_by_trajectory():
    items = [{"id": "tr0/0", "trajectory_id": "tr0", "success": 0.5}, {"id": "x", "trajectory_id": "x", "success": 1}]
    assert turn_values(items) == {(0, "tr0/0"): ("tr0", 0.5), (0, "x"): ("x", 1.0)}


def scripted(tokenizer, right):
    return lambda model: (ScriptedSampler(right[model]), tokenizer)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_a_broken_model_loses_and_identical_models_tie(tmp_path, tokenizer):
    from pivotrl.verifiers import get_verifier

    path = write_turns(tmp_path / "eval.jsonl", [turn(t, k) for t in range(8) for k in range(3)])
    right = {"good": lambda order: not order.endswith("2"),  # 2 turns of 3 in every trajectory
             "broken": lambda order: False, "good-copy": lambda order: not order.endswith("2")}
    cfg = TurnEvalConfig(max_new_tokens=16)
    out = tmp_path / "cmp.json"
    doc = compare_models(path, ["good", "broken", "good-copy"], out, get_verifier("toolcall"), cfg,
                         sampler_for=scripted(tokenizer, right))
    pairs = {(p["a"], p["b"]): p for p in doc["pairs"]}
    assert list(pairs) == [("good", "broken"), ("good", "good-copy"), ("broken", "good-copy")]
    win = pairs[("good", "broken")]
    assert win["diff"] == pytest.approx(2 / 3) and win["verdict"] == "met" and win["reading"] == "good better"
    assert win["pairs"] == 24 and win["clusters"] == 8 and win["ci95"][0] > 0
    loss = pairs[("broken", "good-copy")]
    assert loss["verdict"] == "not met" and loss["reading"] == "good-copy better"
    tie = pairs[("good", "good-copy")]
    assert tie["diff"] == 0.0 and tie["verdict"] == "within noise"
    assert json.loads(out.read_text())["pairs"] == doc["pairs"]
    assert [m["accuracy"] for m in doc["models"]] == pytest.approx([2 / 3, 0.0, 2 / 3])
    assert json.loads(model_result_path(out, 1).read_text())["model"] == "broken"


def test_results_scored_differently_do_not_pair(tmp_path, tokenizer):
    from pivotrl.evaluate.compare import compare_results
    from pivotrl.evaluate.turns import evaluate_turns_file
    from pivotrl.verifiers import get_verifier

    path = write_turns(tmp_path / "eval.jsonl", [turn(t, 0) for t in range(3)])
    paths = []
    for i, threshold in enumerate((1.0, 0.5)):
        paths.append(tmp_path / f"r{i}.json")
        evaluate_turns_file(path, paths[-1], ScriptedSampler(lambda order: True), get_verifier("toolcall"),
                            tokenizer, TurnEvalConfig(max_new_tokens=4, success_threshold=threshold))
    with pytest.raises(ValueError, match=r"--success-threshold 0\.5 vs 1\.0"):  # each value, and the flag
        compare_results(paths, tmp_path / "cmp.json")
    assert compare_results([paths[0], paths[0]], tmp_path / "cmp.json")["pairs"][0]["diff"] == 0.0


def test_cli_compare_the_same_model_twice_is_within_noise(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    path = write_turns(tmp_path / "eval.jsonl", [turn(t, k) for t in range(3) for k in range(2)])
    out = tmp_path / "cmp.json"
    args = ["compare", "--turns", str(path), "--model", str(tiny_model_dir), "--model", str(tiny_model_dir),
            "--out", str(out), "--max-new-tokens", "8"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    (pair,) = doc["pairs"]
    assert pair["diff"] == 0.0 and pair["verdict"] == "within noise" and pair["pairs"] == 6
    assert doc["settings"]["max_new_tokens"] == 8 and len(doc["models"]) == 2
    one = CliRunner().invoke(app, ["compare", "--turns", str(path), "--model", str(tiny_model_dir),
                                   "--out", str(out)])
    assert one.exit_code == 2 and "two --model" in one.output
    # the same pairs from the two results compare --model wrote (as from two evaluate jobs)
    again = CliRunner().invoke(app, ["compare", "--out", str(tmp_path / "again.json"),
                                     *(x for m in doc["models"] for x in ("--result", m["result"]))])
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "again.json").read_text())["pairs"] == doc["pairs"]
    missing = CliRunner().invoke(app, ["compare", "--turns", str(path), "--model", str(tiny_model_dir),
                                       "--model", str(tmp_path / "nope"), "--out", str(out)])
    assert missing.exit_code == 2 and "nope" in missing.output


def test_cli_compare_table_labels_models_and_names_them_whole(tmp_path, tiny_model_dir):
    """At 80 columns a table cuts long names: the rows say #1/#2 and the lines below name them whole."""
    from typer.testing import CliRunner

    from pivotrl.cli import app

    path = write_turns(tmp_path / "eval.jsonl", [turn(t, k) for t in range(2) for k in range(2)])
    long_a = tmp_path / ("a_model_with_a_long_descriptive_folder_name_" * 2)
    long_a.symlink_to(tiny_model_dir)
    res = CliRunner().invoke(app, ["compare", "--turns", str(path), "--model", str(long_a), "--model",
                                   str(tiny_model_dir), "--out", str(tmp_path / "c.json"), "--max-new-tokens", "4"],
                             env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert f"#1 = {long_a}:" in res.output and f"#2 = {tiny_model_dir}:" in res.output
    assert res.output.count("within noise") == 1
