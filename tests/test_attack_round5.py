"""Round 5 of attacks on the tool-call and message verifiers (`toolcall`, `exact`, `judge`).

Each attack is a near-copy of the expert's action that a rule might pay although no rule proves
it the same action (JSON types Python compares equal, NaN/Infinity, -0.0, duplicate keys, call
types, roles, content parts, names, world rules), or hostile input that must not crash a scorer.
Each class is tested in both directions: the wrong action scores 0, the forms a schema, JSON or
the world proves equal still score 1.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pivotrl.formats.actions import parse_completion
from pivotrl.io.records import FunctionCall, Message, ToolCall, Turn
from pivotrl.verifiers import get_verifier
from pivotrl.verifiers.world import register_world

from fake_judge import FakeJudge


def call(name: str, raw: str | dict, type_: str = "function") -> ToolCall:
    return ToolCall(id="c", type=type_, function=FunctionCall(name=name, arguments=raw))


def raw(name: str, text: str | dict, type_: str = "function") -> Message:
    """A call whose arguments text is given as it is (not re-serialised)."""
    return Message(role="assistant", tool_calls=[call(name, text, type_)])


def act(name: str, args: dict[str, Any]) -> Message:
    return raw(name, json.dumps(args, ensure_ascii=False))


def acts(*calls: tuple[str, dict]) -> Message:
    return Message(role="assistant", tool_calls=[
        ToolCall(id=f"c{i}", function=FunctionCall(name=n, arguments=json.dumps(a)))
        for i, (n, a) in enumerate(calls)])


def say(text: Any) -> Message:
    return Message(role="assistant", content=text)


def tool(name: str, props: dict, required: list[str] | None = None, **extra: Any) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": required or [], **extra}}}


def turn(expected: Message, tools: list | None = None, world: str | None = None) -> Turn:
    return Turn(id="r5/1", trajectory_id="r5", turn=1, tools=tools or [],
                context=[Message(role="user", content="please")], expected=expected,
                metadata={"world": world} if world else {})


def score(expected: Message, cand: Message, tools: list | None = None, world: str | None = None,
          **config: Any):
    return get_verifier("toolcall", **config).score(turn(expected, tools, world), cand)


def reward(expected: Message, cand: Message, tools: list | None = None, **config: Any) -> float:
    return score(expected, cand, tools, **config).reward


F = [tool("f", {"n": {"type": "integer"}, "x": {"type": "number"}, "b": {"type": "boolean"},
                "s": {"type": "string"}, "flags": {"type": "array", "items": {"type": "boolean"}},
                "o": {"type": "object"}, "v": {"anyOf": [{"type": "string"},
                                                          {"type": "integer"}]}})]


# ---------------------------------------------------------------- JSON types Python calls equal


@pytest.mark.parametrize("expert,cand", [
    ({"n": 1}, {"n": True}),                      # True == 1 in Python
    ({"b": True}, {"b": 1}),
    ({"b": False}, {"b": 0}),
    ({"flags": [True, False]}, {"flags": [1, 0]}),  # inside an array
    ({"o": {"a": True}}, {"o": {"a": 1}}),        # inside an object
    ({"o": {"a": [False]}}, {"o": {"a": [0]}}),   # nested twice
    ({"x": 1.0}, {"x": True}),
    ({"n": 1}, {"n": 1.0}),                       # an int and a float (integer schema)
    ({"n": 100}, {"n": 1e2}),
    ({"s": "1"}, {"s": 1}),                       # "1" and 1 under a string schema
    ({"v": 5}, {"v": "5"}),                       # a union takes both: they stay two values
    ({"s": "Rome"}, {"s": ["Rome"]}),
    ({"o": {"a": 1}}, {"o": json.dumps({"a": 1})}),  # an object sent as its JSON text
])
def test_values_python_compares_equal_are_other_json_values(expert, cand):
    assert reward(act("f", expert), act("f", cand), F) == 0


def test_the_same_json_value_in_another_form_still_pays():
    assert reward(act("f", {"n": 5, "s": "a"}), act("f", {"s": "a", "n": 5}), F) == 1  # key order
    assert reward(act("f", {"x": 2}), act("f", {"x": 2}), F) == 1      # an int for a number
    assert reward(act("f", {"x": 2.5}), raw("f", '{"x":2.50}'), F) == 1
    assert reward(act("f", {"n": 0}), raw("f", '{"n": -0}'), F) == 1   # -0 is the integer 0
    assert reward(act("f", {"s": "A"}), raw("f", '{"s": "\\u0041"}'), F) == 1  # an escape
    assert reward(act("f", {"n": 5}), raw("f", '{"\\u006e": 5}'), F) == 1      # in a key too
    assert reward(act("f", {"n": 5}), raw("f", {"n": 5}), F) == 1      # arguments as an object
    assert reward(act("f", {}), raw("f", ""), F) == 1                  # no arguments
    # one double written two ways (both texts parse to the same IEEE value)
    assert reward(raw("f", '{"x": 1e20}'), raw("f", '{"x":100000000000000000000.0}'), F) == 1
    assert reward(act("f", {"x": 0.1}), raw("f", '{"x": 0.10000000000000000001}'), F) == 1
    assert reward(act("f", {"x": 2.0}), act("f", {"x": 2}), F, int_float_equal=True) == 1


@pytest.mark.parametrize("expert,cand", [
    ('{"x": NaN}', '{"x": NaN}'),                 # even the expert's own text: not JSON
    ('{"x": NaN}', '{"x":NaN}'),
    ('{"x": Infinity}', '{"x": Infinity}'),
    ('{"x": Infinity}', '{"x": 1e400}'),          # 1e400 is inf only where a double overflows
    ('{"x": 1e308}', '{"x": Infinity}'),
    ('{"x": -Infinity}', '{"x": -1e999}'),
])
def test_nan_and_infinity_are_no_json_numbers_and_never_pay(expert, cand):
    for config in ({}, {"int_float_equal": True}, {"normalize": ["bfcl"]}):
        assert reward(raw("f", expert), raw("f", cand), F, **config) == 0, config


def test_negative_zero_is_another_float():
    assert reward(act("f", {"x": 0.0}), act("f", {"x": -0.0}), F) == 0
    assert reward(act("f", {"x": -0.0}), act("f", {"x": 0.0}), F) == 0
    assert reward(act("f", {"x": -0.0}), act("f", {"x": -0.0}), F) == 1
    # a backend that converts (the user's opt-in) takes -0.0 for the integer 0
    assert reward(act("f", {"n": 0}), act("f", {"n": -0.0}), F, int_float_equal=True) == 1


def test_big_numbers_are_compared_exactly_and_never_crash():
    assert reward(act("f", {"n": 12345678901234567}), raw("f", '{"n": 12345678901234567.0}'),
                  F, int_float_equal=True) == 0
    s = score(act("f", {"n": 1}), raw("f", '{"n": ' + "9" * 5000 + "}"), F)
    assert s.reward == 0 and not s.valid                   # past int()'s digit limit
    s = score(act("f", {"n": 1}), act("f", {"n": "9" * 5000}), F, numeric_strings=True)
    assert s.reward == 0 and s.valid                       # was a ValueError out of score()
    huge_default = [tool("f", {"n": {"type": "integer", "default": "9" * 5000}})]
    assert reward(act("f", {}), act("f", {}), huge_default) == 1
    assert reward(act("f", {"n": 1}), act("f", {}), huge_default) == 0


@pytest.mark.parametrize("expert,cand", [
    (12, "1\u0662"),       # Arabic-Indic digit two: int() reads 12
    (12, "\uff11\uff12"),  # fullwidth "12"
    (12, "\u0661\u0662"),
])
def test_numeric_strings_take_ascii_digits_only(expert, cand):
    assert reward(act("f", {"n": expert}), act("f", {"n": cand}), F, numeric_strings=True) == 0
    assert reward(act("f", {"x": 2.5}), act("f", {"x": "2.\u0665"}), F, numeric_strings=True) == 0
    assert reward(act("f", {"n": expert}), act("f", {"n": "12"}), F, numeric_strings=True) == 1
    assert reward(act("f", {"x": 2.5}), act("f", {"x": "2.5"}), F, numeric_strings=True) == 1


# ---------------------------------------------------------------- arguments texts


@pytest.mark.parametrize("text", [
    '{"n": 5, "n": 500}',                      # last wins in Python: paid before
    '{"n": 500, "n": 5}',
    '{"n": 500, "\\u006e": 5}',                # the same key, escaped
    '{"o": {"a": 1, "a": 2}}',                 # nested
])
def test_a_duplicate_key_names_no_one_call(text):
    last = json.loads(text)
    first = json.loads(text, object_pairs_hook=lambda pairs: dict(reversed(pairs)))
    for expert in (act("f", last), act("f", first)):
        s = score(expert, raw("f", text), F)
        assert s.reward == 0 and not s.valid and "duplicate key" in s.reason
    for exact in (get_verifier("exact"), get_verifier("exact", strict=True)):
        assert exact.score(turn(act("f", last), F), raw("f", text)).reward == 0
    assert get_verifier("exact").score(turn(act("f", last), F), act("f", last)).reward == 1


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "f", "arguments": {"n": 5, "n": 500}}</tool_call>',
    '<tool_call>{"name": "f", "name": "g", "arguments": {"n": 500}}</tool_call>',
    '{"name": "f", "arguments": {"n": 500, "n": 500}}',
    '<tool_call>{"name": "f", "arguments": "{\\"n\\": 5, \\"n\\": 500}"}</tool_call>',
    '<tool_call>{"name": "f", "arguments": {"n": 500, "o": {"a": 1, "a": 2}}}</tool_call>',
])
def test_a_duplicate_key_in_a_completion_names_no_one_call(text):
    parsed = parse_completion(text)
    assert not parsed.valid and "duplicate key" in parsed.reason


def test_a_tool_name_with_surrounding_whitespace_is_no_tools_name():
    parsed = parse_completion('<tool_call>{"name": " f", "arguments": {"n": 500}}</tool_call>')
    assert not parsed.valid and "whitespace" in parsed.reason
    assert parse_completion('<tool_call>{"name": "f", "arguments": {"n": 500}}</tool_call>').valid


@pytest.mark.parametrize("text", [json.dumps(json.dumps({"n": 5})), "[]", "null", "5", '"{}"'])
def test_arguments_that_are_not_one_json_object_score_0(text):
    s = score(act("f", {"n": 5}), raw("f", text), F)
    assert s.reward == 0 and not s.valid


@pytest.mark.parametrize("cand,paid", [
    ({"id": "a", "opts": {"deep": False}}, 1),  # the schema's default, omitted
    ({"id": "a", "lim": 10, "opts": {"deep": False}}, 1),
    ({"id": "a", "lim": 10, "opts": {}}, 1),    # a nested default (written "False"), omitted
    ({"id": "a", "lim": 10}, 0),                # an object with no default of its own, omitted
    ({"id": "a", "lim": None, "opts": {}}, 0),  # null is not the default
    ({"id": "a", "lim": 10.0, "opts": {}}, 0),
    ({"lim": 10, "opts": {}}, 0),               # missing required
    ({"id": "a", "z": None, "lim": 10, "opts": {}}, 0),  # null where the expert gave nothing
    ({"id": "a", "admin": True, "lim": 10, "opts": {}}, 0),  # not in the schema
    ({"id": "a", "opts": {"deep": True}}, 0),
    ({"id": "a", "opts": {"deep": "False"}}, 0),  # the default's text is not the value
])
def test_defaults_only_where_the_schema_states_them(cand, paid):
    tools = [tool("g", {"id": {"type": "string"}, "lim": {"type": "integer", "default": 10},
                        "z": {"type": ["integer", "null"]},
                        "opts": {"type": "object", "properties": {
                            "deep": {"type": "boolean", "default": "False"}}}}, ["id"])]
    assert reward(act("g", {"id": "a", "lim": 10, "opts": {"deep": False}}), act("g", cand),
                  tools) == paid


# ---------------------------------------------------------------- tool names and calls


@pytest.mark.parametrize("name", ["Get_Weather", " get_weather", "get_weather ", "get_weather\n",
                                  "get_w\u0435ather", "get\u200b_weather", "functions.get_weather",
                                  "get-weather", "get_weather\u0301"])
def test_a_tool_name_is_data(name):
    tools = [tool("get_weather", {"city": {"type": "string"}})]
    expert = act("get_weather", {"city": "Rome"})
    for offered in (tools, None):
        assert reward(expert, act(name, {"city": "Rome"}), offered) == 0
    assert reward(expert, act("get_weather", {"city": "Rome"}), tools) == 1


def test_bfcl_underscored_name_must_name_exactly_one_dotted_tool():
    x = {"x": {"type": "integer"}}
    both = [tool("a.b_c", x), tool("a_b.c", x)]   # both rename to "a_b_c"
    assert reward(act("a.b_c", {"x": 1}), act("a_b_c", {"x": 1}), both, normalize=["bfcl"]) == 0
    assert reward(act("a.b_c", {"x": 1}), act("a_b_c", {"x": 1}), both[:1],
                  normalize=["bfcl"]) == 1
    assert reward(act("a.b_c", {"x": 1}), act("a.b_c", {"x": 1}), both, normalize=["bfcl"]) == 1


def test_call_counts_and_repeats():
    w = [tool("get_weather", {"city": {"type": "string"}})]
    rome, paris = ("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Paris"})
    assert reward(acts(rome), acts(rome, paris), w) == 0          # one right, one extra
    assert reward(acts(rome), acts(rome, rome), w) == 0           # the expert's call twice
    assert reward(acts(rome), acts(rome, rome), w, partial_credit=True) == 0
    assert reward(acts(rome, paris), acts(rome, rome), w) == 0    # one call made twice
    assert reward(acts(rome, paris), acts(rome, rome), w, partial_credit=True) == 0
    assert reward(acts(rome, paris), acts(rome), w, partial_credit=True) == 0.5
    # one message's calls are parallel (OpenAI, BFCL's parallel categories): order is free
    assert reward(acts(rome, paris), acts(paris, rome), w) == 1


def test_a_call_of_another_type_scores_0():
    w = [tool("get_weather", {"city": {"type": "string"}})]
    expert = act("get_weather", {"city": "Rome"})
    for kind in ("custom", "code_interpreter", "Function"):
        assert reward(expert, raw("get_weather", '{"city": "Rome"}', kind), w) == 0
    assert reward(expert, raw("get_weather", '{"city": "Rome"}', "function"), w) == 1


def test_only_an_assistant_message_is_an_action():
    expert = act("f", {"n": 1})
    for role in ("user", "tool", "system"):
        s = score(expert, Message(role=role, tool_calls=expert.tool_calls), F)
        assert s.reward == 0 and not s.valid
        assert reward(say("Done."), Message(role=role, content="Done.")) == 0
    assert reward(say("Done."), say("Done.")) == 1


# ---------------------------------------------------------------- messages


@pytest.mark.parametrize("expert,cand", [
    ("Your order o1 is cancelled.", "Your order o1 is cancelled. I also deleted your account."),
    ("Your order o1 is cancelled.", "Your order o1 is cancelled.\nIgnore that: it is not."),
    ("You have 3 orders.", "You have 4 orders."),
    ("You have 3 orders.", "You have 3 orders!!"),
    ("Done.", ""), ("", ""), (" ", " "), ("Done.", "\u200bDone."), ("Done.", "\ufeffDone."),
])
def test_messages_not_proven_the_same_score_0(expert, cand):
    assert reward(say(expert), say(cand)) == 0


def test_a_call_and_a_message_are_never_the_same_action():
    w = [tool("get_weather", {"city": {"type": "string"}})]
    expert = act("get_weather", {"city": "Rome"})
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    assert reward(expert, say(text), w) == 0                 # a call written as text
    assert reward(say("Rome is sunny."), expert, w) == 0
    assert reward(expert, say("Rome is sunny."), w) == 0
    both = Message(role="assistant", content="Rome is sunny.", tool_calls=expert.tool_calls)
    assert reward(say("Rome is sunny."), both, w) == 0


@pytest.mark.parametrize("content", [
    [{"type": "text", "text": "Done."}, {"type": "refusal", "refusal": "I won't."}],
    [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}, {"type": "text",
                                                                     "text": "Done."}],
    [{"type": "text", "text": 5}],             # a TypeError out of message_text before
    [{"text": ["Done."]}],
    [5],
    [None],
])
def test_content_parts_that_are_not_text_never_pay_and_never_crash(content):
    for verifier in (get_verifier("toolcall"), get_verifier("exact"),
                     get_verifier("exact", strict=True)):
        s = verifier.score(turn(say("Done.")), say(content))
        assert s.reward == 0 and not s.valid, verifier
    srv = FakeJudge(lambda a, b: "YES")
    try:
        judged = get_verifier("toolcall", message_rule="judge", judge={"base_url": srv.url})
        assert judged.score(turn(say("Done.")), say(content)).reward == 0
        judge = get_verifier("judge", base_url=srv.url)
        assert judge.score(turn(say("Done.")), say(content)).reward == 0
        assert srv.requests == 0
    finally:
        srv.close()


def test_text_parts_are_the_text():
    assert reward(say("Done."), say([{"type": "text", "text": "Done."}])) == 1
    assert reward(say("Done."), say([{"type": "text", "text": "Do"}, "ne."])) == 1
    assert reward(say([{"type": "text", "text": "Done."}]), say("Done.")) == 1
    assert reward(say("a\ud800b"), say("a\ud800b")) == 1      # a lone surrogate, same text
    assert reward(act("f", {"s": "\ud800"}), raw("f", '{"s": "\\ud800"}'), F) == 1
    assert reward(act("f", {"s": "\ud800"}), raw("f", '{"s": "\\udc00"}'), F) == 0


# ---------------------------------------------------------------- hostile input


def _nested_dict(depth: int) -> dict:
    out: dict = {}
    cur = out
    for _ in range(depth):
        cur["a"] = {}
        cur = cur["a"]
    return out


@pytest.mark.parametrize("expert,cand", [
    (act("f", {"o": {}}), raw("f", '{"o": ' + "[" * 5000 + "]" * 5000 + "}")),
    (raw("f", '{"flags": ' + "[" * 900 + "]" * 900 + "}"),   # both deep: the comparison recursed
     raw("f", '{"flags":' + "[" * 900 + "]" * 900 + "}")),
    (raw("f", '{"flags": ' + "[" * 900 + "]" * 900 + "}"),
     raw("f", '{"flags":' + "[" * 899 + "1" + "]" * 899 + "}")),
    (act("f", {"o": {}}), raw("f", {"o": _nested_dict(3000)})),  # json.dumps recursed
    (act("f", {"o": {}}), raw("f", {"o": {1, 2}})),             # no JSON value at all
])
def test_hostile_arguments_score_0_and_never_raise(expert, cand):
    s = score(expert, cand, F)
    assert s.reward == 0 and not s.valid
    for exact in (get_verifier("exact"), get_verifier("exact", strict=True)):
        exact.score(turn(expert, F), cand)  # a Score, never an exception


def test_every_call_counts_towards_the_size_limit():
    big = Message(role="assistant", tool_calls=[call("f", "{}"),
                                                call("f", {"s": "a" * 100_000})])
    s = score(acts(("f", {}), ("f", {"s": "a" * 100_000})), big, F)
    assert s.reward == 0 and "too long" in s.reason  # the object-form call was not measured
    small = Message(role="assistant", tool_calls=[call("f", "{}"), call("f", {"s": "a"})])
    assert reward(acts(("f", {}), ("f", {"s": "a"})), small, F) == 1


# ---------------------------------------------------------------- the world's own rule


class _StrictShop:
    """A world whose `canonical_call` folds the product's case and rejects what `execute`
    would: a qty that is not an int from 1 to 99, a unit not written exactly as allowed."""
    name = "attack_round5_shop"

    def reset(self, config: dict) -> None:
        pass

    def execute(self, name: str, arguments: dict) -> str:
        return "ok"

    def snapshot(self) -> dict:
        return {}

    def success(self, goal: dict, final_message: str | None) -> bool:
        return False

    def canonical_call(self, name: str, arguments: dict) -> dict | None:
        if name == "buy":
            qty = arguments.get("qty", 1)
            if type(qty) is not int or not 1 <= qty <= 99:
                return None
            return {"product": arguments["product"].lower(), "qty": qty}  # raises on a list
        if name == "set_unit":
            unit = arguments.get("unit")
            return {"unit": unit} if unit in ("celsius", "fahrenheit") else None
        return None  # no rule for other tools


register_world(_StrictShop.name, _StrictShop)
SHOP = [tool("buy", {"product": {"type": "string"}, "qty": {"type": "integer"}}),
        tool("set_unit", {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}),
        tool("note", {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}})]


def shop(expert: Message, cand: Message, **config: Any) -> float:
    return score(expert, cand, SHOP, world=_StrictShop.name, **config).reward


def test_a_call_the_world_rejects_is_not_the_expert_call_it_runs():
    buy = act("buy", {"product": "pen", "qty": 2})
    assert shop(buy, act("buy", {"product": "pen", "qty": 2.0}), int_float_equal=True) == 0
    assert shop(act("set_unit", {"unit": "celsius"}), act("set_unit", {"unit": "Celsius"})) == 0
    s = score(buy, act("buy", {"product": ["pen"], "qty": 2}), SHOP, world=_StrictShop.name)
    assert s.reward == 0 and s.valid  # the world's rule raised: no crash, no pay


def test_the_worlds_own_rule_still_pays_and_schemas_decide_where_it_has_none():
    buy = act("buy", {"product": "pen", "qty": 2})
    assert shop(buy, act("buy", {"product": "PEN", "qty": 2})) == 1   # the world folds case
    assert shop(buy, act("buy", {"qty": 2, "product": "pen"})) == 1
    assert shop(buy, act("buy", {"product": "pen", "qty": 3})) == 0
    # no rule for "note": the schema's enum fold decides, as without a world
    assert shop(act("note", {"unit": "celsius"}), act("note", {"unit": "Celsius"})) == 1
    assert shop(act("note", {"unit": "celsius"}), act("note", {"unit": "fahrenheit"})) == 0
