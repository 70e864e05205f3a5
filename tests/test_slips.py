"""The weak expert's slips: only at the steps that have one, always the same wrong action, wrong
by the world's own success rule, drawn at the configured rate, and nothing without them."""

from __future__ import annotations

import json

import re

import pytest

from pivotrl_testbed.testbed.experts import ExpertConfig, generate_trajectories
from pivotrl_testbed.testbed.slips import slip

N, START = 60, 100000  # the weak expert's task range (TestbedConfig.weak_task_start)
SLIPPING = {"toolshop": {"buy", "return", "swap"}, "terminal": {"sort", "move"}}


def _calls(traj):
    return [(c.function.name, c.args()) for m in traj.messages if m.role == "assistant"
            for c in m.tool_calls or []]


@pytest.mark.parametrize("world", ["toolshop", "terminal"])
def test_a_slip_is_one_wrong_action_where_the_world_has_one(world):
    right = generate_trajectories(world, "train", N, 1, ExpertConfig(habit=0.7), START)
    slipped = generate_trajectories(world, "train", N, 1, ExpertConfig(habit=0.7, slips=1.0), START)
    changed = 0
    for a, b in zip(right, slipped):
        kind = a.metadata["task"]["kind"]
        assert a.metadata["success"]  # the right expert solves every task
        if a.messages == b.messages:
            assert kind not in SLIPPING[world] or (world == "toolshop" and a.metadata["task"]["qty"] == 1)
            continue
        changed += 1
        assert kind in SLIPPING[world]
        ca, cb = _calls(a), _calls(b)
        diff = [i for i, (x, y) in enumerate(zip(ca, cb)) if x != y]
        assert len(ca) == len(cb) and len(diff) == 1  # one action slipped, the rest as before
        name, args = cb[diff[0]]
        if world == "toolshop":
            assert name in ("place_order", "return_item") and "qty" not in args
        else:
            assert args["command"].startswith("sort " if kind == "sort" else "cp ")
        no_duplicates = kind == "sort" and b.metadata["success"]
        if not no_duplicates:
            assert not b.metadata["success"], (b.id, cb[diff[0]])  # wrong by the world's rule
    assert changed >= N // 6


def test_slips_are_drawn_at_their_rate_and_only_where_a_slip_is():
    rate = 0.5
    right = generate_trajectories("toolshop", "train", 400, 1, ExpertConfig(habit=0.7), START)
    half = generate_trajectories("toolshop", "train", 400, 1, ExpertConfig(habit=0.7, slips=rate), START)
    task = [a.metadata["task"] for a in right]
    can = [t["kind"] in SLIPPING["toolshop"] and t["qty"] > 1 for t in task]
    eligible = [(a, b) for a, b, c in zip(right, half, can) if c]
    share = sum(a.messages != b.messages for a, b in eligible) / len(eligible)
    assert len(eligible) >= 80 and 0.35 <= share <= 0.65, (len(eligible), share)
    assert all(a.messages == b.messages for a, b, c in zip(right, half, can) if not c)


def test_no_slip_without_a_call_or_outside_the_listed_steps():
    assert slip("terminal", {"kind": "sort", "out": "o.txt"}, ["a.txt"], ("say", "done", None)) is None
    assert slip("terminal", {"kind": "sort", "out": "o.txt"}, [], ("call", "run", {"command": "ls"})) is None
    assert slip("toolshop", {"kind": "buy", "qty": 1}, ["{}", "{}"],
                ("call", "place_order", {"customer_id": "c", "product_id": "p"})) is None
    assert slip("toolshop", {"kind": "buy", "qty": 3}, ["{}", "{}"],
                ("call", "place_order", {"customer_id": "c", "product_id": "p", "qty": 3})) == \
        ("call", "place_order", {"customer_id": "c", "product_id": "p"})


def test_the_config_field_keeps_every_other_hash():
    from pivotrl_testbed.testbed.build import TestbedConfig

    assert TestbedConfig(weak_slips=0.0).digest() == TestbedConfig().digest()
    assert TestbedConfig(weak_slips=0.8).digest() != TestbedConfig().digest()
    assert TestbedConfig(weak_false_starts=0.0).digest() == TestbedConfig().digest()
    assert TestbedConfig(weak_false_starts=0.7).digest() != TestbedConfig().digest()
    with pytest.raises(ValueError):
        TestbedConfig(weak_slips=1.5)


def _contents(traj):
    return [m.content for m in traj.messages if m.role != "assistant" or not m.tool_calls]


