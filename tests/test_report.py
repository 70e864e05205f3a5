import json

from pivotrl.experiment.report import ci95, frontier, in_domain_at, ood_at, turns_to_reach, write_report


def row(method, world, seed, lr, step, ind, ood, turns=0, kl=0.0, tacc=None):
    return {"method": method, "world": world, "seed": seed, "lr": lr, "step": step,
            "rollout_turns": turns, "kl_to_base": kl, "rank_corr": 0.9,
            "in_domain": {"success": ind, "ci95": [0, 1], "episodes": 10, "turns": 100,
                          "turn_accuracy": ind if tacc is None else tacc},
            "ood": {"arith": {"accuracy": ood, "ci95": [0, 1], "n": 10},
                    "recall": {"accuracy": ood, "ci95": [0, 1], "n": 10}}}


def verdicts(md: str) -> list[str]:
    """The verdict column of the claims table."""
    return [line.rsplit("|", 2)[1].strip() for line in md.splitlines() if line.startswith("| [")]


def test_frontier_and_matched_lookups():
    pts = [{"in_domain": 0.2, "ood": 0.9}, {"in_domain": 0.5, "ood": 0.8},
           {"in_domain": 0.4, "ood": 0.7}, {"in_domain": 0.9, "ood": 0.3}]
    assert [p["in_domain"] for p in frontier(pts)] == [0.2, 0.5, 0.9]
    assert ood_at(pts, 0.45)["ood"] == 0.8 and ood_at(pts, 0.95) is None
    assert in_domain_at(pts, 0.75)["in_domain"] == 0.5
    assert turns_to_reach([{"in_domain": 0.3, "rollout_turns": 10},
                           {"in_domain": 0.6, "rollout_turns": 40}], 0.5) == 40


def test_standard_error_adds_the_seed_spread_to_the_eval_sample():
    from pivotrl.experiment.report import standard_error

    assert abs(standard_error([0.5], 100) - 0.05) < 1e-12  # binomial: sqrt(.25 / 100)
    assert standard_error([0.4, 0.6], 200) > standard_error([0.5, 0.5], 200)
    # two seeds: the seed part carries the t quantile with 1 degree of freedom (12.706)
    spread = 0.1414213562 ** 2 / 2 * (12.706 / 1.96) ** 2
    assert abs(standard_error([0.4, 0.6], 10 ** 9) - spread ** 0.5) < 1e-6


def test_ci95_over_seeds():
    assert ci95([0.5]) is None
    lo, hi = ci95([0.4, 0.5, 0.6])
    assert lo < 0.5 < hi and abs((hi - 0.5) - 4.303 * 0.1 / 3 ** 0.5) < 1e-9


def test_report_shape_and_verdicts(tmp_path):
    rows = []
    for seed in (0, 1):
        for w in ("toolshop", "terminal"):
            rows.append(row("base", w, seed, 0.0, 0, 0.3, 0.95))
            for step, (a, b) in enumerate([(0.5, 0.9), (0.7, 0.85)], start=1):
                rows.append(row("pivotrl", w, seed, 1e-4, step * 10, a, b, turns=100 * step))
                rows.append(row("sft", w, seed, 1e-4, step * 10, a + 0.05, b - 0.2))
                rows.append(row("e2e_rl", w, seed, 1e-4, step * 10, a - 0.1, b, turns=1000 * step))
                rows.append(row("pivotrl_exact", w, seed, 1e-4, step * 10, a - 0.2, b))
    res = write_report(rows, tmp_path, seeds=[0, 1], headline_lr=1e-4, wall_seconds=12.0,
                       theory={"grad_norm_vs_std_corr": 0.8, "points": [
                           {"reward_std": 0.0, "grad_norm": 0.0}, {"reward_std": 0.5, "grad_norm": 1.0}]},
                       pivot_stats={"toolshop": {"turns": 10, "all_fail": 2, "all_pass": 3,
                                                 "mixed": 5, "kept": 5}}, config={})
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps(res))
    pv = saved["methods"]["pivotrl"]
    assert set(pv["in_domain"]) == {"toolshop", "terminal"}
    assert pv["in_domain"]["toolshop"]["success"] == 0.7 and pv["rollout_turns"] == 400
    ck = pv["checkpoints"][-1]
    assert {"step", "lr", "rollout_turns", "in_domain", "ood", "kl_to_base"} <= set(ck)
    # e2e's best in-domain 0.6 is reached by PivotRL at 400 turns and by E2E at 4000.
    match = {"target_in_domain": 0.6, "pivotrl": 400, "e2e_rl": 4000}
    assert saved["turns_to_match_e2e"] == {**match, "by_turn_accuracy": match}  # here tacc == success
    md = (tmp_path / "report.md").read_text()
    assert "4× fewer rollout turns | ratio 10.0× | **met**" in md
    # exact-match: 0.7 vs 0.5 on 40 episodes (2 worlds × 10 × 2 identical seeds): within noise
    assert "| 0.700 vs 0.500 (Δ +0.200 [-0.010, +0.410]) | **within noise**" in md
    assert "exact-match reward costs in-domain accuracy" in md
    for png in ("frontier.png", "compute.png", "theory_grad_vs_std.png", "theory_drift.png"):
        assert (tmp_path / png).stat().st_size > 1000


