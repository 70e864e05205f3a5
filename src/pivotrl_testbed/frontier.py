"""The paper's joint claim read on each arm's frontier: in-domain gain against OOD retention,
matched on the dev split, measured on the eval split.

The paper claims that, from the same base and trajectories, PivotRL gains more in-domain than SFT
*and* keeps the OOD accuracy SFT loses. Comparing each arm's best dev checkpoint can pit an arm
that barely trained against one that did; these rules compare the arms where both moved. They are
fixed here, in code, before any result is read.

Points (`arm_points`), dev split, one decoding (`FrontierConfig.decoding`): every training
  step t of an arm at an lr is a point: the side {method, lr, steps: {world: {seed: step}}} of
  each world-run's checkpoint at t, its seeds and worlds together, with gain = its paired
  difference against the base on the in-domain measure (`FrontierConfig.measure`) and retention
  = the same on OOD (stats.paired on split "dev": 0 for the base, negative when the arm forgot),
  each with its cluster-bootstrap interval, and its mean KL to the base on OOD text (from the
  checkpoint rows). The budget rule (`budget.py`) stops each world-run on its own, so a run that
  stopped before t stands at t with its last checkpoint (its model stays where it stopped, as
  in stats.rollout_ratio): dropping it would leave the runs still improving to stand alone for
  the arm, and cutting the others there would bring back one world's plateau stopping another's
  run. t counts once every run has reached its first checkpoint.

Frontier: the Pareto set of an arm's points (`plots.frontier`: a point is on it when no point of
  the same arm has a higher gain and a retention at least as high).

Matched pairs (`match`), arm a = PivotRL, arm b = SFT by default:
  (a) OOD retention at matched in-domain gain: for every point p on a's frontier with dev gain
      > 0 (an arm that did not move tests nothing), the checkpoint q of arm b (any lr and step,
      on its frontier or not) whose dev gain is nearest p's, if |gain_p − gain_q| ≤ `tolerance`;
      ties go to the q with the higher retention, then the smaller lr and the earlier step (in
      b's favour: the rule can only make a's case harder). Of these pairs, the one at the
      largest gain of p is THE matched pair (where both arms moved most); none = not measurable.
  (b) in-domain gain at matched OOD retention: the same with retention as the matching
      coordinate (ties: q's higher gain, smaller lr, earlier step); THE pair is again the one at
      p's largest gain.
  (c) at matched KL to the base (equal drift, on OOD text): the same with KL as the matching
      coordinate, matched within a relative tolerance (|KL_q − KL_p| ≤ `kl_tolerance` × KL_p:
      KL has no natural absolute scale) and ties to q's higher retention; the one pair is judged
      twice, on OOD and in-domain (which arm spends the same drift better).
Verdicts (`joint`): each matched pair compared on the eval split by stats.paired (a − b): (a) on
  OOD, (b) on the in-domain measure, for every decoding scored (greedy and sampled; the pair is
  matched once, on `decoding`); "met" / "not met" / "within noise" by stats.verdict. The eval
  split is scored at exactly these checkpoints (`matched_sides` → checkpoint_eval.eval_targets),
  chosen on dev only.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pivotrl_testbed import stats
from pivotrl_testbed.checkpoint_eval import DECODINGS, decoded

Row = dict[str, Any]
MATCHES = {  # name: (matching coordinate, eval measure judged, claim)
    "ood_at_matched_gain": ("gain", "ood", "OOD retention at matched in-domain gain (dev-matched, "
                            "eval-measured; paper: PivotRL keeps OOD where SFT loses it)"),
    "gain_at_matched_ood": ("retention", "in_domain", "In-domain gain at matched OOD retention "
                            "(dev-matched, eval-measured; paper: PivotRL gains more in-domain)"),
    "ood_at_matched_kl": ("kl_to_base", "ood", "OOD retention at matched KL to the base (equal "
                          "drift; dev-matched, eval-measured)"),
    "gain_at_matched_kl": ("kl_to_base", "in_domain", "In-domain gain at matched KL to the base "
                           "(equal drift; dev-matched, eval-measured)"),
}


class FrontierConfig(BaseModel):
    """How the joint claim is judged on the frontier (module doc)."""

    model_config = ConfigDict(extra="forbid")

    arms: tuple[str, str] = Field(("pivotrl", "sft"), description="(a, b): every verdict is a − b; "
                                  "a's frontier points are matched to b's checkpoints.")
    measure: Literal["turn", "episode"] = Field("turn", description="The in-domain measure of gain.")
    decoding: Literal["greedy", "sampled"] = Field("greedy", description="The decoding the dev "
                                                   "points are matched on (verdicts: every decoding).")
    tolerance: float = Field(0.02, ge=0, description="Largest |dev difference| on the matching "
                             "coordinate for two checkpoints to count as matched (≈ one 10-step "
                             "move of SFT's dev turn accuracy on the testbed).")
    kl_tolerance: float = Field(0.25, ge=0, description="Matching on KL to the base: largest "
                                "|KL_b − KL_a| as a share of KL_a.")
    replicates: int = Field(500, ge=50, description="Bootstrap replicates of each point's "
                            "descriptive interval (the verdicts use stats.paired's default).")


def mean_kl(rows: list[Row], side: dict[str, Any]) -> float | None:
    """Mean KL to the base over the checkpoint rows of `side`'s checkpoints."""
    kl = [r["kl_to_base"] for r in rows if r["method"] == side["method"]
          and math.isclose(r["lr"], side["lr"]) and r.get("kl_to_base") is not None
          and stats.step_of(side, r["world"], r["seed"]) == r["step"]]
    return mean(kl) if kl else None


