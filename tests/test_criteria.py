"""The headroom acceptance criteria read from a build record and item rows."""

from __future__ import annotations

from pivotrl_testbed.testbed.criteria import AGENTIC_OOD_FLOOR, check


def _rows(method, world, measure, rate, *, step=0, seed=0, n=40, decoding="greedy", prefix="t"):
    return [{"method": method, "world": world, "seed": seed, "lr": 0.0, "step": step,
             "split": "dev", "measure": measure, "item": f"{prefix}-{i}", "cluster": i,
             "outcome": float(i < round(rate * n)), "decoding": decoding} for i in range(n)]


BUILD = {"config": {"worlds": ["toolshop", "terminal"]},
         "pretrain_in_domain": {"toolshop": 0, "terminal": 0},
         "pretrain_world_lists": {"toolshop": 0, "terminal": 0},
         "base": {"by_position": {
             "toolshop": {"0": {"turns": 100, "q": 0.6}, "1": {"turns": 100, "q": 0.2},
                          "5": {"turns": 12, "q": 0.0}},
             "terminal": {"0": {"turns": 100, "q": 0.3}}}}}


def items(sft_terminal=0.5, base_ood=0.95, base_episodes=0.3, agentic=None):
    """`agentic`: {family: the base's dev rate} of agentic-format OOD rows (none by default)."""
    out = []
    for w in ("toolshop", "terminal"):
        for seed in (0, 1):  # the base repeated under every seed: read once
            out += _rows("base", w, "turn", 0.4, seed=seed) + _rows("base", w, "episode", base_episodes, seed=seed)
            out += _rows("base", w, "ood", base_ood, seed=seed, prefix="next")
            for fam, rate in (agentic or {}).items():  # ids as agentic_ood writes them
                out += _rows("base", w, "ood", rate, seed=seed, prefix=f"{fam}-{w}-0")
        out += _rows("sft", w, "turn", 0.5 if w == "toolshop" else sft_terminal, step=20)
        out += _rows("sft", w, "turn", 0.9, step=30)  # not the chosen checkpoint: never read
        out += _rows("sft", w, "turn", 0.9, step=20, decoding="sampled")  # not greedy: never read
    return out


SFT = {"method": "sft", "lr": 0.0, "steps": {w: {0: 20} for w in ("toolshop", "terminal")}}


def test_every_criterion_met_and_what_each_read():
    got = check(BUILD, items(), SFT)
    assert {k: v["verdict"] for k, v in got.items()} == {
        "1_in_domain_only_through_demo_data": "met", "1b_world_met_only_through_demo_data": "met",
        "2_learning_is_possible": "met",
        "3_pivots_exist_everywhere": "met", "4_episodes_neither_solved_nor_hopeless": "met",
        "5_ood_is_there_to_lose": "met", "6_agentic_ood_can_move": "open",
        "7_default_demo_within_20_min": "open"}
    assert got["2_learning_is_possible"]["gain"] == {"toolshop": 0.5 - 0.4, "terminal": 0.5 - 0.4}
    assert got["5_ood_is_there_to_lose"]["base"] == {"next": 0.95}


def test_each_criterion_can_fail():
    assert check(BUILD, items(sft_terminal=0.425), SFT)["2_learning_is_possible"]["verdict"] == "not met"
    assert check(BUILD, items(base_ood=0.85), SFT)["5_ood_is_there_to_lose"]["verdict"] == "not met"
    assert check(BUILD, items(base_episodes=0.6), SFT)[
        "4_episodes_neither_solved_nor_hopeless"]["verdict"] == "not met"
    low = {**BUILD, "base": {"by_position": {**BUILD["base"]["by_position"],
                                              "terminal": {"2": {"turns": 30, "q": 0.05}}}}}
    assert check(low, items(), SFT)["3_pivots_exist_everywhere"]["below_floor"] == {
        "toolshop": {}, "terminal": {"2": 0.05}}
    seen = {**BUILD, "pretrain_in_domain": {"toolshop": 2000, "terminal": 0}}
    assert check(seen, items(), SFT)["1_in_domain_only_through_demo_data"]["verdict"] == "not met"
    listed = {**BUILD, "pretrain_world_lists": {"toolshop": 0, "terminal": 3}}
    assert check(listed, items(), SFT)["1b_world_met_only_through_demo_data"]["verdict"] == "not met"
    # no SFT checkpoint, no build record: open, not met
    assert check(BUILD, items(), None)["2_learning_is_possible"]["verdict"] == "open"
    assert check({"config": BUILD["config"]}, items(), SFT)[
        "1_in_domain_only_through_demo_data"]["verdict"] == "open"


def test_agentic_ood_criterion_is_computed_and_apart_from_criterion_5():
    both = {"plain_with_tools": 0.7, "no_tool_fits": 0.65}
    got = check(BUILD, items(agentic=both), SFT)
    assert got["6_agentic_ood_can_move"]["verdict"] == "met"
    assert got["6_agentic_ood_can_move"]["base"] == {"no_tool_fits": 0.65, "plain_with_tools": 0.7}
    assert got["6_agentic_ood_can_move"]["floor"] == AGENTIC_OOD_FLOOR == 0.6
    # criterion 5 reads the non-agentic families only: agentic rows below its 0.9 floor leave it met
    assert got["5_ood_is_there_to_lose"] == {"base": {"next": 0.95}, "verdict": "met"}
    low = check(BUILD, items(agentic={**both, "no_tool_fits": 0.55}), SFT)
    assert low["6_agentic_ood_can_move"]["verdict"] == "not met"
    assert low["5_ood_is_there_to_lose"]["verdict"] == "met"
    # the non-agentic floor failing leaves criterion 6 to its own rows
    mixed = check(BUILD, items(base_ood=0.5, agentic=both), SFT)
    assert [mixed[k]["verdict"] for k in ("5_ood_is_there_to_lose", "6_agentic_ood_can_move")] == [
        "not met", "met"]
    assert check(BUILD, items(), SFT)["6_agentic_ood_can_move"]["verdict"] == "open"
