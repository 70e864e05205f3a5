"""The acceptance criteria for a base whose missing skill costs whole tasks (docs/RESULTS.md,
"Acceptance criteria for a base whose missing skill costs tasks"), checked from a build record,
the item rows of an SFT-only demo run on that build, and the base's rescue record
(`testbed/rescue.py`).

The earlier criteria (`criteria.py`) asked for headroom in turn accuracy; a base met them whose
headroom was a habit it recovered from within the episode, so no arm finished more tasks than it.
These ask for headroom in **episode success**, caused by a step the demo's data teaches:

- `sft_gain`: SFT on the demo's data, each world's run at its own checkpoint, with the lr,
  chosen on greedy dev episode success (`stats.choose`), raises greedy dev episode success by ≥
  `EPISODE_GAIN` in each world;
- `base_episodes`: the base's greedy dev episode success is within `EPISODES` in each world;
- `pivots`: the base's per-sample success q is ≥ `Q_FLOOR` at every turn position with ≥
  `Q_MIN_TURNS` turns that holds a planted step (the build record's `by_position`; where the
  steps sit, `testbed/planted.py`), in each world; positions without one are reported beside
  it (`unplanted_below_floor`), not judged. Amended after the six candidates U–Z were judged on
  every position (docs/RESULTS.md, "The pivot criterion as it was meant"): the criterion is
  there so that pivots exist where tasks are decided, and a shortfall at a position that
  decides nothing can only handicap PivotRL;
- `ood` / `agentic_ood`: the base's greedy dev accuracy ≥ `OOD_FLOOR` on each non-agentic OOD
  family, ≥ `AGENTIC_OOD_FLOOR` on each agentic-format one;
- `ood_can_move`: SFT trained past its chosen point (a later checkpoint at its chosen lr, or any
  checkpoint at ≥ `OVERTRAIN_LR` × that lr) moves some OOD family's greedy dev accuracy by ≥
  `OOD_MOVE` from the base's, so that "SFT forgets" is a claim the measure could show;
- `rescue`: on the base's failed greedy dev episodes, replacing its action at the deciding step
  (its first action the world's verifier does not accept as the expert's at the same state) by
  the expert's, and continuing greedily, succeeds in ≥ `RESCUE_MIN` of them, in each world;
- `self_rescue`: of the base's greedy dev episodes with such a wrong step, ≤ `SELF_RESCUE_MAX`
  succeed anyway (the base does not recover from its own wrong step), in each world.

Each is met, not met, or open (its measure is missing), with the numbers it read. Every number
is on dev, greedy. The run: `scripts/task_criteria.py BUILD --config CONFIG --out DIR`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from pivotrl_testbed.stats import choose, step_of
from pivotrl_testbed.testbed.agentic_ood import AGENTIC_FAMILIES, family_of
from pivotrl_testbed.testbed.criteria import AGENTIC_OOD_FLOOR, OOD_FLOOR, Q_FLOOR, Q_MIN_TURNS

EPISODE_GAIN = 0.10  # SFT − base, greedy dev episode success, each world
EPISODES = (0.10, 0.50)  # the base's greedy dev episode success, each world
OOD_MOVE = 0.05  # some OOD family, |SFT past its chosen point − base|, greedy dev
OVERTRAIN_LR = 3.0  # "past its chosen point" includes every checkpoint at ≥ 3× the chosen lr
RESCUE_MIN = 0.5  # the expert's action at the deciding step rescues this share of failed episodes
SELF_RESCUE_MAX = 0.2  # the base recovers from its own wrong step in at most this share


def _verdict(ok: bool | None) -> str:
    return "open" if ok is None else "met" if ok else "not met"


def greedy_dev(items: Sequence[dict[str, Any]], measure: str) -> list[dict[str, Any]]:
    return [r for r in items if r["split"] == "dev" and r["measure"] == measure
            and r.get("decoding", "greedy") == "greedy"]


def _means(rows: Sequence[dict[str, Any]], key) -> dict[Any, float]:
    acc: dict[Any, list[float]] = defaultdict(list)
    for r in rows:
        acc[key(r)].append(float(r["outcome"]))
    return {k: sum(v) / len(v) for k, v in acc.items()}


def base_rows(items: Sequence[dict[str, Any]], measure: str) -> list[dict[str, Any]]:
    """The base's greedy dev rows of `measure`, from its first seed (the base is one model)."""
    rows = [r for r in greedy_dev(items, measure) if r["method"] == "base"]
    first = min((int(r["seed"]) for r in rows), default=0)
    return [r for r in rows if int(r["seed"]) == first]


