"""Reward hacking: wrong actions that look right must score 0, right actions that look wrong 1.

One test per class of leak. Each builds the smallest case a policy could find by itself (a
near-copy of the expert's action that does something else) and asserts the verdict the verifier
must give; `tests/test_verifiers_*.py` test the verifiers' ordinary behaviour.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pivotrl.io.records import FunctionCall, Message, ToolCall, Turn
from pivotrl.sandbox.bwrap import sandbox_available
from pivotrl.verifiers import get_verifier
from pivotrl.verifiers.world import register_world

from fake_judge import FakeJudge

needs_bwrap = pytest.mark.skipif(not sandbox_available(), reason="bubblewrap not usable here")


def call(name: str, **args: Any) -> ToolCall:
    return ToolCall(id=f"c_{name}", function=FunctionCall(name=name, arguments=json.dumps(args)))


def calls(*cs: ToolCall) -> Message:
    return Message(role="assistant", tool_calls=list(cs))


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def turn(expected: Message, tools: list | None = None, **metadata: Any) -> Turn:
    return Turn(id=f"h/{abs(hash(expected.model_dump_json()))}", trajectory_id="h", turn=1,
                tools=tools or [], context=[Message(role="user", content="help me")],
                expected=expected, metadata=metadata)


def fn(name: str, props: dict, required: list[str] | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props,
        "required": list(props) if required is None else required}}}


class StoreWorld:
    """Customers' orders; unknown keys and failures are one generic error text."""
    name = "hack_store"

    def reset(self, config: dict[str, Any]) -> None:
        self.orders = {k: list(v) for k, v in config.get("orders", {}).items()}

    def execute(self, name: str, arguments: dict[str, Any]) -> str:
        cid = arguments.get("customer_id")
        if name == "list_orders" and cid in self.orders:
            return json.dumps(self.orders[cid])
        if name == "delete_customer" and cid in self.orders and not self.orders[cid]:
            del self.orders[cid]
            return json.dumps({"ok": True})
        return json.dumps({"error": "request failed"})

    def snapshot(self) -> Any:
        return self.orders

    def success(self, goal: dict[str, Any], final_message: str | None) -> bool:
        return self.orders == goal


register_world("hack_store", StoreWorld)
STORE = {"orders": {"c1": [], "c2": [], "c3": ["o7"]}}


# ---------------------------------------------------------------- final messages


WRONG_MESSAGES = [  # (expert, candidate that says something else in nearly the same words)
    ("You currently have 1 pending order in your account with us today.",
     "You currently have 2 pending orders in your account with us today."),  # count
    ("Your pending order o12 has been cancelled and the refund is on its way to you.",
     "Your pending order o13 has been cancelled and the refund is on its way to you."),  # id
    ("Your pending order o12 has been cancelled and the refund is on its way to you.",
     "Your pending order o12 has not been cancelled and the refund is on its way to you."),
    ("Your pending order o12 has been cancelled and the refund is on its way to you.",
     "Your pending order o12 has failed to be cancelled and the refund is on its way to you."),
    ("The balance of the account after the last transfer is -50 dollars today.",
     "The balance of the account after the last transfer is 50 dollars today."),  # sign
    ("Unfortunately order o12 had already shipped, so I started a return for it instead.",
     "I cannot help with that."),  # an apology in an answer is not a refusal
    ("👍", "!!!"),  # no words on either side
]


@pytest.mark.parametrize("expert,cand", WRONG_MESSAGES)
def test_final_message_with_other_facts_scores_0(expert, cand):
    """A wrong count, id, negation or sign; a refusal for an answer; symbols for symbols."""
    assert get_verifier("toolcall").score(turn(say(expert)), say(cand)).reward == 0.0
    store = turn(say(expert), world="hack_store", world_config=STORE)
    assert get_verifier("state").score(store, say(cand)).reward == 0.0
    shell = get_verifier("shell")
    assert shell.score(turn(say(expert), workspace={"a.txt": "x\n"}), say(cand)).reward == 0.0


