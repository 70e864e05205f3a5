"""Where a base's planted steps sit: per world and turn position, how many of the demo's expert
turns hold a step at which the recipe's weak expert makes a planted wrong action.

A recipe plants a step through its weak expert (`testbed/slips.py`): a grounding slip (a value
read from a listing, or named by the request, taken wrong), a slip (a habitual wrong form) or a
false start (a wrong first call). A base pretrained on that expert's trajectories inherits the
wrong action there, so those are the steps the demo's data has to teach, and where PivotRL needs
pivots. Which positions hold them is a fact of the recipe and the demo's data, not of the
weights: it is computed here from the config and the expert's trajectories, with the weak
expert's own slip functions, so nothing is hand-listed.

A turn holds a planted step of a kind when any of the recipe's pretraining mixtures (the build's
own and each stage's) plants that kind at a non-zero rate and the kind's slip function returns a
wrong action for the expert's step in that state; a slip that would leave the step unchanged
(the listing's first entry is the right one) plants nothing there.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any

from pivotrl.io.records import Trajectory, iter_valid
from pivotrl_testbed.testbed.experts import observations
from pivotrl_testbed.testbed.slips import false_start, grounding_slip, slip
from pivotrl_testbed.testbed.stages import stage_config


def plant_kinds(cfg: Any) -> set[str]:
    """The kinds of planted step of a TestbedConfig's recipe, over its build mixture and every
    stage's: "false_start", "slip", "grounding:<terminal mode>"."""
    kinds: set[str] = set()
    for mix in [cfg.with_stages(0)] + [stage_config(cfg, i) for i in range(len(cfg.pretrain_stages))]:
        if mix.weak_false_starts > 0:
            kinds.add("false_start")
        if mix.weak_slips > 0:
            kinds.add("slip")
        if mix.weak_grounding_slips > 0:
            kinds.add(f"grounding:{mix.weak_grounding_terminal}")
    return kinds


def planted_at(world: str, task: dict[str, Any], context: list, message, position: int,
               kinds: set[str]) -> list[str]:
    """The planted kinds (of `kinds`) that the expert's `message` at `position` (0-based assistant
    ordinal) after `context` holds."""
    if not message.tool_calls:
        return []
    call = message.tool_calls[0]
    step = ("call", call.function.name, call.args())
    obs = observations(context)
    held = []
    for kind in sorted(kinds):
        if kind == "false_start":
            hit = position == 0 and false_start(world, task) is not None
        elif kind == "slip":
            hit = slip(world, task, obs, step) is not None
        else:
            hit = grounding_slip(world, task, obs, step, kind.split(":", 1)[1]) is not None
        if hit:
            held.append(kind)
    return held


def planted_by_position(world: str, trajectories: Iterable[Trajectory],
                        kinds: set[str]) -> dict[str, dict[str, Any]]:
    """{position: {"turns": n, "planted": turns holding any planted step, "by_kind": {kind: n}}}
    over the expert's assistant turns, positions as in the build record's `by_position`."""
    out: dict[str, dict[str, Any]] = {}
    for traj in trajectories:
        task = traj.metadata["task"]
        position = 0
        for i, msg in enumerate(traj.messages):
            if msg.role != "assistant":
                continue
            held = planted_at(world, task, traj.messages[:i], msg, position, kinds)
            row = out.setdefault(str(position), {"turns": 0, "planted": 0, "by_kind": {}})
            row["turns"] += 1
            row["planted"] += bool(held)
            for kind in held:
                row["by_kind"][kind] = row["by_kind"].get(kind, 0) + 1
            position += 1
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def planted_table(build: Path | None, cfg: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """{world: planted_by_position} over the first trajectories of each world's train split that
    the build record's `by_position` profiled: read from a build's `<world>/train.jsonl`, or, with
    `build` None, generated from the config (the demo's expert data depends only on the config)."""
    from pivotrl_testbed.testbed.build import SKILL_TRAJECTORIES
    from pivotrl_testbed.testbed.mixture import trajectories

    n = min(SKILL_TRAJECTORIES, cfg.n_train)
    kinds = plant_kinds(cfg)
    out = {}
    for w in cfg.worlds:
        trajs = (islice(iter_valid(build / w / "train.jsonl", Trajectory), n) if build
                 else trajectories(w, "train", n, cfg.expert_seed, None, 0, cfg.workers))
        out[w] = planted_by_position(w, trajs, kinds)
    return out
