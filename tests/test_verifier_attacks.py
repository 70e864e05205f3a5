"""Attacks on `toolcall`'s argument, message and judge rules: each pays only what is proven.

One parametrized case per attack class of the "pay only what is proven" rule (free-text
arguments, short values, Unicode, null, sets, defaults, messages, refusals, judge replies), each
with the smallest near-copy of the expert's action that means something else (reward 0), and
where a schema or the text itself grants an equivalence, the form it grants (reward 1).
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import pytest

from pivotrl.io.records import FunctionCall, Message, ToolCall, Turn
from pivotrl.verifiers import get_verifier

from fake_judge import FakeJudge


def act(name: str, args: dict[str, Any]) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(
        id="c", function=FunctionCall(name=name, arguments=json.dumps(args, ensure_ascii=False)))])


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def turn(expected: Message, tools: list | None = None) -> Turn:
    return Turn(id="atk/1", trajectory_id="atk", turn=1, tools=tools or [],
                context=[Message(role="user", content="please")], expected=expected)


def tool(name: str, props: dict, required: list[str] | None = None) -> list[dict]:
    return [{"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": required or []}}}]


TEXT = {"type": "string"}
TOOLCALL = get_verifier("toolcall")


def reward(expected: Message, cand: Message, tools: list | None = None, verifier=TOOLCALL) -> float:
    return verifier.score(turn(expected, tools), cand).reward


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize("expert,cand", [
    ("hire the new engineer on Monday", "fire the new engineer on Monday"),  # one letter, a word
    ("move 200 from savings to checking", "move 200 from checking to savings"),  # roles swapped
    ("delete the backups older than a week", "delete all the backups older than a week"),
    ("please do delete the old backups now", "please do not delete the old backups now"),
    ("only rows where price > 100", "only rows where price < 100"),  # operator
    ("only rows where price >= 100", "only rows where price > 100"),
    ("Increase the budget by ten percent", "Decrease the budget by ten percent"),
    ("Schedule it for 10:30", "Schedule it for 10:30."),  # punctuation is not whitespace
])
def test_free_text_argument_changed_by_one_token_scores_0(expert, cand):
    tools = tool("add_task", {"note": TEXT})
    assert reward(act("add_task", {"note": expert}), act("add_task", {"note": cand}), tools) == 0


@pytest.mark.parametrize("expert,cand", [
    ("5 mb", "5 Mb"), ("10 ms", "10 Ms"), ("Co", "CO"), ("-f", "-F"), ("Polish", "polish"),
    ("1.10", "1.1"), ("007", "7"), ("5.0", "5"), ("New York, NY", "New York NY"),
])
def test_short_values_whose_case_or_digits_carry_meaning_score_0(expert, cand):
    tools = tool("convert", {"value": TEXT})
    assert reward(act("convert", {"value": expert}), act("convert", {"value": cand}), tools) == 0


@pytest.mark.parametrize("expert,cand", [
    ("paypal", "p\u0430ypal"),     # Cyrillic a
    ("Office", "O\ufb03ce"),       # the "ffi" ligature: NFKC would merge them
    ("x2", "x\u00b2"),             # superscript two
    ("ABC", "\uff21\uff22\uff23"),  # full-width letters
    ("Paris", "Paris\u200b"),      # a zero-width space is not whitespace
    ("Paris Lyon", "Paris\x1fLyon"),  # nor a control character str.split splits at
])
def test_unicode_look_alikes_score_0(expert, cand):
    for props in ({"city": TEXT}, {"account_id": TEXT}):
        key = next(iter(props))
        tools = tool("lookup", props)
        assert reward(act("lookup", {key: expert}), act("lookup", {key: cand}), tools) == 0


def test_canonically_equivalent_unicode_is_another_string_unless_the_user_normalises():
    composed, decomposed = "Café de Flore", unicodedata.normalize("NFD", "Café de Flore")
    assert composed != decomposed
    tools = tool("save", {"city": TEXT, "path": TEXT})
    assert reward(act("save", {"city": composed}), act("save", {"city": decomposed}), tools) == 0
    nfc = get_verifier("toolcall", normalize=["unicode"], free_text=["city", "path"])
    assert reward(act("save", {"city": composed}), act("save", {"city": decomposed}), tools,
                  nfc) == 1
    # A file system does not normalise: two byte strings are two files, whatever the option.
    assert reward(act("save", {"path": composed}), act("save", {"path": decomposed}), tools,
                  nfc) == 0


def test_whitespace_is_data_unless_the_user_normalises_and_then_on_one_line_only():
    tools = tool("write_file", {"name": TEXT, "content": TEXT})
    one_line = act("write_file", {"name": "x", "content": "Dear  team, all good."})
    spaced = act("write_file", {"name": "x", "content": " Dear team,\tall good. "})
    assert reward(one_line, spaced, tools) == 0
    loose = get_verifier("toolcall", normalize=["whitespace"], free_text=["content"])
    assert reward(one_line, spaced, tools, loose) == 1
    code = act("write_file", {"name": "x", "content": "if a:\n    b()\n    c()\n"})
    for other in ("if a:\n    b()\nc()\n", "if a: b() c()", "if a:\n    b()\n    c()"):
        assert reward(code, act("write_file", {"name": "x", "content": other}), tools, loose) == 0


def test_explicit_null_is_a_value_not_an_omission():
    props = {"user_id": TEXT, "phone": {"type": ["string", "null"]}}
    tools = tool("update_user", props, ["user_id"])
    clear = act("update_user", {"user_id": "u1", "phone": None})  # null: remove the phone
    assert reward(clear, act("update_user", {"user_id": "u1"}), tools) == 0
    assert reward(act("update_user", {"user_id": "u1"}), clear, tools) == 0
    # Only the schema's own `default: null` makes omission mean null.
    tools = tool("update_user", {**props, "phone": {"type": ["string", "null"], "default": None}},
                 ["user_id"])
    assert reward(clear, act("update_user", {"user_id": "u1"}), tools) == 1


def test_arrays_are_sets_only_under_unique_items():
    items = {"type": "array", "items": TEXT}
    named_like_a_set = tool("make_playlist", {"tags": items, "recipients": items})
    order = {"tags": ["intro", "verse", "outro"], "recipients": ["a@x.io", "b@x.io"]}
    for key in order:
        cand = {**order, key: list(reversed(order[key]))}
        assert reward(act("make_playlist", order), act("make_playlist", cand),
                      named_like_a_set) == 0, key
    unique = tool("make_playlist", {"tags": {**items, "uniqueItems": True}, "recipients": items})
    cand = {**order, "tags": ["outro", "intro", "verse"]}
    assert reward(act("make_playlist", order), act("make_playlist", cand), unique) == 1
    cand = {**order, "tags": ["outro", "Intro", "verse"]}  # a set of other items
    assert reward(act("make_playlist", order), act("make_playlist", cand), unique) == 0


def test_defaults_in_prose_grant_nothing_schema_defaults_do():
    prose = {"type": "string", "description": "Sort order. Defaults to 'asc' for names and to "
                                              "'desc' for dates."}
    tools = tool("list_files", {"order": prose, "limit": {"type": "integer", "default": 50}})
    assert reward(act("list_files", {"order": "asc"}), act("list_files", {}), tools) == 0
    assert reward(act("list_files", {"limit": 50}), act("list_files", {}), tools) == 1
    assert reward(act("list_files", {"limit": 50.0}), act("list_files", {}), tools) == 0


@pytest.mark.parametrize("expert,cand,paid", [
    ({"unit": "celsius"}, {"unit": "Celsius"}, 1),   # one allowed value folds to it
    ({"unit": "celsius"}, {"unit": "kelvin"}, 0),
    ({"unit": "K"}, {"unit": "k"}, 0),               # "k" folds to two allowed values
    ({"unit": "fahrenheit"}, {"unit": "FAHRENHEIT "}, 0),  # not an allowed value in any case
])
def test_enum_case_is_granted_only_by_a_single_match(expert, cand, paid):
    tools = tool("set_unit", {"unit": {"type": "string",
                                       "enum": ["celsius", "fahrenheit", "K", "k"]}})
    assert reward(act("set_unit", expert), act("set_unit", cand), tools) == paid


@pytest.mark.parametrize("expert,cand,paid", [
    ({"qty": 2}, {"qty": 2.0}, 0),      # "number", but a stored record reads 2.0
    ({"qty": 2.5}, {"qty": 2.50}, 1),
    ({"qty": 2}, {"qty": "2"}, 0),      # another JSON type
    ({"qty": 2}, {"qty": True}, 0),
    ({"flag": True}, {"flag": 1}, 0),
    ({"flag": False}, {"flag": None}, 0),
    ({"qty": 0.1}, {"qty": 0.1000000000001}, 0),
])
def test_json_types_and_values(expert, cand, paid):
    tools = tool("order", {"qty": {"type": "number"}, "flag": {"type": "boolean"}})
    assert reward(act("order", expert), act("order", cand), tools) == paid


def test_unproven_text_goes_to_the_judge_only_when_configured_and_proven_never():
    tools = tool("add_task", {"note": TEXT, "priority": {"type": "integer"}})
    expert = act("add_task", {"note": "Call Mia about the invoice", "priority": 2})
    reworded = act("add_task", {"note": "call Mia regarding the invoice", "priority": 2})
    wrong_number = act("add_task", {"note": "call Mia regarding the invoice", "priority": 3})
    srv = FakeJudge(lambda a, b: "YES")
    try:
        judged = get_verifier("toolcall", unproven_rule="judge", judge={"base_url": srv.url})
        assert reward(expert, reworded, tools) == 0  # the default: not proven
        assert reward(expert, reworded, tools, judged) == 1 and srv.requests == 2  # both orders
        assert reward(expert, wrong_number, tools, judged) == 0 and srv.requests == 2
        assert reward(expert, act("add_task", {"note": "Call Mia about the invoice",
                                               "priority": 2}), tools, judged) == 1
        assert srv.requests == 2  # the same action needs no judge
    finally:
        srv.close()


# ---------------------------------------------------------------- final messages


@pytest.mark.parametrize("expert,cand", [
    ("Alice paid Bob $20.", "Bob paid Alice $20."),                       # roles swapped
    ("You have 3 pending and 5 shipped orders.", "You have 5 pending and 3 shipped orders."),
    ("Transfer from savings to checking is done.", "Transfer from checking to savings is done."),
    ("The alarm is on.", "The alarm is off."),
    ("Your order has shipped.", "Your order hasn't shipped."),           # contraction
    ("Your order has shipped.", "Your order has not shipped."),
    ("The payment went through.", "The payment was declined."),          # negative verb
    ("The payment went through.", "The bank refused the payment."),
    ("Your order is cancelled.", "Votre commande n'est pas annulée."),   # another language
    ("Order 0012 costs 5.50.", "Order 12 costs 5.5."),                   # zeros as written
    ("Version 1.10 is installed.", "Version 1.1 is installed."),
    ("The total is $5.", "The total is €5."),                            # currency symbols
    ("The total is $5.", "The total is 5."),
    ("Rows with x > 5 were removed.", "Rows with x < 5 were removed."),  # operators
    ("Rows with x >= 5 were removed.", "Rows with x > 5 were removed."),
    ("Your code is ABC.", "Your code is abc."),
    ("Your city is Paris.", "Your city is P\u0430ris."),
    ("Your order o12 is cancelled.", "Done: order o12 has been cancelled."),  # a paraphrase
])
def test_messages_that_are_not_proven_the_same_score_0(expert, cand):
    assert reward(say(expert), say(cand)) == 0


def test_messages_pay_when_the_same_text_with_the_ends_trimmed():
    assert reward(say("Your order o12 is cancelled.\n"), say(" Your order o12 is cancelled. ")) == 1
    assert reward(say("Your order  o12\nis cancelled."), say("Your order o12 is cancelled.")) == 0
    cafe = "Meet me at Café de Flore."
    assert reward(say(cafe), say(unicodedata.normalize("NFD", cafe))) == 0
    assert reward(say("Done."), say("   ")) == 0
    assert reward(say("Go to Paris now."), say("Go to Paris\u3000now.")) == 0


REFUSAL = "I'm sorry, none of the available functions can order a pizza."


@pytest.mark.parametrize("cand", [
    "None of the tools can do that, but I cancelled your order.",
    "No available function can do that; refund done.",
    "No tool can undo the transfer I made.",
    "No tool was needed to cancel your order.",
    "None of the available tools can do that, so I transferred $500.",
    "I cannot help further - your account 42 was deleted.",
    "Your order has been cancelled. None of the tools can do more.",
    "None of the tools can stop the order I placed from shipping.",
    "I cannot help with that.",  # declines, but not for lack of a tool: another decision
    "Use the tools.",
])
def test_a_refusal_that_claims_anything_is_not_a_refusal(cand):
    assert reward(say(REFUSAL), say(cand)) == 0


@pytest.mark.parametrize("cand", [
    "I cannot help with that: no suitable tool.",
    "Unfortunately, the functions available don't support that.",
    "I'm sorry, but none of the provided tools can help with this request.",
])
def test_refusals_in_other_words_are_the_judges_question(cand):
    assert reward(say(REFUSAL), say(cand)) == 0
    srv = FakeJudge(lambda a, b: "YES")
    try:
        judged = get_verifier("toolcall", message_rule="judge", judge={"base_url": srv.url})
        assert reward(say(REFUSAL), say(cand), verifier=judged) == 1 and srv.requests == 2
    finally:
        srv.close()


# ---------------------------------------------------------------- judge replies


@pytest.mark.parametrize("reply", [
    "They are NOT functionally equivalent.", "Equivalent? No.", "YES", "Yes, equivalent.",
    "VERDICT: YES, mostly", "VERDICT: NO\nVERDICT: YES", "<think>VERDICT: YES",
])
def test_a_judge_reply_not_in_the_format_is_invalid_and_never_pays(reply):
    srv = FakeJudge(lambda a, b: reply, raw=True)
    try:
        judge = get_verifier("judge", base_url=srv.url)
        sc = judge.score(turn(say("The capital is Paris.")), say("Paris is the capital."))
        assert (sc.reward, sc.valid) == (0.0, False) and "invalid judge reply" in sc.reason
        via_toolcall = get_verifier("toolcall", message_rule="judge", judge={"base_url": srv.url})
        assert reward(say("The capital is Paris."), say("Paris is the capital."),
                      verifier=via_toolcall) == 0
    finally:
        srv.close()