@pytest.mark.parametrize("world", ["toolshop", "terminal"])
def test_a_false_start_is_a_wrong_first_call_then_the_experts_own_trajectory(world):
    from pivotrl.verifiers.world import make_world

    right = generate_trajectories(world, "train", N, 1, ExpertConfig(habit=0.7), START)
    started = generate_trajectories(world, "train", N, 1, ExpertConfig(habit=0.7, false_starts=1.0), START)
    for a, b in zip(right, started):
        first = next(i for i, m in enumerate(b.messages) if m.role == "assistant")
        wrong, error = b.messages[first], b.messages[first + 1]
        (name, args), *rest = _calls(b)
        assert rest == _calls(a) and (name, args) != _calls(a)[0]  # then the expert, call for call
        assert _contents(b)[:first] + _contents(b)[first + 1:] == _contents(a)
        assert b.metadata["success"]  # it recovers: the episode succeeds as the expert's does
        assert [c.id for m in b.messages for c in m.tool_calls or []] == \
            [f"call_{i}" for i in range(len(rest) + 1)]
        # an error of the world, never a change of its state
        w = make_world(world)
        w.reset(a.metadata["world_config"])
        before = w.snapshot()
        assert w.execute(name, args) == error.content
        assert ("no customer" in error.content) if world == "toolshop" else ("No such file" in error.content)
        assert w.snapshot() == before
        assert wrong.tool_calls[0].id == error.tool_call_id == "call_0"


def test_terminals_false_start_lists_a_folder_no_task_makes():
    from pivotrl_testbed.testbed.slips import ASSUMED_DIR
    from pivotrl_testbed.testbed.terminal import DIRS

    assert ASSUMED_DIR not in DIRS


def test_false_starts_are_drawn_at_their_rate_and_off_by_default():
    # The draw is the world-agnostic expert's (experts.py); toolshop needs no sandbox to replay
    # 400 trajectories (terminal took 21 s), and each world's false start is tested above.
    rate = 0.5
    plain = generate_trajectories("toolshop", "train", 200, 1, ExpertConfig(habit=0.7), START)
    half = generate_trajectories("toolshop", "train", 200, 1, ExpertConfig(habit=0.7, false_starts=rate), START)
    share = sum(len(b.messages) != len(a.messages) for a, b in zip(plain, half)) / len(plain)
    assert 0.35 <= share <= 0.65, share
    assert all(a.messages == b.messages or len(b.messages) == len(a.messages) + 2 for a, b in zip(plain, half))
    assert generate_trajectories("toolshop", "train", 20, 1, ExpertConfig(habit=0.7, false_starts=0.0), START) == plain[:20]


@pytest.mark.parametrize("world", ["toolshop", "terminal"])
def test_a_grounding_slip_takes_the_listings_first_entry_and_loses_the_task(world):
    right = generate_trajectories(world, "train", N, 1, ExpertConfig(habit=0.7), START)
    slipped = generate_trajectories(world, "train", N, 1, ExpertConfig(habit=0.7, grounding_slips=1.0), START)
    lost = 0
    for a, b in zip(right, slipped):
        kind = a.metadata["task"]["kind"]
        if a.messages == b.messages:
            continue
        assert kind in ({"cancel", "return", "change", "swap", "count"} if world == "toolshop"
                        else {"head", "lines", "sort", "move"})
        ca, cb = _calls(a), _calls(b)
        first = next(i for i, (x, y) in enumerate(zip(ca, cb)) if x != y)
        obs = [m.content for m in b.messages if m.role == "tool"]
        if world == "toolshop" and kind != "count":  # the first listed order, not the right one
            assert cb[first][1]["order_id"] == json.loads(obs[1])[0]["order_id"] != ca[first][1]["order_id"]
        elif world == "terminal":  # the first listed file
            assert obs[0].split()[0] in cb[first][1]["command"]
        lost += not b.metadata["success"]
    assert lost >= N // 4  # a slipped trajectory is a lost task (terminal: but by a coincidence)
    # drawn once per trajectory, at its rate, and nothing without it
    half = generate_trajectories(world, "train", N, 1, ExpertConfig(habit=0.7, grounding_slips=0.5), START)
    changed = [a.messages != h.messages for a, h in zip(right, half)]
    assert 0 < sum(changed) < sum(a.messages != b.messages for a, b in zip(right, slipped))


