"""The one scoring path and its rule set: every stage (profiling, the GRPO reward, turn accuracy,
`pivotrl verify`) scores through `pivotrl.scoring`, so the rules are tested here once, and each
caller is checked to route through it."""

from __future__ import annotations

import math

import pytest

from pivotrl.io.records import Turn
from pivotrl.scoring import score_actions, score_completion, score_completions
from pivotrl.verifiers.base import Score

TURN = Turn.model_validate({"id": "t/0", "trajectory_id": "t", "turn": 0,
                            "context": [{"role": "user", "content": "hi"}],
                            "expected": {"role": "assistant", "content": "hello"}})
CALL = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'


class Scripted:
    """Returns one scripted result per action text (an exception is raised, not returned)."""

    def __init__(self, results):
        self.results, self.batches = results, 0

    def score(self, turn, action):
        result = self.results[action.content or action.tool_calls[0].function.name]
        if isinstance(result, Exception):
            raise result
        return result

    def score_batch(self, turns, actions):
        self.batches += 1
        return [self.score(t, a) for t, a in zip(turns, actions)]


@pytest.mark.parametrize("raw, reward, valid", [
    (Score(1.3, True), 1.0, True),              # clamped to [0, 1]
    (Score(-0.2, True), 0.0, True),
    (Score(float("nan"), True), 0.0, True),     # NaN would poison the group's advantage
    (Score(float("inf"), True), 0.0, True),
    (Score(0.5, True, "half"), 0.5, True),
])
def test_rewards_are_finite_and_in_range(raw, reward, valid):
    s = score_completion(Scripted({"f": raw}), TURN, CALL)
    assert s.reward == reward and s.valid is valid and math.isfinite(s.reward)


def test_a_verifier_exception_is_an_invalid_zero_and_isolated():
    verifier = Scripted({"ok": Score(1.0, True), "boom": RuntimeError("bad sample")})
    scores = score_completions(verifier, [TURN] * 3, ["ok", "boom", "ok"])
    assert [s.reward for s in scores] == [1.0, 0.0, 1.0]
    assert [s.valid for s in scores] == [True, False, True]
    assert "verifier error: RuntimeError: bad sample" in scores[1].reason


def test_unparseable_text_never_reaches_the_verifier():
    verifier = Scripted({})  # any verifier call would raise KeyError
    s = score_completion(verifier, TURN, CALL[:-3])
    assert (s.reward, s.valid) == (0.0, False) and s.reason
    assert verifier.batches == 0


def test_valid_actions_are_scored_in_one_batch_and_order_is_kept():
    verifier = Scripted({"a": Score(0.0, True), "b": Score(1.0, True)})
    scores = score_completions(verifier, [TURN] * 4, ["a", CALL[:-3], "b", "a"])
    assert [s.reward for s in scores] == [0.0, 0.0, 1.0, 0.0]
    assert [s.valid for s in scores] == [True, False, True, True]
    assert verifier.batches == 1


def test_a_repeated_action_on_one_turn_is_verified_once():
    seen = []

    class Counting(Scripted):
        def score(self, turn, action):
            seen.append((turn.id, action.content))
            return super().score(turn, action)

    other = TURN.model_copy(update={"id": "t/1"})
    verifier = Counting({"a": Score(1.0, True, "same"), "b": Score(0.0, True)})
    scores = score_completions(verifier, [TURN, TURN, TURN, other, other],
                               ["a", "b", "a", "a", "a"])
    assert [s.reward for s in scores] == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert scores[2] == scores[0] and scores[2].reason == "same"
    # one verification per distinct (turn, action): the copies on TURN and on `other` are reused,
    # but the same text on another turn is verified for that turn
    assert sorted(seen) == [("t/0", "a"), ("t/0", "b"), ("t/1", "a")]


def test_score_actions_keeps_the_callers_reasons():
    scores = score_actions(Scripted({}), [TURN], [None], ["line 3: not JSON"])
    assert scores[0].reason == "line 3: not JSON" and not scores[0].valid
    with pytest.raises(ValueError):
        score_actions(Scripted({}), [TURN, TURN], [None])


def test_every_stage_scores_through_this_path():
    # The callers name the path; a new hand-written parse-then-score loop would not.
    import inspect

    from pivotrl.profile import loop as profiling
    from pivotrl.evaluate import cases as verify
    from pivotrl_testbed import episodes
    from pivotrl.train import reward as rewards

    assert "score_completions" in inspect.getsource(profiling.score_samples)
    assert "score_completions" in inspect.getsource(rewards.PivotReward.__call__)
    assert "score_completions" in inspect.getsource(episodes.turn_accuracy)
    assert "score_actions" in inspect.getsource(verify.verify_file)
