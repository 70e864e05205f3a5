"""Agreement of `toolcall` and `exact` with BFCL's own `ast_checker` on mutated expert calls.

Cases: every Python-language single-turn BFCL v4 entry with possible answers (simple_python,
multiple, parallel, parallel_multiple, live_simple, live_multiple, live_parallel,
live_parallel_multiple). The expert call is the first acceptable value of every argument; each
entry is mutated (reordered keys, int→float, float→int, dropped optional, explicit default,
wrong number/string/bool, upper case, respacing, BFCL's alternative answer, dropped required,
extra argument, stringified number, wrong function, reversed list, reordered / dropped /
duplicated parallel calls) and judged by `ast_checker` (the truth) and by our verifiers.
Print the table with `python3 tests/bfcl_support.py` (measured 2026-12-02: 24,692 cases;
toolcall default accuracy 0.882 / precision 0.995 / recall 0.683; with `normalize: [bfcl]`
0.972 / 0.996 / 0.927; with `unproven_rule: judge` and an *oracle* judge stand-in (BFCL's own
verdict, the upper bound of what a judge adds) 0.974 / 0.996 / 0.932, 6,110 judge requests;
exact 0.821 / 1.000 / 0.515).

BFCL calls Python functions with the JSON values as they are, so "10" for an integer parameter
is a TypeError there: toolcall is measured with `numeric_strings=False` (its default).

Where `toolcall` disagrees with BFCL on purpose (it pays only what a rule proves):
- BFCL lower-cases every string and drops spaces and ",./-_*^": "SAN FRANCISCO" and
  "San Francisco CA" pass there. Case and punctuation can carry meaning ("mg"/"Mg", "-f"/"-F"),
  so they are not proven the same: 0 by default, the judge's question with `unproven_rule:
  judge` (upper_case, respace: most of the false negatives). `normalize: [bfcl]` declares BFCL's
  checker as the environment and applies its rule.
- BFCL passes an int for a float parameter (Python converts it); a record that stores what it
  is given stores another value, so by default an int and a float are two values (float_to_int:
  the 108 cases BFCL accepts are false negatives; `normalize: [bfcl]` or `int_float_equal` pays
  them).
- An optional argument given on one side only is equal only to the schema's own `default`;
  BFCL's answer lists say per case whether it may be omitted, which no schema states
  (drop_optional false negatives). Where the schema has a `default` key and BFCL's answer list
  lacks it, the call executes the same: those are the remaining false positives (~35 of 38).
- BFCL's alternative answers ("San Francisco, CA" or "San Francisco, California"; lists in
  either order) cannot be known from one expert call: false negatives by design, unless the
  judge pays them.
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("bfcl_eval")

import bfcl_support  # noqa: E402

from pivotrl.io.records import Message, Turn  # noqa: E402
from pivotrl.verifiers import get_verifier  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return list(bfcl_support.cases())


@pytest.fixture(scope="module")
def results(rows):
    verifiers = {"toolcall": get_verifier("toolcall", numeric_strings=False),
                 "exact": get_verifier("exact")}
    return {name: bfcl_support.agreement(v, rows) for name, v in verifiers.items()}


def test_enough_cases_with_both_verdicts(rows):
    assert len(rows) > 20_000
    truths = [r[-1] for r in rows]
    assert 0.3 < sum(truths) / len(truths) < 0.7  # mutations give both verdicts in bulk


def test_toolcall_agrees_with_ast_checker(results):
    tc = results["toolcall"]
    print({k: v for k, v in tc.items() if k != "disagreements"})
    # Floors a little under what was measured (0.882 / 0.995 / 0.683): precision first.
    assert tc["accuracy"] >= 0.87
    assert tc["precision"] >= 0.99
    assert tc["recall"] >= 0.67


def test_toolcall_beats_exact(results):
    tc, ex = results["toolcall"], results["exact"]
    assert ex["precision"] == 1.0  # exact never accepts what BFCL rejects here...
    assert ex["recall"] < 0.6      # ...but rejects half of what BFCL accepts
    assert tc["accuracy"] > ex["accuracy"] + 0.05
    assert tc["recall"] > ex["recall"] + 0.15


def test_judge_backed_toolcall_with_an_oracle_judge(rows):
    """`unproven_rule: judge` with BFCL's own verdict as the judge: what a perfect judge adds
    when it is asked only about unproven differences (all cases: 0.974 / 0.996 / 0.932). Every
    4th case (6,173; 0.978 / 0.998 / 0.941): each judge request is an HTTP round trip, and
    all 24,692 cases cost 16 s of the suite."""
    rows = rows[::4]
    judged = bfcl_support.judged_agreement(rows, bfcl_support.oracle_rule(rows))
    alone = bfcl_support.agreement(get_verifier("toolcall", numeric_strings=False), rows)
    print({k: v for k, v in judged.items() if k not in ("disagreements", "by_label")})
    assert judged["precision"] >= 0.99 and judged["accuracy"] >= 0.97
    assert judged["recall"] >= alone["recall"] + 0.2
    assert 0 < judged["judge_requests"] < 0.3 * len(rows) * 2  # most actions need no judge


def test_a_yes_man_judge_never_pays_a_proven_difference():
    """A judge that always says YES is asked only where every difference is unproven: no
    mutation that changes a number, a boolean, a function or the calls gains from it."""
    rows = list(bfcl_support.cases(per_category=40))
    base = bfcl_support.agreement(get_verifier("toolcall"), rows)["by_label"]
    yes = bfcl_support.judged_agreement(rows, lambda a, b: "YES")
    for label in ("wrong_number", "flip_bool", "drop_required", "extra_arg", "wrong_function",
                  "duplicated_call", "dropped_call", "stringify_number"):
        assert yes["by_label"][label] == base[label], label
    assert yes["by_label"]["wrong_string"][0] < base["wrong_string"][0]  # text: the judge's call


def test_the_bfcl_option_agrees_with_bfcls_normalising_checker(rows, results):
    bfcl = bfcl_support.agreement(get_verifier("toolcall", normalize=["bfcl"]), rows)
    print({k: v for k, v in bfcl.items() if k not in ("disagreements", "by_label")})
    assert bfcl["accuracy"] >= 0.96 and bfcl["precision"] >= 0.99
    assert bfcl["accuracy"] > results["toolcall"]["accuracy"] + 0.05
    for label in ("respace", "upper_case", "float_to_int"):
        assert bfcl["by_label"][label][0] >= 0.99, label
    # by default an int for a float parameter is another value (a stored record differs)
    assert results["toolcall"]["by_label"]["float_to_int"][0] == 0.0


@pytest.mark.parametrize("label", ["identity", "reordered_keys", "drop_required", "extra_arg",
                                   "wrong_function", "duplicated_call", "dropped_call",
                                   "stringify_number", "int_to_float"])
def test_mutations_with_full_agreement(results, label):
    acc, n = results["toolcall"]["by_label"][label]
    assert n > 50 and acc >= 0.995, (label, acc, n)


@pytest.mark.parametrize("label,floor", [("reordered_calls", 0.99), ("wrong_number", 0.99),
                                         ("wrong_string", 0.995), ("flip_bool", 0.98),
                                         ("drop_optional", 0.83), ("add_default", 0.95),
                                         ("upper_case", 0.12)])
def test_mutations_with_documented_disagreement(results, label, floor):
    acc, n = results["toolcall"]["by_label"][label]
    assert acc >= floor, (label, acc, n)


def test_irrelevance_calls_score_zero_and_refusals_are_the_judges():
    """BFCL irrelevance: no function fits, so the expert declines. Any call scores 0 (BFCL agrees);
    the expert's own refusal scores 1; a refusal in other words is not proven the same decision
    (no phrase list decides: one can also claim an action), so it is 0 by default and the
    judge's question with `message_rule: judge`. A message is never a free pass (NeMo-Gym's
    pitfall), where BFCL accepts any non-call."""
    from fake_judge import FakeJudge

    verifier = get_verifier("toolcall")
    expert = "I cannot do this with the functions I have."
    refusals = ["I'm sorry, but none of the available functions can help with this request.",
                "I cannot answer this with the provided tools."]
    import bfcl_eval

    path = os.path.join(os.path.dirname(bfcl_eval.__file__), "data", "BFCL_v4_irrelevance.json")
    with open(path) as fh:
        entries = [json.loads(line) for _, line in zip(range(20), fh)]
    srv = FakeJudge(lambda a, b: "NO" if "42" in a + b else "YES")
    try:
        judged = get_verifier("toolcall", message_rule="judge", judge={"base_url": srv.url})
        for entry in entries:
            fn = entry["function"][0]
            turn = Turn(id=entry["id"], trajectory_id=entry["id"], turn=0,
                        tools=[bfcl_support.to_openai_tool(f) for f in entry["function"]],
                        context=[], expected=Message(role="assistant", content=expert))
            call = bfcl_support.as_message([(fn["name"], {})])
            assert verifier.score(turn, call).reward == 0.0
            assert verifier.score(turn, Message(role="assistant", content=expert)).reward == 1
            for text in refusals:
                msg = Message(role="assistant", content=text)
                assert verifier.score(turn, msg).reward == 0.0
                assert judged.score(turn, msg).reward == 1.0
            answer = Message(role="assistant", content="The answer is 42.")
            assert verifier.score(turn, answer).reward == 0.0
            assert judged.score(turn, answer).reward == 0.0
    finally:
        srv.close()
