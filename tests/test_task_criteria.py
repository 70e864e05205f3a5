"""The task-headroom acceptance criteria read from a build record, item rows and a rescue record."""

from __future__ import annotations

from pivotrl_testbed.testbed.task_criteria import check

WORLDS = ("toolshop", "terminal")


def _rows(method, world, measure, rate, *, step=0, seed=0, lr=0.0, n=40, decoding="greedy", prefix="t"):
    return [{"method": method, "world": world, "seed": seed, "lr": lr, "step": step,
             "split": "dev", "measure": measure, "item": f"{prefix}-{i}", "cluster": i,
             "outcome": float(i < round(rate * n)), "decoding": decoding} for i in range(n)]


BUILD = {"config": {"worlds": list(WORLDS)},
         "base": {"by_position": {
             "toolshop": {"0": {"turns": 100, "q": 0.6}, "4": {"turns": 12, "q": 0.0}},
             "terminal": {"0": {"turns": 100, "q": 0.3}, "1": {"turns": 40, "q": 0.15}}}}}
# Where the planted steps sit (`testbed/planted.py`): toolshop's position 4 holds none.
PLANTED = {"toolshop": {"0": {"planted": 50}, "4": {"planted": 0}},
           "terminal": {"0": {"planted": 0}, "1": {"planted": 30}, "2": {"planted": 5}}}
RESCUE = {w: {"failed": 20, "rescued": 12, "departed": 25, "self_rescued": 3} for w in WORLDS}


def items(base_eps=0.25, sft_terminal=0.375, ood_late=0.95, ood_3x=0.95, agentic=0.8):
    """Base greedy dev rows; SFT at lr 1e-4, steps 10 / 20 / 30 (20 best on episodes in each
    world, beyond its run's δ ≈ 0.077 on 40 items), and at 3e-4 (worse on episodes); OOD 'next'
    and one agentic family."""
    out = []
    for w in WORLDS:
        out += _rows("base", w, "episode", base_eps)
        out += _rows("base", w, "ood", 0.95, prefix="next") + _rows("base", w, "ood", agentic,
                                                                      prefix=f"no_tool_fits-{w}-0")
        for step, eps, ood in ((10, 0.25, 0.95), (20, 0.375 if w == "toolshop" else sft_terminal, 0.95),
                               (30, 0.3, ood_late)):
            out += _rows("sft", w, "episode", eps, step=step, lr=1e-4)
            out += _rows("sft", w, "ood", ood, step=step, lr=1e-4, prefix="next")
        out += _rows("sft", w, "episode", 0.9, step=20, lr=1e-4, decoding="sampled")  # never read
        out += _rows("sft", w, "episode", 0.2, step=10, lr=3e-4)
        out += _rows("sft", w, "ood", ood_3x, step=10, lr=3e-4, prefix="next")
    return out


def test_every_criterion_met_and_what_each_read():
    got = check(BUILD, items(ood_late=0.85), RESCUE, planted=PLANTED)
    assert {k: v["verdict"] for k, v in got.items()} == {
        "sft_gain": "met", "base_episodes": "met", "pivots": "met", "ood": "met",
        "agentic_ood": "met", "ood_can_move": "met", "rescue": "met", "self_rescue": "met"}
    assert got["sft_gain"]["sft_chosen"] == {"lr": 1e-4, "steps": {"terminal": {0: 20}, "toolshop": {0: 20}}}
    assert got["sft_gain"]["gain"] == {"toolshop": 0.375 - 0.25, "terminal": 0.375 - 0.25}
    assert got["ood_can_move"]["largest_move"] == ("next lr=0.0001 seed=0 step=30", -0.1)
    assert got["rescue"]["by_world"]["toolshop"]["rescue"] == 0.6
    assert got["self_rescue"]["by_world"]["terminal"]["self_rescue"] == 0.12


