"""The weak expert's slips: one plausible wrong action per kind of step, made as a habit.

A base that learns a world's mechanics from a weaker expert also learns that expert's habits.
Most of the weak expert's habits are harmless (`ExpertConfig.habit`: its preferred form among
equivalent ones) and its mistakes are noise (`ExpertConfig.noise`: a wrong id, then a retry). A
slip is neither: at a step that has one, the weak expert makes the same wrong action with
probability `ExpertConfig.slips`, and goes on as if it were right. A base pretrained on those
trajectories takes the slip for the way things are done, so its greedy action there is wrong
while its samples are sometimes right (q about 1 − slips); the worlds' expert never slips, so
the demo's trajectories teach what the base lacks: a new domain's conventions, by design rather
than by the luck of a run (docs/RESULTS.md, "Candidates").

The slips, each a reading of the request a careless agent makes, and each wrong by the world's
own success rule:

- toolshop: `place_order` / `return_item` without `qty` when the user asked for more than one
  (the schema's default is 1: the order or the return is for one item);
- terminal `sort`: `sort f > out`, keeping the duplicates the user asked to drop (wrong whenever
  the file has one);
- terminal `move`: `cp f dir/`, leaving the original where the user asked it moved.
"""

from __future__ import annotations

from typing import Any

from pivotrl_testbed.testbed.terminal import file_in

Step = tuple[str, Any, Any]  # an expert step (experts.Step): ("call", name, args) or ("say", text)


def slip(world: str, task: dict[str, Any], obs: list[str], step: Step) -> Step | None:
    """The slipped version of the expert's `step` at this point of `task`, or None where the
    world has no slip (module doc)."""
    if step[0] != "call":
        return None
    name, args = step[1], step[2]
    kind, k = task.get("kind"), len(obs)
    if world == "toolshop" and name in ("place_order", "return_item") and int(task.get("qty", 1)) > 1:
        return ("call", name, {a: v for a, v in args.items() if a != "qty"})
    if world == "terminal" and kind == "sort" and k == 1:
        return ("call", name, {"command": f"sort {file_in(obs[0], 'txt')} > {task['out']}"})
    if world == "terminal" and kind == "move" and k == 2:
        return ("call", name, {"command": f"cp {file_in(obs[0], 'log')} {task['dir']}/"})
    return None
