"""Strings are data, and only offered tools pay: `toolcall`'s default string, number and tool
rules, each class in both directions (the wrong action scores 0, the equivalent one still 1),
and the opt-in `normalize` rules for environments that normalise strings themselves."""

from __future__ import annotations

import json
import random
import string
from typing import Any

import pytest

from pivotrl.io.records import FunctionCall, Message, ToolCall, Turn
from pivotrl.verifiers import get_verifier

TEXT = {"type": "string"}


def act(name: str, args: dict[str, Any]) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(
        id="c", function=FunctionCall(name=name, arguments=json.dumps(args, ensure_ascii=False)))])


def tool(name: str, props: dict, **extra: Any) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": [], **extra}}}


def reward(tools: list, expert: Message, cand: Message, **config: Any) -> float:
    t = Turn(id="s/1", trajectory_id="s", turn=1, tools=tools, context=[], expected=expert)
    return get_verifier("toolcall", **config).score(t, cand).reward


def one(props: dict, key: str, expert: Any, cand: Any, **config: Any) -> float:
    return reward([tool("f", props)], act("f", {key: expert}), act("f", {key: cand}), **config)


# ---------------------------------------------------------------- enums: ASCII folds only


@pytest.mark.parametrize("allowed,expert,cand,paid", [
    (["class", "struct"], "class", "cla\u017fs", 0),     # long s: casefolds to "class"
    (["glass", "metal"], "glass", "gla\u00df", 0),       # sharp s: casefolds to "glass"
    (["k", "m"], "k", "\u212a", 0),                      # the Kelvin sign: lower() is "k"
    (["café", "bar"], "café", "CAFÉ", 0),                # non-ASCII allowed values: no fold
    (["class", "struct"], "class", "Class", 1),          # an ASCII fold naming one value
    (["DEBUG", "INFO"], "DEBUG", "debug", 1),
    (["K", "k"], "k", "K", 0),                           # ...but "K" is itself allowed
    (["on", "On", "off"], "on", "ON", 0),                # a fold naming two values
])
def test_enum_case_folds_only_within_ascii_and_to_one_value(allowed, expert, cand, paid):
    assert one({"v": {"type": "string", "enum": allowed}}, "v", expert, cand) == paid


@pytest.mark.parametrize("key,expert,cand", [
    ("level", "DEBUG", "debug"),      # log levels: case-sensitive backends reject "debug"
    ("unit", "mL", "ml"), ("unit", "Mb", "mb"), ("unit", "K", "k"),
    ("name", "McDonald", "Mcdonald"),
])
def test_case_without_an_enum_is_data(key, expert, cand):
    props = {key: TEXT}
    assert one(props, key, expert, cand) == 0
    assert one(props, key, expert, expert) == 1
    # the user's declared rule, on a field the user declares prose: a name never grants it
    assert one(props, key, expert, cand, normalize=["case"]) == 0
    assert one(props, key, expert, cand, normalize=["case"], free_text=[key]) == 1


# ---------------------------------------------------------------- whitespace and Unicode


@pytest.mark.parametrize("key,expert,cand", [
    ("delimiter", "\t", " "),                                         # tab vs space
    ("query", "SELECT * FROM users WHERE name = 'Ann  Lee'",          # two spaces in a literal
     "SELECT * FROM users WHERE name = 'Ann Lee'"),
    ("name", "Mia Li", " Mia Li"), ("name", "Mia Li", "Mia  Li"),     # padded, re-spaced
    ("subject", "Weekly report", "Weekly report "),
    ("address", "12 Main St", "12\u00a0Main St"),                     # a no-break space
    ("city", "Café", "Cafe\u0301"),                                   # NFD is other code points
])
def test_padded_respaced_and_decomposed_strings_are_other_values(key, expert, cand):
    assert one({key: TEXT}, key, expert, cand) == 0
    assert one({key: TEXT}, key, expert, expert) == 1


def test_the_whitespace_option_pays_respacing_in_free_text_only():
    loose = {"normalize": ["whitespace", "unicode"], "free_text": ["subject", "city"]}
    assert one({"subject": TEXT}, "subject", "Weekly report", " Weekly  report ", **loose) == 1
    assert one({"city": TEXT}, "city", "Café", "Cafe\u0301", **loose) == 1
    # the same strings in a field nobody declared prose: data, whatever the option
    undeclared = {"normalize": ["whitespace", "unicode"]}
    assert one({"subject": TEXT}, "subject", "Weekly report", " Weekly  report ", **undeclared) == 0
    assert one({"city": TEXT}, "city", "Café", "Cafe\u0301", **undeclared) == 0
    # never a string of whitespace only, never code, never an identifier
    assert one({"delimiter": TEXT}, "delimiter", "\t", " ", **loose) == 0
    assert one({"sql": TEXT}, "sql", "SELECT 'a  b'", "SELECT 'a b'", **loose) == 0
    assert one({"path": TEXT}, "path", "my  file.txt", "my file.txt", **loose) == 0
    with pytest.raises(ValueError):
        get_verifier("toolcall", normalize=["fuzzy"])


