"""The Terminus-2 action reader: the harness's JSON, strictly (pivotrl.formats.terminus)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pivotrl.formats.terminus import action_difference, parse_terminus

ACTION = {"analysis": "At a prompt.", "plan": "List, then count.",
          "commands": [{"keystrokes": "ls -la\n", "duration": 0.1},
                       {"keystrokes": "wc -l notes.txt\n", "duration": 1}],
          "task_complete": False}
TEXT = json.dumps(ACTION, indent=2)


def _with(**changes) -> str:
    return json.dumps({**ACTION, **changes})


@pytest.mark.parametrize("text", [
    TEXT,
    "<think>\nLook first.\n</think>\n\n" + TEXT,
    "Look first.\n</think>\n" + TEXT,  # the chat template opened <think> in the prompt
    TEXT + "<|im_end|>",
    "  " + TEXT + "\n\n",
])
def test_valid_forms_give_the_typed_action(text):
    parsed = parse_terminus(text)
    assert parsed.valid, parsed.reason
    action = parsed.action
    assert [c.keystrokes for c in action.commands] == ["ls -la\n", "wc -l notes.txt\n"]
    assert [c.duration for c in action.commands] == [0.1, 1.0]
    assert (action.analysis, action.plan, action.task_complete) == (
        "At a prompt.", "List, then count.", False)
    assert json.loads(parsed.body) == ACTION


def test_thinking_is_returned_apart_and_optional_fields_default():
    parsed = parse_terminus('<think>plan it</think>{"analysis": "", "plan": "", '
                            '"commands": [{"keystrokes": "C-c"}]}')
    assert parsed.thinking == "plan it"
    assert parsed.action.task_complete is False  # the schema's default
    assert parsed.action.commands[0].duration == 1.0
    assert parse_terminus(_with(commands=[], task_complete=True)).action.commands == []


def test_a_think_tag_inside_keystrokes_is_data():
    text = _with(commands=[{"keystrokes": "echo '</think>' <think>\n"}])
    assert parse_terminus(text).action.commands[0].keystrokes == "echo '</think>' <think>\n"


@pytest.mark.parametrize("text, reason", [
    (TEXT + "\n" + TEXT, "a second JSON object"),
    (TEXT + "\nRunning these now.", "text after the JSON object"),
    ("Here is my answer:\n" + TEXT, "text before the JSON object"),
    ("```json\n" + TEXT + "\n```", "text before the JSON object"),
    ("<think>unfinished " + TEXT, "unterminated <think>"),
    ("<think>a</think><think>b</think>" + TEXT, "a second <think> block"),
    ("<think>a <think>b</think>" + TEXT, "nested <think> block"),
    ("Sure. <think>b</think>" + TEXT, "text before the <think> block"),
    (TEXT + "</think>", "text after the JSON object"),
    (TEXT[:-3], "not valid JSON"),
    ("", "no JSON object"),
    ("[" + TEXT + "]", "text before the JSON object"),
    (json.dumps({k: v for k, v in ACTION.items() if k != "commands"}), "missing field 'commands'"),
    (json.dumps({k: v for k, v in ACTION.items() if k != "plan"}), "missing field 'plan'"),
    (_with(commands={"keystrokes": "ls\n"}), "commands is a JSON dict, not an array"),
    (_with(commands=["ls\n"]), "commands[0] is a JSON str, not an object"),
    (_with(commands=[{"keystrokes": ["ls", "-la"]}]), "commands[0].keystrokes is a JSON list"),
    (_with(commands=[{"keystrokes": 7}]), "commands[0].keystrokes is a JSON int"),
    (_with(commands=[{"duration": 1.0}]), "commands[0] has no keystrokes"),
    (_with(commands=[{"keystrokes": "ls\n", "duration": "0.1"}]), "commands[0].duration is not a number"),
    (_with(commands=[{"keystrokes": "ls\n", "duration": True}]), "commands[0].duration is not a number"),
    (TEXT.replace("0.1", "NaN"), "NaN is not a JSON number"),
    (_with(commands=[{"keystrokes": "ls\n", "is_blocking": True}]), "unknown field 'is_blocking'"),
    (_with(task_complete="true"), "task_complete is a JSON str, not a boolean"),
    (_with(task_complete=1), "task_complete is a JSON int, not a boolean"),
    (_with(analysis=None), "analysis is a JSON NoneType"),
    (_with(name="run"), "unknown field 'name'"),
    ('{"analysis": "a", "analysis": "b", "plan": "", "commands": []}', "duplicate key 'analysis'"),
    (json.dumps({"state_analysis": "", "explanation": "", "commands": [],
                 "is_task_complete": False}), "unknown field 'state_analysis'"),  # Terminus-1
])
def test_anything_else_is_an_unparseable_action(text, reason):
    parsed = parse_terminus(text)
    assert not parsed.valid and parsed.action is None
    assert reason in parsed.reason


@pytest.mark.parametrize("value", [None, 3, b"{}", ["{}"], "{" * 100_000, "[" * 5000 + "]" * 5000,
                                   '{"analysis": ' * 3000, "x" * 70_000, "\ud800{}"])
def test_hostile_inputs_never_crash(value):
    parsed = parse_terminus(value)
    assert not parsed.valid and parsed.reason


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300),
                 st.builds(lambda i, s: TEXT[:i] + s + TEXT[i:],
                           st.integers(0, len(TEXT)), st.text(max_size=5))))
def test_mutated_text_never_crashes_and_a_valid_parse_has_the_harness_types(text):
    parsed = parse_terminus(text)
    assert parsed.valid == (parsed.action is not None)
    if parsed.valid:
        assert all(isinstance(c.keystrokes, str) and isinstance(c.duration, float)
                   for c in parsed.action.commands)
        assert isinstance(parsed.action.task_complete, bool)
    else:
        assert parsed.reason


def _action(*keys, done=False, duration=0.1):
    return parse_terminus(json.dumps({"analysis": "", "plan": "", "task_complete": done,
                                      "commands": [{"keystrokes": k, "duration": duration}
                                                   for k in keys]})).action


def test_identity_ignores_durations_and_free_text_but_nothing_else():
    expert = _action("ls -la\n", "wc -l notes.txt\n")
    assert action_difference(expert, _action("ls -la\n", "wc -l notes.txt\n", duration=5)) == ""
    assert action_difference(expert, _action("ls -la\n", "wc -l notes.txt\n", "rm -rf /\n"))
    assert action_difference(expert, _action("ls -la\n"))
    assert action_difference(expert, _action("wc -l notes.txt\n", "ls -la\n"))
    assert action_difference(expert, _action("ls -la", "wc -l notes.txt\n"))  # no Enter: not run
    assert action_difference(expert, _action("LS -LA\n", "wc -l notes.txt\n"))
    assert "task_complete" in action_difference(expert, _action("ls -la\n", "wc -l notes.txt\n",
                                                                done=True))