def sft_choice(items: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """SFT's checkpoint and lr chosen on greedy dev episode success, by the demo's own rule
    (`stats.choose`), or None when SFT has no dev episodes."""
    return choose(greedy_dev(items, "episode"), measure="episode").get("sft")


def _at(rows: Sequence[dict[str, Any]], chosen: dict[str, Any]) -> list[dict[str, Any]]:
    """SFT's rows at its chosen checkpoints: each world's run at its own step."""
    return [r for r in rows if r["method"] == "sft" and abs(float(r["lr"]) - float(chosen["lr"])) < 1e-12
            and step_of(chosen, r["world"], int(r["seed"])) == int(r["step"])]


def past_chosen(rows: Sequence[dict[str, Any]], chosen: dict[str, Any]) -> list[dict[str, Any]]:
    """SFT rows trained past its chosen point (each world's run past its own chosen step): later
    steps at its lr, every step at ≥ 3× it."""
    lr = float(chosen["lr"])
    out = []
    for r in rows:
        step = step_of(chosen, r["world"], int(r["seed"]))
        if r["method"] != "sft" or step is None:
            continue
        same_lr = abs(float(r["lr"]) - lr) < 1e-12
        if (same_lr and int(r["step"]) > step) or float(r["lr"]) >= OVERTRAIN_LR * lr - 1e-12:
            out.append(r)
    return out


def check(build: dict[str, Any], items: Sequence[dict[str, Any]],
          rescue: dict[str, dict[str, int]] | None,
          to_cap: Sequence[dict[str, Any]] = (),
          planted: dict[str, dict[str, dict[str, Any]]] | None = None) -> dict[str, Any]:
    """Every criterion of the module doc: {name: {"verdict", ...numbers}}. `rescue`: {world:
    {"failed", "rescued", "departed", "self_rescued"}} (`testbed/rescue.py`), None: open.
    `to_cap`: rows of SFT runs trained to their cap without the plateau stop; read only by
    `ood_can_move` (past the chosen point), never by the choice. `planted`: {world: {position:
    {"planted": n, ...}}} (`planted.planted_by_position`), None: `pivots` is open."""
    worlds = build.get("config", {}).get("worlds", [])
    out: dict[str, Any] = {}

    base_eps = _means(base_rows(items, "episode"), lambda r: r["world"])
    chosen = sft_choice(items)
    sft_eps = _means(_at(greedy_dev(items, "episode"), chosen), lambda r: r["world"]) if chosen else {}
    gain = {w: (sft_eps[w] - base_eps[w]) if w in sft_eps and w in base_eps else None for w in worlds}
    out["sft_gain"] = {
        "base": base_eps, "sft": sft_eps, "gain": gain, "floor": EPISODE_GAIN,
        "sft_chosen": chosen and {"lr": chosen["lr"], "steps": chosen["steps"]},
        "verdict": _verdict(None if not worlds or any(g is None for g in gain.values())
                            else all(g >= EPISODE_GAIN - 1e-12 for g in gain.values()))}

    out["base_episodes"] = {
        "base": base_eps, "range": list(EPISODES),
        "verdict": _verdict(None if not worlds or any(w not in base_eps for w in worlds)
                            else all(EPISODES[0] <= base_eps[w] <= EPISODES[1] for w in worlds))}

    out["pivots"] = pivots_criterion(build, planted, worlds)

    base_fam = _means(base_rows(items, "ood"), lambda r: family_of(r["item"]))
    plain = {f: v for f, v in sorted(base_fam.items()) if f not in AGENTIC_FAMILIES}
    agentic = {f: v for f, v in sorted(base_fam.items()) if f in AGENTIC_FAMILIES}
    out["ood"] = {"base": plain, "floor": OOD_FLOOR,
                  "verdict": _verdict(all(v >= OOD_FLOOR for v in plain.values()) if plain else None)}
    out["agentic_ood"] = {"base": agentic, "floor": AGENTIC_OOD_FLOOR,
                          "verdict": _verdict(all(v >= AGENTIC_OOD_FLOOR for v in agentic.values())
                                              if agentic else None)}

    moves: dict[str, float] = {}
    if chosen:
        later = _means(past_chosen(greedy_dev(items, "ood"), chosen)
                       + [{**r, "step": -int(r["step"])} for r in past_chosen(greedy_dev(to_cap, "ood"), chosen)],
                       lambda r: (family_of(r["item"]), float(r["lr"]), int(r["seed"]), int(r["step"])))
        for (fam, lr, seed, step), v in later.items():
            if fam in base_fam:
                key = f"{fam} lr={lr:g} seed={seed} step={abs(step)}{' (run to the cap)' if step < 0 else ''}"
                moves[key] = round(v - base_fam[fam], 4)
    biggest = max(moves.items(), key=lambda kv: abs(kv[1]), default=None)
    out["ood_can_move"] = {"largest_move": biggest, "checkpoints_read": len(moves), "floor": OOD_MOVE,
                           "verdict": _verdict(None if not moves
                                               else abs(biggest[1]) >= OOD_MOVE - 1e-12)}

    rates = {w: rescue_rates(rescue[w]) for w in worlds if rescue and w in rescue}
    complete = bool(worlds) and len(rates) == len(worlds)
    out["rescue"] = {"by_world": rates, "floor": RESCUE_MIN, "verdict": _verdict(
        None if not complete else all(r["rescue"] is not None and r["rescue"] >= RESCUE_MIN
                                      for r in rates.values()))}
    out["self_rescue"] = {"by_world": rates, "ceiling": SELF_RESCUE_MAX, "verdict": _verdict(
        None if not complete else all(r["self_rescue"] is not None
                                      and r["self_rescue"] <= SELF_RESCUE_MAX for r in rates.values()))}
    return out


def pivots_criterion(build: dict[str, Any], planted: dict[str, dict[str, dict[str, Any]]] | None,
                     worlds: Sequence[str]) -> dict[str, Any]:
    """`pivots` (module doc): q below the floor at a position with enough turns, split into the
    positions that hold a planted step (judged) and the rest (reported)."""
    by_pos = (build.get("base") or {}).get("by_position") or {}
    low = {w: {pos: v["q"] for pos, v in by_pos.get(w, {}).items()
               if v["turns"] >= Q_MIN_TURNS and v["q"] < Q_FLOOR} for w in worlds}
    held = {w: {pos for pos, row in (planted or {}).get(w, {}).items() if row["planted"] > 0}
            for w in worlds}
    judged = {w: {p: q for p, q in low[w].items() if p in held[w]} for w in worlds}
    known = bool(worlds) and planted is not None and all(w in by_pos and w in planted for w in worlds)
    return {"below_floor": judged,
            "unplanted_below_floor": {w: {p: q for p, q in low[w].items() if p not in held[w]}
                                      for w in worlds},
            "planted_positions": {w: sorted(held[w], key=int) for w in worlds},
            "floor": Q_FLOOR, "min_turns": Q_MIN_TURNS,
            "verdict": _verdict(not any(judged.values()) if known else None)}


def rescue_rates(counts: dict[str, int]) -> dict[str, Any]:
    """{"rescue": rescued / failed, "self_rescue": self_rescued / departed, ...counts}; a rate
    with an empty denominator is None (not met: nothing showed the step decides tasks)."""
    def rate(a: str, b: str) -> float | None:
        return round(counts[a] / counts[b], 4) if counts.get(b) else None

    return {**counts, "rescue": rate("rescued", "failed"), "self_rescue": rate("self_rescued", "departed")}
