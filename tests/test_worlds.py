"""The testbed worlds and their experts: determinism, splits, success, equivalent forms, sandbox."""

from __future__ import annotations

import json
import random

import pytest

from pivotrl.sandbox import bwrap as sandbox
from pivotrl.io.records import check_trajectory
from pivotrl_testbed.testbed import experts, terminal, toolshop
from pivotrl_testbed.testbed.experts import WEAK, Chooser, expert_message, generate_trajectories
from pivotrl_testbed.testbed.tasks import describe_testbed, make_task, make_tasks, split_of, task_ids
from pivotrl.verifiers.world import make_world, world_at_turn
from pivotrl_testbed.episodes import expert_turns

needs_sandbox = pytest.mark.skipif(not sandbox.sandbox_available(), reason="bubblewrap unavailable")


def test_tasks_are_deterministic_and_split_by_id():
    a = make_tasks("toolshop", "train", 20)
    b = make_tasks("toolshop", "train", 20)
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    train, ev = set(task_ids("toolshop", "train", 200)), set(task_ids("toolshop", "eval", 50))
    assert not train & ev
    assert all(split_of(t) == "eval" for t in ev)
    # about one in five held out
    frac = sum(split_of(f"terminal-{i}") == "eval" for i in range(1000)) / 1000
    assert 0.15 < frac < 0.25


def test_task_records_carry_the_contract_metadata():
    for world in ("toolshop", "terminal"):
        t = make_task(world, f"{world}-3")
        assert t.domain == world and [m.role for m in t.messages] == ["system", "user"]
        assert {"world", "world_config", "goal", "task_id", "split", "task"} <= set(t.metadata)
        assert t.tools and all(tool["type"] == "function" for tool in t.tools)
    assert 8 <= len(toolshop.TOOLS) <= 15


def test_task_texts_vary():
    texts = {make_task("toolshop", f"toolshop-{i}").messages[1].content for i in range(100)}
    kinds = {make_task("toolshop", f"toolshop-{i}").metadata["task"]["kind"] for i in range(100)}
    assert len(texts) > 90 and kinds == set(toolshop.KINDS)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_toolshop_expert_trajectory_succeeds(seed):
    for split, n in (("train", 150), ("eval", 40)):
        trajs = generate_trajectories("toolshop", split, n, seed=seed)
        for traj in trajs:
            assert traj.metadata["success"], (traj.id, traj.messages)
            assert check_trajectory(traj) is None
            calls = sum(len(m.tool_calls or []) for m in traj.messages)
            assert 2 <= calls <= 6
            assert traj.messages[-1].role == "assistant" and not traj.messages[-1].tool_calls


@needs_sandbox
@pytest.mark.parametrize("seed", [0, 1])
def test_every_terminal_expert_trajectory_succeeds(seed):
    trajs = generate_trajectories("terminal", "train", 25, seed=seed)
    assert {t.metadata["task"]["kind"] for t in trajs} == set(terminal.KINDS)
    for traj in trajs:
        assert traj.metadata["success"], (traj.id, [m.content for m in traj.messages])
        assert check_trajectory(traj) is None


def test_later_arguments_depend_on_earlier_observations():
    """Ids are never in the user text: the expert must read them from observations."""
    for traj in generate_trajectories("toolshop", "train", 40, seed=0):
        user = traj.messages[1].content
        seen = " ".join(m.content for m in traj.messages if m.role == "tool")
        for m in traj.messages:
            for call in m.tool_calls or []:
                for key, value in call.args().items():
                    if key.endswith("_id"):
                        assert value not in user and value in seen, (traj.id, key, value)


def test_the_expert_uses_many_forms():
    forms = set()
    for traj in generate_trajectories("toolshop", "train", 60, seed=0):
        for m in traj.messages:
            for call in m.tool_calls or []:
                forms.add((call.function.name, call.function.arguments))
    # same call, different text: key order, omitted defaults, "2" vs 2, case
    arg_sets = {}
    for name, args in forms:
        arg_sets.setdefault(name, set()).add(tuple(json.loads(args)))
    assert any(len(v) > 1 for v in arg_sets.values())
    texts = [a for _, a in forms]
    assert any('"status": "any"' in a for a in texts) and any('"qty": "' in a for a in texts)


