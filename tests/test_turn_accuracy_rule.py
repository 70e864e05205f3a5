"""One rule for turn accuracy: the testbed's demo measure (`pivotrl_testbed.evaluate.evaluate_turns`)
and `pivotrl evaluate --turns` give the same number and the same interval on the same checkpoint
and turns, with a 0/1 verifier and with a shaped one (rewards between 0 and 1)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.io.records import Trajectory, iter_valid, write_atomic
from pivotrl.verifiers import get_verifier, register
from pivotrl.verifiers.base import Score


@register("shaped_for_tests")
class Shaped:
    """toolcall's verdict, shaped: 1 for an equivalent call, 0.4 for a valid action that is not
    (below the success threshold: a failure, though its reward is not 0)."""

    name = "shaped_for_tests"

    def __init__(self):
        self.inner = get_verifier("toolcall")

    def score(self, turn, action):
        return self.score_batch([turn], [action])[0]

    def score_batch(self, turns, actions):
        return [Score(1.0 if s.reward >= 1.0 else 0.4 if s.valid else 0.0, s.valid, s.reason)
                for s in self.inner.score_batch(turns, actions)]


@pytest.fixture(scope="module")
def checkpoint_and_trajectories(quick_testbed):
    from pivotrl_testbed.testbed.shipped import SHIPPED

    testbed, _ = quick_testbed  # its eval tasks; the shipped base, which solves some of them
    trajs = list(iter_valid(testbed / "toolshop" / "eval.jsonl", Trajectory))[:12]
    return SHIPPED / "base", trajs


@pytest.mark.parametrize("verifier", ["toolcall", "shaped_for_tests"])
def test_the_demos_turn_accuracy_is_evaluate_turns(verifier, checkpoint_and_trajectories, tmp_path):
    from pivotrl.extract import extract_file
    from pivotrl_testbed.episodes import ModelPolicy
    from pivotrl_testbed.evaluate import evaluate_turns
    from pivotrl_testbed.testbed.tiny import load_tiny

    base, trajs = checkpoint_and_trajectories
    model, tok = load_tiny(base)
    items: list[dict] = []
    demo = evaluate_turns(ModelPolicy(model, tok, max_new_tokens=96), trajs, verifier, items)

    write_atomic(tmp_path / "trajs.jsonl", trajs)
    extract_file(tmp_path / "trajs.jsonl", tmp_path / "turns.jsonl")
    out = tmp_path / "result.json"
    result = CliRunner().invoke(app, ["evaluate", "--model", str(base), "--turns", str(tmp_path / "turns.jsonl"),
                                      "--out", str(out), "--verifier", verifier, "--max-new-tokens", "96"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["turns"] == demo["turns"] == len(items)
    assert doc["accuracy"] == demo["turn_accuracy"]
    assert doc["ci95"] == demo["turn_ci95"]
    assert 0 < doc["accuracy"] < 1  # the check can tell rules apart: some turns pass, some fail
    if verifier == "shaped_for_tests":
        # Averaging raw rewards (the demo's rule before) would give another number here.
        assert doc["mean_reward"] != doc["accuracy"]
