"""The weak expert's slips: only at the steps that have one, always the same wrong action, wrong
by the world's own success rule, drawn at the configured rate, and nothing without them."""

from __future__ import annotations

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
    with pytest.raises(ValueError):
        TestbedConfig(weak_slips=1.5)
