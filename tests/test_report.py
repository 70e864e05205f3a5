"""The demo report: dev-chosen checkpoints, paired verdicts recomputable from the item rows,
the contract shape of results.json."""

import json

import pytest

from pivotrl_testbed.plots import frontier
from pivotrl_testbed.report import ci95, write_report

N = 40  # items per (split, measure, world)


def outcomes(rate):
    """Item outcomes at `rate`, nested: a higher rate succeeds on a superset of items, as two
    checkpoints of one base mostly agree."""
    return [int((i * 7) % N < round(rate * N)) for i in range(N)]


def make(spec, seeds=(0,), worlds=("w",), ood=0.9):
    """spec: {method: {(lr, step): (dev rate, eval rate[, ood rate][, rollout turns])}}."""
    rows, items = [], []
    for method, points in spec.items():
        for (lr, step), vals in points.items():
            dev, ev = vals[0], vals[1]
            o = vals[2] if len(vals) > 2 else ood
            turns = vals[3] if len(vals) > 3 else 0
            for seed in seeds:
                for world in worlds:
                    key = dict(method=method, world=world, seed=seed, lr=lr, step=step)
                    rates = {split: {"in_domain": {"success": r, "ci95": [0, 1], "episodes": N,
                                                   "turns": N, "turn_accuracy": r},
                                     "ood": {"next": {"accuracy": o, "ci95": [0, 1], "n": N}}}
                             for split, r in (("dev", dev), ("eval", ev))}
                    rows.append({**key, "rollout_turns": turns, "kl_to_base": 0.1, "rank_corr": 0.9,
                                 **rates["eval"], "dev": rates["dev"]})
                    for split, rate in (("dev", dev), ("eval", ev)):
                        for measure, r in (("turn", rate), ("episode", rate), ("ood", o)):
                            for i, out in enumerate(outcomes(r)):
                                items.append({**key, "split": split, "measure": measure, "item": i,
                                              "cluster": i // 2 if measure == "turn" else i,
                                              "outcome": out})
    return rows, items


def report(tmp_path, rows, items, seeds=(0,), **kw):
    return write_report(rows, items, tmp_path, seeds=list(seeds), select_on="turn", wall_seconds=6.0,
                        theory=kw.pop("theory", {}), pivot_stats=kw.pop("pivot_stats", {}), config={}, **kw)


def test_frontier_and_seed_interval():
    pts = [{"in_domain": 0.2, "ood": 0.9}, {"in_domain": 0.5, "ood": 0.8},
           {"in_domain": 0.4, "ood": 0.7}, {"in_domain": 0.9, "ood": 0.3}]
    assert [p["in_domain"] for p in frontier(pts)] == [0.2, 0.5, 0.9]
    assert ci95([0.5]) is None
    lo, hi = ci95([0.4, 0.5, 0.6])
    assert lo < 0.5 < hi and abs((hi - 0.5) - 4.303 * 0.1 / 3 ** 0.5) < 1e-9


def test_checkpoints_are_chosen_on_dev_never_on_eval(tmp_path):
    """PivotRL's step 10 is best on dev, step 20 on eval: the report stands on step 10; the lr
    whose dev score is best wins even where another lr looks better on eval."""
    rows, items = make({
        "base": {(0.0, 0): (0.3, 0.3)},
        "pivotrl": {(1e-4, 10): (0.6, 0.4), (1e-4, 20): (0.5, 0.8),
                    (3e-4, 10): (0.4, 0.9), (3e-4, 20): (0.4, 0.9)},
        "sft": {(1e-4, 10): (0.3, 0.4), (1e-4, 20): (0.45, 0.45)}})  # gaps beyond δ ≈ 0.08
    res = report(tmp_path, rows, items)
    pv = res["methods"]["pivotrl"]
    assert pv["chosen"]["lr"] == 1e-4 and pv["chosen"]["steps"] == {"w": {"0": 10}}
    assert pv["in_domain"]["w"]["success"] == 0.4  # eval at the dev-chosen step, not the max 0.9
    v = next(v for v in res["verdicts"] if v["a"]["method"] == "pivotrl" and v["b"]["method"] == "sft"
             and v["measure"] == "turn")
    assert v["a"]["steps"] == {"w": {"0": 10}} and v["b"]["steps"] == {"w": {"0": 20}}
    assert v["diff"] == pytest.approx(0.4 - 0.45) and v["verdict"] in ("within noise", "not met")
    # the learning curves are drawn on dev, the split scored at every checkpoint
    curve = {(c["lr"], c["step"]): c["turn_accuracy"] for c in pv["checkpoints"]}
    assert curve == {(1e-4, 10): 0.6, (1e-4, 20): 0.5, (3e-4, 10): 0.4, (3e-4, 20): 0.4}