def arm_points(items: list[Row], rows: list[Row], method: str, cfg: FrontierConfig,
               decoding: str | None = None) -> list[dict[str, Any]]:
    """Every training step of `method` at each lr as a point (module doc), sorted by lr and step."""
    mine = [r for r in decoded(items, decoding or cfg.decoding)
            if r["split"] == "dev" and r["method"] in (method, "base")]
    # {lr: {(world, seed): the steps that run was scored at}}
    runs: dict[float, dict[tuple[str, int], set[int]]] = defaultdict(lambda: defaultdict(set))
    for r in mine:
        if r["method"] == method and r["measure"] == cfg.measure:
            runs[float(r["lr"])][(r["world"], int(r["seed"]))].add(int(r["step"]))
    base = stats.base_side(mine)
    points = []
    for lr, by_run in sorted(runs.items()):
        for step in sorted(set().union(*by_run.values())):
            if any(min(got) > step for got in by_run.values()):
                continue  # a run has no checkpoint yet: the point would stand without it
            at: dict[str, dict[int, int]] = defaultdict(dict)
            for (world, seed), got in sorted(by_run.items()):
                at[world][seed] = max(s for s in got if s <= step)  # a stopped run: its last
            side = {"method": method, "lr": lr, "steps": dict(at)}
            point = _point(mine, rows, side, base, cfg)
            if point is not None:
                points.append({**point, "step": step})
    return points


def _point(mine: list[Row], rows: list[Row], side: dict[str, Any], base: dict[str, Any],
           cfg: FrontierConfig) -> dict[str, Any] | None:
    """One point (module doc) of `side` against `base`; None when nothing pairs."""
    gain = stats.paired(mine, side, base, measure=cfg.measure, split="dev", replicates=cfg.replicates)
    keep = stats.paired(mine, side, base, measure="ood", split="dev", replicates=cfg.replicates)
    if gain is None or keep is None:
        return None
    return {**side, "gain": gain["diff"], "gain_ci95": gain["ci95"], "retention": keep["diff"],
            "retention_ci95": keep["ci95"], "kl_to_base": mean_kl(rows, side)}


