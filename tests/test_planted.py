"""Where a recipe's planted steps sit, computed from its config and the demo's expert data."""

from __future__ import annotations

from pivotrl_testbed.testbed.build import TestbedConfig, load_testbed_config
from pivotrl_testbed.testbed.experts import observations
from pivotrl_testbed.testbed.mixture import trajectories
from pivotrl_testbed.testbed.planted import plant_kinds, planted_at, planted_by_position
from pivotrl_testbed.testbed.slips import grounding_slip

Z = "docs/results/candidates/z/config.yaml"


def test_a_recipe_without_slips_plants_nothing():
    cfg = TestbedConfig()
    assert plant_kinds(cfg) == set()
    table = planted_by_position("toolshop", trajectories("toolshop", "train", 10, 0, None, 0, 1), set())
    assert table and all(row["planted"] == 0 for row in table.values())


def test_the_kinds_come_from_every_stage_of_the_recipe():
    cfg = load_testbed_config(Z)
    # the false start is planted by the build's own mixture, the grounding slip by the last stage
    assert plant_kinds(cfg) == {"false_start", "grounding:request"}
    assert plant_kinds(cfg.with_stages(0)) == {"false_start"}


def test_a_planted_turn_is_one_where_the_slip_changes_the_expert_call():
    kinds = {"grounding:file"}
    trajs = trajectories("toolshop", "train", 30, 0, None, 0, 1)
    seen = 0
    for traj in trajs:
        position = 0
        for i, msg in enumerate(traj.messages):
            if msg.role != "assistant":
                continue
            held = planted_at("toolshop", traj.metadata["task"], traj.messages[:i], msg, position, kinds)
            if msg.tool_calls:
                call = msg.tool_calls[0]
                step = ("call", call.function.name, call.args())
                slipped = grounding_slip("toolshop", traj.metadata["task"],
                                         observations(traj.messages[:i]), step, "file")
                assert bool(held) == (slipped is not None and slipped != step)
                seen += bool(held)
            else:
                assert held == []  # a reply holds no planted call
            position += 1
    assert seen > 0
    table = planted_by_position("toolshop", trajs, kinds)
    assert sum(r["planted"] for r in table.values()) == seen
    assert table["0"]["planted"] == 0  # the first call is a lookup: no value read from a listing


def test_the_false_start_sits_at_the_first_turn_only():
    table = planted_by_position("terminal", trajectories("terminal", "train", 20, 0, None, 0, 1),
                                {"false_start"})
    assert table["0"] == {"turns": 20, "planted": 20, "by_kind": {"false_start": 20}}
    assert all(row["planted"] == 0 for pos, row in table.items() if pos != "0")