def test_each_worlds_run_is_reported_and_judged_at_its_own_step(tmp_path):
    """PivotRL's toolshop run is best on dev at step 10, its terminal run at step 30: the report
    names both steps, and the verdict against the base reads each world's eval items at that
    world's step (toolshop 0.6 at 10, terminal 0.7 at 30), never one step for both."""
    spec = {"toolshop": {(1e-4, 10): (0.7, 0.6), (1e-4, 30): (0.3, 0.0)},
            "terminal": {(1e-4, 10): (0.3, 0.0), (1e-4, 30): (0.7, 0.7)}}
    rows, items = make({"base": {(0.0, 0): (0.3, 0.3)}}, worlds=("toolshop", "terminal"))
    for world, points in spec.items():
        got = make({"pivotrl": points}, worlds=(world,))
        rows, items = rows + got[0], items + got[1]
    res = report(tmp_path, rows, items)
    assert res["methods"]["pivotrl"]["chosen"]["steps"] == {"terminal": {"0": 30}, "toolshop": {"0": 10}}
    assert res["methods"]["pivotrl"]["in_domain"]["toolshop"]["success"] == 0.6
    assert res["methods"]["pivotrl"]["in_domain"]["terminal"]["success"] == 0.7
    v = next(v for v in res["verdicts"] if (v["a"]["method"], v["b"]["method"], v["measure"], v["decoding"])
             == ("pivotrl", "base", "turn", "greedy"))
    assert v["a_mean"] == pytest.approx((0.6 + 0.7) / 2) and v["diff"] == pytest.approx((0.6 + 0.7) / 2 - 0.3)
    md = (tmp_path / "report.md").read_text()
    assert "| pivotrl | 0.0001 | terminal 30, toolshop 10 |" in md
    assert "pivotrl (lr 0.0001, steps terminal 30, toolshop 10)" in md


def test_an_arm_chosen_at_its_cap_is_a_warning_before_any_number(tmp_path):
    """SFT's dev score still rises at its cap (step 20): the report says the cap chose it."""
    rows, items = make({"base": {(0.0, 0): (0.3, 0.3)},
                        "sft": {(1e-4, 10): (0.4, 0.4), (1e-4, 20): (0.7, 0.7)},
                        "pivotrl": {(1e-4, 10): (0.7, 0.6), (1e-4, 20): (0.4, 0.4)}})
    res = report(tmp_path, rows, items, caps={"sft": 20, "pivotrl": 20})
    assert [f["kind"] for f in res["health"]] == ["chosen at the cap"] and "sft:" in res["health"][0]["why"]
    md = (tmp_path / "report.md").read_text()
    assert md.index("chosen at the cap") < md.index("| pivotrl |")
    assert not report(tmp_path / "b", rows, items, caps={"sft": 30, "pivotrl": 30})["health"]


def test_the_dev_curve_holds_a_stopped_worlds_run_at_its_last_checkpoint():
    """Toolshop's run stopped at step 10, terminal's went on to 20: the curve at 20 is terminal's
    step 20 with toolshop's model where it stopped, not terminal's alone."""
    from pivotrl_testbed.report import checkpoint_curve

    rows, _ = make({"sft": {(1e-4, 10): (0.5, 0.5, 0.9, 10)}}, worlds=("toolshop",))
    rows += make({"sft": {(1e-4, 10): (0.2, 0.2, 0.9, 10), (1e-4, 20): (0.4, 0.4, 0.9, 20)}}, worlds=("terminal",))[0]
    curve = {c["step"]: (c["turn_accuracy"], c["rollout_turns"]) for c in checkpoint_curve(rows, "sft")}
    assert curve == {10: (pytest.approx(0.35), 20), 20: (pytest.approx(0.45), 30)}


