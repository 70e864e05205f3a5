"""The joint claim's rules on hand-built item rows: the budget rule's stopping step, frontier
points and their Pareto set, the matched-pair rule (fixed before results), eval verdicts per
decoding recomputable from items.jsonl's rows, and the eval split scored at matched checkpoints."""

import pytest

from pivotrl_testbed import stats
from pivotrl_testbed.budget import BudgetRule, stop_step
from pivotrl_testbed.checkpoint_eval import decoded, eval_targets
from pivotrl_testbed.frontier import FrontierConfig, joint, match, matched_sides, pareto
from pivotrl_testbed.joint_report import joint_markdown, joint_results
from test_checkpoint_eval import Run

N = 40  # items per (split, measure); rates are multiples of 1/40, so every difference is exact


def outcomes(rate):
    """Nested outcomes: a higher rate succeeds on a superset of items (paired diff = rate diff)."""
    return [int((i * 7) % N < round(rate * N)) for i in range(N)]


# (method, lr, step): (turn rate, OOD rate), the same on dev and eval unless EVAL overrides.
GRID = {("base", 0.0, 0): (0.300, 0.950),
        ("pivotrl", 1e-4, 10): (0.325, 0.950), ("pivotrl", 1e-4, 20): (0.350, 0.950),
        ("pivotrl", 3e-4, 10): (0.400, 0.925),
        ("sft", 1e-4, 10): (0.350, 0.900), ("sft", 1e-4, 20): (0.400, 0.850),
        ("sft", 3e-4, 10): (0.450, 0.800)}
SAMPLED_SHIFT = {"pivotrl": (0.075, 0.025)}  # sampled rows: PivotRL better than greedy shows


def make_items(seeds=(0, 1)):
    items = []
    for (method, lr, step), (turn, ood) in GRID.items():
        for decoding in ("greedy", "sampled"):
            dt, do = SAMPLED_SHIFT.get(method, (0.0, 0.0)) if decoding == "sampled" else (0.0, 0.0)
            for seed in seeds:
                for split in ("dev", "eval"):
                    for measure, rate in (("turn", turn + dt), ("ood", ood + do)):
                        items += [{"method": method, "world": "w", "seed": seed, "lr": lr, "step": step,
                                   "split": split, "measure": measure, "item": i,
                                   "cluster": i // 2 if measure == "turn" else i, "outcome": o,
                                   "decoding": decoding, "position": i % 5, "kind": "message" if i % 2 else "tool_call"}
                                  for i, o in enumerate(outcomes(rate))]
    return items


ROWS = [{"method": m, "lr": lr, "step": s, "seed": 0, "world": "w", "kl_to_base": 0.1 * (i + 1)}
        for i, (m, lr, s) in enumerate(GRID)]


def test_budget_rule_stops_after_patience_checkpoints_without_a_gain():
    rule = BudgetRule(patience=2)
    # 30 does not beat 20's 0.35, nor does 40 (equal is no improvement): stop at 40
    assert stop_step([(10, .30), (20, .35), (30, .34), (40, .35)], rule, cap=60, start=.25)[0] == 40
    assert stop_step([(10, .30), (20, .35), (30, .34)], rule, cap=60, start=.25) == (None, "running")
    # the base's score is the first bar: two checkpoints below it stop the run
    assert stop_step([(10, .20), (20, .24)], rule, cap=60, start=.25)[0] == 20
    assert stop_step([(10, .20), (20, .24)], rule, cap=60)[0] is None  # no bar: 10 sets it, 20 beats it
    # min_improvement: a 0.01 rise does not count, a 0.19 one resets the count; the cap ends it
    strict = BudgetRule(patience=2, min_improvement=0.02)
    assert stop_step([(10, .30), (20, .31), (30, .50)], strict, cap=30, start=.25) == (30, "cap")
    assert stop_step([(10, .30), (20, .31), (30, .31)], strict, cap=60, start=.25)[0] == 30
    with pytest.raises(ValueError):
        BudgetRule(patience=0)


