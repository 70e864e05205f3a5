"""Paired comparisons from per-item outcomes: the demo's checkpoint choice and verdict rule.

The demo saves one row per scored item (`items.jsonl`):
`{"method", "world", "seed", "lr", "step", "split", "measure", "item", "cluster", "outcome"}`
(`measure` is "episode", "turn" or "ood"; `cluster` is the task or trajectory the item belongs
to). Everything the report concludes is recomputed here from those rows, by these rules:

Checkpoint choice (`choose`), on the **dev** split only, by a rule float noise cannot move:
  the score of a checkpoint (method, lr, seed, step) is its mean outcome over every dev item of
  the selection measure, all worlds pooled. Each run (method, lr, seed) keeps the **earliest**
  step whose score is within δ of its best step's; each method keeps the **smallest** lr whose
  kept checkpoints' mean score over seeds is within δ of the best lr's. δ is the dev split's own
  noise, one binomial standard error of the best score over its items, √(p(1 − p)/n)
  (`noise_delta`): two checkpoints closer than that are the same to dev, so a difference in the
  fourth decimal (float noise between machines moved PivotRL's dev score 0.5657 → 0.5629 and its
  chosen step 50 → 60, docs/RESULTS.md) cannot move the choice unless it crosses the band's
  edge. The eval split never takes part in a choice.

Paired difference (`paired`), on the **eval** split:
  a side is (method, lr, {seed: step}). Item (world, item) at seed s pairs side a's outcome with
  side b's; only pairs present on both sides count. diff = Σ (outcome_a − outcome_b) / n over
  every pair of every seed: the difference of the two sides' mean outcomes on the same items.

95% interval and verdict: the core's paired cluster bootstrap (`pivotrl.evaluate.compare`, its module doc
  gives the rule), with keys (seed, world, item) and the rows' `cluster` values as clusters, so
  one OOD problem scored under each world's model is one cluster.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from pivotrl.evaluate.compare import (
    BOOTSTRAP_REPLICATES,
    bootstrap_weights,
    cell_sums,
    paired_values,
    verdict,  # noqa: F401 (the demo's verdict is the core's)
    weighted_mean,
)

Row = dict[str, Any]


def side_outcomes(items: Iterable[Row], method: str, lr: float, steps: dict[int, int], *,
                  split: str, measure: str) -> dict[tuple[int, str, str], tuple[str, float]]:
    """{(seed, world, item): (cluster key, outcome)} of one side's checkpoints."""
    out = {}
    for r in items:
        if (r["method"] == method and r["split"] == split and r["measure"] == measure
                and math.isclose(r["lr"], lr) and steps.get(r["seed"]) == r["step"]):
            out[(r["seed"], r["world"], str(r["item"]))] = (str(r["cluster"]), float(r["outcome"]))
    return out


def paired(items: Sequence[Row], a: dict[str, Any], b: dict[str, Any], *, measure: str,
           split: str = "eval", replicates: int = BOOTSTRAP_REPLICATES) -> dict[str, Any] | None:
    """The paired difference a − b on `measure` with its cluster-bootstrap 95% interval.
    `a` and `b` are sides: {"method", "lr", "steps": {seed: step}}; "worlds": those the pairs
    are in. None when nothing pairs."""
    sa = side_outcomes(items, a["method"], a["lr"], a["steps"], split=split, measure=measure)
    sb = side_outcomes(items, b["method"], b["lr"], b["steps"], split=split, measure=measure)
    got = paired_values(sa, sb, replicates)
    if got is not None:  # an arm trained in fewer worlds (the ablations in --full) pairs on those
        got["worlds"] = sorted({world for _, world, _ in set(sa) & set(sb)})
    return got


# ------------------------------------------------------------------ checkpoint choice on dev


def checkpoint_scores(items: Iterable[Row], *, split: str, measure: str) -> dict[tuple, float]:
    """{(method, lr, seed, step): mean outcome} over the split's items of `measure`, worlds pooled."""
    return {k: s for k, (s, _) in checkpoint_cells(items, split=split, measure=measure).items()}


def checkpoint_cells(items: Iterable[Row], *, split: str, measure: str) -> dict[tuple, tuple[float, int]]:
    """{(method, lr, seed, step): (mean outcome, items)} over the split's items of `measure`."""
    acc: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0])
    for r in items:
        if r["split"] == split and r["measure"] == measure:
            cell = acc[(r["method"], float(r["lr"]), int(r["seed"]), int(r["step"]))]
            cell[0] += float(r["outcome"])
            cell[1] += 1
    return {k: (s / n, n) for k, (s, n) in acc.items() if n}


def noise_delta(score: float, n: int) -> float:
    """δ of the choice rule (module doc): one binomial standard error √(p(1 − p)/n) of a dev
    score p over n items. Outcomes that are means of samples vary less than 0/1 ones, so for
    them this band is a little wide: a choice then prefers the earlier, smaller, cooler option."""
    p = min(max(score, 0.0), 1.0)
    return math.sqrt(p * (1.0 - p) / n) if n > 0 else 0.0