def test_verdicts_recompute_from_the_item_rows(tmp_path):
    """A script that knows only the documented rule recomputes every diff from items.jsonl."""
    seeds = (0, 1)
    rows, items = make({
        "base": {(0.0, 0): (0.3, 0.3, 0.9)},
        "pivotrl": {(1e-4, 10): (0.6, 0.7, 0.9, 100)},
        "sft": {(1e-4, 10): (0.5, 0.35, 0.6, 0)},
        "e2e_rl": {(1e-4, 10): (0.5, 0.5, 0.9, 5000)},
        "pivotrl_exact": {(1e-4, 10): (0.5, 0.5, 0.9, 100)}}, seeds=seeds, worlds=("a", "b"))
    res = report(tmp_path, rows, items, seeds, pivot_stats={"a": {"profile_rollout_turns": 10}})
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == res
    assert {"wall_seconds", "seeds", "methods", "turns_to_match_e2e", "theory", "verdicts"} <= set(saved)
    for v in saved["verdicts"]:
        assert {"claim", "measure", "a", "b", "diff", "ci95", "verdict"} <= set(v)
        a = {(r["seed"], r["world"], r["item"]): r["outcome"] for r in items
             if r["method"] == v["a"]["method"] and r["split"] == "eval" and r["measure"] == v["measure"]
             and r["step"] == v["a"]["steps"][r["world"]][str(r["seed"])]}
        b = {(r["seed"], r["world"], r["item"]): r["outcome"] for r in items
             if r["method"] == v["b"]["method"] and r["split"] == "eval" and r["measure"] == v["measure"]
             and r["step"] == v["b"]["steps"][r["world"]][str(r["seed"])]}
        assert v["diff"] == pytest.approx(sum(a[k] - b[k] for k in a) / len(a))
        assert v["ci95"][0] <= v["diff"] <= v["ci95"][1]
    by = {(v["a"]["method"], v["b"]["method"], v["measure"]): v for v in saved["verdicts"]}
    assert by[("pivotrl", "sft", "turn")]["verdict"] == "met"  # 0.70 vs 0.35 on 160 pairs
    assert by[("pivotrl", "sft", "ood")]["verdict"] == "met"  # SFT forgot: 0.9 vs 0.6
    assert by[("sft", "base", "ood")]["verdict"] == "not met"
    assert by[("pivotrl", "base", "ood")]["diff"] == 0.0 and by[("pivotrl", "base", "ood")]["verdict"] == "within noise"
    assert ("pivotrl", "pivotrl_no_filter", "turn") not in by  # arm not run: no verdict invented
    tm = saved["turns_to_match_e2e"]
    assert tm["pivotrl"] == 200 and tm["e2e_rl"] == 10000  # summed over the two worlds
    assert tm["by_measure"]["turn"]["ratio"] == 50.0 and tm["by_measure"]["turn"]["verdict"] == "met"
    assert tm["by_measure"]["turn"]["without_profiling"]["pivotrl"] == 190
    md = (tmp_path / "report.md").read_text()
    assert "## The paper's claims against ours (paired, eval split)" in md
    assert "## The data each arm saw" in md and "| **met** |" in md
    for png in ("frontier.png", "compute.png", "theory_drift.png"):
        assert (tmp_path / png).stat().st_size > 1000


