"""Property tests of `toolcall`: one meaning-bearing change scores 0, a schema-granted form 1.

Generated pairs that change one token that carries meaning (a digit, a letter, a swap of two
values, a case change, an operator, a negation, an array's order, a number) must score 0, in
arguments and in final messages; generated pairs that the schema declares equal (an enum in
another case, a `uniqueItems` array in another order, an omitted key with a schema `default`,
key order, whitespace in the JSON; an int for a same-valued float of a `number` only under
`int_float_equal` or `normalize: [bfcl]`, whitespace in a one-line text only under `normalize:
[whitespace]`) must score 1. `max_examples` is modest so
that the file runs in seconds.
"""

from __future__ import annotations

import json
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pivotrl.io.records import FunctionCall, Message, ToolCall, Turn
from pivotrl.verifiers import get_verifier

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VERIFIER = get_verifier("toolcall")
TEXT = {"type": "string"}
WORD = st.text(alphabet=string.ascii_letters, min_size=1, max_size=8)
SENTENCE = st.lists(WORD, min_size=2, max_size=10)


def call(args: dict | str, name: str = "do") -> Message:
    raw = args if isinstance(args, str) else json.dumps(args)
    return Message(role="assistant", tool_calls=[ToolCall(id="c", function=FunctionCall(
        name=name, arguments=raw))])


def score(expected: Message, cand: Message, props: dict | None = None) -> float:
    tools = [] if props is None else [{"type": "function", "function": {"name": "do", "parameters": {
        "type": "object", "properties": props, "required": []}}}]
    t = Turn(id="p/1", trajectory_id="p", turn=1, tools=tools, context=[], expected=expected)
    return VERIFIER.score(t, cand).reward


def both_ways(text: str, other: str) -> tuple[float, float]:
    """(argument verdict, message verdict) for one pair of texts."""
    arg = score(call({"note": text}), call({"note": other}), {"note": TEXT})
    msg = score(Message(role="assistant", content=text), Message(role="assistant", content=other))
    return arg, msg


# ---------------------------------------------------------------- one meaning-bearing change: 0


@FAST
@given(SENTENCE, st.data())
def test_one_letter_changed_scores_0(words, data):
    i = data.draw(st.integers(0, len(words) - 1))
    j = data.draw(st.integers(0, len(words[i]) - 1))
    new = data.draw(st.sampled_from(string.ascii_letters).filter(lambda c: c != words[i][j]))
    changed = words[:i] + [words[i][:j] + new + words[i][j + 1:]] + words[i + 1:]
    assert both_ways(" ".join(words), " ".join(changed)) == (0, 0)  # case changes included


@FAST
@given(SENTENCE, st.integers(0, 10 ** 6), st.integers(1, 9), st.data())
def test_one_digit_changed_scores_0(words, number, delta, data):
    digits = str(number)
    k = data.draw(st.integers(0, len(digits) - 1))
    other = digits[:k] + str((int(digits[k]) + delta) % 10) + digits[k + 1:]
    at = data.draw(st.integers(0, len(words)))
    a, b = words[:at] + [digits] + words[at:], words[:at] + [other] + words[at:]
    assert both_ways(" ".join(a), " ".join(b)) == (0, 0)


@FAST
@given(SENTENCE, st.data())
def test_two_values_swapped_scores_0(words, data):
    i, j = data.draw(st.lists(st.integers(0, len(words) - 1), min_size=2, max_size=2,
                              unique=True))
    if words[i] == words[j]:
        words = words[:j] + [words[j] + "x"] + words[j + 1:]
    swapped = list(words)
    swapped[i], swapped[j] = words[j], words[i]
    assert both_ways(" ".join(words), " ".join(swapped)) == (0, 0)


@FAST
@given(SENTENCE, st.sampled_from(["<", ">", "=", "<=", ">=", "!="]), st.data())
def test_an_operator_flipped_scores_0(words, op, data):
    other = data.draw(st.sampled_from(["<", ">", "=", "<=", ">=", "!="]).filter(lambda o: o != op))
    at = data.draw(st.integers(1, len(words) - 1))
    a = " ".join(words[:at] + [op] + words[at:])
    b = " ".join(words[:at] + [other] + words[at:])
    assert both_ways(a, b) == (0, 0)


@FAST
@given(SENTENCE, st.sampled_from(["not", "never", "no", "n't"]), st.data())
def test_a_negation_inserted_scores_0(words, neg, data):
    at = data.draw(st.integers(1, len(words) - 1))
    if neg == "n't":
        negated = words[:at - 1] + [words[at - 1] + "n't"] + words[at:]
    else:
        negated = words[:at] + [neg] + words[at:]
    assert both_ways(" ".join(words), " ".join(negated)) == (0, 0)