def earliest_within(scored: Sequence[tuple[Any, float, int]]) -> tuple[Any, float]:
    """(key, score) of the first of `scored` ((key, score, items), in preference order: the
    earlier step, the smaller lr, the lower temperature) whose score is within `noise_delta` of
    the best one's."""
    if not scored:
        raise ValueError("nothing was scored to choose from")
    best = max(scored, key=lambda x: x[1])
    floor = best[1] - noise_delta(best[1], best[2]) - 1e-12
    key, score, _ = next(x for x in scored if x[1] >= floor)
    return key, score


def choose(items: Sequence[Row], *, measure: str, split: str = "dev") -> dict[str, dict[str, Any]]:
    """Each method's checkpoints chosen on `split` (module doc): {method: {"method", "lr",
    "steps": {seed: step}, "dev_score", "delta"}}."""
    cells = checkpoint_cells(items, split=split, measure=measure)
    # A checkpoint pools the worlds, so it is a candidate only at a step every world of its run
    # reached: under the budget rule one world's run can stop before another's.
    worlds: dict[tuple[str, float, int, int], set[str]] = defaultdict(set)
    for r in items:
        if r["split"] == split and r["measure"] == measure:
            worlds[(r["method"], float(r["lr"]), int(r["seed"]), int(r["step"]))].add(r["world"])
    every: dict[tuple[str, float, int], set[str]] = defaultdict(set)
    for (method, lr, seed, _), names in worlds.items():
        every[(method, lr, seed)] |= names
    steps: dict[tuple[str, float, int], list[tuple[int, float, int]]] = defaultdict(list)
    for (method, lr, seed, step), (score, n) in sorted(cells.items()):  # sorted: earlier steps first
        if worlds[(method, lr, seed, step)] == every[(method, lr, seed)]:
            steps[(method, lr, seed)].append((step, score, n))
    runs: dict[str, dict[float, dict[int, tuple[int, float, int]]]] = defaultdict(lambda: defaultdict(dict))
    for (method, lr, seed), scored in steps.items():
        step, score = earliest_within(scored)
        runs[method][lr][seed] = (step, score, next(n for s, _, n in scored if s == step))
    chosen: dict[str, dict[str, Any]] = {}
    for method, by_lr in sorted(runs.items()):
        lrs = [(lr, sum(s for _, s, _ in per_seed.values()) / len(per_seed),
                sum(n for _, _, n in per_seed.values())) for lr, per_seed in sorted(by_lr.items())]
        lr, mean_score = earliest_within(lrs)  # sorted by lr: the smaller first
        best = max(lrs, key=lambda x: x[1])
        chosen[method] = {"method": method, "lr": lr,
                          "steps": {seed: step for seed, (step, _, _) in sorted(by_lr[lr].items())},
                          "dev_score": mean_score, "delta": noise_delta(best[1], best[2])}
    return chosen


def eval_mean(items: Sequence[Row], side: dict[str, Any], *, measure: str,
              split: str = "eval") -> float | None:
    vals = side_outcomes(items, side["method"], side["lr"], side["steps"], split=split,
                         measure=measure)
    return sum(v for _, v in vals.values()) / len(vals) if vals else None


# ------------------------------------------------------------------ power before results


def paired_halfwidth(items: Sequence[Row], *, measure: str, seeds: int, split: str = "eval",
                     method: str = "base") -> dict[str, Any] | None:
    """The 95% half-width a paired difference would have if the two arms' item outcomes were
    independent draws at `method`'s rate (the base's, before any training), with the eval
    split's cluster structure: 1.96 × √2 × (cluster-bootstrap standard error of the base's
    mean). Not divided by √seeds: every seed is scored on the same items, so seeds do not
    average the items' variance away (measured: PivotRL − SFT ±0.025–0.027 at each of three
    seeds alone, ±0.029 at the three together; docs/RESULTS.md); what seeds add is training
    noise, which this number does not model. Arms that agree on many items get narrower
    intervals, arms whose seeds differ wider ones: a planning number, not a bound. The minimum
    detectable effect at 80% power is (1.96 + 0.84) / 1.96 of it. `worst_half_width`: the same
    at rate 0.5 (the widest), with the base's design effect. `seeds` is recorded, not used."""
    mine = [r for r in items if r["method"] == method and r["split"] == split
            and r["measure"] == measure]
    first = min((r["seed"] for r in mine), default=None)
    vals = {(0, r["world"], str(r["item"])): (str(r["cluster"]), float(r["outcome"]))
            for r in mine if r["seed"] == first}
    if not vals:
        return None
    clusters = sorted({c for c, _ in vals.values()})
    total, count = cell_sums(vals, [0], clusters)
    reps = np.array([weighted_mean(total, count, ws, wc)
                     for ws, wc in bootstrap_weights(1, len(clusters))])
    se = float(reps.std(ddof=1))
    half = 1.96 * math.sqrt(2.0) * se
    rate = float(total.sum() / count.sum())
    # Worst case, rate 0.5, with the same design effect (clustering) as the base's outcomes; a
    # base at rate 0 or 1 has none to measure, so its items count as independent there.
    deff = se ** 2 / (rate * (1 - rate) / len(vals)) if 0 < rate < 1 else 1.0
    worst = 1.96 * math.sqrt(2.0 * 0.25 * deff / len(vals))
    return {"measure": measure, "items": len(vals), "clusters": len(clusters), "seeds": seeds,
            "rate": rate, "half_width": half, "mde_80": half * (1.96 + 0.8416) / 1.96,
            "design_effect": deff, "worst_half_width": worst}