def test_missing_arm_is_not_measurable_and_theory_shows_its_null(tmp_path):
    rows, items = make({"base": {(0.0, 0): (0.3, 0.3)}, "pivotrl": {(1e-4, 10): (0.3, 0.3, 0.9, 10)},
                        "e2e_rl": {(1e-4, 10): (0.3, 0.3, 0.9, 1000)}})
    items = [r for r in items if r["method"] != "pivotrl" or r["split"] == "dev" or r["measure"] != "ood"]
    theory = {"grad_norm_vs_std_corr": 0.9, "null_grad_norm_vs_std_corr": 0.88,
              "progress_mean": 0.01, "null_progress_mean": 0.0, "mixed_states": 3, "zero_std_states": 1,
              "points": [{"reward_std": s, "grad_norm": s, "null_grad_norm": s, "progress": s,
                          "null_progress": 0.0} for s in (0.0, 0.2, 0.4, 0.5)]}
    res = report(tmp_path, rows, items, theory=theory,
                 power=[{"measure": "turn", "items": 40, "clusters": 20, "seeds": 1, "rate": 0.3,
                         "half_width": 0.12, "mde_80": 0.17}])
    by = {(v["a"]["method"], v["b"]["method"], v["measure"]): v["verdict"] for v in res["verdicts"]}
    assert by[("pivotrl", "base", "ood")] == "not measurable"
    assert by[("pivotrl", "base", "turn")] == "within noise"  # identical outcomes: Δ 0 [0, 0]
    # E2E RL never beat the base: reaching its level proves nothing, whatever the ratio (100×).
    assert res["turns_to_match_e2e"]["by_measure"]["turn"]["ratio"] == 100.0
    assert res["turns_to_match_e2e"]["by_measure"]["turn"]["verdict"] == "not measurable"
    md = (tmp_path / "report.md").read_text()
    assert "| Pearson r, plain gradient norm vs reward std | 0.900 | 0.880 |" in md
    assert "| turn accuracy | 40 | 20 | 1 | 0.300 | ±0.120 | 0.170 | ±— |" in md
    assert (tmp_path / "theory_grad_vs_std.png").exists()


def test_plots_label_their_split_tick_the_compute_axis_and_bar_the_frontier(tmp_path, monkeypatch):
    """Read off the figures as saved: every axis label of the checkpoint plots says dev (the
    split they show), compute.png's x axis has tick labels, the frontier has interval bars."""
    from matplotlib.container import ErrorbarContainer
    from matplotlib.figure import Figure

    saved = {}
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: (
        saved.__setitem__(str(path).rsplit("/", 1)[-1], fig), real(fig, path, **kw))[1])
    rows, items = make({"base": {(0.0, 0): (0.3, 0.3)},
                        "pivotrl": {(1e-4, 10): (0.6, 0.7, 0.9, 100), (1e-4, 20): (0.7, 0.7, 0.8, 250)},
                        "e2e_rl": {(1e-4, 10): (0.5, 0.5, 0.9, 3000)}}, seeds=(0, 1))
    for r in rows:  # the seeds disagree, so the intervals over seeds have a width
        r["dev"]["in_domain"]["success"] -= 0.1 * r["seed"]
    report(tmp_path, rows, items, (0, 1))
    for name in ("frontier.png", "compute.png"):
        for ax in saved[name].axes:
            assert "dev" in ax.get_ylabel() and "eval" not in ax.get_ylabel() + ax.get_xlabel()
    for ax in saved["compute.png"].axes:
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert {"100", "250", "3,000"} <= set(labels), labels
    first = saved["frontier.png"].axes[0]
    bars = [c for c in first.containers if isinstance(c, ErrorbarContainer)]
    assert bars and "95% interval over seeds" in first.get_title()


def with_agentic(rows, items, rates):
    """Agentic-format OOD rows added to `make`'s: {method: rate} of family no_tool_fits, on both
    splits, in the rows' per-family rates and as item rows (ids as agentic_ood writes them)."""
    rows = [{**r, "ood": {**r["ood"], "no_tool_fits": {"accuracy": rates[r["method"]], "ci95": [0, 1], "n": N}},
             "dev": {**r["dev"], "ood": {**r["dev"]["ood"], "no_tool_fits": {
                 "accuracy": rates[r["method"]], "ci95": [0, 1], "n": N}}}} for r in rows]
    extra = [{**r, "item": f"no_tool_fits-toolshop-0-{r['item']}",
              "outcome": outcomes(rates[r["method"]])[r["item"]]}
             for r in items if r["measure"] == "ood"]
    return rows, items + extra