def test_flat_results_are_not_measurable_rather_than_met(tmp_path):
    """When no method beats the base in-domain, 0.0 ≥ 0.0 must not count as a claim met."""
    rows = [row("base", "w", 0, 0.0, 0, 0.0, 0.5)]
    for m in ("sft", "pivotrl", "e2e_rl", "pivotrl_exact"):
        rows += [row(m, "w", 0, 1e-4, s, 0.0, 0.5, turns=10 * s) for s in (1, 2)]
    write_report(rows, tmp_path, seeds=[0], headline_lr=1e-4, wall_seconds=1.0, theory={},
                 pivot_stats={}, config={})
    md = (tmp_path / "report.md").read_text()
    # two matched points, compute, one ablation; once per in-domain measure
    assert verdicts(md) == ["**not measurable**"] * 8
    assert "No method moved episode success above the base" in md
    assert "No method moved turn accuracy above the base" in md


def test_each_in_domain_measure_gets_its_own_verdicts(tmp_path):
    """Flat episode success but moving turn accuracy: the turn-accuracy claims are judged, the
    episode ones stay not measurable; the wall time counts every invocation."""
    rows = [row("base", "w", 0, 0.0, 0, 0.0, 0.9, tacc=0.3)]
    for s in (1, 2):
        rows.append(row("sft", "w", 0, 1e-4, s, 0.0, 0.9 - 0.2 * s, tacc=0.3 + 0.1 * s))
        rows.append(row("pivotrl", "w", 0, 1e-4, s, 0.0, 0.9, turns=10 * s, tacc=0.3 + 0.1 * s))
    res = write_report(rows, tmp_path, seeds=[0], headline_lr=1e-4, wall_seconds=6.0, theory={},
                       pivot_stats={}, config={},
                       invocations=[{"wall_seconds": 600.0}, {"wall_seconds": 6.0}])
    assert res["methods"]["pivotrl"]["checkpoints"][-1]["turn_accuracy"] == 0.5
    assert res["matched"]["turn_accuracy"]["ood_at_target"] == {"sft": 0.5, "pivotrl": 0.9}
    md = (tmp_path / "report.md").read_text()
    assert "[turn accuracy] At matched in-domain accuracy PivotRL keeps more OOD" in md
    # OOD 0.9 vs 0.5 on 20 items each: the interval of the difference excludes 0
    assert "| 0.900 vs 0.500 (Δ +0.400 [+0.144, +0.656]) | **met**" in md
    # turn accuracy 0.5 vs 0.5 at matched OOD: no difference either way
    assert verdicts(md) == ["**not measurable**"] * 2 + ["**met**", "**within noise**"]
    assert "10.1 min over the 2 invocations" in md
