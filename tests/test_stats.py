"""The verdict rule: paired differences over the same items, cluster bootstrap, dev-only choice."""

import random

import pytest

from pivotrl_testbed.stats import choose, paired, paired_halfwidth, rollout_ratio, step_of, verdict


def item(method, seed, step, item_id, cluster, outcome, *, lr=1e-4, split="eval", measure="turn",
         world="w"):
    return {"method": method, "world": world, "seed": seed, "lr": lr, "step": step, "split": split,
            "measure": measure, "item": item_id, "cluster": cluster, "outcome": outcome}


def side(method, seeds=(0,), step=10, lr=1e-4, worlds=("w",)):
    return {"method": method, "lr": lr, "steps": {w: {s: step for s in seeds} for w in worlds}}


def test_paired_difference_is_the_mean_item_difference_and_deterministic():
    rows = []
    for i, (a, b) in enumerate([(1, 0), (1, 1), (0, 0), (1, 0), (0, 1), (1, 1)]):
        rows += [item("pivotrl", 0, 10, i, i // 2, a), item("sft", 0, 10, i, i // 2, b)]
    rows.append(item("sft", 0, 10, 99, 9, 1))  # unpaired: b only, must not count
    got = paired(rows, side("pivotrl"), side("sft"), measure="turn")
    assert got["diff"] == pytest.approx((1 + 0 + 0 + 1 - 1 + 0) / 6) and got["pairs"] == 6
    assert got["clusters"] == 3 and got["ci95"][0] <= got["diff"] <= got["ci95"][1]
    assert paired(rows, side("pivotrl"), side("sft"), measure="turn") == got
    assert paired(rows, side("pivotrl"), side("sft"), measure="episode") is None


def test_pairing_sees_a_small_consistent_gain_that_independent_errors_would_hide():
    """Two arms that agree on most items: +0.05 on 600 items is decided when paired, although
    each arm's own 95% interval is about ±0.04 wide."""
    rng = random.Random(0)
    rows = []
    for i in range(600):
        b = int(rng.random() < 0.5)
        a = 1 if (b == 0 and i % 10 == 0) else b
        rows += [item("pivotrl", 0, 10, i, i, a), item("sft", 0, 10, i, i, b)]
    got = paired(rows, side("pivotrl"), side("sft"), measure="turn")
    assert got["diff"] > 0.03 and got["verdict"] == "met"
    same = paired(rows, side("sft"), side("sft"), measure="turn")
    assert same["diff"] == 0.0 and same["ci95"] == [0.0, 0.0] and same["verdict"] == "within noise"


def test_clustered_items_get_a_wider_interval_than_independent_ones():
    rng = random.Random(1)
    clustered, independent = [], []
    for c in range(40):
        d = int(rng.random() < 0.5)  # the whole trajectory moves together
        for j in range(5):
            i = c * 5 + j
            clustered += [item("a", 0, 10, i, c, d), item("b", 0, 10, i, c, 0)]
            independent += [item("a", 0, 10, i, i, d), item("b", 0, 10, i, i, 0)]
    wide = paired(clustered, side("a"), side("b"), measure="turn")
    narrow = paired(independent, side("a"), side("b"), measure="turn")
    assert wide["diff"] == narrow["diff"]
    assert (wide["ci95"][1] - wide["ci95"][0]) > 1.8 * (narrow["ci95"][1] - narrow["ci95"][0])


def test_seed_spread_widens_the_interval():
    """Same tasks under three seeds: a gain that only one seed shows is not decided."""
    rows = []
    for seed in (0, 1, 2):
        for i in range(100):
            a = 1 if seed == 0 else 0
            rows += [item("a", seed, 10, i, i, a), item("b", seed, 10, i, i, 0)]
    got = paired(rows, side("a", (0, 1, 2)), side("b", (0, 1, 2)), measure="turn")
    assert got["diff"] == pytest.approx(1 / 3) and got["seeds"] == 3
    assert got["ci95"][0] == 0.0 and got["verdict"] == "within noise"


def test_choice_uses_dev_only_and_breaks_ties_early_and_small():
    rows = []
    for lr, dev, ev in ((1e-4, {10: 0.6, 20: 0.4}, {10: 0.1, 20: 0.9}),
                        (3e-4, {10: 0.5, 20: 0.5}, {10: 0.9, 20: 0.9})):
        for step in (10, 20):
            for i in range(10):
                rows.append(item("pivotrl", 0, step, i, i, int(i < 10 * dev[step]), lr=lr, split="dev"))
                rows.append(item("pivotrl", 0, step, i, i, int(i < 10 * ev[step]), lr=lr))
    got = choose(rows, measure="turn")["pivotrl"]
    assert got["lr"] == 1e-4 and got["steps"] == {"w": {0: 10}} and got["dev_score"] == pytest.approx(0.6)
    flat = [r for r in rows if r["lr"] == 3e-4]
    assert choose(flat, measure="turn")["pivotrl"]["steps"] == {"w": {0: 10}}  # tie: the earlier step


def test_rollout_ratio_and_its_interval():
    rows, turns = [], {}
    for step, acc in ((10, 0.2), (20, 0.6)):
        turns[("pivotrl", 1e-4, "w", 0, step)] = 100 * step
        turns[("e2e_rl", 1e-4, "w", 0, step)] = 1000 * step
        for i in range(50):
            rows.append(item("pivotrl", 0, step, i, i, int(i < 50 * acc)))
            rows.append(item("e2e_rl", 0, step, i, i, int(i < 25)))
    got = rollout_ratio(rows, turns, side("e2e_rl", step=20), {"method": "pivotrl", "lr": 1e-4},
                        measure="turn")
    assert got["target"] == 0.5 and got["pivotrl"] == 2000 and got["e2e_rl"] == 20000
    assert got["ratio"] == 10.0 and got["ci95"][0] <= 10.0 <= got["ci95"][1]
    assert got["verdict"] in ("met", "within noise")
    never = rollout_ratio(rows, turns, side("e2e_rl", step=20), {"method": "pivotrl", "lr": 3e-4},
                          measure="turn")
    assert never is None  # no PivotRL checkpoints at that lr: nothing to compare


@pytest.mark.parametrize("stopped", [("w", 1), ("v", 0)], ids=["a seed", "a world"])
def test_rollout_ratio_counts_a_stopped_run_at_its_last_checkpoint(stopped):
    """One PivotRL run (another seed, or the same seed's run in another world) stopped at step 10
    (the budget rule); run ("w", 0) trained on to 20. At step 20 the curve pools ("w", 0)'s step
    20 with the stopped run's step 10, outcomes and turns alike."""
    rows, turns = [], {}
    seeds, worlds = sorted({0, stopped[1]}), sorted({"w", stopped[0]})
    for (world, seed), acc_by_step in ((("w", 0), {10: 0.2, 20: 0.8}), (stopped, {10: 0.6})):
        for step, acc in acc_by_step.items():
            turns[("pivotrl", 1e-4, world, seed, step)] = 100 * step
            rows += [item("pivotrl", seed, step, i, i, int(i < 50 * acc), world=world) for i in range(50)]
        turns[("e2e_rl", 1e-4, world, seed, 20)] = 20000
        rows += [item("e2e_rl", seed, 20, i, i, int(i < 30), world=world) for i in range(50)]  # 0.6
    got = rollout_ratio(rows, turns, side("e2e_rl", seeds=seeds, step=20, worlds=worlds),
                        {"method": "pivotrl", "lr": 1e-4}, measure="turn")
    # Step 10: (0.2 + 0.6) / 2 = 0.4 < 0.6. Step 20: (0.8 + 0.6) / 2 = 0.7, at 2000 + 1000 turns
    # (summed over worlds, averaged over seeds).
    cost = (2000 + 1000) / len(seeds)
    assert got["target"] == pytest.approx(0.6) and got["pivotrl"] == cost
    assert got["ratio"] == pytest.approx(2 * 20000 / len(seeds) / cost)


def test_halfwidth_of_independent_arms_matches_the_binomial_formula():
    rng = random.Random(2)
    rows = [item("base", 0, 0, i, i, int(rng.random() < 0.5), lr=0.0) for i in range(400)]
    got = paired_halfwidth(rows, measure="turn", seeds=1)
    expected = 1.96 * (2 * 0.25 / 400) ** 0.5  # ≈ 0.069
    assert got["half_width"] == pytest.approx(expected, rel=0.15)
    # seeds are scored on the same items: they do not shrink the items' variance
    assert paired_halfwidth(rows, measure="turn", seeds=4)["half_width"] == got["half_width"]
    assert verdict([-0.1, -0.01]) == "not met" and verdict([0.01, 0.2]) == "met"


def test_halfwidth_has_a_worst_case_when_the_base_never_succeeds():
    rows = [item("base", 0, 0, i, i // 4, 0, lr=0.0) for i in range(200)]
    got = paired_halfwidth(rows, measure="turn", seeds=1)
    assert got["half_width"] == 0.0 and got["design_effect"] == 1.0
    assert got["worst_half_width"] == pytest.approx(1.96 * (0.5 / 200) ** 0.5)


def test_one_ood_problem_is_one_cluster_across_worlds():
    """Each world's model answers the same OOD problems; a hard problem is hard for both, so the
    problem, not (world, problem), is what the bootstrap redraws."""
    rng = random.Random(4)
    shared, split = [], []
    for c in range(60):
        d = int(rng.random() < 0.5)
        for world in ("toolshop", "terminal"):
            shared += [item("a", 0, 10, c, c, d, world=world, measure="ood"),
                       item("b", 0, 10, c, c, 0, world=world, measure="ood")]
            split += [item("a", 0, 10, c, f"{world}/{c}", d, world=world, measure="ood"),
                      item("b", 0, 10, c, f"{world}/{c}", 0, world=world, measure="ood")]
    both = ("toolshop", "terminal")
    wide = paired(shared, side("a", worlds=both), side("b", worlds=both), measure="ood")
    narrow = paired(split, side("a", worlds=both), side("b", worlds=both), measure="ood")
    assert wide["clusters"] == 60 and narrow["clusters"] == 120 and wide["pairs"] == 120
    assert (wide["ci95"][1] - wide["ci95"][0]) > 1.25 * (narrow["ci95"][1] - narrow["ci95"][0])


def curves(method, by_world, *, lr=1e-4, seed=0, split="dev", n=40):
    """Item rows of `method`'s runs: {world: {step: rate}}, n items per checkpoint."""
    return [item(method, seed, step, f"{world}-{i}", f"{world}-c{i}", float(i < round(n * rate)),
                 lr=lr, split=split, world=world)
            for world, by_step in by_world.items() for step, rate in by_step.items() for i in range(n)]


def test_each_world_keeps_its_own_step_where_its_dev_curve_peaks():
    """Toolshop's run peaks at step 10 and falls; terminal's (stopped later by the budget rule)
    climbs to step 30. One step for both would serve one world's plateau to the other; each
    world's run keeps its own."""
    rows = curves("e2e_rl", {"toolshop": {10: 0.8, 20: 0.4, 30: 0.4}, "terminal": {10: 0.2, 20: 0.4, 30: 0.9}})
    got = choose(rows, measure="turn")["e2e_rl"]
    assert got["steps"] == {"terminal": {0: 30}, "toolshop": {0: 10}}
    assert (step_of(got, "toolshop", 0), step_of(got, "terminal", 0)) == (10, 30)
    assert got["dev_score"] == pytest.approx((0.8 + 0.9) / 2)
    # a run that stopped at step 20 in one world: the other's later peak is still its own
    short = curves("e2e_rl", {"toolshop": {10: 0.2, 20: 0.4}, "terminal": {10: 0.2, 20: 0.4, 30: 1.0}})
    assert choose(short, measure="turn")["e2e_rl"]["steps"] == {"terminal": {0: 30}, "toolshop": {0: 20}}


def test_the_lr_is_chosen_on_each_worlds_kept_checkpoint_pooled():
    """lr 1e-4 peaks at a different step in each world (0.8 at 10 in toolshop, at 30 in
    terminal; never above 0.6 at one step for both); lr 3e-4 gets 0.65 in both at step 10. Each
    world at its own step, 1e-4 scores 0.8 and is kept; a step shared by the worlds would have
    kept 3e-4."""
    rows = (curves("sft", {"toolshop": {10: 0.8, 30: 0.4}, "terminal": {10: 0.4, 30: 0.8}}, n=200)
            + curves("sft", {"toolshop": {10: 0.65, 30: 0.6}, "terminal": {10: 0.65, 30: 0.6}}, lr=3e-4, n=200))
    got = choose(rows, measure="turn")["sft"]
    assert got["lr"] == 1e-4 and got["dev_score"] == pytest.approx(0.8)
    assert got["steps"] == {"terminal": {0: 30}, "toolshop": {0: 10}}


def test_paired_pairs_each_worlds_items_at_that_worlds_chosen_step():
    """The verdict between dev-chosen sides reads toolshop's eval items at toolshop's chosen
    step (10) and terminal's at terminal's (30), never one world's items at the other's step."""
    dev = curves("pivotrl", {"toolshop": {10: 0.8, 30: 0.4}, "terminal": {10: 0.2, 30: 0.9}})
    ev = curves("pivotrl", {"toolshop": {10: 0.75, 30: 0.0}, "terminal": {10: 0.0, 30: 0.5}}, split="eval")
    base = curves("base", {"toolshop": {0: 0.25}, "terminal": {0: 0.25}}, lr=0.0, split="eval")
    chosen = choose(dev, measure="turn")["pivotrl"]
    got = paired(dev + ev + base, chosen, side("base", step=0, lr=0.0, worlds=("toolshop", "terminal")),
                 measure="turn")
    assert got["pairs"] == 80 and got["worlds"] == ["terminal", "toolshop"]
    assert got["a_mean"] == pytest.approx((0.75 + 0.5) / 2)
    assert got["diff"] == pytest.approx((0.75 + 0.5) / 2 - 0.25)
    # the sides of results.json (seeds as strings) pair the same
    import json

    again = paired(dev + ev + base, json.loads(json.dumps(chosen)),
                   side("base", step=0, lr=0.0, worlds=("toolshop", "terminal")), measure="turn")
    assert again["diff"] == got["diff"]


def test_an_arm_trained_in_one_world_pairs_on_that_world_only_and_says_so():
    """--full trains the ablations in toolshop alone: their verdict against PivotRL (both worlds)
    is the difference on toolshop's items, and the verdict names the world it stands on."""
    rows = []
    for i in range(8):
        rows += [item("pivotrl", 0, 10, i, i, 1, world="toolshop"),
                 item("pivotrl", 0, 10, i, i, 0, world="terminal"),
                 item("pivotrl_random", 0, 10, i, i, i % 2, world="toolshop")]
    got = paired(rows, side("pivotrl", worlds=("toolshop", "terminal")), side("pivotrl_random", worlds=("toolshop",)),
                 measure="turn")
    assert got["worlds"] == ["toolshop"] and got["pairs"] == 8
    assert got["a_mean"] == 1.0 and got["diff"] == pytest.approx(0.5)  # terminal's 0s left out


def test_choice_takes_the_earliest_step_and_smallest_lr_within_one_standard_error():
    """Float noise between machines moved a dev score by 0.003 and the chosen step by 10: within
    δ (one binomial standard error of the best score) the earliest step is chosen, so it cannot."""
    from pivotrl_testbed.stats import noise_delta

    def run(lr, scores, n=100):
        return [item("pivotrl", 0, step, i, i, float(i < round(n * sc)), lr=lr, split="dev")
                for step, sc in scores.items() for i in range(n)]

    assert noise_delta(0.5, 100) == pytest.approx(0.05)
    near = run(1e-4, {10: 0.50, 20: 0.54, 30: 0.53})  # δ = √(.54·.46/100) ≈ 0.0498
    assert choose(near, measure="turn")["pivotrl"]["steps"] == {"w": {0: 10}}
    for noisy in (0.53, 0.54):  # the best step moving by noise leaves the choice
        assert choose(run(1e-4, {10: 0.50, 20: noisy, 30: 0.53}), measure="turn")["pivotrl"]["steps"] == {"w": {0: 10}}
    far = run(1e-4, {10: 0.40, 20: 0.54})  # beyond δ: the better step
    assert choose(far, measure="turn")["pivotrl"]["steps"] == {"w": {0: 20}}
    lrs = run(1e-4, {10: 0.50}) + run(3e-4, {10: 0.53})  # within δ: the smaller lr
    got = choose(lrs, measure="turn")["pivotrl"]
    assert got["lr"] == 1e-4 and got["dev_score"] == pytest.approx(0.50) and got["delta"] == pytest.approx(
        noise_delta(0.53, 100))
    assert choose(run(1e-4, {10: 0.40}) + run(3e-4, {10: 0.53}), measure="turn")["pivotrl"]["lr"] == 3e-4