def test_agentic_format_ood_is_reported_apart(tmp_path):
    """SFT keeps the non-agentic OOD (0.9 = the base's) but forgets the agentic-format one (0.8 →
    0.3): each kind has its own verdicts, columns and per-family cells, and neither is pooled
    into the other."""
    rows, items = make({"base": {(0.0, 0): (0.3, 0.3, 0.9)}, "sft": {(1e-4, 10): (0.5, 0.5, 0.9)},
                        "pivotrl": {(1e-4, 10): (0.6, 0.6, 0.9)}})
    rows, items = with_agentic(rows, items, {"base": 0.8, "sft": 0.3, "pivotrl": 0.8})
    res = report(tmp_path, rows, items)
    by = {(v["a"]["method"], v["b"]["method"], v["measure"]): v for v in res["verdicts"]
          if v["decoding"] == "greedy"}
    assert by[("sft", "base", "ood")]["diff"] == 0.0 and by[("sft", "base", "ood")]["pairs"] == N
    assert by[("sft", "base", "agentic_ood")]["diff"] == pytest.approx(0.3 - 0.8)
    assert by[("sft", "base", "agentic_ood")]["verdict"] == "not met"  # it forgot
    assert by[("pivotrl", "sft", "agentic_ood")]["verdict"] == "met"
    assert by[("sft", "base", "agentic_ood")]["pairs"] == N
    assert res["methods"]["sft"]["checkpoints"][0]["ood"] == 0.9  # the curve: non-agentic only
    md = (tmp_path / "report.md").read_text()
    assert "| non-agentic OOD | agentic-format OOD |" in md
    assert "| OOD next | agentic-format OOD no_tool_fits |" in md
    assert "| 0.900 | 0.300 |" in md  # SFT's two kinds, side by side
    assert "| SFT's agentic-format OOD accuracy vs the base's (not met = it forgot) | " \
           "agentic-format OOD accuracy (greedy) |" in md
    assert "| SFT's OOD accuracy vs the base's (paper: −9.83; not met = it forgot) | " \
           "non-agentic OOD accuracy (greedy) |" in md


def test_without_agentic_rows_nothing_agentic_is_reported(tmp_path):
    rows, items = make({"base": {(0.0, 0): (0.3, 0.3, 0.9)}, "sft": {(1e-4, 10): (0.5, 0.5, 0.6)}})
    res = report(tmp_path, rows, items)
    assert {v["measure"] for v in res["verdicts"]} == {"turn", "episode", "ood"}  # sft vs base only
    md = (tmp_path / "report.md").read_text()
    assert "agentic-format" not in md and "| non-agentic OOD | KL to base (OOD) |" in md


def test_one_seed_says_so_and_a_ratio_near_the_base_or_at_a_bound_is_no_ratio(tmp_path):
    """A one-seed run's verdicts carry '1 seed: indicative; `--full` decides'; E2E RL's target
    under the base + 0.05 makes the rollout ratio 'not measurable'; an interval whose end is the
    estimate is shown as a bound, with the interval's method named."""
    from pivotrl_testbed.report import ONE_SEED

    spec = {"base": {(0.0, 0): (0.30, 0.30)},
            "pivotrl": {(1e-4, 5): (0.60, 0.60, 0.9, 100), (1e-4, 10): (0.62, 0.62, 0.9, 200)},
            "sft": {(1e-4, 10): (0.5, 0.5)},
            "e2e_rl": {(1e-4, 10): (0.33, 0.33, 0.9, 5000)}}
    res = report(tmp_path, *make(spec), pivot_stats={"w": {"profile_rollout_turns": 0}})
    assert res["note"] == ONE_SEED and all(v["note"] == ONE_SEED for v in res["verdicts"])
    md = (tmp_path / "report.md").read_text()
    assert f"**{ONE_SEED}**" in md and f"(1 seed: indicative; `--full` decides) |" in md
    near = res["turns_to_match_e2e"]["by_measure"]["turn"]
    assert near["verdict"] == "not measurable" and "0.05" in near["why"]
    spec["e2e_rl"] = {(1e-4, 10): (0.55, 0.55, 0.9, 5000)}  # clears the base by 0.25: read
    res = report(tmp_path / "b", *make(spec, seeds=(0, 1)), seeds=(0, 1),
                 pivot_stats={"w": {"profile_rollout_turns": 0}})
    read = res["turns_to_match_e2e"]["by_measure"]["turn"]
    assert "note" not in res["verdicts"][0] and read["verdict"] != "not measurable"
    assert read["pivotrl"] == 100 and read["bound"] == "upper"  # reached at its first checkpoint
    md = (tmp_path / "b" / "report.md").read_text()
    assert "ratio ≤ 50.0× (a bound" in md and "percentile (2.5%, 97.5%)" in md


