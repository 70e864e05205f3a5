"""The weak expert's slips and false starts: plausible wrong actions, made as a habit.

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

A slip sits at a step few trajectories have (a quarter of them), so it is a few percent of the
turns, and a habit pretrained at 0.8 was not undone by the demo's data within its budget
(docs/RESULTS.md, candidate N). A **false start** sits at the one step every trajectory has, the
first call: with probability `ExpertConfig.false_starts` the weak expert opens with its world's
wrong first call, reads the error, and then makes the right one (as it recovers from a wrong id).
Its episodes still succeed, so a base that pretrains on it keeps its episodes; at a rate above
one half its greedy first call is the false start, while its samples open right about as often
as the weak expert did; the worlds' expert never starts falsely. The false starts, each an error in the
world (never a state change) and never equivalent to the expert's first call:

- toolshop: `get_customer` with the user's e-mail as the `customer_id` (the id tool where the
  lookup by e-mail goes): "no customer …";
- terminal: `ls data` (a folder the agent assumes and no workspace has: `DIRS` never holds it).
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


ASSUMED_DIR = "data"  # terminal's false start lists it; no workspace has it (not in DIRS)


def false_start(world: str, task: dict[str, Any]) -> Step | None:
    """The weak expert's wrong first call in `world` for `task` (module doc), or None where the
    world has none."""
    if world == "toolshop" and task.get("email"):
        return ("call", "get_customer", {"customer_id": task["email"]})
    if world == "terminal":
        return ("call", "run", {"command": f"ls {ASSUMED_DIR}"})
    return None