# ------------------------------------------------------------------ rollout turns to match E2E


def rollout_ratio(items: Sequence[Row], turns: dict[tuple, float], e2e: dict[str, Any],
                  pivotrl: dict[str, Any], *, measure: str, claimed: float = 4.0,
                  split: str = "eval", replicates: int = BOOTSTRAP_REPLICATES) -> dict[str, Any] | None:
    """Rollout turns PivotRL spends to reach E2E RL's accuracy, against E2E RL's own.

    Target: E2E RL's mean `split` outcome at its dev-chosen checkpoints (side `e2e`); E2E's cost:
    the rollout turns at those checkpoints (mean over seeds). PivotRL (at its dev-chosen lr,
    `pivotrl["lr"]`) reaches the target at its earliest step whose mean outcome over seeds is ≥
    the target; its cost is that step's rollout turns (mean over seeds; profiling included, as
    `turns` counts it). A seed's run that the budget rule stopped before step t counts at t as
    its last checkpoint, outcome and turns: a stopped run spends no more rollouts and its model
    stays where it stopped. ratio = E2E's turns / PivotRL's (0 when PivotRL never reaches it). The
    interval redraws target and curve together under the same bootstrap as `paired`;
    "met" when its lower end is ≥ `claimed`, "not met" when its upper end is below."""
    e2e_vals = side_outcomes(items, e2e["method"], e2e["lr"], e2e["steps"], split=split,
                             measure=measure)
    seeds = sorted(e2e["steps"])
    run_steps = {s: sorted(k[3] for k in turns if k[0] == pivotrl["method"] and k[2] == s
                           and math.isclose(k[1], pivotrl["lr"])) for s in seeds}
    at: dict[int, dict[int, int]] = {}  # step t -> {seed: the checkpoint that seed has at t}
    for t in sorted({t for steps in run_steps.values() for t in steps}):
        reached = {s: max(x for x in steps if x <= t) for s, steps in run_steps.items()
                   if steps and steps[0] <= t}
        if len(reached) == len(seeds):
            at[t] = reached
    curve = {t: side_outcomes(items, pivotrl["method"], pivotrl["lr"], by_seed, split=split,
                              measure=measure) for t, by_seed in at.items()}
    curve = {t: v for t, v in curve.items() if v}
    if not e2e_vals or not curve:
        return None
    clusters = sorted({c for c, _ in e2e_vals.values()} | {c for v in curve.values() for c, _ in v.values()})
    e2e_cells = cell_sums(e2e_vals, seeds, clusters)
    curve_cells = {t: cell_sums(v, seeds, clusters) for t, v in curve.items()}
    e2e_turns = sum(turns[(e2e["method"], e2e["lr"], s, st)] for s, st in e2e["steps"].items()) / len(seeds)
    pivot_turns = {t: sum(turns[(pivotrl["method"], pivotrl["lr"], s, st)] for s, st in at[t].items())
                   / len(seeds) for t in curve}

    def reach(ws: np.ndarray, wc: np.ndarray) -> tuple[float, float | None]:
        target = weighted_mean(*e2e_cells, ws, wc)
        hit = [pivot_turns[t] for t in sorted(curve) if weighted_mean(*curve_cells[t], ws, wc) >= target - 1e-12]
        return target, (min(hit) if hit else None)

    ones = (np.ones(len(seeds)), np.ones(len(clusters)))
    target, reached = reach(*ones)
    reps = []
    for ws, wc in bootstrap_weights(len(seeds), len(clusters), replicates):
        _, got = reach(ws, wc)
        reps.append(e2e_turns / got if got else 0.0)
    lo, hi = float(np.quantile(reps, 0.025)), float(np.quantile(reps, 0.975))
    ratio = e2e_turns / reached if reached else 0.0
    # PivotRL's cost is read at a checkpoint, so the ratio takes few values: when PivotRL reaches
    # the target at its first checkpoint in most redraws, an end of the interval is the estimate
    # itself, and the estimate is a bound (at most, or at least, this), not a ratio.
    bound = ("upper" if math.isclose(hi, ratio, rel_tol=1e-9) else
             "lower" if math.isclose(lo, ratio, rel_tol=1e-9) else None)
    return {"target": target, "e2e_rl": e2e_turns, "pivotrl": reached, "ratio": ratio,
            "ci95": [lo, hi], "claimed": claimed, "interval_method": RATIO_INTERVAL, "bound": bound,
            "verdict": "met" if lo >= claimed else "not met" if hi < claimed else "within noise"}


RATIO_INTERVAL = ("percentile (2.5%, 97.5%) of the ratio over the paired cluster bootstrap's "
                  "redraws (seeds and clusters reweighted together; target and curve redrawn "
                  "with the same weights)")
