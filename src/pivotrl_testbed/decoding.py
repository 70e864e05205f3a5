"""Which decoding an arm is judged at, fixed by rule before any result: the dev-best temperature.

An arm's eval number depends on how it is decoded: PivotRL sharpens the policy, so at T = 1 it
can beat a base that is better greedily (docs/RESULTS.md). Choosing the decoding after seeing
the verdicts is a forking path, so the rule is code:

RULE (below, printed in the report): at each run's dev-chosen checkpoint, episode success and
turn accuracy are scored on dev at every temperature of a small grid (0 = greedy; each T > 0 as
the mean success of k seeded samples per item). Each arm (method) takes, on the demo's selection
measure (episode success by default), the lowest temperature whose dev score, pooled over its
chosen checkpoints of every world and seed, is within one binomial standard error of its best
(`stats.noise_delta`, the checkpoint choice's band: the more deterministic decoding unless dev
can tell them apart); the same on turn accuracy is reported beside it. Its eval number, and the headline
verdicts, are read at that temperature, each arm at its own. The eval split is scored greedy and
at the training temperature at every chosen checkpoint, and at another grid temperature only at
the chosen checkpoints of the arms whose dev-best it is, once dev has chosen: nothing else reads
it (the demo's eval phase was its longest on a 4-layer base, docs/RESULTS.md). Beside it, at
the training temperature: pass@k (at least one of k samples succeeds) and pass^k (all k succeed), from n
samples per item with the unbiased estimators 1 − C(n−c, k)/C(n, k) and C(c, k)/C(n, k)
(c successes of n; Chen et al. 2021, Yao et al. 2024), on the headline arms' first
`pass_seeds` seeds. pass@k rising while accuracy at the dev-best temperature does not is
sharpening, not new ability.

Item rows carry the decoding that scored them: "greedy" (T = 0), "sampled" (the training
temperature, k samples), "T<t>" (another grid temperature) and "pass" (n samples at the training
temperature, with `samples` and `successes`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pivotrl_testbed import stats

RULE = ("Decoding (fixed before any result, pivotrl_testbed/decoding.py): at each run's "
        "dev-chosen checkpoint, the selection measure (episode success by default) and turn "
        "accuracy are scored on dev at every temperature of the grid; each arm takes the lowest "
        "temperature whose dev score is within one binomial standard error of its best (its "
        "chosen checkpoints of every world and seed pooled) and its eval number and the headline "
        "verdicts are read there, each arm at its own. pass@k and pass^k: at the training "
        "temperature, unbiased estimators from n samples per item, at the base and the headline "
        "arms' chosen checkpoints of the first `pass_seeds` seeds (descriptive: no verdict reads "
        "them).")
DEV_BEST = "dev-best"  # the decoding label of rows read at their arm's dev-best temperature
PASS = "pass"


class DecodingRule(BaseModel):
    """The temperature grid and the pass@k scoring (module doc)."""

    model_config = ConfigDict(extra="forbid")

    temperatures: list[float] = Field(default_factory=lambda: [0.0, 0.5, 1.0],
                                      description="The grid each arm's decoding is chosen from on "
                                      "dev (0 = greedy).")
    k: int = Field(4, ge=1, description="Samples per item at each temperature above 0.")
    pass_samples: int = Field(16, ge=1, description="Samples per item (n) at the training "
                              "temperature for pass@k and pass^k; each k ≤ n.")
    pass_k: list[int] = Field(default_factory=lambda: [4, 16], description="The k of pass@k and "
                              "pass^k.")
    pass_trajectories: int = Field(
        50, ge=0, description="pass@k's items: the expert turns of the first N eval trajectories "
        "per world (0: all that turn accuracy scores). n samples of every turn were the largest "
        "cost of a chosen checkpoint's grid on a 4-layer base (70 s of 115 for 100 toolshop "
        "trajectories, beside two builds; docs/RESULTS.md); pass@k is read as a mean, never in a "
        "paired verdict, and half the turns keep it within a few hundredths.")
    pass_seeds: int = Field(
        1, ge=0, description="pass@k is scored at the headline arms' chosen checkpoints of the "
        "demo's first N training seeds (and the base); 0: every seed. It is a descriptive mean, never in a "
        "paired verdict, and its n samples of every turn were ~70% of a chosen checkpoint's grid "
        "(95 s of 133 on toolshop, beside a demo): on every seed of --full, an estimated 40% of "
        "its eval phase, for no verdict. One seed gives it the default demo's precision.")
    measures: list[Literal["turn", "ood", "episode"]] = Field(
        default_factory=lambda: ["turn", "ood", "episode"], description="Measures scored on eval "
        "at an arm's dev-best temperature (pass@k: turns only). The temperature is chosen on the "
        "demo's selection measure (dev is scored over the grid on episodes and turns), and an "
        "arm deployed there finishes tasks and answers OOD questions there too: without OOD "
        "there, an arm chosen at 0.5 had no OOD rows at its temperature and its OOD verdicts "
        "were 'not measurable' (an SFT run on a candidate base, docs/RESULTS.md).")
    seed: int = Field(0, description="Base seed of the samples' seeds.")

    def seeds_with_pass(self, seeds: Sequence[int]) -> list[int]:
        """The training seeds whose chosen checkpoints get pass@k's n samples (the base always)."""
        return list(seeds) if self.pass_seeds == 0 else list(seeds)[:self.pass_seeds]


def label(t: float, train_temperature: float) -> str:
    """The item rows' decoding label of temperature `t`."""
    if t == 0:
        return "greedy"
    return "sampled" if math.isclose(t, train_temperature) else f"T{t:g}"