def test_denser_early_checkpoints_do_not_stop_a_run_sooner():
    """With checkpoints every 5 steps to 20 and every 10 after, a plateau is patience × 10 steps
    since the last gain (from step 0 when the base sets the bar), as at 10-step checkpoints."""
    rule = BudgetRule(patience=2)
    flat = [(5, .20), (10, .20), (15, .20)]
    assert stop_step(flat, rule, cap=60, start=.25)[0] == 10  # patience counted in checkpoints
    assert stop_step(flat, rule, cap=60, start=.25, every=10) == (None, "running")
    assert stop_step(flat + [(20, .20)], rule, cap=60, start=.25, every=10)[0] == 20
    gain = [(5, .30), (10, .31), (15, .30), (20, .30), (30, .31)]  # last gain at 10: stop at 30
    assert stop_step(gain[:4], rule, cap=60, start=.25, every=10) == (None, "running")
    assert stop_step(gain, rule, cap=60, start=.25, every=10)[0] == 30
    from pivotrl_testbed.demo_config import DemoConfig

    cfg = DemoConfig(steps=60, e2e_steps=150)
    assert cfg.checkpoint_steps("sft") == [5, 10, 15, 20, 30, 40, 50, 60] and cfg.save_every() == 5
    assert cfg.checkpoint_steps("e2e_rl")[:6] == [5, 10, 15, 20, 30, 40]
    assert DemoConfig(early_until=0).checkpoint_steps("sft") == [10, 20, 30, 40, 50, 60]


def pt(method, gain, retention, lr=1e-4, step=10):
    return {"method": method, "lr": lr, "step": step, "steps": {"w": {0: step}}, "gain": gain,
            "retention": retention}


def test_match_takes_the_nearest_b_within_tolerance_at_as_largest_gain():
    front = [pt("a", 0.01, 0.0), pt("a", 0.05, -0.01), pt("a", 0.08, -0.03)]
    b = [pt("b", 0.04, -0.05), pt("b", 0.06, -0.04, lr=3e-4), pt("b", 0.20, -0.20, step=20)]
    got = match(front, b, on="gain", tolerance=0.02)
    assert (got["a"]["gain"], got["b"]["gain"], round(got["distance"], 9)) == (0.08, 0.06, 0.02)
    # a tie on the matching coordinate goes to b's better other coordinate (b's favour)
    tie = pt("b", 0.06, -0.02, lr=3e-4, step=20)
    assert match(front, b + [tie], on="gain", tolerance=0.02)["b"] is tie
    # on retention: a's -0.03 is nearest b's -0.04 (0.01 away; -0.05 is 0.02 away)
    assert match(front, b, on="retention", tolerance=0.02)["b"]["retention"] == -0.04
    assert match(front, b, on="gain", tolerance=0.001) is None
    # an arm that did not move tests nothing: no pair from points with gain <= 0
    assert match([pt("a", 0.0, 0.0), pt("a", -0.02, 0.01)], b, on="gain", tolerance=1.0) is None


def test_frontier_points_pairs_and_eval_verdicts_recompute_from_item_rows():
    items = make_items()
    cfg = FrontierConfig(tolerance=0.02, replicates=50)
    got = joint(items, ROWS, cfg)
    pts = got["points"]["greedy"]
    # gain and retention are paired differences against the base on dev (rates are exact)
    assert [(p["lr"], p["step"], round(p["gain"], 9), round(p["retention"], 9)) for p in pts["pivotrl"]] == [
        (1e-4, 10, 0.025, 0.0), (1e-4, 20, 0.05, 0.0), (3e-4, 10, 0.1, -0.025)]
    assert pts["pivotrl"][2]["kl_to_base"] == pytest.approx(0.4)
    assert [(p["lr"], p["step"]) for p in pareto(pts["pivotrl"])] == [(1e-4, 20), (3e-4, 10)]
    # (a): PivotRL's largest-gain frontier point (+0.10) and SFT's checkpoint at the same gain
    a = got["verdicts"]["ood_at_matched_gain"]
    assert (a["pair"]["a"]["lr"], a["pair"]["a"]["step"]) == (3e-4, 10)
    assert (a["pair"]["b"]["lr"], a["pair"]["b"]["step"]) == (1e-4, 20)
    for decoding, v in a["by_decoding"].items():
        again = stats.paired(decoded(items, decoding),
                             {"method": "pivotrl", "lr": 3e-4, "steps": {"w": {0: 10, 1: 10}}},
                             {"method": "sft", "lr": 1e-4, "steps": {"w": {0: 20, 1: 20}}}, measure="ood")
        assert (v["diff"], v["ci95"], v["verdict"]) == (again["diff"], again["ci95"], again["verdict"])
    assert a["by_decoding"]["greedy"]["diff"] == pytest.approx(0.925 - 0.85)
    assert a["by_decoding"]["sampled"]["diff"] == pytest.approx(0.95 - 0.85)
    # (b): no SFT checkpoint keeps OOD within 0.02 of a PivotRL frontier point
    assert got["verdicts"]["gain_at_matched_ood"]["pair"] is None
    assert got["verdicts"]["gain_at_matched_ood"]["by_decoding"]["greedy"]["verdict"] == "not measurable"
    wider = joint(items, ROWS, cfg.model_copy(update={"tolerance": 0.03}))["verdicts"]["gain_at_matched_ood"]
    assert (wider["pair"]["b"]["lr"], wider["pair"]["b"]["step"]) == (1e-4, 10)
    assert wider["by_decoding"]["greedy"]["diff"] == pytest.approx(0.40 - 0.35)