def _equivalent_forms_agree(world_name: str, trajs, n_alt: int) -> int:
    checked = 0
    for turn in expert_turns(trajs):
        if not turn.expected.tool_calls:
            continue
        params = turn.metadata["task"]
        ref_world = world_at_turn(turn)
        ref_obs = [ref_world.execute(c.function.name, c.args()) for c in turn.expected.tool_calls]
        for alt_seed in range(100, 100 + n_alt):
            alt = expert_message(world_name, params, turn.context, alt_seed)
            w = world_at_turn(turn)
            obs = [w.execute(c.function.name, c.args()) for c in alt.tool_calls]
            assert obs == ref_obs, (turn.id, alt.tool_calls, turn.expected.tool_calls)
            assert w.snapshot() == ref_world.snapshot(), turn.id
            checked += alt.tool_calls[0].function.arguments != turn.expected.tool_calls[0].function.arguments
    return checked


def test_equivalent_forms_lead_to_the_same_state_toolshop():
    trajs = generate_trajectories("toolshop", "train", 40, seed=0)
    assert _equivalent_forms_agree("toolshop", trajs, 4) > 50  # many differ in text, not effect


@needs_sandbox
def test_equivalent_forms_lead_to_the_same_state_terminal():
    trajs = generate_trajectories("terminal", "train", 8, seed=0)
    assert _equivalent_forms_agree("terminal", trajs, 2) > 3


def test_a_wrong_action_changes_the_outcome():
    """Not everything is equivalent: cancelling the wrong order leaves another state."""
    traj = next(t for t in generate_trajectories("toolshop", "train", 40, seed=0)
                if t.metadata["task"]["kind"] == "cancel")
    turn = [t for t in expert_turns([traj]) if t.expected.tool_calls][-1]
    good, bad = world_at_turn(turn), world_at_turn(turn)
    args = turn.expected.tool_calls[0].args()
    good.execute("cancel_order", args)
    other = next(o for o in bad.state["orders"] if o != args["order_id"])
    bad.execute("cancel_order", {**args, "order_id": other})
    assert good.snapshot() != bad.snapshot()
    assert good.success(traj.metadata["goal"], "done")
    assert not bad.success(traj.metadata["goal"], "done")
    assert not good.success(traj.metadata["goal"], None)  # no final message: not done


def test_count_task_needs_the_number_in_the_message():
    traj = next(t for t in generate_trajectories("toolshop", "train", 60, seed=0)
                if t.metadata["task"]["kind"] == "count")
    n = traj.metadata["goal"]["mention"][0]
    w = make_world("toolshop")
    w.reset(traj.metadata["world_config"])
    assert w.success(traj.metadata["goal"], f"You have {n} shipped orders.")
    assert not w.success(traj.metadata["goal"], f"You have {int(n) + 1}{n} shipped orders.")


def test_toolshop_never_raises_on_hostile_arguments():
    w = make_world("toolshop")
    w.reset(make_task("toolshop", "toolshop-1").metadata["world_config"])
    before = w.snapshot()
    rng = random.Random(0)
    junk = [None, 1, -5, 2.5, True, "", " ", "x" * 1000, [], {}, {"a": [1]}, "o10", "c10", "'; DROP"]
    for name in [t["function"]["name"] for t in toolshop.TOOLS] + ["nope", ""]:
        for _ in range(30):
            props = ["email", "customer_id", "order_id", "product_id", "qty", "status", "reason",
                     "city", "name", "zzz"]
            args = {k: rng.choice(junk) for k in rng.sample(props, rng.randrange(0, 4))}
            obs = w.execute(name, args)
            assert isinstance(obs, str) and obs
    assert isinstance(w.execute("find_customer", ["not", "a", "dict"]), str)
    json.dumps(w.snapshot())  # still JSON-able
    assert before is not w.snapshot()


def test_world_accepts_equivalent_values():
    task = next(t for t in make_tasks("toolshop", "train", 60) if t.metadata["task"]["kind"] == "buy")
    email = task.metadata["task"]["email"]
    w = make_world("toolshop")
    w.reset(task.metadata["world_config"])
    assert w.execute("find_customer", {"email": email.upper()}) == \
        w.execute("find_customer", {"email": " " + email.lower()})
    cid = json.loads(w.execute("find_customer", {"email": email}))["customer_id"]
    assert w.execute("list_orders", {"customer_id": cid}) == \
        w.execute("list_orders", {"status": "ANY", "customer_id": cid})
    pid = json.loads(w.execute("find_product", {"name": task.metadata["task"]["product"].upper()}))
    a, b = make_world("toolshop"), make_world("toolshop")
    a.reset(task.metadata["world_config"])
    b.reset(task.metadata["world_config"])
    assert a.execute("place_order", {"customer_id": cid, "product_id": pid["product_id"]}) == \
        b.execute("place_order", {"product_id": pid["product_id"], "customer_id": cid, "qty": "1"})
    assert a.snapshot() == b.snapshot()
    assert "error" in a.execute("place_order", {"customer_id": cid, "product_id": pid["product_id"],
                                                 "qty": "two"})