def test_each_criterion_can_fail():
    def verdict(name, **kw):
        rescue = kw.pop("rescue", RESCUE)
        planted = kw.pop("planted", PLANTED)
        return check(kw.pop("build", BUILD), items(**kw), rescue, planted=planted)[name]["verdict"]

    assert verdict("sft_gain", sft_terminal=0.325) == "not met"  # +0.075 in terminal
    assert verdict("base_episodes", base_eps=0.05) == "not met"
    assert verdict("agentic_ood", agentic=0.5) == "not met"
    assert verdict("ood_can_move") == "not met"  # nothing past the chosen point moves
    assert verdict("ood_can_move", ood_3x=0.875) == "met"  # 3× the lr moves it
    low = {**BUILD, "base": {"by_position": {**BUILD["base"]["by_position"],
                                              "terminal": {"2": {"turns": 30, "q": 0.05}}}}}
    assert verdict("pivots", build=low) == "not met"  # position 2 holds 5 planted steps
    assert verdict("pivots", build=low, planted=None) == "open"
    weak = {**RESCUE, "terminal": {"failed": 20, "rescued": 9, "departed": 25, "self_rescued": 6}}
    assert verdict("rescue", rescue=weak) == "not met" and verdict("self_rescue", rescue=weak) == "not met"


def test_pivots_are_judged_where_a_step_is_planted_and_the_rest_reported():
    low = {**BUILD, "base": {"by_position": {
        "toolshop": {"0": {"turns": 100, "q": 0.6}, "4": {"turns": 36, "q": 0.08}},
        "terminal": {"1": {"turns": 100, "q": 0.16}}}}}
    got = check(low, items(), RESCUE, planted=PLANTED)["pivots"]
    assert got["verdict"] == "met"
    assert got["unplanted_below_floor"]["toolshop"] == {"4": 0.08}
    assert got["planted_positions"] == {"toolshop": ["0"], "terminal": ["1", "2"]}
    one = {**PLANTED, "toolshop": {"0": {"planted": 50}, "4": {"planted": 1}}}
    got = check(low, items(), RESCUE, planted=one)["pivots"]  # one planted turn is enough to judge
    assert got["verdict"] == "not met" and got["below_floor"]["toolshop"] == {"4": 0.08}


def test_missing_measures_are_open():
    got = check({"config": BUILD["config"]}, [], None)
    assert {v["verdict"] for v in got.values()} == {"open"}
    assert check(BUILD, items(), {"toolshop": RESCUE["toolshop"]})["rescue"]["verdict"] == "open"


def test_a_run_to_the_cap_counts_past_the_chosen_point_only():
    cap = [r for w in WORLDS for step, rate in ((20, 0.5), (60, 0.875))
           for r in _rows("sft", w, "ood", rate, step=step, lr=1e-4, prefix="next")]
    got = check(BUILD, items(), RESCUE, to_cap=cap)["ood_can_move"]
    assert got["verdict"] == "met" and got["largest_move"] == ("next lr=0.0001 seed=0 step=60 (run to the cap)", -0.075)
    early = [r for r in cap if r["step"] == 20]  # at the chosen step itself: not past it
    assert check(BUILD, items(), RESCUE, to_cap=early)["ood_can_move"]["verdict"] == "not met"


def test_sfts_gain_in_each_world_is_read_at_that_worlds_own_checkpoint():
    """Terminal's SFT run peaks at step 30 (0.5), toolshop's at 20: each world's gain is its own
    run's, at its own step, not both at one step."""
    rows = [r for r in items() if not (r["world"] == "terminal" and r["step"] == 30 and r["measure"] == "episode")]
    rows += _rows("sft", "terminal", "episode", 0.5, step=30, lr=1e-4)
    got = check(BUILD, rows, RESCUE)["sft_gain"]
    assert got["sft_chosen"]["steps"] == {"terminal": {0: 30}, "toolshop": {0: 20}}
    assert got["gain"] == {"toolshop": 0.375 - 0.25, "terminal": 0.5 - 0.25}