def test_the_eval_split_is_scored_at_matched_checkpoints_too():
    items = [r for r in make_items(seeds=(0,)) if r["split"] == "dev"]
    cfg = FrontierConfig(replicates=50)
    sides = matched_sides(items, ROWS, cfg)
    assert [(s["method"], s["lr"], s["steps"]) for s in sides] == [("pivotrl", 3e-4, {"w": {0: 10}}),
                                                                  ("sft", 1e-4, {"w": {0: 20}}),
                                                                  ("sft", 1e-4, {"w": {0: 10}})]
    runs = [Run("w", m, lr, 0) for m in ("pivotrl", "sft") for lr in (1e-4, 3e-4)]
    chosen = {"pivotrl": {"method": "pivotrl", "lr": 3e-4, "steps": {"w": {0: 10}}},
              "sft": {"method": "sft", "lr": 3e-4, "steps": {"w": {0: 10}}}}
    got = sorted((r.method, r.lr, step) for r, step in eval_targets(chosen, runs, sides))
    # PivotRL's chosen checkpoint is also its matched one: scored once
    assert got == [("pivotrl", 3e-4, 10), ("sft", 1e-4, 10), ("sft", 1e-4, 20), ("sft", 3e-4, 10)]


def test_report_sections_and_where_each_arm_gains():
    items = make_items(seeds=(0,))
    chosen = {"pivotrl": {"method": "pivotrl", "lr": 1e-4, "steps": {"w": {0: 20}}},
              "sft": {"method": "sft", "lr": 3e-4, "steps": {"w": {0: 10}}}}
    rows = ROWS + [{"method": "sft", "world": "w", "lr": 3e-4, "seed": 0, "step": 10,
                    "stop_step": 10, "stop_reason": "plateau"}]
    res = joint_results(rows, items, chosen, FrontierConfig(replicates=50))
    assert res["budget"] == [{"method": "sft", "world": "w", "lr": 3e-4, "seed": 0, "stop_step": 10,
                              "stop_reason": "plateau"}]
    mech = {(m["side"], m["decoding"], m["by"], m["group"]): m for m in res["mechanism"]}
    # by world: the whole eval split, so the gain is the rate difference to the base
    assert mech[("sft", "greedy", "world", "w")]["gain"] == pytest.approx(0.45 - 0.30)
    assert mech[("pivotrl", "sampled", "world", "w")]["gain"] == pytest.approx(0.35 + 0.075 - 0.30)
    assert {k[3] for k in mech if k[2] == "position"} == {"0", "1", "2", "3+"}
    # a group's gain is the paired difference on that group's items alone
    sub = [r for r in decoded(items, "greedy") if r["kind"] == "tool_call" and r["split"] == "eval"]
    again = stats.paired(sub, {"method": "sft", "lr": 3e-4, "steps": {"w": {0: 10}}},
                         {"method": "base", "lr": 0.0, "steps": {"w": {0: 0}}}, measure="turn")
    assert mech[("sft", "greedy", "kind", "tool_call")]["gain"] == again["diff"]
    text = "\n".join(joint_markdown({**res, "config": {"steps": 60, "budget": {"patience": 2}}}))
    assert "## The joint claim on the frontier" in text and "| sft | w | 0.0003 | 0 | 10 | plateau |" in text