def test_an_output_slip_writes_the_default_name_and_loses_the_task():
    """Terminal's grounding slip on the request's value: `out.txt` where the user named another
    output, only in the kinds that write one, and every such trajectory is a lost task."""
    from pivotrl_testbed.testbed.slips import DEFAULT_OUTPUT

    right = generate_trajectories("terminal", "train", N, 1, ExpertConfig(habit=0.7), START)
    cfg = ExpertConfig(habit=0.7, grounding_slips=1.0, grounding_terminal="output")
    slipped = generate_trajectories("terminal", "train", N, 1, cfg, START)
    changed = 0
    for a, b in zip(right, slipped):
        task = a.metadata["task"]
        writes = task["kind"] in ("head", "copy", "sort") and task["out"] != DEFAULT_OUTPUT
        assert (a.messages != b.messages) == writes, task
        if not writes:
            continue
        changed += 1
        ca, cb = _calls(a), _calls(b)
        first = next(i for i, (x, y) in enumerate(zip(ca, cb)) if x != y)
        assert DEFAULT_OUTPUT in cb[first][1]["command"] and task["out"] not in cb[first][1]["command"]
        assert a.metadata["success"] and not b.metadata["success"]
    assert changed >= N // 5


def test_an_output_slip_renames_the_whole_name_only():
    """Attacks on the rename: a name inside a longer name or after a path's dot stays as it is,
    a command that does not write the user's file is no slip, and nor is the user asking for
    `out.txt` itself."""
    from pivotrl_testbed.testbed.slips import output_slip

    call = lambda cmd: ("call", "run", {"command": cmd})  # noqa: E731
    task = {"kind": "copy", "out": "res.txt"}
    assert output_slip(task, call("cp pres.txt res.txt")) == call("cp pres.txt out.txt")
    assert output_slip(task, call("cp a.res.txt b")) is None  # the name only as a suffix
    assert output_slip(task, call("ls")) is None
    assert output_slip({"kind": "copy", "out": "out.txt"}, call("cp a out.txt")) is None
    assert output_slip(task, ("say", "done")) is None


def test_a_request_slip_writes_a_default_for_every_value_the_request_names():
    """`grounding_terminal = "request"`: the output file, `move`'s folder and `count`'s level each
    written as the careless agent's default, in exactly the kinds that name one (five of seven),
    where the user asked for another. Every slipped output or folder loses the task; a slipped
    level loses it unless the two levels happen to count the same."""
    from pivotrl_testbed.testbed.slips import REQUEST_DEFAULTS

    right = generate_trajectories("terminal", "train", N, 1, ExpertConfig(habit=0.7), START)
    cfg = ExpertConfig(habit=0.7, grounding_slips=1.0, grounding_terminal="request")
    slipped = generate_trajectories("terminal", "train", N, 1, cfg, START)
    slot = {"head": "out", "copy": "out", "sort": "out", "move": "dir", "count": "level"}
    changed, lost = 0, 0
    for a, b in zip(right, slipped):
        task = a.metadata["task"]
        named = slot.get(task["kind"])
        planted = named is not None and task[named] != REQUEST_DEFAULTS[named]
        assert (a.messages != b.messages) == planted, task
        if not planted:
            continue
        changed += 1
        names = lambda value: [c for c in _calls(b)  # noqa: E731 - calls naming the whole value
                               if re.search(rf"(?<![\w.]){re.escape(value)}\b", c[1]["command"])]
        assert names(REQUEST_DEFAULTS[named]) and not names(task[named]), task
        lost += not b.metadata["success"]
        if named != "level":
            assert a.metadata["success"] and not b.metadata["success"], task
    assert changed >= N // 3 and lost >= changed - changed // 5


def test_a_request_slip_renames_whole_values_only():
    """Attacks on the rename: a folder named like a file's stem or extension (`logs` beside
    `app.log`), a level inside another word, a command that names none of the request's values,
    and a request that asked for the default itself."""
    from pivotrl_testbed.testbed.slips import request_slip

    call = lambda cmd: ("call", "run", {"command": cmd})  # noqa: E731
    every = ("out", "dir", "level")
    move = {"kind": "move", "dir": "logs"}
    assert request_slip(move, call("mv app.log logs/"), every) == call("mv app.log old/")
    assert request_slip(move, call("mkdir -p logs"), every) == call("mkdir -p old")
    assert request_slip(move, call("mv app.log ./logs2/"), every) is None
    count = {"kind": "count", "level": "WARN"}
    assert request_slip(count, call("grep -c WARN app.log"), every) == call("grep -c ERROR app.log")
    assert request_slip(count, call("grep -c WARNING app.log"), every) is None
    assert request_slip(count, call("ls"), every) is None
    assert request_slip({"kind": "count", "level": "ERROR"}, call("grep -c ERROR a.log"), every) is None
    assert request_slip(move, call("mv app.log logs/"), ("out",)) is None  # the output slip alone
    assert request_slip(count, ("say", "There are 2."), every) is None