def test_each_arms_compute_is_reported_beside_it():
    from pivotrl_testbed.compute import compute_block
    from pivotrl_testbed.report_md import compute_section

    def run(method, steps, turns, secs, tokens=None, world="w"):
        out = [{"method": method, "world": world, "seed": 0, "lr": 1e-4, "step": s, "rollout_turns": t,
                **({"train_tokens": tokens[0] * s, "rollout_tokens": tokens[1] * s} if tokens else {})}
               for s, t in zip(steps, turns)]
        out[-1]["train_seconds"] = secs
        return out

    rows = run("pivotrl", (10, 20, 30), (1100, 1200, 1300), 300.0, (50, 5)) \
        + run("e2e_rl", (10, 20), (500, 1000), 100.0, (100, 40))
    rows += run("sft", (10, 20), (0, 0), 40.0)  # rows from before the trainers counted tokens
    side = lambda m, step: {"method": m, "lr": 1e-4, "steps": {"w": {0: step}}}  # noqa: E731
    chosen = {"pivotrl": side("pivotrl", 10), "e2e_rl": side("e2e_rl", 20), "sft": side("sft", 20),
              "base": side("base", 0)}
    got = compute_block(rows, chosen, {"w": {"profile_rollout_turns": 1000}})
    # the counters at the chosen step itself (10), not the run's last (30), nor pro-rated
    assert got["arms"]["pivotrl"] == {"rollout_turns": 1100, "profiling_samples": 1000,
                                      "train_seconds": 100.0, "train_seconds_run": 300.0,
                                      "training_tokens": 500, "rollout_tokens": 50}
    assert got["arms"]["e2e_rl"]["training_tokens"] == 2000 and got["arms"]["e2e_rl"]["rollout_tokens"] == 800
    assert got["arms"]["sft"]["profiling_samples"] == 0 and "base" not in got["arms"]
    assert got["arms"]["sft"]["training_tokens"] is None and got["arms"]["sft"]["rollout_tokens"] is None
    assert got["pivotrl_over_e2e"] == {"rollout_turns": 1.1, "train_seconds": 1.0,
                                       "training_tokens": 0.25, "rollout_tokens": 0.0625}
    assert "sft" in got["note"] and "pivotrl" not in got["note"]
    md = "\n".join(compute_section({"compute": got, "methods": {
        "pivotrl": {"in_domain": {"w": {"turn_accuracy": 0.625}}}}}))
    line = next(x for x in md.splitlines() if x.startswith("| pivotrl |"))
    assert line.startswith("| pivotrl | 0.625 | 500 | 50 | 1100 | 1000 |")
    assert next(x for x in md.splitlines() if x.startswith("| sft |")).startswith(
        "| sft | — | not recorded | not recorded | 0 |")
    assert "training tokens 0.25, rollout tokens 0.06" in md and "Not in the table: training and rollout " \
        "tokens were not recorded for sft" in md
    # one world's run without the counters: the arm's sum over worlds is unknown, not a part of it
    rows += run("sft", (10, 20), (0, 0), 40.0, (30, 0), world="v")
    chosen["sft"] = {"method": "sft", "lr": 1e-4, "steps": {"w": {0: 20}, "v": {0: 20}}}
    assert compute_block(rows, chosen, {})["arms"]["sft"]["training_tokens"] is None
    counted = [r for r in rows if not (r["method"] == "sft" and r["world"] == "w")]
    got = compute_block(counted, chosen, {})
    assert got["arms"]["sft"]["training_tokens"] == 600 and got["note"] is None
    assert "Not in the table" not in "\n".join(compute_section({"compute": got}))