@FAST
@given(st.lists(WORD, min_size=2, max_size=6, unique=True), st.data())
def test_an_ordered_array_reordered_scores_0(items, data):
    perm = data.draw(st.permutations(items).filter(lambda p: list(p) != items))
    props = {"tags": {"type": "array", "items": TEXT}}  # a set-like name, no uniqueItems
    assert score(call({"tags": items}), call({"tags": list(perm)}), props) == 0


@FAST
@given(st.integers(-10 ** 12, 10 ** 12), st.integers(-1000, 1000).filter(bool),
       st.sampled_from(["integer", "number"]))
def test_another_number_scores_0(n, delta, kind):
    props = {"qty": {"type": kind}}
    assert score(call({"qty": n}), call({"qty": n + delta}), props) == 0
    assert score(call({"qty": n}), call({"qty": str(n)}), props) == 0  # another JSON type


# ---------------------------------------------------------------- schema-granted forms: 1


@FAST
@given(st.lists(WORD, min_size=1, max_size=6, unique_by=str.casefold), st.data())
def test_enum_in_another_case_scores_1(values, data):
    value = data.draw(st.sampled_from(values))
    cased = "".join(data.draw(st.sampled_from([c.lower(), c.upper()])) for c in value)
    props = {"mode": {"type": "string", "enum": values}}
    assert score(call({"mode": value}), call({"mode": cased}), props) == 1


@FAST
@given(st.lists(WORD, min_size=1, max_size=6, unique=True), st.data())
def test_unique_items_in_another_order_scores_1(items, data):
    perm = data.draw(st.permutations(items))
    props = {"tags": {"type": "array", "items": TEXT, "uniqueItems": True}}
    assert score(call({"tags": items}), call({"tags": list(perm)}), props) == 1


@FAST
@given(st.one_of(st.integers(-100, 100), WORD, st.booleans(), st.none()), st.booleans())
def test_omitted_schema_default_scores_1(default, expert_gives_it):
    props = {"x": {"default": default}, "y": TEXT}
    given_, omitted = {"x": default, "y": "a"}, {"y": "a"}
    expert, cand = (given_, omitted) if expert_gives_it else (omitted, given_)
    assert score(call(expert), call(cand), props) == 1


@FAST
@given(st.dictionaries(WORD, st.one_of(st.integers(), WORD, st.booleans()), min_size=1,
                       max_size=6), st.data(), st.sampled_from([None, 0, 2]))
def test_key_order_and_json_whitespace_score_1(args, data, indent):
    keys = data.draw(st.permutations(list(args)))
    raw = json.dumps({k: args[k] for k in keys}, indent=indent, separators=(" , ", " :  "))
    assert score(call(args), call(raw)) == 1


@FAST
@given(st.integers(-2 ** 53, 2 ** 53))
def test_int_for_the_same_valued_number_scores_1_only_when_the_backend_converts(n):
    props = {"amount": {"type": "number"}}
    assert score(call({"amount": n}), call({"amount": float(n)}), props) == 0
    t = Turn(id="p/1", trajectory_id="p", turn=1, context=[], expected=call({"amount": n}),
             tools=[{"type": "function", "function": {"name": "do", "parameters": {
                 "type": "object", "properties": props}}}])
    for config in ({"int_float_equal": True}, {"normalize": ["bfcl"]}):
        assert get_verifier("toolcall", **config).score(t, call({"amount": float(n)})).reward == 1


@FAST
@given(SENTENCE, st.data())
def test_whitespace_in_a_one_line_text_scores_1_only_when_normalised(words, data):
    gaps = [data.draw(st.text(alphabet=" \t", min_size=1, max_size=3)) for _ in words]
    spaced = "".join(g + w for g, w in zip(gaps, words)) + data.draw(st.sampled_from(["", " "]))
    text = " ".join(words)
    # strings are data; a message is its own text, ends trimmed
    assert both_ways(text, spaced) == (spaced == text, spaced.strip() == text)
    loose = get_verifier("toolcall", normalize=["whitespace"], free_text=["note"])
    t = Turn(id="p/1", trajectory_id="p", turn=1, context=[], expected=call({"note": text}),
             tools=[{"type": "function", "function": {"name": "do", "parameters": {
                 "type": "object", "properties": {"note": TEXT}}}}])
    assert loose.score(t, call({"note": spaced})).reward == 1