@needs_sandbox
def test_terminal_commands_run_in_the_sandbox(monkeypatch):
    calls = []
    real = sandbox.run_in_sandbox

    def spy(command, workdir, limits=None, **kw):
        calls.append(command)
        return real(command, workdir, limits, **kw)

    monkeypatch.setattr(sandbox, "run_in_sandbox", spy)
    w = make_world("terminal")
    w.reset({"workspace": {"a.txt": "hello\n"}})
    assert w.execute("run", {"command": "hostname"}) == "sandbox"
    assert "user:x:1000" in w.execute("run", {"command": "cat /etc/passwd"})
    out = w.execute("run", {"command": "echo pwned > /etc/x; cat a.txt"})
    assert "hello" in out and "[exit 0]" not in out
    assert w.execute("run", {"command": "false"}).endswith("[exit 1]")
    assert w.execute("run", {"command": "mkdir d"}) == "(no output)"
    assert calls == ["hostname", "cat /etc/passwd", "echo pwned > /etc/x; cat a.txt", "false",
                     "mkdir d"]
    # the attempt on /etc failed, and is part of the state all the same
    assert w.snapshot() == {"a.txt": "hello\n", "d/": "<dir>",
                            "\0/etc/x": "attempted open-write"}
    assert w.execute("cat", {"command": "ls"}).startswith("error")
    assert w.execute("run", {"command": 5}).startswith("error")
    assert len(calls) == 5  # errors in the call itself never reach a shell
    path = w.workdir
    w.close()
    assert not path.exists()


@needs_sandbox
def test_terminal_observations_are_deterministic():
    task = make_task("terminal", "terminal-0")
    obs = []
    for _ in range(2):
        w = make_world("terminal")
        w.reset(task.metadata["world_config"])
        obs.append([w.execute("run", {"command": c}) for c in ("ls", "touch z; ls", "wc -l *")])
        obs[-1].append(w.snapshot())
    assert obs[0] == obs[1]


@needs_sandbox
def test_a_pipelines_errors_read_the_same_every_run():
    """Four processes of one pipeline fail at once on one stderr pipe: stderr is line-buffered in
    the sandbox (no message spliced into another) and the world sorts the lines, so the
    observation does not depend on the scheduler (before: 14 distinct texts in 20 runs)."""
    w = make_world("terminal")
    w.reset({"workspace": {"a.txt": "x\n"}})
    seen = {w.execute("run", {"command": "cat m1.txt | cat m2.txt | cat m3.txt | nosuchcmd"})
            for _ in range(40)}
    assert len(seen) == 1, seen
    lines = seen.pop().splitlines()
    assert lines[:4] == sorted(lines[:4]) and sum(ln.startswith("cat: m") for ln in lines) == 3


def test_weak_expert_is_partly_competent_and_records_are_valid():
    trajs = generate_trajectories("toolshop", "train", 150, seed=0, config=WEAK)
    rate = sum(t.metadata["success"] for t in trajs) / len(trajs)
    assert 0.2 < rate < 0.8, rate
    assert all(check_trajectory(t) is None for t in trajs)
    assert all(t.metadata["expert"] == "weak" for t in trajs)
    # it recovers from some of its wrong ids: an error observation then a later success
    recovered = [t for t in trajs if t.metadata["success"]
                 and any('"error"' in (m.content or "") for m in t.messages if m.role == "tool")]
    assert recovered


def test_habit_prefers_one_form():
    ch = Chooser(random.Random(0), habit=0.9)
    picks = [ch.pick(["a", "b", "c"]) for _ in range(500)]
    assert picks.count("c") > 400
    ch = Chooser(random.Random(0))
    picks = [ch.pick(["a", "b", "c"]) for _ in range(600)]
    assert all(150 < picks.count(x) < 250 for x in "abc")


def test_describe_testbed():
    d = describe_testbed(n_sample=50)
    assert d["worlds"]["toolshop"]["n_tools"] == len(toolshop.TOOLS)
    assert d["worlds"]["terminal"]["tools"] == ["run"]
    assert set(d["ood"]) >= {"add", "reverse", "recall"}
    assert experts.MAX_TURNS <= 8