def test_a_run_stopped_early_stands_at_its_last_checkpoint_in_later_points():
    """The budget rule stops toolshop's run at step 10 while terminal's goes on to 20: each is
    its own run, so the point at 20 is terminal's step 20 with toolshop's model where it stopped
    (step 10), not a point cut at 10 (terminal's later checkpoint lost) nor terminal's alone."""
    from pivotrl_testbed.frontier import arm_points

    rows = []
    for world, steps in (("toolshop", (0, 10)), ("terminal", (0, 10, 20))):
        for step in steps:
            method = "base" if step == 0 else "pivotrl"
            for measure in ("turn", "ood"):
                rows += [{"method": method, "world": world, "seed": 0, "lr": 0.0 if step == 0 else 1e-4,
                          "step": step, "split": "dev", "measure": measure, "item": f"{world}-{i}",
                          "cluster": f"{world}-{i}", "outcome": float(i < step // 5), "decoding": "greedy"}
                         for i in range(6)]
    points = arm_points(rows, [], "pivotrl", FrontierConfig(replicates=50))
    assert [(p["step"], p["steps"]) for p in points] == [
        (10, {"terminal": {0: 10}, "toolshop": {0: 10}}), (20, {"terminal": {0: 20}, "toolshop": {0: 10}})]
    # gain at 20: terminal 4/6 and toolshop 2/6 against a base of 0: (4 + 2) / 12
    assert points[1]["gain"] == pytest.approx(6 / 12)


def test_a_seed_stopped_early_stands_at_its_last_checkpoint_in_later_points():
    """Seed 1's run stopped at step 10, seed 0's went on to 20: the point at 20 holds seed 1 at
    step 10 (its model stays there), so it is not seed 0's alone (the seed still improving), and
    matched to another arm's point it pairs on every seed on eval."""
    from pivotrl_testbed.frontier import arm_points

    rows = []
    for seed, steps in ((0, (0, 10, 20)), (1, (0, 10))):
        for step in steps:
            method = "base" if step == 0 else "pivotrl"
            for measure in ("turn", "ood"):
                rows += [{"method": method, "world": "w", "seed": seed, "lr": 0.0 if step == 0 else 1e-4,
                          "step": step, "split": "dev", "measure": measure, "item": i, "cluster": i,
                          "outcome": float((i + step // 10) % 2), "decoding": "greedy"}
                         for i in range(6)]
    points = arm_points(rows, [], "pivotrl", FrontierConfig(replicates=50))
    assert [(p["step"], p["steps"]) for p in points] == [(10, {"w": {0: 10, 1: 10}}), (20, {"w": {0: 20, 1: 10}})]


def test_matched_kl_pairs_equal_drift_within_a_relative_tolerance():
    # PivotRL's largest-gain frontier point (lr 3e-4, step 10) drifted KL 0.4; SFT's nearest
    # checkpoint drifted 0.5: matched at a 25 % tolerance (±0.1), not at 20 % (±0.08). The one
    # pair is judged on OOD and in-domain.
    items = make_items()
    got = joint(items, ROWS, FrontierConfig(replicates=50))["verdicts"]
    ood, gain = got["ood_at_matched_kl"], got["gain_at_matched_kl"]
    assert ood["pair"] == gain["pair"] and ood["matched_on"] == "kl_to_base"
    assert (ood["pair"]["a"]["lr"], ood["pair"]["a"]["step"]) == (3e-4, 10)
    assert (ood["pair"]["b"]["lr"], ood["pair"]["b"]["step"]) == (1e-4, 10)
    assert ood["by_decoding"]["greedy"]["diff"] == pytest.approx(0.925 - 0.900)
    assert gain["by_decoding"]["greedy"]["diff"] == pytest.approx(0.400 - 0.350)
    strict = joint(items, ROWS, FrontierConfig(replicates=50, kl_tolerance=0.2))["verdicts"]
    assert strict["ood_at_matched_kl"]["pair"] is None
    assert strict["gain_at_matched_kl"]["by_decoding"]["greedy"]["verdict"] == "not measurable"
    # points without a KL are never matched on it
    no_kl = [{**p, "kl_to_base": None} for p in (pt("a", 0.1, 0.0), pt("b", 0.1, 0.0))]
    assert match(no_kl[:1], no_kl[1:], on="kl_to_base", tolerance=1.0) is None