def test_only_the_arms_chosen_by_the_profile_are_charged_its_samples(tmp_path):
    """The compute table and the rollout-turn counter charge the profile to the same arms:
    pivotrl and pivotrl_exact select by it; pivotrl_random borrows only the pivot count."""
    from types import SimpleNamespace

    from pivotrl_testbed.compute import compute_block
    from pivotrl_testbed.jobs import Job, rollout_turns_at

    cfg, stats = SimpleNamespace(num_generations=4, pivots_per_step=2), {"profile_rollout_turns": 1000}
    side = lambda m: {"method": m, "lr": 1e-4, "steps": {"w": {0: 10}}}  # noqa: E731
    for method, charged in (("pivotrl", True), ("pivotrl_exact", True), ("pivotrl_random", False),
                            ("pivotrl_no_filter", False)):
        turns = rollout_turns_at(Job("w", method, 1e-4, 0), 10, tmp_path, cfg, stats)
        assert turns == 80 + 1000 * charged, method
        rows = [{"method": method, "world": "w", "seed": 0, "lr": 1e-4, "step": 10, "rollout_turns": turns,
                 "train_seconds": 1.0}]
        got = compute_block(rows, {method: side(method)}, {"w": stats})["arms"][method]
        assert got["profiling_samples"] == 1000 * charged, method


def test_the_report_names_its_choice_rules_and_marks_a_one_seed_ablation(tmp_path):
    """results.json and report.md name the checkpoint rule and where each headline arm's lr came
    from (the committed tuning run when the config trains the tuned values, else its own grid);
    in a multi-seed run, a verdict against an ablation trained on one seed is marked indicative,
    and a headline verdict is not."""
    from pivotrl_testbed.demo_config import TUNED_LEARNING_RATES, TUNED_LR_SOURCE
    from pivotrl_testbed.report_md import ONE_SEED_SIDE
    from pivotrl_testbed.stats import CHECKPOINT_RULE

    spec = {"base": {(0.0, 0): (0.30, 0.30)}, "pivotrl": {(1e-4, 5): (0.6, 0.6)},
            "sft": {(1e-4, 5): (0.5, 0.5)}}
    rows, items = make(spec, seeds=(0, 1))
    abl_rows, abl_items = make({"pivotrl_random": {(1e-4, 5): (0.55, 0.55)}}, seeds=(0,))
    config = {"learning_rates": {"sft": [TUNED_LEARNING_RATES["sft"]], "pivotrl": [3e-5, 1e-4]}}
    res = write_report(rows + abl_rows, items + abl_items, tmp_path, seeds=[0, 1], select_on="turn",
                       wall_seconds=1.0, theory={}, pivot_stats={}, config=config)
    rules = res["choice_rules"]
    assert rules["checkpoint"] == CHECKPOINT_RULE and TUNED_LR_SOURCE in rules["lr sft"]
    assert TUNED_LR_SOURCE not in rules["lr pivotrl"] and "3e-05 / 0.0001" in rules["lr pivotrl"]
    marked = {v["b"]["method"] for v in res["verdicts"] if v.get("note") == ONE_SEED_SIDE}
    assert marked == {"pivotrl_random"}
    md = (tmp_path / "report.md").read_text()
    assert "## How the arms were chosen" in md and CHECKPOINT_RULE in md
    assert md.index("## How the arms were chosen") < md.index("## The paper's claims")
    assert f"({ONE_SEED_SIDE}) |" in md
