"""Paired comparisons from per-item outcomes: the demo's checkpoint choice and verdict rule.

The demo saves one row per scored item (`items.jsonl`):
`{"method", "world", "seed", "lr", "step", "split", "measure", "item", "cluster", "outcome"}`
(`measure` is "episode", "turn" or "ood"; `cluster` is the task or trajectory the item belongs
to). Everything the report concludes is recomputed here from those rows, by these rules:

Checkpoint choice (`choose`), on the **dev** split only, by a rule float noise cannot move:
  each world's model is its own run (method, lr, world, seed): trained alone, stopped alone by
  the budget rule on its own dev score (budget.py), and deployed alone, as the paper trains one
  model per domain. So each world-run keeps its own checkpoint: the score of a checkpoint
  (method, lr, world, seed, step) is its mean outcome over that world's dev items of the
  selection measure, and the run keeps the **earliest** step whose score is within δ of its
  best step's. One step for every world would let one world's plateau choose (and, under the
  budget rule, stop) the other world's still-improving model. Each method then keeps the
  **smallest** lr whose kept checkpoints' score is within δ of the best lr's, that score pooled
  over worlds and seeds: per seed, the item-weighted mean over its worlds' kept checkpoints;
  then the mean over seeds. δ is the dev split's own noise, one binomial standard error of the
  best score over its items, √(p(1 − p)/n) (`noise_delta`): two checkpoints closer than that
  are the same to dev, so a difference in the fourth decimal (float noise between machines
  moved PivotRL's dev score 0.5657 → 0.5629 and its chosen step 50 → 60, docs/RESULTS.md)
  cannot move the choice unless it crosses the band's edge. The eval split never takes part in
  a choice.

A side (`choose`'s value, `base_side`, a frontier point) is {"method", "lr", "steps": {world:
  {seed: step}}}; `step_of` and `side_runs` are the only readers of "steps" (a side read back
  from results.json has its seeds as strings; they read both).

Paired difference (`paired`), on the **eval** split:
  item (world, item) at seed s pairs side a's outcome at a's step for that world and seed with
  side b's at b's; only pairs present on both sides count. diff = Σ (outcome_a − outcome_b) / n
  over every pair of every seed: the difference of the two sides' mean outcomes on the same
  items.

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


# The checkpoint and lr choice in one sentence, as results.json and the report name it.
CHECKPOINT_RULE = ("Checkpoint and lr choice (pivotrl_testbed/stats.py, dev split only): each world's run "
                   "keeps its earliest checkpoint whose dev score is within δ of its best (ties and "
                   "near-ties go to the earlier step); each method keeps its smallest lr whose kept "
                   "checkpoints' score, pooled over worlds and seeds, is within δ of the best lr's; δ is "
                   "one binomial standard error of the best score, √(p(1 − p)/n) over its dev items.")


def step_of(side: dict[str, Any], world: str, seed: int) -> int | None:
    """The step of `side`'s checkpoint for its run in `world` at `seed`; None: no such run."""
    by_seed = side["steps"].get(world) or {}
    step = by_seed.get(seed, by_seed.get(str(seed)))
    return None if step is None else int(step)


def side_runs(side: dict[str, Any]) -> list[tuple[str, int, int]]:
    """[(world, seed, step)] of every run `side` has a checkpoint of, sorted."""
    return sorted((world, int(seed), int(step)) for world, by_seed in side["steps"].items()
                  for seed, step in by_seed.items())


def base_side(items: Iterable[Row], seeds: Iterable[int] | None = None) -> dict[str, Any]:
    """The base as a side: step 0 in every world the base was scored in, at `seeds` (None: the
    seeds its rows are under)."""
    base = [r for r in items if r["method"] == "base"]
    seeds = sorted({int(r["seed"]) for r in base} if seeds is None else set(seeds))
    return {"method": "base", "lr": 0.0,
            "steps": {w: {s: 0 for s in seeds} for w in sorted({r["world"] for r in base})}}


def side_outcomes(items: Iterable[Row], side: dict[str, Any], *, split: str,
                  measure: str) -> dict[tuple[int, str, str], tuple[str, float]]:
    """{(seed, world, item): (cluster key, outcome)} of one side's checkpoints."""
    out = {}
    for r in items:
        if (r["method"] == side["method"] and r["split"] == split and r["measure"] == measure
                and math.isclose(r["lr"], side["lr"])
                and step_of(side, r["world"], r["seed"]) == r["step"]):
            out[(r["seed"], r["world"], str(r["item"]))] = (str(r["cluster"]), float(r["outcome"]))
    return out


def paired(items: Sequence[Row], a: dict[str, Any], b: dict[str, Any], *, measure: str,
           split: str = "eval", replicates: int = BOOTSTRAP_REPLICATES) -> dict[str, Any] | None:
    """The paired difference a − b on `measure` with its cluster-bootstrap 95% interval.
    `a` and `b` are sides (module doc); "worlds": those the pairs are in. None when nothing
    pairs."""
    sa = side_outcomes(items, a, split=split, measure=measure)
    sb = side_outcomes(items, b, split=split, measure=measure)
    got = paired_values(sa, sb, replicates)
    if got is not None:  # an arm trained in fewer worlds (the ablations in --full) pairs on those
        got["worlds"] = sorted({world for _, world, _ in set(sa) & set(sb)})
    return got


# ------------------------------------------------------------------ checkpoint choice on dev