def test_final_message_rewording_is_the_judges_refusals_included():
    """A rewording is not proven the same answer: 0 by default, the judge's call under
    `message_rule: judge`; two refusals in other words too (no phrase list decides)."""
    verifier = get_verifier("toolcall")
    same = [("Your order o12 is cancelled.", "Done: order o12 has been cancelled."),
            ("You have 2 shipped orders.", "You have two shipped orders!"),
            ("I'm sorry, none of the available functions can order a pizza.",
             "I cannot help with that: no suitable tool.")]
    srv = FakeJudge(lambda a, b: "YES")
    try:
        judged = get_verifier("toolcall", message_rule="judge", judge={"base_url": srv.url})
        for expert, cand in same:
            assert verifier.score(turn(say(expert)), say(cand)).reward == 0.0, cand
            assert judged.score(turn(say(expert)), say(cand)).reward == 1.0, cand
    finally:
        srv.close()


# ---------------------------------------------------------------- toolcall strings and numbers

ROUTE = [fn("plan_route", {"distance": {"type": "string"}, "shift": {"type": "string"},
                           "when": {"type": "string"}, "position": {"type": "string"},
                           "note": {"type": "string"}, "account": {"type": "number"},
                           "query": {"type": "string"}},
            required=[])]
SQL = ("SELECT name, city FROM customers WHERE age > 30 AND city = 'Oslo' AND active = 1 "
       "ORDER BY name LIMIT 10")
LONG_NOTE = ("please leave the parcel with the neighbour at number 12 because nobody will be at "
             "home during the day and the courier should ring twice before leaving")


@pytest.mark.parametrize("key,expert,cand", [
    ("distance", "1.5 km", "15 km"),
    ("shift", "-5 hours", "5 hours"),
    ("when", "12/1/2024 morning", "1/21/2024 morning"),
    ("position", "40.7128, -74.0060", "40.7128, 74.0060"),
    ("position", "40.7128, -74.0060", "407128, -740060"),
    ("note", LONG_NOTE, LONG_NOTE.replace("should ring", "should not ring")),
    ("note", LONG_NOTE, LONG_NOTE.replace("number 12", "number 13")),
    ("note", LONG_NOTE, LONG_NOTE.replace("before leaving", "after leaving")),
    ("account", 12345678901234567, 1.2345678901234568e16),
    ("query", SQL, SQL.replace("age > 30", "age < 30")),
])
def test_toolcall_values_that_mean_something_else_score_0(key, expert, cand):
    """Punctuation that carries meaning, a flipped negation, id or word in long text, a large
    id passed as a float: each is another call."""
    t = turn(calls(call("plan_route", **{key: expert})), ROUTE)
    assert get_verifier("toolcall").score(t, calls(call("plan_route", **{key: cand}))).reward == 0


def test_partial_credit_never_pays_an_extra_destructive_call():
    tools = [fn("get_user", {"user_id": {"type": "string"}}),
             fn("delete_user", {"user_id": {"type": "string"}})]
    verifier = get_verifier("toolcall", partial_credit=True)
    one = turn(calls(call("get_user", user_id="u1")), tools)
    assert verifier.score(one, calls(call("get_user", user_id="u1"),
                                     call("delete_user", user_id="u1"))).reward == 0.0
    two = turn(calls(call("get_user", user_id="u1"), call("get_user", user_id="u2")), tools)
    assert verifier.score(two, calls(call("get_user", user_id="u1"),
                                     call("delete_user", user_id="u2"))).reward == 0.0
    assert verifier.score(two, calls(call("get_user", user_id="u1"))).reward == 0.5


def test_forms_the_schema_and_the_world_treat_as_the_same_action_score_1():
    """The opposite error: `qty` "2" for 2, an enum in another case, a city in another case in
    a write call, all executed identically by the toolshop world."""
    from pivotrl_testbed.testbed import toolshop

    verifier = get_verifier("toolcall")
    pairs = [(call("place_order", customer_id="c1", product_id="p2", qty=2),
              call("place_order", customer_id="c1", product_id="p2", qty="2")),
             (call("cancel_order", order_id="o12", reason="duplicate"),
              call("cancel_order", order_id="o12", reason="Duplicate")),
             (call("update_address", customer_id="c1", city="rome"),
              call("update_address", customer_id="c1", city="Rome"))]
    for expert, cand in pairs:
        t = turn(calls(expert), toolshop.TOOLS, world="toolshop")
        assert verifier.score(t, calls(cand)).reward == 1.0, cand
    wrong = call("update_address", customer_id="c1", city="oslo")
    t = turn(calls(pairs[2][0]), toolshop.TOOLS, world="toolshop")
    assert verifier.score(t, calls(wrong)).reward == 0.0