def best_temperature(scores: dict[float, float], sizes: dict[float, int] | None = None) -> float:
    """The lowest temperature whose score is within δ of the highest (`stats.noise_delta`: one
    binomial standard error of the best score over its `sizes` items, the checkpoint rule's
    band); without `sizes`, δ = 0 (ties to 1e-12 go to the lower temperature)."""
    if not scores:
        raise ValueError("no temperature was scored")
    ts = sorted(scores)
    top = max(ts, key=lambda t: scores[t])
    n = (sizes or {}).get(top, 0)
    return stats.earliest_within([(t, scores[t], n) for t in ts])[0]


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n, c of them good, is good)."""
    _check(n, c, k)
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """P(all k samples drawn without replacement from n, c of them good, are good)."""
    _check(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def _check(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 ≤ c ≤ n and 1 ≤ k ≤ n, got n={n}, c={c}, k={k}")


def dev_cells(items: Sequence[dict[str, Any]], chosen: dict[str, dict[str, Any]],
              temperatures: Iterable[float], train_temperature: float,
              measure: str = "turn") -> dict[str, dict[float, tuple[float, int]]]:
    """{method: {temperature: (mean dev outcome of `measure` at its chosen checkpoints, items)}},
    for the temperatures scored there."""
    out: dict[str, dict[float, tuple[float, int]]] = {}
    for name, side in chosen.items():
        for t in temperatures:
            rows = [r for r in items if r.get("decoding", "greedy") == label(t, train_temperature)]
            got = stats.side_outcomes(rows, side, split="dev", measure=measure)
            if got:
                out.setdefault(name, {})[t] = (sum(v for _, v in got.values()) / len(got), len(got))
    return out


def dev_scores(items: Sequence[dict[str, Any]], chosen: dict[str, dict[str, Any]],
               temperatures: Iterable[float], train_temperature: float,
               measure: str = "turn") -> dict[str, dict[float, float]]:
    """{method: {temperature: mean dev outcome at its chosen checkpoints}} (`dev_cells`' means)."""
    return {m: {t: s for t, (s, _) in by.items()}
            for m, by in dev_cells(items, chosen, temperatures, train_temperature, measure).items()}


def dev_best(cells: dict[str, dict[float, tuple[float, int]]]) -> dict[str, float]:
    """{method: its dev-best temperature} from `dev_cells` (the noise band's rule)."""
    return {m: best_temperature({t: s for t, (s, _) in by.items()}, {t: n for t, (_, n) in by.items()})
            for m, by in cells.items()}


def at_dev_best(items: Iterable[dict[str, Any]], best: dict[str, float],
                train_temperature: float) -> list[dict[str, Any]]:
    """The rows of each method at its dev-best temperature, relabelled DEV_BEST (so that the
    paired rules, which take one decoding at a time, pair every arm at its own temperature)."""
    want = {m: label(t, train_temperature) for m, t in best.items()}
    return [{**r, "decoding": DEV_BEST} for r in items
            if r["method"] in want and r.get("decoding", "greedy") == want[r["method"]]]


def pass_rates(items: Iterable[dict[str, Any]], side: dict[str, Any], ks: Sequence[int], *,
               split: str = "eval", measure: str = "turn") -> dict[str, Any] | None:
    """Mean pass@k and pass^k over the side's PASS rows (items × seeds), or None without any."""
    rows = [r for r in items if r.get("decoding") == PASS and r["method"] == side["method"]
            and r["split"] == split and r["measure"] == measure
            and math.isclose(float(r["lr"]), float(side["lr"]))
            and stats.step_of(side, r["world"], int(r["seed"])) == int(r["step"])]
    if not rows:
        return None
    out: dict[str, Any] = {"items": len(rows), "samples": rows[0]["samples"]}
    for k in ks:
        usable = [r for r in rows if k <= r["samples"]]
        if not usable:
            continue
        out[f"pass@{k}"] = sum(pass_at_k(r["samples"], r["successes"], k) for r in usable) / len(usable)
        out[f"pass^{k}"] = sum(pass_hat_k(r["samples"], r["successes"], k) for r in usable) / len(usable)
    return out


def decoding_results(items: Sequence[dict[str, Any]], chosen: dict[str, dict[str, Any]],
                     rule: DecodingRule, train_temperature: float,
                     measure: str = "turn") -> dict[str, Any]:
    """The report's decoding block: every arm's dev scores over the grid on `measure` (the
    demo's selection measure), its dev-best temperature there, the same on turn accuracy beside
    it (`dev_turn`, `best_turn`: reported, never read by a verdict), and pass@k / pass^k on
    eval at the training temperature."""
    cells = dev_cells(items, chosen, rule.temperatures, train_temperature, measure)
    turn = cells if measure == "turn" else dev_cells(items, chosen, rule.temperatures,
                                                     train_temperature, "turn")
    passes = {m: p for m, side in chosen.items()
              if (p := pass_rates(items, side, rule.pass_k)) is not None}

    def shown(by: dict[str, dict[float, tuple[float, int]]]) -> dict[str, dict[str, float]]:
        return {m: {f"{t:g}": s for t, (s, _) in sc.items()} for m, sc in by.items()}

    return {"rule": RULE, "measure": measure, "temperatures": rule.temperatures,
            "train_temperature": train_temperature, "dev": shown(cells), "best": dev_best(cells),
            "dev_turn": shown(turn), "best_turn": dev_best(turn), "pass": passes}