def checkpoint_scores(items: Iterable[Row], *, split: str, measure: str) -> dict[tuple, float]:
    """{(method, lr, world, seed, step): mean outcome} over the split's items of `measure`."""
    return {k: s for k, (s, _) in checkpoint_cells(items, split=split, measure=measure).items()}


def checkpoint_cells(items: Iterable[Row], *, split: str, measure: str) -> dict[tuple, tuple[float, int]]:
    """{(method, lr, world, seed, step): (mean outcome, items)} over the split's items of
    `measure`: one cell per world-run's checkpoint."""
    acc: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0])
    for r in items:
        if r["split"] == split and r["measure"] == measure:
            cell = acc[(r["method"], float(r["lr"]), r["world"], int(r["seed"]), int(r["step"]))]
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
    "steps": {world: {seed: step}}, "dev_score", "delta"}}."""
    steps: dict[tuple[str, float, str, int], list[tuple[int, float, int]]] = defaultdict(list)
    for (method, lr, world, seed, step), (score, n) in sorted(checkpoint_cells(
            items, split=split, measure=measure).items()):  # sorted: earlier steps first
        steps[(method, lr, world, seed)].append((step, score, n))
    # {method: {lr: {seed: {world: (kept step, its score, its items)}}}}
    runs: dict[str, dict[float, dict[int, dict[str, tuple[int, float, int]]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(dict)))
    for (method, lr, world, seed), scored in steps.items():
        step, score = earliest_within(scored)
        runs[method][lr][seed][world] = (step, score, next(n for s, _, n in scored if s == step))
    chosen: dict[str, dict[str, Any]] = {}
    for method, by_lr in sorted(runs.items()):
        lrs = []
        for lr, by_seed in sorted(by_lr.items()):  # sorted by lr: the smaller first
            per_seed = [sum(s * n for _, s, n in kept.values()) / sum(n for _, _, n in kept.values())
                        for kept in by_seed.values()]
            lrs.append((lr, sum(per_seed) / len(per_seed),
                        sum(n for kept in by_seed.values() for _, _, n in kept.values())))
        lr, mean_score = earliest_within(lrs)
        best = max(lrs, key=lambda x: x[1])
        kept_steps: dict[str, dict[int, int]] = defaultdict(dict)
        for seed, kept in sorted(by_lr[lr].items()):
            for world, (step, _, _) in sorted(kept.items()):
                kept_steps[world][seed] = step
        chosen[method] = {"method": method, "lr": lr, "steps": dict(sorted(kept_steps.items())),
                          "dev_score": mean_score, "delta": noise_delta(best[1], best[2])}
    return chosen


def eval_mean(items: Sequence[Row], side: dict[str, Any], *, measure: str,
              split: str = "eval") -> float | None:
    vals = side_outcomes(items, side, split=split, measure=measure)
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
    the target; its cost is that step's rollout turns (summed over worlds, mean over seeds;
    profiling included, as `turns` counts it). `turns`: {(method, lr, world, seed, step): rollout
    turns of that world-run up to that checkpoint}. A world-run that the budget rule stopped
    before step t counts at t as its last checkpoint, outcome and turns: a stopped run spends no
    more rollouts and its model stays where it stopped. ratio = E2E's turns / PivotRL's (0 when
    PivotRL never reaches it). The interval redraws target and curve together under the same
    bootstrap as `paired`; "met" when its lower end is ≥ `claimed`, "not met" when its upper end
    is below."""
    e2e_vals = side_outcomes(items, e2e, split=split, measure=measure)
    seeds = sorted({seed for _, seed, _ in side_runs(e2e)})
    run_steps: dict[tuple[str, int], list[int]] = defaultdict(list)  # (world, seed) -> its steps
    for method, lr, world, seed, step in turns:
        if method == pivotrl["method"] and math.isclose(lr, pivotrl["lr"]) and seed in seeds:
            run_steps[(world, seed)].append(step)
    run_steps = {run: sorted(steps) for run, steps in run_steps.items()}
    at: dict[int, dict[str, Any]] = {}  # step t -> the side of the checkpoints every run has at t
    for t in sorted({t for steps in run_steps.values() for t in steps}):
        if all(steps[0] <= t for steps in run_steps.values()):
            reached: dict[str, dict[int, int]] = defaultdict(dict)
            for (world, seed), steps in run_steps.items():
                reached[world][seed] = max(x for x in steps if x <= t)
            at[t] = {"method": pivotrl["method"], "lr": pivotrl["lr"], "steps": dict(reached)}
    curve = {t: side_outcomes(items, side, split=split, measure=measure) for t, side in at.items()}
    curve = {t: v for t, v in curve.items() if v}
    if not e2e_vals or not curve:
        return None

    def cost(side: dict[str, Any]) -> float:  # rollout turns summed over worlds, mean over seeds
        return sum(turns[(side["method"], side["lr"], w, s, st)]
                   for w, s, st in side_runs(side)) / len(seeds)

    clusters = sorted({c for c, _ in e2e_vals.values()} | {c for v in curve.values() for c, _ in v.values()})
    e2e_cells = cell_sums(e2e_vals, seeds, clusters)
    curve_cells = {t: cell_sums(v, seeds, clusters) for t, v in curve.items()}
    e2e_turns = cost(e2e)
    pivot_turns = {t: cost(at[t]) for t in curve}

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
