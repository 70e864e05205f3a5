"""Terminus-2 trajectories become turns of their own action kind, and such turns are paid only
for the expert's own action, whatever the verifier (pivotrl.extract, pivotrl.verifiers.terminus_identity)."""

from __future__ import annotations

import json
from pathlib import Path

from pivotrl.extract import ExtractOptions, extract_file
from pivotrl.formats.actions import parse_completion
from pivotrl.io.records import Trajectory, Turn, iter_valid
from pivotrl.scoring import score_actions, score_completions
from pivotrl.verifiers import get_verifier
from pivotrl.verifiers.base import Score

TRAJECTORIES = Path(__file__).resolve().parent / "fixtures" / "terminus" / "trajectories.jsonl"


def _turns(tmp_path, **opts) -> dict[str, Turn]:
    out = tmp_path / "turns.jsonl"
    summary = extract_file(TRAJECTORIES, out, ExtractOptions(**opts))
    return summary, {t.id: t for t in iter_valid(out, Turn)}


def test_extract_keeps_terminus_turns_as_their_own_action_kind(tmp_path):
    summary, turns = _turns(tmp_path)
    # t2-auto: turn 1 has text after its JSON (the harness would warn and run it): skipped, and
    # counted; its later turn is still extracted with the unreadable message in its context.
    assert sorted(turns) == ["chat-1/0", "t2-auto/0", "t2-auto/2", "t2-declared/0"]
    assert summary.skipped == {"not a Terminus-2 action": 1}
    first = turns["t2-auto/0"]
    assert first.metadata["action_format"] == "terminus_2"
    assert first.expected.content.startswith("{") and first.expected.content.endswith("}")
    assert json.loads(first.expected.content)["commands"][0]["keystrokes"] == "ls -la\n"
    assert first.expected.reasoning_content.strip() == "We are in /app. Look at the file first."
    last = turns["t2-auto/2"]
    assert [m.role for m in last.context] == ["user", "assistant", "user", "assistant", "user"]
    assert last.context[1].reasoning_content is None  # earlier turns' reasoning dropped by default
    assert "I will now run these commands." in last.context[3].content
    assert json.loads(last.expected.content)["task_complete"] is True
    assert turns["t2-declared/0"].metadata["action_format"] == "terminus_2"  # metadata.harness
    assert "action_format" not in turns["chat-1/0"].metadata


def test_only_tool_calls_keeps_terminus_actions_and_chat_mode_reads_messages(tmp_path):
    _, turns = _turns(tmp_path, only_tool_calls=True)
    assert sorted(turns) == ["t2-auto/0", "t2-auto/2", "t2-declared/0"]
    _, turns = _turns(tmp_path, action_format="chat")
    assert len(turns) == 5 and not any("action_format" in t.metadata for t in turns.values())
    assert turns["t2-auto/0"].expected.content.startswith("<think>")  # a message, as written


def _terminus_turn(*keys: str, done: bool = False) -> Turn:
    action = {"analysis": "a", "plan": "p", "task_complete": done,
              "commands": [{"keystrokes": k, "duration": 0.1} for k in keys]}
    return Turn(id="t/0", trajectory_id="t", turn=0, metadata={"action_format": "terminus_2"},
                context=[{"role": "user", "content": "Current Terminal Screen:\n$ "}],
                expected={"role": "assistant", "content": json.dumps(action)})


def _completion(*keys: str, done: bool = False, think: str = "", duration: float = 0.1) -> str:
    action = {"analysis": "other words", "plan": "other plan", "task_complete": done,
              "commands": [{"keystrokes": k, "duration": duration} for k in keys]}
    return (f"<think>{think}</think>\n" if think else "") + json.dumps(action, indent=2)


class PaysEverything:
    """A verifier that would pay any action: a Terminus-2 turn must never reach it."""
    name = "pays_everything"

    def score(self, turn, action):
        return Score(1.0, True, "paid")


def test_a_right_command_plus_a_surplus_one_is_not_paid():
    turn = _terminus_turn("cat notes.txt\n")
    texts = [_completion("cat notes.txt\n", think="read it", duration=3.0),
             _completion("cat notes.txt\n", "rm -rf /app\n"),
             _completion("rm -rf /app\n", "cat notes.txt\n")]
    for verifier in (get_verifier("exact"), get_verifier("toolcall"), get_verifier("shell"),
                     PaysEverything()):
        scores = score_completions(verifier, [turn] * 3, texts, parse_completion)
        assert [s.reward for s in scores] == [1.0, 0.0, 0.0], verifier.name
        assert scores[1].valid and "2 commands where the expert sent 1" in scores[1].reason


def test_text_rules_do_not_pay_a_terminus_action():
    turn = _terminus_turn("ls -la\n")
    texts = [_completion("LS -LA\n"),  # `exact` folds case in messages
             _completion("ls  -la\n"),  # and collapses spaces
             _completion("ls -la\n", done=True),
             _completion("ls -la\n") + "\nDone.",  # text after the object
             '<tool_call>{"name": "run", "arguments": {"command": "ls -la"}}</tool_call>']
    scores = score_completions(get_verifier("exact"), [turn] * len(texts), texts, parse_completion)
    assert [s.reward for s in scores] == [0.0] * len(texts)
    assert [s.valid for s in scores] == [True, True, True, False, False]
    assert "not a Terminus-2 action: text after the JSON object" in scores[3].reason
    assert "tool call" in scores[4].reason


def test_a_verifier_that_reads_terminus_actions_gets_them():
    class Reads(PaysEverything):
        action_formats = ("terminus_2",)

    turn = _terminus_turn("ls\n")
    score = score_completions(Reads(), [turn], [_completion("rm -rf /\n")], parse_completion)[0]
    assert (score.reward, score.reason) == (1.0, "paid")


def test_an_unusable_expert_and_unparsed_actions_score_zero_invalid():
    turn = _terminus_turn("ls\n").model_copy(update={"expected": Trajectory.model_validate(
        {"id": "x", "messages": [{"role": "assistant", "content": "not json"}]}).messages[0]})
    score = score_completions(PaysEverything(), [turn], [_completion("ls\n")], parse_completion)[0]
    assert (score.reward, score.valid) == (0.0, False) and "expert action unusable" in score.reason
    scores = score_actions(PaysEverything(), [_terminus_turn("ls\n")], [None], ["cut short"])
    assert (scores[0].reward, scores[0].valid, scores[0].reason) == (0.0, False, "cut short")