@pytest.mark.parametrize("key,expert,cand", [
    ("table", "Users", "users"),                         # two tables on a case-sensitive store
    ("query", "SELECT * FROM t WHERE a = 'x  y'", "SELECT * FROM t WHERE a = 'x y'"),
    ("query", "SELECT * FROM Users", "select * from users"),
    ("level", "DEBUG", "debug"),
    ("field", "Total", "total"),                         # a key name in a record
])
def test_normalize_never_folds_identifiers_or_code_it_was_not_told_are_prose(key, expert, cand):
    every = {"normalize": ["whitespace", "case", "unicode"]}
    assert one({key: TEXT}, key, expert, cand, **every) == 0
    # declaring another field prose changes nothing here
    assert one({key: TEXT}, key, expert, cand, free_text=["note"], **every) == 0
    # a field whose schema makes it an identifier stays exact even when declared
    ident = {"type": "string", "enum": [expert, cand]}
    assert one({key: ident}, key, expert, cand, free_text=[key], **every) == 0


def test_the_schema_can_declare_prose_and_declarations_reach_nested_and_array_fields():
    prose = {"type": "string", "contentMediaType": "text/plain"}
    every = {"normalize": ["whitespace", "case"]}
    assert one({"note": prose}, "note", "Call me later", "call  me later", **every) == 1
    assert one({"note": prose}, "note", "Call me later", "Call me sooner", **every) == 0
    assert one({"note": prose}, "note", "Call me later", "call  me later") == 0  # no option on
    nested = {"msg": {"type": "object", "properties": {"body": TEXT, "to": TEXT}}}
    assert one(nested, "msg", {"body": "Hi Ann", "to": "ann"}, {"body": "hi  ann", "to": "ann"},
               free_text=["msg.body"], **every) == 1
    assert one(nested, "msg", {"body": "Hi Ann", "to": "ann"}, {"body": "Hi Ann", "to": "Ann"},
               free_text=["msg.body"], **every) == 0
    items = {"lines": {"type": "array", "items": {"type": "object", "properties": {"note": TEXT}}}}
    assert one(items, "lines", [{"note": "A b"}, {"note": "C"}], [{"note": "a  B"}, {"note": "c"}],
               free_text=["lines.note"], **every) == 1


# ---------------------------------------------------------------- e-mail: only `format: email`


def test_email_domain_case_only_in_a_format_email_field():
    email = {"type": "string", "format": "email"}
    assert one({"to": email}, "to", "ops@Example.com", "ops@example.COM") == 1
    assert one({"to": email}, "to", "ops@Example.com", "Ops@example.com") == 0
    # file paths and other strings that look like addresses compare exactly
    for key in ("attachment", "path", "note"):
        assert one({key: TEXT}, key, "backup@Server.Logs", "backup@server.logs") == 0
        assert one({key: TEXT}, key, "reports/Q1@Team.csv", "reports/q1@team.csv") == 0


# ---------------------------------------------------------------- integers and floats


@pytest.mark.parametrize("schema,expert,cand,paid", [
    ({"type": "integer"}, 2, 2.0, 0),   # a record that stores what it gets stores 2.0
    ({"type": "integer"}, 2.0, 2, 0),
    ({}, 2, 2.0, 0),
    ({"type": ["integer", "string"]}, 2, 2.0, 0),
    ({"type": "number"}, 2, 2.0, 0),    # JSON Schema's one `number`, but the record differs
    ({"type": "number"}, 2.0, 2, 0),
    ({"type": "number"}, 2.5, 2.5, 1),
    ({"type": "number"}, 2, 2, 1),
    ({"type": "number"}, 2, 2.5, 0),
])
def test_an_int_and_a_float_are_two_values(schema, expert, cand, paid):
    assert one({"qty": schema}, "qty", expert, cand) == paid


