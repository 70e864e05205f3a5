"""The rescue test finds the first wrong step, replays the episode with the expert's action there,
and counts the episodes that recover by themselves."""

from __future__ import annotations

import json

from pivotrl.formats.actions import parse_completion, render_action
from pivotrl.verifiers import get_verifier
from pivotrl_testbed.episodes import ScriptedPolicy
from pivotrl_testbed.testbed.experts import step_message
from pivotrl_testbed.testbed.rescue import rescue_test
from pivotrl_testbed.testbed.slips import grounding_slip
from pivotrl_testbed.testbed.tasks import make_tasks


class Ungrounded:
    """The expert, but every order it reads from a listing is the listing's first."""

    def __init__(self, tasks):
        self.expert = ScriptedPolicy(tasks)
        self.params = {t.messages[-1].content: t.metadata["task"] for t in tasks}

    def act(self, context, tools):
        text = self.expert.act(context, tools)
        msg = parse_completion(text).message
        if not msg.tool_calls:
            return text
        call = msg.tool_calls[0]
        obs = [m.content for m in context if m.role == "tool"]
        params = self.params[next(m.content for m in context if m.role == "user")]
        slipped = grounding_slip("toolshop", params, obs, ("call", call.function.name, call.args()))
        return text if slipped is None else render_action(step_message(slipped, 0))


def test_the_deciding_step_is_the_first_wrong_one_and_the_experts_action_there_rescues():
    tasks = [t for t in make_tasks("toolshop", "eval", 40) if t.metadata["task"]["kind"] == "cancel"]
    verifier = get_verifier("state")
    got = rescue_test("toolshop", tasks, Ungrounded(tasks), verifier)
    c = got["counts"]
    assert c["episodes"] == len(tasks) and c["failed"] > 0  # some first orders are the wrong one
    assert c["departed"] == c["failed"] and c["self_rescued"] == 0  # every wrong step loses the task
    assert c["rescued"] == c["failed"]  # one wrong step: the expert's action there wins the task
    for row in got["episodes"]:
        assert row["step"] == 2 and json.loads(row["action"].split("\n")[1])["name"] == "cancel_order"
        assert row["action"] != row["expert"] and row["rescued"]
    clean = rescue_test("toolshop", tasks, ScriptedPolicy(tasks), verifier)["counts"]
    assert clean == {"episodes": len(tasks), "failed": 0, "departed": 0, "self_rescued": 0, "rescued": 0}


def test_tasks_that_share_a_request_are_replayed_each_with_its_own_actions():
    """Terminal's requests without parameters repeat: a won and a lost task with the same
    request; only the lost one is replayed, with its own actions."""
    tasks = [t for t in make_tasks("toolshop", "eval", 40) if t.metadata["task"]["kind"] == "cancel"]
    policy, verifier = Ungrounded(tasks), get_verifier("state")
    rows = rescue_test("toolshop", tasks, policy, verifier)["episodes"]
    won = next(t for t in tasks if t.id not in {r["task"] for r in rows})
    lost = next(t for t in tasks if t.id in {r["task"] for r in rows})
    twin = lost.model_copy(update={"id": "twin", "messages": won.messages})  # the won task's request
    got = rescue_test("toolshop", [won, twin], policy, verifier)
    assert [r["task"] for r in got["episodes"]] == ["twin"] and "rescued" in got["episodes"][0]