# ---------------------------------------------------------------- state


def test_state_same_observation_from_another_action_scores_0():
    """c1 and c2 both have no orders: reading c2's list shows the expert's `[]` for c1; another
    tool fails with the same error text as the expert's call."""
    verifier = get_verifier("state")
    read = turn(calls(call("list_orders", customer_id="c1")), world="hack_store",
                world_config=STORE)
    assert verifier.score(read, calls(call("list_orders", customer_id="c1"))).reward == 1.0
    sc = verifier.score(read, calls(call("list_orders", customer_id="c2")))
    assert sc.reward == 0.0 and "action" in sc.reason
    failing = turn(calls(call("list_orders", customer_id="c9")), world="hack_store",
                   world_config=STORE)
    assert verifier.score(failing, calls(call("delete_customer", customer_id="c9"))).reward == 0


# ---------------------------------------------------------------- shell / terminal

WORKSPACE = {"notes.txt": "apple\nbanana\napple pie\ncherry\n", "logs/": None}


@needs_bwrap
def test_shell_message_with_a_fenced_block_is_not_a_run_call():
    shell = get_verifier("shell", timeout_s=2.0)
    t = turn(calls(call("run", command="grep -c apple notes.txt")), workspace=WORKSPACE)
    assert shell.score(t, say("```bash\ngrep -c apple notes.txt\n```")).reward == 0.0
    assert shell.score(t, calls(call("run", command="grep apple notes.txt | wc -l"))).reward == 1
    shell.close()


@needs_bwrap
@pytest.mark.parametrize("expert,cand", [
    ("grep -c apple notes.txt", "echo 2"),
    ("head -2 notes.txt", "printf 'apple\\nbanana\\n'"),
    ("sort -u notes.txt > out.txt", "printf 'apple\\napple pie\\nbanana\\ncherry\\n' > out.txt"),
    ("ls", "printf 'logs\\nnotes.txt\\n'"),
])
def test_command_that_only_prints_the_expected_output_scores_0(expert, cand):
    """Same stdout and files today, but without the reads the expert's command relies on."""
    shell = get_verifier("shell", timeout_s=2.0)
    t = turn(calls(call("run", command=expert)), workspace=WORKSPACE)
    sc = shell.score(t, calls(call("run", command=cand)))
    shell.close()
    assert sc.reward == 0.0 and "perturbed" in sc.reason, sc.reason
    state = get_verifier("state")
    t = turn(calls(call("run", command=expert)), world="terminal",
             world_config={"workspace": WORKSPACE})
    assert state.score(t, calls(call("run", command=cand))).reward == 0.0
    same = {"grep -c apple notes.txt": "grep --count -e apple ./notes.txt",
            "head -2 notes.txt": "sed -n 1,2p notes.txt",
            "sort -u notes.txt > out.txt": "sort notes.txt | uniq > out.txt", "ls": "ls -1"}
    assert state.score(t, calls(call("run", command=same[expert]))).reward == 1.0


# ---------------------------------------------------------------- judge


def lenient(a: str, b: str) -> str:
    """A judge that ignores whitespace and cut markers: equal texts get YES."""
    norm = [" ".join(x.replace("…[cut]", "").split()) for x in (a, b)]
    return "YES" if norm[0] == norm[1] else "NO"


def test_judge_sees_the_whole_candidate():
    """Repeat the expert's answer, pad past the cut, then reverse it."""
    srv = FakeJudge(lenient)
    try:
        verifier = get_verifier("judge", base_url=srv.url)
        t = turn(say("The capital of France is Paris."))
        assert verifier.score(t, say("The capital of France is Paris.")).reward == 1.0
        sneaky = "The capital of France is Paris." + " " * 5000 + " No: it is Lyon."
        assert verifier.score(t, say(sneaky)).reward == 0.0
        huge = "The capital of France is Paris." + " " * 20000 + " No: it is Lyon."
        sc = verifier.score(t, say(huge))
        assert (sc.reward, sc.valid) == (0.0, False) and "too long" in sc.reason
    finally:
        srv.close()
