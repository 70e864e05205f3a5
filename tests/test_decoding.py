"""The decoding rule: each arm at its dev-best temperature (ties to the lower), and unbiased
pass@k / pass^k, on synthetic per-item results."""

from __future__ import annotations

import itertools
import random

import pytest

from pivotrl_testbed.decoding import (
    DEV_BEST,
    DecodingRule,
    at_dev_best,
    best_temperature,
    decoding_results,
    pass_at_k,
    pass_hat_k,
)
from pivotrl_testbed.report import verdicts


def test_the_best_dev_score_wins_and_ties_go_to_the_lower_temperature():
    assert best_temperature({0.0: 0.70, 0.5: 0.74, 1.0: 0.72}) == 0.5
    assert best_temperature({1.0: 0.74, 0.0: 0.74, 0.5: 0.70}) == 0.0
    assert best_temperature({0.5: 0.6, 1.0: 0.6}) == 0.5
    with pytest.raises(ValueError):
        best_temperature({})


@pytest.mark.parametrize("n,c", [(6, 0), (6, 1), (6, 3), (6, 6), (7, 4)])
def test_pass_estimators_equal_the_mean_over_every_k_subset(n, c):
    # Unbiased: the estimator is the exact mean, over every way to draw k of the n samples, of
    # "some drawn sample succeeds" (pass@k) and "every drawn sample succeeds" (pass^k).
    samples = [1] * c + [0] * (n - c)
    for k in range(1, n + 1):
        draws = list(itertools.combinations(samples, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(d) for d in draws) / len(draws))
        assert pass_hat_k(n, c, k) == pytest.approx(sum(all(d) for d in draws) / len(draws))
    with pytest.raises(ValueError):
        pass_at_k(4, 2, 5)


def test_the_pass_estimators_are_unbiased_for_the_population_rate():
    # With a true per-sample rate p, E[pass@k estimate] = 1 − (1 − p)^k and E[pass^k] = p^k.
    rng, n, k, p = random.Random(0), 16, 4, 0.3
    draws = [sum(rng.random() < p for _ in range(n)) for _ in range(20000)]
    assert sum(pass_at_k(n, c, k) for c in draws) / len(draws) == pytest.approx(1 - (1 - p) ** k, abs=0.01)
    assert sum(pass_hat_k(n, c, k) for c in draws) / len(draws) == pytest.approx(p ** k, abs=0.003)


def _rows(method, step, split, decoding, outcomes, **extra):
    return [{"method": method, "world": "w", "seed": 0, "lr": 0.0 if method == "base" else 1e-4,
             "step": step, "split": split, "measure": "turn", "item": f"t{i}",
             "cluster": f"c{i // 2}", "outcome": o, "decoding": decoding, **extra}
            for i, o in enumerate(outcomes)]


def _chosen():
    return {"base": {"method": "base", "lr": 0.0, "steps": {"w": {0: 0}}},
            "pivotrl": {"method": "pivotrl", "lr": 1e-4, "steps": {"w": {0: 20}}}}


def test_each_arm_is_judged_at_its_own_dev_best_temperature():
    dev = {"base": {"greedy": 0.8, "T0.5": 0.6, "sampled": 0.5},
           "pivotrl": {"greedy": 0.5, "T0.5": 0.9, "sampled": 0.7}}
    items = []
    for m, step in (("base", 0), ("pivotrl", 20)):
        for decoding, rate in dev[m].items():
            items += _rows(m, step, "dev", decoding, [1.0] * int(rate * 10) + [0.0] * (10 - int(rate * 10)))
        # eval: the base is good greedily, PivotRL at T = 0.5 — and the other way round elsewhere
        items += _rows(m, step, "eval", "greedy", [1.0] * 20 if m == "base" else [0.0] * 20)
        items += _rows(m, step, "eval", "T0.5", [0.0] * 20 if m == "base" else [1.0] * 20)
        items += _rows(m, 10, "dev", "T0.5", [1.0] * 10)  # an unchosen checkpoint: never read
    items += _rows("pivotrl", 20, "eval", "pass", [0.25] * 20, samples=16, successes=4)
    rule = DecodingRule()
    got = decoding_results(items, _chosen(), rule, train_temperature=1.0)
    assert got["best"] == {"base": 0.0, "pivotrl": 0.5}
    assert got["dev"]["pivotrl"] == {"0": 0.5, "0.5": 0.9, "1": 0.7}
    assert got["pass"]["pivotrl"]["pass@16"] == 1.0
    assert got["pass"]["pivotrl"]["pass^4"] == pytest.approx(1 / 1820)
    assert got["pass"]["pivotrl"]["pass@4"] == pytest.approx(pass_at_k(16, 4, 4))
    rows = at_dev_best(items, got["best"], 1.0)
    assert {(r["method"], r["split"]) for r in rows if r["decoding"] == DEV_BEST} >= {
        ("base", "eval"), ("pivotrl", "eval")}
    assert all(r["decoding"] == DEV_BEST for r in rows)
    # The headline verdict pairs the base greedy with PivotRL at 0.5: both perfect, no difference;
    # read greedily PivotRL loses everything.
    vs = verdicts(items, _chosen(), got["best"], 1.0)
    head = [v for v in vs if v["decoding"] == DEV_BEST and v["claim"].startswith("PivotRL improves")]
    greedy = [v for v in vs if v["decoding"] == "greedy" and v["claim"].startswith("PivotRL improves")]
    assert head[0]["diff"] == 0.0 and head[0]["a_mean"] == 1.0
    assert greedy[0]["diff"] == -1.0
    assert vs[0]["decoding"] == DEV_BEST  # the headline first


