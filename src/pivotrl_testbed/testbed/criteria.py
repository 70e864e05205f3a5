"""The acceptance criteria for a base with headroom (docs/RESULTS.md), checked from a build
record and the item rows of an SFT-only demo run on that build.

Each criterion is met, not met, or open (its measure is missing), with the numbers it read. The
run is `scripts/headroom_criteria.py BUILD --config CONFIG --out DIR`: the demo with the SFT arm
only, its own budget rule and selection, the dev split also scored greedily (so the base's dev
episodes and OOD are there); every number below is on dev.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from pivotrl_testbed.stats import step_of
from pivotrl_testbed.testbed.agentic_ood import AGENTIC_FAMILIES, family_of

GAIN = 0.05  # SFT − base, greedy dev turn accuracy, each world
Q_FLOOR, Q_MIN_TURNS = 0.1, 20  # per-sample success at each turn position with ≥ 20 turns
EPISODES = (0.10, 0.50)  # the base's greedy dev episode success, each world
OOD_FLOOR = 0.9  # the base's greedy dev accuracy, each non-agentic family
# The base's greedy dev accuracy, each agentic-format family (agentic_ood.py): high enough that a
# drop after training on the worlds is the loss of a skill the base had, with room below it to
# show that drop.
AGENTIC_OOD_FLOOR = 0.6


def _mean(rows: Sequence[dict[str, Any]]) -> float | None:
    return sum(float(r["outcome"]) for r in rows) / len(rows) if rows else None


def _verdict(ok: bool | None) -> str:
    return "open" if ok is None else "met" if ok else "not met"


def dev_rates(items: Sequence[dict[str, Any]], method: str, side: dict[str, Any] | None,
              measure: str) -> dict[str, float | None]:
    """{world: mean greedy dev outcome} of `method` at `side`'s checkpoints (each world's run
    at its own step, `stats.step_of`; None: every checkpoint)."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in items:
        if (r["method"] == method and r["split"] == "dev" and r["measure"] == measure
                and r.get("decoding", "greedy") == "greedy"
                and (side is None or step_of(side, r["world"], int(r["seed"])) == int(r["step"]))):
            by[r["world"]].append(r)
    return {w: _mean(rows) for w, rows in by.items()}


def check(build: dict[str, Any], items: Sequence[dict[str, Any]],
          sft: dict[str, Any] | None) -> dict[str, Any]:
    """Every criterion of docs/RESULTS.md's list: {name: {"verdict", ...numbers}}. `sft`: SFT's
    dev-chosen side (`stats.choose`), None: SFT has none."""
    worlds = build.get("config", {}).get("worlds", [])
    base_seed = min((int(r["seed"]) for r in items if r["method"] == "base"), default=0)
    base_items = [r for r in items if r["method"] != "base" or int(r["seed"]) == base_seed]
    out: dict[str, Any] = {}

    seen = build.get("pretrain_in_domain")
    out["1_in_domain_only_through_demo_data"] = {
        "pretraining_examples_with_world_names": seen,
        "verdict": _verdict(None if seen is None else all(v == 0 for v in seen.values()))}

    lists = build.get("pretrain_world_lists")
    out["1b_world_met_only_through_demo_data"] = {
        "pretraining_examples_with_world_tool_list": lists,
        "verdict": _verdict(None if lists is None else all(v == 0 for v in lists.values()))}

    base = dev_rates(base_items, "base", None, "turn")
    sft_rates = dev_rates(items, "sft", sft, "turn") if sft else {}
    gains = {w: (sft_rates[w] - base[w]) if sft_rates.get(w) is not None and base.get(w) is not None
             else None for w in worlds}
    out["2_learning_is_possible"] = {
        "base": base, "sft": sft_rates, "sft_steps": sft and sft["steps"], "gain": gains,
        "verdict": _verdict(None if any(g is None for g in gains.values()) or not gains
                            else all(g >= GAIN for g in gains.values()))}

    by_pos = (build.get("base") or {}).get("by_position") or {}
    low = {w: {pos: v["q"] for pos, v in by_pos.get(w, {}).items()
               if v["turns"] >= Q_MIN_TURNS and v["q"] < Q_FLOOR} for w in worlds}
    out["3_pivots_exist_everywhere"] = {
        "below_floor": low, "by_position": by_pos,
        "verdict": _verdict(None if not all(w in by_pos for w in worlds)
                            else not any(low.values()))}

    eps = dev_rates(base_items, "base", None, "episode")
    out["4_episodes_neither_solved_nor_hopeless"] = {
        "base": eps, "verdict": _verdict(None if not all(eps.get(w) is not None for w in worlds)
                                         else all(EPISODES[0] <= eps[w] <= EPISODES[1] for w in worlds))}

    fam: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in base_items:
        if (r["method"] == "base" and r["split"] == "dev" and r["measure"] == "ood"
                and r.get("decoding", "greedy") == "greedy"):
            fam[family_of(r["item"])].append(r)
    ood = {f: _mean(rows) for f, rows in sorted(fam.items()) if f not in AGENTIC_FAMILIES}
    out["5_ood_is_there_to_lose"] = {
        "base": ood, "verdict": _verdict(all(v >= OOD_FLOOR for v in ood.values()) if ood else None)}
    agentic = {f: _mean(rows) for f, rows in sorted(fam.items()) if f in AGENTIC_FAMILIES}
    out["6_agentic_ood_can_move"] = {
        "base": agentic, "floor": AGENTIC_OOD_FLOOR,
        "verdict": _verdict(all(v >= AGENTIC_OOD_FLOOR for v in agentic.values()) if agentic else None)}
    out["7_default_demo_within_20_min"] = {"verdict": "open",
                                           "why": "measured by a default demo run on the base"}
    return out


def in_domain_examples(world: str, trajectories: list) -> int:
    """How many pretraining trajectories hold one of `world`'s own tool names or its system
    prompt: 0 when the base meets the world only through the demo's data."""
    from pivotrl_testbed.testbed.tasks import world_module

    mod = world_module(world)
    names = {t["function"]["name"] for t in mod.TOOLS}
    return sum(bool(names & {t["function"]["name"] for t in traj.tools or []})
               or any(m.role == "system" and m.content == mod.SYSTEM_PROMPT for m in traj.messages)
               for traj in trajectories)


def world_list_examples(world: str, trajectories: list) -> int:
    """How many pretraining trajectories hold `world`'s whole tool list (every tool name and
    argument key the world has) or its system prompt: 0 when the base never met the world as
    such, though it may have met some of its names elsewhere (`variant_names: shared`)."""
    from pivotrl_testbed.testbed.tasks import world_module

    mod = world_module(world)
    own = {(t["function"]["name"], k) for t in mod.TOOLS for k in t["function"]["parameters"]["properties"]}

    def listed(traj) -> set:
        return {(t["function"]["name"], k) for t in traj.tools or []
                for k in t["function"].get("parameters", {}).get("properties", {})}

    return sum(own <= listed(traj)
               or any(m.role == "system" and m.content == mod.SYSTEM_PROMPT for m in traj.messages)
               for traj in trajectories)