@pytest.mark.parametrize("schema,config,paid", [
    ({"type": "integer"}, {"int_float_equal": True}, 1),
    ({"type": "number"}, {"int_float_equal": True}, 1),
    ({}, {"int_float_equal": True}, 0),             # no schema type: still two values
    ({"type": "number"}, {"normalize": ["bfcl"]}, 1),  # BFCL converts for float parameters
    ({"type": "integer"}, {"normalize": ["bfcl"]}, 0),  # ...and rejects a float for an int
])
def test_int_float_equal_and_bfcl_are_the_opt_ins(schema, config, paid):
    assert one({"qty": schema}, "qty", 2, 2.0, **config) == paid
    assert one({"qty": schema}, "qty", 2, 2.5, **config) == 0


# ---------------------------------------------------------------- only offered tools pay

RUN = [tool("run", {"command": TEXT})]


@pytest.mark.parametrize("expert,cand", [
    (act("run", {"command": "ls"}), act("sh", {"command": "ls"})),       # a tool not offered
    (act("sh", {"command": "ls"}), act("sh", {"command": "ls"})),        # even copying the expert
    (act("run", {"command": "ls"}), act("run", {"cmd": "ls"})),          # an argument not offered
    (act("run", {"command": "ls", "cmd": "rm -rf ~"}),
     act("run", {"command": "ls", "cmd": "rm -rf ~"})),                  # ...the expert's own too
    (act("run", {"command": "ls"}), act("run", {"command": "ls", "sudo": True})),
])
def test_tools_and_arguments_the_turn_does_not_offer_score_0(expert, cand):
    t = Turn(id="s/2", trajectory_id="s", turn=1, tools=RUN, context=[], expected=expert)
    sc = get_verifier("toolcall").score(t, cand)
    assert sc.reward == 0 and ("not offered" in sc.reason or "unknown argument" in sc.reason)


def test_offered_tools_still_pay_and_open_schemas_take_more_keys():
    assert reward(RUN, act("run", {"command": "ls"}), act("run", {"command": "ls"})) == 1
    opened = [tool("log", {"msg": TEXT}, additionalProperties=True)]
    extra = act("log", {"msg": "hi", "tag": "x"})
    assert reward(opened, extra, act("log", {"tag": "x", "msg": "hi"})) == 1
    assert reward(opened, extra, act("log", {"msg": "hi", "tag": "y"})) == 0
    # a turn that offers no tools (data without schemas): no tool list to hold calls to
    assert reward([], act("sh", {"cmd": "ls"}), act("sh", {"cmd": "ls"})) == 1


# ---------------------------------------------------------------- the `bfcl` option


def test_bfcl_option_is_bfcls_own_string_rule():
    pytest.importorskip("bfcl_eval")
    import bfcl_support

    from pivotrl.verifiers.arguments import bfcl_key

    ast_checker, _ = bfcl_support.ast_module()
    rng = random.Random(0)
    alphabet = string.ascii_letters + " ,./-_*^'\"\t()é"
    for _ in range(500):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        assert bfcl_key(s) == ast_checker.standardize_string(s), s
    props = {"city": TEXT, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}
    assert one(props, "city", "San Francisco", "SAN FRANCISCO", normalize=["bfcl"]) == 1
    assert one(props, "city", "San Francisco", "SAN FRANCISCO") == 0
    assert one(props, "city", "San Francisco", "San Jose", normalize=["bfcl"]) == 0
    assert one(props, "unit", "celsius", "Celsius.", normalize=["bfcl"]) == 1


def test_the_shell_verifier_pays_only_the_turns_own_shell_tool():
    """`shell` reads a command from any common shell tool name and argument (`sh`, `cmd`); where
    the turn offers tools, only those and their schemas' arguments pay."""
    from pivotrl.sandbox.bwrap import sandbox_available

    if not sandbox_available():
        pytest.skip("bubblewrap not usable here")
    shell = get_verifier("shell", timeout_s=2.0)
    try:
        t = Turn(id="s/3", trajectory_id="s", turn=1, tools=RUN, context=[],
                 expected=act("run", {"command": "ls"}), metadata={"workspace": {"a.txt": "x\n"}})
        for cand in (act("sh", {"command": "ls"}), act("run", {"cmd": "ls"}),
                     act("bash", {"cmd": "ls"}), act("run", {"command": "ls", "cmd": "ls"})):
            sc = shell.score(t, cand)
            assert sc.reward == 0 and ("not offered" in sc.reason or "unknown" in sc.reason), cand
        assert shell.score(t, act("run", {"command": "ls"})).reward == 1
    finally:
        shell.close()
