"""The `exact` and `toolcall` verifiers, the reward-hacking guards, and `pivotrl verify`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pivotrl.formats.actions import parse_completion
from pivotrl.scoring import score_completion
from pivotrl.io.records import Message, Turn
from pivotrl.verifiers import get_verifier
from pivotrl.verifiers.schema import MISSING
from pivotrl.verifiers.toolcall import ToolcallConfig, build_index

TOOLS = [
    {"type": "function", "function": {"name": "search_flights", "description": "Find flights.",
     "parameters": {"type": "object", "required": ["origin", "destination", "date"], "properties": {
         "origin": {"type": "string", "description": "IATA code"},
         "destination": {"type": "string"},
         "date": {"type": "string", "format": "date"},
         "passengers": {"type": "integer", "default": 1},
         "max_price": {"type": "number"},
         "cabin": {"type": "string", "enum": ["economy", "business"], "default": "economy"},
         "nonstop": {"type": "boolean", "description": "Only direct flights. Defaults to false."},
         "city_name": {"type": "string"},
         "note": {"type": "string", "description": "Free-text note to the agent."},
         "stops": {"type": "array", "items": {"type": "string"}},
         "filters": {"type": "object", "properties": {
             "airline": {"type": "string"}, "refundable": {"type": "boolean", "default": False}},
             "required": ["airline"]}}}}},
    {"type": "function", "function": {"name": "get_user", "parameters": {
        "type": "object", "required": ["user_id"], "properties": {"user_id": {"type": "string"}}}}},
]
BASE = {"origin": "SFO", "destination": "JFK", "date": "2026-12-01"}


def call_turn(*calls: tuple[str, dict], tools=TOOLS) -> Turn:
    return Turn(id="t/1", trajectory_id="t", turn=1, tools=tools,
                context=[Message(role="user", content="Book it")],
                expected=Message(role="assistant", tool_calls=[
                    {"id": f"e{i}", "type": "function",
                     "function": {"name": n, "arguments": json.dumps(a)}}
                    for i, (n, a) in enumerate(calls)]))


def msg_turn(text: str) -> Turn:
    return Turn(id="t/2", trajectory_id="t", turn=2, tools=TOOLS, context=[],
                expected=Message(role="assistant", content=text))


def hermes(*calls: tuple[str, dict], content: str = "") -> str:
    blocks = [f'<tool_call>\n{json.dumps({"name": n, "arguments": a})}\n</tool_call>' for n, a in calls]
    return "\n".join(([content] if content else []) + blocks)


@pytest.fixture(scope="module")
def toolcall():
    return get_verifier("toolcall")


def reward(verifier, turn, text) -> float:
    return score_completion(verifier, turn, text).reward


# ---------------------------------------------------------------- toolcall: equivalences


@pytest.mark.parametrize("cand", [
    {"date": "2026-12-01", "destination": "JFK", "origin": "SFO"},          # key order
    {**BASE, "passengers": 1},                                             # explicit default
    {**BASE, "cabin": "economy"},                                          # enum default
    {**BASE, "filters": {"airline": "UA"}, "cabin": "Economy"},            # enum case, one match
])
def test_equivalent_calls_score_one(toolcall, cand):
    expert = {**BASE, "filters": {"airline": "UA"}} if "filters" in cand else BASE
    assert reward(toolcall, call_turn(("search_flights", expert)), hermes(("search_flights", cand))) == 1.0


def test_numbers_exactly_strings_as_data(toolcall):
    turn = call_turn(("search_flights", {**BASE, "max_price": 300, "city_name": "New York, NY"}))
    assert reward(toolcall, turn, hermes(("search_flights", {**BASE, "max_price": 300,
                                                             "city_name": "New York, NY"}))) == 1.0
    assert reward(toolcall, turn, hermes(("search_flights", {**BASE, "max_price": 300.0,
                                                             "city_name": "New York, NY"}))) == 0.0
    for city in (" New York,  NY", "new york ny", "New York NY", "new York, NY"):
        assert reward(toolcall, turn, hermes(("search_flights", {**BASE, "max_price": 300,
                                                                 "city_name": city}))) == 0.0
    assert reward(toolcall, turn, hermes(("search_flights", {**BASE, "max_price": 301,
                                                             "city_name": "New York, NY"}))) == 0.0


def test_omitted_default_on_the_expert_side(toolcall):
    turn = call_turn(("search_flights", {**BASE, "passengers": 1, "cabin": "economy"}))
    assert reward(toolcall, turn, hermes(("search_flights", BASE))) == 1.0
    turn = call_turn(("search_flights", {**BASE, "passengers": 2}))
    assert reward(toolcall, turn, hermes(("search_flights", BASE))) == 0.0


def test_parallel_calls_are_a_multiset(toolcall):
    a, b = ("get_user", {"user_id": "u1"}), ("get_user", {"user_id": "u2"})
    turn = call_turn(a, b)
    assert reward(toolcall, turn, hermes(b, a)) == 1.0
    assert reward(toolcall, turn, hermes(a, a)) == 0.0  # u2 never fetched
    assert reward(toolcall, turn, hermes(a)) == 0.0


def test_a_right_call_plus_a_surplus_one_is_not_paid():
    """NeMo-Gym's comparator never penalises surplus calls; here a right call with an extra one
    (another tool, the same call again, a second argument set) scores 0 under every setting,
    partial credit and a judge that answers YES to everything included (the count differs: a
    proven difference, never asked)."""
    from fake_judge import FakeJudge

    right = ("search_flights", BASE)
    turn = call_turn(right)
    assert reward(get_verifier("toolcall"), turn, hermes(right)) == 1.0
    surplus = [hermes(right, ("get_user", {"user_id": "u1"})), hermes(right, right),
               hermes(("get_user", {"user_id": "u1"}), right),
               hermes(right, ("search_flights", {**BASE, "date": "2026-12-02"}))]
    srv = FakeJudge(lambda a, b: "YES")
    try:
        for verifier in (get_verifier("toolcall"), get_verifier("toolcall", partial_credit=True),
                         get_verifier("toolcall", unproven_rule="judge", judge={"base_url": srv.url})):
            for text in surplus:
                assert reward(verifier, turn, text) == 0.0, text
        assert srv.requests == 0
    finally:
        srv.close()


def test_partial_credit_is_opt_in_and_never_pays_a_wrong_call():
    turn = call_turn(("get_user", {"user_id": "u1"}), ("get_user", {"user_id": "u2"}))
    half = hermes(("get_user", {"user_id": "u1"}))
    partial = get_verifier("toolcall", partial_credit=True)
    assert reward(get_verifier("toolcall"), turn, half) == 0.0
    assert reward(partial, turn, half) == 0.5
    wrong = hermes(("get_user", {"user_id": "u1"}), ("get_user", {"user_id": "u9"}))
    assert reward(partial, turn, wrong) == 0.0  # u9 is a call the expert never made


@pytest.mark.parametrize("cand,why", [
    ({**BASE, "origin": "sfo"}, "identifier compared exactly"),
    ({**BASE, "cabin": "Business"}, "another enum value"),
    ({**BASE, "passengers": "2"}, "another number as a string"),
    ({**BASE, "passengers": "01"}, "not a canonical integer literal"),
    ({**BASE, "passengers": 2.0, "cabin": "economy"}, "other value"),
    ({**BASE, "nonstop": 0}, "number for a boolean"),
    ({**BASE, "stops": ["ORD", "DEN"]}, "argument the expert did not give, no default"),
    ({**BASE, "date": "2026-12-02"}, "wrong date"),
    ({**BASE, "nonstop": False}, "'Defaults to false' in a description grants no default"),
    ({**BASE, "city_name": None}, "an explicit null is a value, not an omission"),
])
def test_differences_score_zero(toolcall, cand, why):
    turn = call_turn(("search_flights", BASE))
    assert reward(toolcall, turn, hermes(("search_flights", cand))) == 0.0, why


def test_equivalences_the_schema_grants():
    turn = call_turn(("search_flights", {**BASE, "passengers": 2, "cabin": "business"}))
    # An enum value in another case folds to exactly one allowed value: granted by default.
    cased = {**BASE, "passengers": 2, "cabin": "Business"}
    assert reward(get_verifier("toolcall"), turn, hermes(("search_flights", cased))) == 1.0
    # A numeric string for an integer only when asked for (lax backends); default: a type error.
    same = {**BASE, "passengers": "2", "cabin": "Business"}
    assert reward(get_verifier("toolcall"), turn, hermes(("search_flights", same))) == 0.0
    lax = get_verifier("toolcall", numeric_strings=True)
    assert reward(lax, turn, hermes(("search_flights", same))) == 1.0


def test_float_for_integer_parameter_is_configurable():
    turn = call_turn(("search_flights", {**BASE, "passengers": 2}))
    text = hermes(("search_flights", {**BASE, "passengers": 2.0}))
    assert reward(get_verifier("toolcall"), turn, text) == 0.0
    assert reward(get_verifier("toolcall", int_float_equal=True), turn, text) == 1.0


def test_lists_in_order_and_nested_objects(toolcall):
    turn = call_turn(("search_flights", {**BASE, "stops": ["ORD", "DEN"],
                                         "filters": {"airline": "UA", "refundable": False}}))
    same = {**BASE, "stops": ["ORD", "DEN"], "filters": {"airline": "UA"}}  # nested default
    assert reward(toolcall, turn, hermes(("search_flights", same))) == 1.0
    swapped = {**BASE, "stops": ["DEN", "ORD"], "filters": {"airline": "UA"}}
    assert reward(toolcall, turn, hermes(("search_flights", swapped))) == 0.0
    no_airline = {**BASE, "stops": ["ORD", "DEN"], "filters": {"refundable": False}}
    assert reward(toolcall, turn, hermes(("search_flights", no_airline))) == 0.0


def test_free_text_pays_up_to_whitespace_only_when_the_user_normalises():
    long = ("please make sure the seat is next to the window because my daughter gets very "
            "anxious on long flights and likes to look outside")
    turn = call_turn(("search_flights", {**BASE, "note": long}))
    spaced = "  " + long.replace(" window ", " window \t ") + " "
    assert reward(get_verifier("toolcall"), turn,
                  hermes(("search_flights", {**BASE, "note": spaced}))) == 0.0
    verifier = get_verifier("toolcall", normalize=["whitespace"], free_text=["note"])
    assert reward(verifier, turn, hermes(("search_flights", {**BASE, "note": spaced}))) == 1.0
    for other in (long.replace("anxious", "anxous"), long.capitalize(), long + ".",
                  "aisle seat please"):  # a typo, case, a full stop: not proven the same
        assert reward(verifier, turn, hermes(("search_flights", {**BASE, "note": other}))) == 0.0


def test_short_strings_compare_the_same_in_reads_and_writes():
    verifier = get_verifier("toolcall")
    for name in ("get_weather", "update_address"):
        turn = call_turn((name, {"city": "New York, NY"}), tools=[])
        assert reward(verifier, turn, hermes((name, {"city": "New York, NY"}))) == 1.0
        assert reward(verifier, turn, hermes((name, {"city": "New York,\tNY"}))) == 0.0
        assert reward(verifier, turn, hermes((name, {"city": "new york ny"}))) == 0.0


def test_email_domain_up_to_case_only_under_format_email(toolcall):
    tools = [{"type": "function", "function": {"name": "find_user", "parameters": {
        "type": "object", "properties": {"email": {"type": "string", "format": "email"}}}}}]
    turn = call_turn(("find_user", {"email": "Mia.Li@Example.com"}), tools=tools)
    assert reward(toolcall, turn, hermes(("find_user", {"email": "Mia.Li@EXAMPLE.COM"}))) == 1.0
    assert reward(toolcall, turn, hermes(("find_user", {"email": "mia.li@example.com"}))) == 0.0
    assert reward(toolcall, turn, hermes(("find_user", {"email": "Mia.Li@example.org"}))) == 0.0
    untyped = call_turn(("find_user", {"email": "Mia.Li@Example.com"}), tools=[])
    assert reward(toolcall, untyped, hermes(("find_user", {"email": "Mia.Li@EXAMPLE.COM"}))) == 0


def test_dotted_name_called_with_underscores_only_under_bfcl():
    tools = [{"type": "function", "function": {"name": "math.factorial", "parameters": {
        "type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]}}}]
    turn = call_turn(("math.factorial", {"number": 5}), tools=tools)
    assert reward(get_verifier("toolcall"), turn, hermes(("math_factorial", {"number": 5}))) == 0
    verifier = get_verifier("toolcall", normalize=["bfcl"])
    assert reward(verifier, turn, hermes(("math_factorial", {"number": 5}))) == 1.0
    assert reward(verifier, turn, hermes(("math_factorial", {"number": 6}))) == 0.0
    both = tools + [{"type": "function", "function": {"name": "math_factorial", "parameters": {}}}]
    turn = call_turn(("math.factorial", {"number": 5}), tools=both)
    assert reward(verifier, turn, hermes(("math_factorial", {"number": 5}))) == 0.0


def test_unknown_function_schema_falls_back_to_values():
    turn = call_turn(("mystery", {"a": 1, "b": "x"}), tools=[])
    verifier = get_verifier("toolcall")
    assert reward(verifier, turn, hermes(("mystery", {"b": "x", "a": 1}))) == 1.0
    assert reward(verifier, turn, hermes(("mystery", {"b": "x", "a": 1.0}))) == 0.0  # no `number`
    assert reward(verifier, turn, hermes(("mystery", {"a": 1}))) == 0.0


# ---------------------------------------------------------------- reward-hacking guards


def test_guard_malformed_call(toolcall):
    turn = call_turn(("get_user", {"user_id": "u1"}))
    s = score_completion(toolcall, turn, '<tool_call>{"name": "get_user", "arguments": {"user_id": </tool_call>')
    assert (s.reward, s.valid) == (0.0, False)
    bad_args = Message(role="assistant", tool_calls=[
        {"id": "c", "function": {"name": "get_user", "arguments": "{not json"}}])
    assert toolcall.score(turn, bad_args).reward == 0.0 and not toolcall.score(turn, bad_args).valid
    assert toolcall.score(turn, None) .reward == 0.0


def test_guard_dropped_required_argument(toolcall):
    turn = call_turn(("search_flights", BASE))
    s = score_completion(toolcall, turn, hermes(("search_flights", {"origin": "SFO", "destination": "JFK"})))
    assert s.reward == 0.0 and "required" in s.reason


def test_guard_extra_unknown_argument(toolcall):
    turn = call_turn(("get_user", {"user_id": "u1"}))
    s = score_completion(toolcall, turn, hermes(("get_user", {"user_id": "u1", "admin": True})))
    assert s.reward == 0.0 and "unknown argument" in s.reason


def test_guard_several_calls_where_one_is_expected(toolcall):
    turn = call_turn(("get_user", {"user_id": "u1"}))
    spray = hermes(("get_user", {"user_id": "u1"}), ("get_user", {"user_id": "u2"}))
    assert reward(toolcall, turn, spray) == 0.0
    assert reward(toolcall, turn, hermes(("get_user", {"user_id": "u1"}))) == 1.0


def test_guard_message_instead_of_call_and_vice_versa(toolcall):
    turn = call_turn(("get_user", {"user_id": "u1"}))
    s = score_completion(toolcall, turn, "I will look up the user now.")
    assert s.reward == 0.0 and s.valid and "message instead" in s.reason
    s = score_completion(toolcall, msg_turn("Your flight is booked."), hermes(("get_user", {"user_id": "u1"})))
    assert s.reward == 0.0


def test_guard_huge_output(toolcall):
    turn = call_turn(("search_flights", {**BASE, "note": "x"}))
    huge = Message(role="assistant", tool_calls=[{"id": "c", "function": {
        "name": "search_flights", "arguments": json.dumps({**BASE, "note": "x " * 40_000})}}])
    s = toolcall.score(turn, huge)
    assert s.reward == 0.0 and "too long" in s.reason
    assert reward(toolcall, turn, hermes(("search_flights", BASE)) + " " + "pad " * 20_000) == 0.0


def test_guard_padding_after_the_call(toolcall):
    turn = call_turn(("get_user", {"user_id": "u1"}))
    assert reward(toolcall, turn, hermes(("get_user", {"user_id": "u1"})) + "<|im_end|>") == 1.0
    assert reward(toolcall, turn, hermes(("get_user", {"user_id": "u1"})) + " ok ok ok") == 0.0


# ---------------------------------------------------------------- messages are never a free pass


def test_message_rule_exact_and_any():
    verifier = get_verifier("toolcall")
    turn = msg_turn("Your flight SFO to JFK on December 1 is booked, confirmation ABC123.")
    assert reward(verifier, turn, "Your flight SFO to JFK on December 1 is booked, confirmation ABC123.\n") == 1.0
    assert reward(verifier, turn, "Your flight SFO to JFK on December 1 is booked,\n confirmation ABC123.") == 0.0
    assert reward(verifier, turn, "Your flight SFO to JFK on December 1 is booked; confirmation ABC123!") == 0.0
    assert reward(verifier, turn, "Sure.") == 0.0
    refusal = msg_turn("I'm sorry, none of the available functions can order a pizza.")
    assert reward(verifier, refusal, "I'm sorry, none of the available functions can order a pizza.") == 1
    for text in ["I cannot help with that: no suitable tool.",  # no phrase list decides
                 "Unfortunately the provided functions don't support ordering food.",
                 "Here is your pizza order summary."]:
        assert reward(verifier, refusal, text) == 0.0, text
    assert reward(get_verifier("toolcall", message_rule="any"), turn, "Sure.") == 1.0
    with pytest.raises(ValueError):
        get_verifier("toolcall", refusal_match=True)  # the phrase list is gone, not ignored


# ---------------------------------------------------------------- exact


def test_exact_is_strict_but_canonical():
    exact = get_verifier("exact")
    turn = call_turn(("search_flights", {**BASE, "passengers": 2}))
    reordered = dict(reversed(list({**BASE, "passengers": 2}.items())))
    assert reward(exact, turn, hermes(("search_flights", reordered))) == 1.0
    assert reward(exact, turn, hermes(("search_flights", {**BASE, "passengers": 2.0}))) == 0.0
    assert reward(exact, call_turn(("search_flights", BASE)),
                  hermes(("search_flights", {**BASE, "passengers": 1}))) == 0.0
    two = call_turn(("get_user", {"user_id": "a"}), ("get_user", {"user_id": "b"}))
    assert reward(exact, two, hermes(("get_user", {"user_id": "b"}), ("get_user", {"user_id": "a"}))) == 0.0
    turn = msg_turn("Done.  Booked!")
    assert reward(exact, turn, "done. booked!") == 1.0
    assert reward(exact, turn, "Done, booked!") == 0.0
    assert exact.score(turn, None).valid is False


def test_broken_expert_arguments_are_a_clear_invalid_score():
    turn = Turn(id="t/9", trajectory_id="t", turn=9, context=[], expected={
        "role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{oops"}}]})
    action = parse_completion(hermes(("f", {}))).message
    for name in ("toolcall", "exact"):
        s = get_verifier(name).score(turn, action)
        assert (s.reward, s.valid) == (0.0, False) and "expert" in s.reason


def test_score_batch_matches_score(toolcall):
    turns = [call_turn(("get_user", {"user_id": "u1"})), msg_turn("Hi there.")]
    actions = [parse_completion(hermes(("get_user", {"user_id": "u1"}))).message,
               parse_completion("Hi there.").message]
    for name in ("toolcall", "exact"):
        v = get_verifier(name)
        assert v.score_batch(turns, actions) == [v.score(t, a) for t, a in zip(turns, actions)]


# ---------------------------------------------------------------- config and `pivotrl verify`


def test_yaml_config_documents_the_defaults():
    path = Path(__file__).resolve().parents[1] / "configs" / "verifiers" / "toolcall.yaml"
    assert yaml.safe_load(path.read_text()) == ToolcallConfig().model_dump()
    for name, field in ToolcallConfig.model_fields.items():
        assert field.description, name
    with pytest.raises(ValueError):
        get_verifier("toolcall", no_such_option=1)


def test_schema_index_types_and_defaults():
    fn = build_index(TOOLS)["search_flights"]
    assert fn.required == {"origin", "destination", "date"}
    assert fn.props["passengers"].default == 1
    assert fn.props["nonstop"].default is MISSING  # "Defaults to false" in prose is not read
    assert fn.props["origin"].string_class == "exact"  # "IATA code" in its description
    assert fn.props["city_name"].string_class is None and fn.props["date"].string_class == "exact"
    assert fn.props["note"].string_class is None and fn.props["stops"].items.kind == "string"
    assert fn.props["filters"].props["refundable"].default is False


def write_cases(path: Path) -> list:
    turn = json.loads(call_turn(("get_user", {"user_id": "u1"})).model_dump_json(exclude_none=True))
    lines = [
        json.dumps({**turn, "id": "a", "completion": hermes(("get_user", {"user_id": "u1"}))}),
        json.dumps({**turn, "id": "b", "candidate": {"role": "assistant", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "get_user", "arguments": {"user_id": "u2"}}}]}}),
        "{not json",
        json.dumps({**turn, "id": "d", "completion": "<tool_call>{oops</tool_call>"}),
        json.dumps({"id": "e", "completion": "hi"}),
        json.dumps({**turn, "id": "f"}),
        json.dumps({**turn, "id": "g", "candidate": {"role": "user", "content": "x"}}),
        "",
        json.dumps([1, 2]),
    ]
    path.write_text("\n".join(lines) + "\n")
    return lines


def test_verify_file_one_line_per_input_line(tmp_path):
    from pivotrl.evaluate.cases import verify_file

    cases = tmp_path / "cases.jsonl"
    lines = write_cases(cases)
    out = tmp_path / "out.jsonl"
    summary = verify_file(cases, "toolcall", {}, out)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == len(lines) == summary.lines
    assert [r["id"] for r in rows] == ["a", "b", None, "d", "e", "f", "g", None, None]
    assert [r["reward"] for r in rows] == [1.0] + [0.0] * 8
    assert [r["valid"] for r in rows] == [True, True] + [False] * 7
    assert "line 3" in rows[2]["reason"] and "not JSON" in rows[2]["reason"]
    assert "not valid JSON" in rows[3]["reason"]
    assert "line 5" in rows[4]["reason"] and "trajectory_id" in rows[4]["reason"]
    assert "neither" in rows[5]["reason"] and "candidate.role" in rows[6]["reason"]
    assert set(rows[0]) == {"id", "reward", "valid", "reason"}


def test_cli_verify_with_yaml_config(tmp_path):
    from typer.testing import CliRunner

    from pivotrl.cli import app

    cases = tmp_path / "cases.jsonl"
    write_cases(cases)
    cfg = tmp_path / "v.yaml"
    cfg.write_text("toolcall:\n  message_rule: any\n")
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(app, ["verify", str(cases), "--verifier", "toolcall", "--config", str(cfg),
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert len(out.read_text().splitlines()) == 9
    res = CliRunner().invoke(app, ["verify", str(cases), "--verifier", "exact"])
    assert res.exit_code == 0
    assert json.loads(res.stdout.splitlines()[0]) == {"id": "a", "reward": 1.0, "valid": True, "reason": ""}
    res = CliRunner().invoke(app, ["verify", str(cases), "--verifier", "nope"])
    assert res.exit_code == 1
    bad_cfg = tmp_path / "bad.yaml"
    bad_cfg.write_text("message_rule: [1]\n")
    assert CliRunner().invoke(app, ["verify", str(cases), "--config", str(bad_cfg)]).exit_code == 1


def test_list_order_only_uniqueitems_makes_a_set():
    s = {"type": "string"}
    tools = [{"type": "function", "function": {"name": "send_mail", "parameters": {
        "type": "object", "properties": {"to": s, "cc": {"type": "array", "items": s},
                                         "bcc": {"type": "array", "items": s,
                                                 "uniqueItems": True}}}}}]
    verifier = get_verifier("toolcall")
    mail = call_turn(("send_mail", {"to": "a@x.io", "cc": ["b@x.io", "c@x.io"],
                                    "bcc": ["d@x.io", "e@x.io"]}), tools=tools)
    def cand(cc, bcc):
        return hermes(("send_mail", {"to": "a@x.io", "cc": cc, "bcc": bcc}))
    assert reward(verifier, mail, cand(["b@x.io", "c@x.io"], ["e@x.io", "d@x.io"])) == 1
    # "cc" names a set to a reader, but the schema does not say so: order is part of the call.
    assert reward(verifier, mail, cand(["c@x.io", "b@x.io"], ["d@x.io", "e@x.io"])) == 0
    assert reward(verifier, mail, cand(["b@x.io", "c@x.io"], ["e@x.io", "e@x.io"])) == 0


def test_enum_case_only_when_it_names_one_value():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
              "properties": {"mode": {"type": "string", "enum": ["fast", "Fast", "safe"]}}}}}]
    verifier = get_verifier("toolcall")
    assert reward(verifier, call_turn(("f", {"mode": "safe"}), tools=tools), hermes(("f", {"mode": "SAFE"}))) == 1
    assert reward(verifier, call_turn(("f", {"mode": "fast"}), tools=tools), hermes(("f", {"mode": "FAST"}))) == 0