def test_ood_is_read_at_the_arms_dev_best_temperature_too():
    """An arm chosen at T = 0.5 on turns is judged on OOD at 0.5: the grid scores OOD by default,
    and without those rows the OOD verdict is not measurable (not read at another temperature)."""
    assert "ood" in DecodingRule().measures
    turns = (_rows("base", 0, "dev", "greedy", [1.0] * 8 + [0.0] * 2)
             + _rows("pivotrl", 20, "dev", "T0.5", [1.0] * 9 + [0.0]))
    ood = [{**r, "measure": "ood"} for r in _rows("base", 0, "eval", "greedy", [1.0] * 10)]
    ood_at_half = [{**r, "measure": "ood"} for r in _rows("pivotrl", 20, "eval", "T0.5", [0.0] * 10)]
    best = {"base": 0.0, "pivotrl": 0.5}

    def ood_verdict(items):
        return next(v for v in verdicts(items, _chosen(), best, 1.0)
                    if v["decoding"] == DEV_BEST and v["claim"].startswith("PivotRL's OOD accuracy vs the base"))

    assert ood_verdict(turns + ood)["verdict"] == "not measurable"
    got = ood_verdict(turns + ood + ood_at_half)
    assert (got["a_mean"], got["b_mean"]) == (0.0, 1.0)


def test_the_eval_split_is_scored_at_a_grid_temperature_only_where_an_arm_chose_it(monkeypatch, tmp_path):
    """The demo scores dev over the grid first (episodes, the selection measure); then eval at
    T = 0.5 only at the chosen checkpoints of the arms whose dev-best is 0.5 (PivotRL's), and at
    the training temperature only the episodes its own scoring leaves out (SFT's and the
    base's dev-best is T = 1), never greedily (scored at every chosen checkpoint)."""
    import pivotrl_testbed.demo as demo
    import pivotrl_testbed.frontier as frontier
    import pivotrl_testbed.report as report
    from pivotrl_testbed.demo import DemoConfig
    from pivotrl_testbed.jobs import Job

    worlds = ["toolshop", "terminal"]
    jobs = [Job(w, m, 1e-4, 0) for w in worlds for m in ("pivotrl", "sft")]
    # each world's run chose its own step: toolshop's 20, terminal's 30
    step = {"toolshop": 20, "terminal": 30}
    chosen = {m: {"method": m, "lr": 1e-4 if m != "base" else 0.0,
                  "steps": {w: {0: step[w] if m != "base" else 0} for w in worlds}}
              for m in ("pivotrl", "sft", "base")}
    monkeypatch.setattr(report, "chosen_sides", lambda *a, **k: chosen)
    monkeypatch.setattr(frontier, "matched_sides", lambda *a, **k: [])
    monkeypatch.setattr(demo, "merge_eval", lambda *a, **k: None)

    def dev_rows(method, world, step, decoding, rate):
        return [{"method": method, "world": world, "seed": 0, "lr": 1e-4 if method != "base" else 0.0,
                 "step": step, "split": "dev", "measure": "episode", "item": i, "cluster": i,
                 "outcome": float(i < rate * 10), "decoding": decoding} for i in range(10)]

    items = [r for m in ("pivotrl", "sft", "base") for w in worlds
             for r in dev_rows(m, w, chosen[m]["steps"][w][0], "sampled", 0.5)]
    at_half = {"pivotrl": 0.9, "sft": 0.2, "base": 0.2}  # only PivotRL is best at 0.5
    monkeypatch.setattr(demo, "eval_at", lambda job, step, *a: ({}, []))
    monkeypatch.setattr(demo, "grid_at", lambda job, world, step, *a: (
        dev_rows(job.method if job else "base", world, step, "T0.5", at_half[job.method if job else "base"])
        + dev_rows(job.method if job else "base", world, step, "greedy", 0.3)))
    calls: list[tuple[str, str, int, float]] = []
    monkeypatch.setattr(demo, "temperature_at", lambda job, world, step, t, *a: calls.append(
        (job.method if job else "base", world, step, t)) or [])
    logged: list[str] = []
    demo.score_chosen(jobs, [], items, tmp_path, tmp_path, DemoConfig(worlds=worlds, workers=1), logged.append)
    assert sorted(calls) == [("base", "terminal", 0, 1.0), ("base", "toolshop", 0, 1.0),
                             ("pivotrl", "terminal", 30, 0.5), ("pivotrl", "toolshop", 20, 0.5),
                             ("sft", "terminal", 30, 1.0), ("sft", "toolshop", 20, 1.0)]
    assert any("dev-best temperatures: " in line and "pivotrl 0.5" in line for line in logged)


def test_the_lowest_temperature_within_one_standard_error_of_the_best_is_chosen():
    scores = {0.0: 0.50, 0.5: 0.54, 1.0: 0.52}
    assert best_temperature(scores) == 0.5  # without sizes: the best (ties only to 1e-12)
    assert best_temperature(scores, {0.0: 100, 0.5: 100, 1.0: 100}) == 0.0  # δ ≈ 0.05
    assert best_temperature(scores, {0.0: 10_000, 0.5: 10_000, 1.0: 10_000}) == 0.5  # δ ≈ 0.005
