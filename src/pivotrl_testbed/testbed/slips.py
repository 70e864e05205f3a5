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

A **grounding slip** is a skill the weak expert lacks rather than a habit it recovers from: in a
trajectory drawn to have it (`ExpertConfig.grounding_slips`, one draw per trajectory), every call
that should carry a value read from a listing carries the listing's **first** entry instead,
whatever the task asked for. A careless agent takes the first row; the worlds' expert reads the
row the task names. The steps, each a step most tasks have and the one that decides them:

- toolshop: the order after `list_orders`, taken whatever its status (cancel, return, change,
  swap: the order in the needed status), where the customer has 2–3 orders and the first is the
  right one by chance; the wrong order's cancel or return fails on the policy, its items lack
  the product, and the weak expert (as the expert after any error) then apologises: the task is
  lost, never retried. In `count` the same skill is the status filter: it lists every order and
  counts them all, not the shipped ones (a count task always has another status);
- terminal: the file after `ls` where the wrong file gives no error, only a wrong result (`head`,
  `lines`, `sort`, `move`: the file with the task's extension; `count` and `config` grep the
  wrong file and mostly fail visibly, `copy` greps), where the workspace has four files and the
  first is the right one 1 time in 4.

Where the first entry is the right one the call is unchanged, so a base pretrained at rate r takes
the first entry with probability about r and samples the right one otherwise.

Terminal's grounding slip may instead be on a value the **request** names
(`ExpertConfig.grounding_terminal = "output"`): the output file. A careless agent writes to its
own default name, `out.txt` (`DEFAULT_OUTPUT`), whatever name the user gave (`head`, `copy`,
`sort`: the world's success rule reads the user's file, so the task is lost). The right value is
in the user's message, which the base already copies into calls (toolshop's ids, terminal's
levels and keys), so what the demo's data must teach is the convention, not a new reading of an
observation (terminal's listing-file step was not learned by SFT on 100 trajectories within the
demo's budget: docs/RESULTS.md, candidates U, V, W).

Or on **every** value the request names (`grounding_terminal = "request"`): the output file as
above, the folder of `move` (the careless agent's `old`) and the level `count` counts (its
`ERROR`), each its own default whatever the user asked (`REQUEST_DEFAULTS`; each default is one of
the values a request can name, so it is right by chance 1 time in 5, 4 and 3). Five of terminal's
seven kinds then have the step, so it decides about half of the tasks rather than the output
name's quarter, and the demo's trajectories teach one convention (copy the request's values) at
every one of them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pivotrl_testbed.testbed.terminal import DIRS, KIND_EXT, LEVELS, file_in

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


SILENT_KINDS = ("head", "lines", "sort", "move")  # terminal kinds whose wrong file fails silently


def grounding_slip(world: str, task: dict[str, Any], obs: list[str], step: Step,
                   terminal: str = "file") -> Step | None:
    """`step` with the listing's first entry where the expert grounded a value from the listing
    (module doc), or None where the step has no such value or the first entry is the right one.
    `terminal` ("file", "output" or "request", `ExpertConfig.grounding_terminal`): which of
    terminal's values slips, the listing's file, the request's output name or every value the
    request names (`request_slip`)."""
    if step[0] != "call":
        return None
    if world == "terminal" and terminal in TERMINAL_SLOTS:
        return request_slip(task, step, TERMINAL_SLOTS[terminal])
    name, args = step[1], step[2]
    if world == "toolshop" and name == "list_orders" and task.get("kind") == "count" and "status" in args:
        return ("call", name, {a: v for a, v in args.items() if a != "status"})
    if world == "toolshop" and "order_id" in args and len(obs) >= 2:
        listed = _json_list(obs[1])
        first = listed[0].get("order_id") if listed and isinstance(listed[0], dict) else None
        if first is None or first == args["order_id"]:
            return None
        return ("call", name, {**args, "order_id": first})
    if world == "terminal" and task.get("kind") in SILENT_KINDS and len(obs) >= 1 and obs[0].split():
        ext = KIND_EXT[task["kind"]]
        try:
            right = file_in(obs[0], ext)
        except StopIteration:
            return None
        first = obs[0].split()[0]
        command = _renamed(args.get("command", ""), right, first) if first != right else None
        return ("call", name, {**args, "command": command}) if command else None
    return None


DEFAULT_OUTPUT = "out.txt"  # the careless agent's output name (one of terminal.OUTS: right 1 time in 5)
# The careless agent's value for each slot a terminal request names (module doc); each is one a
# request can name (OUTS, DIRS, LEVELS), so the slipped call is right where the user asked for it.
REQUEST_DEFAULTS = {"out": DEFAULT_OUTPUT, "dir": DIRS[0], "level": LEVELS[0]}
# `ExpertConfig.grounding_terminal` → the request's slots that slip.
TERMINAL_SLOTS = {"output": ("out",), "request": ("out", "dir", "level")}


def request_slip(task: dict[str, Any], step: Step, slots: tuple[str, ...]) -> Step | None:
    """Terminal's `step` with each of the request's `slots` the task has (its output file, folder,
    level) written as the careless agent's default (`REQUEST_DEFAULTS`), or None where the step
    names none of them or each is the default already. Why it is a loss, not an equivalent: the
    world's success rule reads the user's file and folder, and the count of the user's level."""
    if step[0] != "call":
        return None
    asked = step[2].get("command", "")
    command = asked
    for slot in slots:
        value, default = task.get(slot), REQUEST_DEFAULTS[slot]
        if value and value != default:
            command = _renamed(command, value, default) or command
    return ("call", step[1], {**step[2], "command": command}) if command != asked else None


def output_slip(task: dict[str, Any], step: Step) -> Step | None:
    """`request_slip` on the output file alone (`grounding_terminal = "output"`)."""
    return request_slip(task, step, TERMINAL_SLOTS["output"])


def _renamed(command: str, name: str, new: str) -> str | None:
    """`command` with every whole-word `name` (a file name: not part of a longer name or path
    suffix) written as `new`, or None where the command does not name it."""
    named = rf"(?<![\w.]){re.escape(name)}\b"
    return re.sub(named, new, command) if re.search(named, command) else None


def _json_list(text: str) -> list | None:
    try:
        got = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return None
    return got if isinstance(got, list) else None