def pareto(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The frontier of gain and retention, sorted by gain (plots.frontier's rule)."""
    from pivotrl_testbed.plots import frontier

    return [p["point"] for p in frontier([{"gain": p["gain"], "ood": p["retention"], "point": p}
                                          for p in points], key="gain")]


def match(frontier_a: list[dict[str, Any]], points_b: list[dict[str, Any]], *, on: str,
          tolerance: float) -> dict[str, Any] | None:
    """THE matched pair on coordinate `on` ("gain", "retention" or "kl_to_base", whose
    `tolerance` is relative to a's KL), by the module doc's rule: {"a": point, "b": point,
    "distance"} or None."""
    other = "gain" if on == "retention" else "retention"
    best = None
    for p in sorted(frontier_a, key=lambda p: p["gain"]):
        if p["gain"] <= 0 or p.get(on) is None:
            continue
        width = tolerance * p[on] if on == "kl_to_base" else tolerance
        near = [q for q in points_b if q.get(on) is not None and abs(q[on] - p[on]) <= width + 1e-12]
        if not near:
            continue
        q = min(near, key=lambda q: (round(abs(q[on] - p[on]), 12), -q[other], q["lr"], q["step"]))
        if best is None or p["gain"] >= best["a"]["gain"]:
            best = {"a": p, "b": q, "distance": abs(q[on] - p[on])}
    return best


def side_of(point: dict[str, Any]) -> dict[str, Any]:
    return {k: point[k] for k in ("method", "lr", "steps")}


def matched(items: list[Row], rows: list[Row], cfg: FrontierConfig) -> dict[str, Any]:
    """Both arms' dev points and frontiers, and the matched pair of every rule in MATCHES."""
    a, b = cfg.arms
    pts = {arm: arm_points(items, rows, arm, cfg) for arm in (a, b)}
    front = {arm: pareto(p) for arm, p in pts.items()}
    pairs = {name: match(front[a], pts[b], on=on, tolerance=cfg.kl_tolerance
                         if on == "kl_to_base" else cfg.tolerance)
             for name, (on, _, _) in MATCHES.items()}
    return {"points": pts, "frontier": front, "pairs": pairs}


def matched_sides(items: list[Row], rows: list[Row], cfg: FrontierConfig) -> list[dict[str, Any]]:
    """The checkpoints the matched pairs stand on (dev only): the eval split must score them."""
    got = matched(items, rows, cfg)["pairs"]
    out: list[dict[str, Any]] = []
    for side in (side_of(pair[k]) for pair in got.values() if pair for k in ("a", "b")):
        if side not in out:  # the matched-KL pair serves two verdicts
            out.append(side)
    return out


def joint(items: list[Row], rows: list[Row], cfg: FrontierConfig) -> dict[str, Any]:
    """results.json's "joint" entry: the dev frontiers (of every decoding scored, for the plot)
    and each matched pair with its eval verdicts per decoding."""
    m = matched(items, rows, cfg)
    present = [d for d in DECODINGS if decoded(items, d)]
    curves = {d: m["points"] if d == cfg.decoding else
              {arm: arm_points(items, rows, arm, cfg, d) for arm in cfg.arms} for d in present}
    # A decoding the dev split was not scored in (only eval) has no points to draw.
    curves = {d: by_arm for d, by_arm in curves.items() if any(by_arm.values())}
    verdicts: dict[str, Any] = {}
    for name, (on, judged, claim) in MATCHES.items():
        pair = m["pairs"][name]
        entry: dict[str, Any] = {"claim": claim, "matched_on": on, "measure": judged,
                                 "tolerance": cfg.kl_tolerance if on == "kl_to_base" else cfg.tolerance,
                                 "pair": pair, "by_decoding": {}}
        for d in present:
            got = None
            if pair:
                measure = cfg.measure if judged == "in_domain" else "ood"
                got = stats.paired(decoded(items, d), side_of(pair["a"]), side_of(pair["b"]),
                                   measure=measure, split="eval")
            entry["by_decoding"][d] = {**(got or {}), "verdict": got["verdict"] if got
                                       else "not measurable"}
        verdicts[name] = entry
    return {"config": cfg.model_dump(mode="json"), "points": curves,
            "frontier": {arm: m["frontier"][arm] for arm in cfg.arms}, "verdicts": verdicts}


def plot_frontiers(result: dict[str, Any], out: Path) -> list[str]:
    """joint_frontier.png: each arm's dev points (gain vs retention, 95% intervals) per decoding,
    the frontier joined, the matched pairs linked. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = result.get("points") or {}
    if not curves:
        return []
    fig, axes = plt.subplots(1, len(curves), figsize=(6.5 * len(curves), 5), squeeze=False)
    for ax, (decoding, by_arm) in zip(axes[0], curves.items()):
        for arm, pts in by_arm.items():
            if not pts:
                continue
            xerr = [[p["gain"] - p["gain_ci95"][0] for p in pts], [p["gain_ci95"][1] - p["gain"] for p in pts]]
            yerr = [[p["retention"] - p["retention_ci95"][0] for p in pts],
                    [p["retention_ci95"][1] - p["retention"] for p in pts]]
            bar = ax.errorbar([p["gain"] for p in pts], [p["retention"] for p in pts], xerr=xerr,
                              yerr=yerr, fmt="o", alpha=0.45, label=f"{arm} (every lr × step)")
            front = pareto(pts)
            ax.plot([p["gain"] for p in front], [p["retention"] for p in front], "-",
                    color=bar[0].get_color(), label=f"{arm} frontier")
        if decoding == result["config"]["decoding"]:
            for name, v in result["verdicts"].items():
                if v["pair"]:
                    a, b = v["pair"]["a"], v["pair"]["b"]
                    ax.plot([a["gain"], b["gain"]], [a["retention"], b["retention"]], "k--", lw=1)
                    ax.annotate(name, (a["gain"], a["retention"]), fontsize=7)
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_xlabel(f"dev in-domain gain vs base ({result['config']['measure']}, {decoding})")
        ax.set_ylabel(f"dev OOD retention vs base ({decoding})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "joint_frontier.png", dpi=110)
    plt.close(fig)
    return ["joint_frontier.png"]
