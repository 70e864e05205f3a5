"""actions.py: completion text ⇄ assistant message; hostile text never crashes it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pivotrl.formats.actions import MAX_COMPLETION_CHARS, ParsedAction, parse_completion, render_action
from pivotrl.scoring import score_completion
from pivotrl.io.records import Message, Turn


def calls_of(parsed: ParsedAction) -> list[tuple[str, dict]]:
    assert parsed.valid, parsed.reason
    return [(c.function.name, json.loads(c.function.arguments)) for c in parsed.message.tool_calls or []]


def test_hermes_single_call_with_think_and_end_marker():
    text = ('<think>the user wants weather</think>\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>')
    parsed = parse_completion(text)
    assert calls_of(parsed) == [("get_weather", {"city": "Paris"})]
    call = parsed.message.tool_calls[0]
    assert parsed.message.role == "assistant" and parsed.message.content is None
    assert call.id == "call_0" and isinstance(call.function.arguments, str)


def test_several_calls_text_before_and_string_arguments():
    text = ('Let me check both.\n<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>\n')
    parsed = parse_completion(text)
    assert calls_of(parsed) == [("a", {"x": 1}), ("b", {})]
    assert parsed.message.content == "Let me check both."
    assert [c.id for c in parsed.message.tool_calls] == ["call_0", "call_1"]


@pytest.mark.parametrize("text,expected", [
    ('{"name": "f", "arguments": {"k": "v"}}', [("f", {"k": "v"})]),
    ('[{"name": "f", "arguments": {}}, {"name": "g", "parameters": {"n": 2}}]',
     [("f", {}), ("g", {"n": 2})]),
    ('{"type": "function", "function": {"name": "f", "arguments": "{\\"a\\": true}"}}',
     [("f", {"a": True})]),
    ('```json\n{"name": "f", "arguments": {"a": 1}}\n```', [("f", {"a": 1})]),
    ('{"role": "assistant", "content": null, "tool_calls": [{"id": "x", "type": "function", '
     '"function": {"name": "f", "arguments": "{}"}}]}', [("f", {})]),
    ('reasoning so far</think><tool_call>{"name": "f", "arguments": {}}</tool_call>', [("f", {})]),
    ('[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]', [("f", {"a": 1})]),
    ('<|python_tag|>{"name": "f", "parameters": {"a": 1}}<|eom_id|>', [("f", {"a": 1})]),
])
def test_bare_json_openai_shapes_and_open_think(text, expected):
    assert calls_of(parse_completion(text)) == expected


def test_plain_message_and_json_answer_are_messages():
    parsed = parse_completion("<think>easy</think>The answer is 4.<|im_end|>")
    assert parsed.valid and parsed.message.tool_calls is None
    assert parsed.message.content == "The answer is 4."
    parsed = parse_completion('{"answer": 4}')
    assert parsed.valid and parsed.message.tool_calls is None


@pytest.mark.parametrize("text,reason", [
    ("", "empty"),
    ("   <|im_end|>", "empty"),
    ("<think>only thinking</think>", "empty"),
    ("<think>never closed", "unterminated"),
    ('<tool_call>{"name": "f", "arguments": {}}', "unclosed"),
    ('<tool_call>{"name": "f", "arguments": {</tool_call>', "not valid JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', "without a name"),
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', "without a name"),
    ('<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>', "not an object"),
    ('<tool_call>{"name": "f", "arguments": "not json"}</tool_call>', "not valid JSON"),
    ('<tool_call>"just a string"</tool_call>', "not an object"),
    ('<tool_call>{"name": "f", "arguments": {}}</tool_call> and some padding', "after the last"),
    ('<tool_call>{"name": "f", "arguments": {}}</tool_call><|im_end|>junk', "after the last"),
    ('{"name": "f", "arguments": {}}</tool_call>', "without <tool_call>"),
    ('{"name": 3, "arguments": {}}', "without a name"),
    ("[TOOL_CALLS] sure, calling it", "no valid tool call"),
])
def test_invalid_actions_have_reasons(text, reason):
    parsed = parse_completion(text)
    assert not parsed.valid and parsed.message is None
    assert reason in parsed.reason


def test_huge_completion_is_invalid():
    pad = "x" * (MAX_COMPLETION_CHARS + 1)
    parsed = parse_completion('<tool_call>{"name": "f", "arguments": {"a": "%s"}}</tool_call>' % pad)
    assert not parsed.valid and "too long" in parsed.reason


def test_non_string_input_is_invalid_not_an_exception():
    assert not parse_completion(None).valid  # type: ignore[arg-type]
    assert not parse_completion(b"<tool_call>").valid  # type: ignore[arg-type]
    deep = "[" * 100_000 + "]" * 100_000
    assert parse_completion(f"<tool_call>{deep}</tool_call>").valid is False


def test_render_action_is_canonical_hermes():
    msg = Message(role="assistant", content="Checking.", tool_calls=[
        {"id": "z", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": [2]}'}}])
    text = render_action(msg)
    assert text == 'Checking.\n<tool_call>\n{"name": "f", "arguments": {"b": 1, "a": [2]}}\n</tool_call>'
    back = parse_completion(text)
    assert back.message.content == "Checking." and calls_of(back) == [("f", {"b": 1, "a": [2]})]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)
safe_text = st.text(max_size=40).filter(lambda s: "<" not in s and ">" not in s and s.strip() == s
                                        and not s.startswith(("{", "[", "`")))


@settings(max_examples=80, deadline=None)
@given(content=safe_text, calls=st.lists(
    st.tuples(st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,15}", fullmatch=True),
              st.dictionaries(st.text(max_size=8), json_values, max_size=4)), max_size=3))
def test_render_then_parse_round_trips(content, calls):
    if not content and not calls:
        return
    msg = Message(role="assistant", content=content or None, tool_calls=[
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(calls)] or None)
    back = parse_completion(render_action(msg))
    assert back.valid, back.reason
    assert (back.message.content or "") == content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in back.message.tool_calls or []] \
        == [(n, a) for n, a in calls]


fragments = st.sampled_from(["<tool_call>", "</tool_call>", "<think>", "</think>", "<|im_end|>",
                             '{"name": "f", "arguments": ', "{", "}", "[", "]", '"', "\\", "null",
                             '{"type": "function", "function": ', "```json\n", "```", " ", "\n"])


@settings(max_examples=250, deadline=None)
@given(st.lists(fragments | st.text(max_size=10), max_size=30).map("".join))
def test_parse_never_raises_on_hostile_text(text):
    parsed = parse_completion(text)
    assert isinstance(parsed, ParsedAction)
    assert parsed.valid == (parsed.message is not None)
    if not parsed.valid:
        assert parsed.reason
    else:
        for call in parsed.message.tool_calls or []:
            assert isinstance(json.loads(call.function.arguments), dict)


def test_score_completion_scores_invalid_as_zero_with_reason():
    from pivotrl.verifiers import get_verifier

    turn = Turn(id="t/1", trajectory_id="t", turn=1, context=[], expected={
        "role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}]})
    verifier = get_verifier("toolcall")
    good = score_completion(verifier, turn, '<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert (good.reward, good.valid) == (1.0, True)
    bad = score_completion(verifier, turn, '<tool_call>{"name": "f", "arguments": {}}</tool_call>!!')
    assert (bad.reward, bad.valid) == (0.0, False) and "after the last" in bad.reason


# ---------------------------------------------------------------- shared rules of every format


def test_a_json_call_cut_short_is_invalid_not_a_message():
    cut = '{"name": "get_order", "parameters": {"order_id": "O-1'
    assert not parse_completion(cut).valid
    assert not parse_completion('[{"name": "f", "arguments": {').valid
    prose = parse_completion("{braces} are how sets are written")
    assert prose.valid and prose.message.content.startswith("{braces}")


@pytest.mark.parametrize("text", [
    "<tool_call>\n<function=get_order>\n<parameter=order_id>\nO-1\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>get_order\n<arg_key>order_id</arg_key>\n<arg_value>O-1</arg_value>\n</tool_call>",
    "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_order",
    " to=functions.get_order<|channel|>commentary json<|message|>{}<|call|>",
])
def test_another_formats_call_is_invalid_under_the_json_reader(text):
    # Read with the Hermes/JSON reader, another family's call must never pass as a message.
    parsed = parse_completion(text)
    assert not parsed.valid and parsed.reason


def test_parse_with_applies_the_shared_rules_to_any_reader():
    from pivotrl.formats.actions import InvalidAction, parse_with

    def reader(body):
        if body == "boom":
            raise KeyError("reader bug")
        if body == "bad":
            raise InvalidAction("not a call")
        return body.split("|")[0], [("f", {"x": 1})] if "|" in body else []

    assert parse_with("hi|call", reader).message.tool_calls[0].function.name == "f"
    assert parse_with("<think>plan</think>hi", reader).message.content == "hi"
    assert parse_with("bad", reader).reason == "not a call"
    assert not parse_with("boom", reader).valid  # a reader bug is an invalid action, not a crash
    assert not parse_with("x" * 10, reader, max_chars=5).valid
    assert not parse_with("see <arg_key>", reader).valid  # a call marker left in the content
    opened = dict(think_opens_in_prompt=True)
    assert parse_with("plan</think>hi", reader, **opened).message.content == "hi"
    assert "thinking" in parse_with("still planning", reader, **opened).reason
    assert parse_with("<tool_call>", lambda b: ("", [("f", {})]), **opened).valid  # acts at once


family_fragments = st.sampled_from([
    "<tool_call>", "</tool_call>", "<function=f>", "</function>", "<parameter=x>", "</parameter>",
    "<arg_key>x</arg_key>", "<arg_value>", "</arg_value>", "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>", "function<｜tool▁sep｜>f\n```json\n", "```", "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>", "<|start|>assistant", " to=functions.f", "<|channel|>", "analysis",
    "commentary json", "final", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<think>",
    "</think>", "{", "}", '"', "\n", "1"])


@settings(max_examples=150, deadline=None)
@given(st.lists(family_fragments | st.text(max_size=6), max_size=25).map("".join))
def test_every_format_reader_never_raises_on_hostile_text(text):
    from pivotrl.formats.families import FORMATS, FormatParser

    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}}]
    for fmt in FORMATS.values():
        parsed = FormatParser(fmt, think_opens_in_prompt=True)(text, tools)
        assert parsed.valid == (parsed.message is not None) and (parsed.valid or parsed.reason)
        for call in (parsed.message.tool_calls or []) if parsed.valid else []:
            assert isinstance(json.loads(call.function.arguments), dict)
