"""The built-in testbed worlds: registry, task ids and splits, task records, `describe_testbed`.

Each world lives in its own module (`toolshop`, `terminal`) and exposes the same few names:
`NAME`, `TOOLS` (OpenAI tool schemas), `SYSTEM_PROMPT`, `KINDS` (task kinds), `generate(task_id,
rng) -> dict(user, world_config, goal, task)` and a World class registered with `register_world`.

A task is a Trajectory record holding only the system prompt and the user request; its metadata
carries everything an executor needs (docs/DESIGN.md): `world`, `world_config` (the initial state),
`goal` (what success means), `task_id`, `split`, and `task` (the parameters the user stated in
words: what an expert may read, never the hidden state).
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Iterator
from itertools import count, islice
from typing import Any

from pivotrl_testbed.testbed.common import EVAL_PERCENT, WORLDS, compact, stable_int  # noqa: F401
from pivotrl.io.records import Message, Trajectory

WORLD_MODULES = {w: f"pivotrl_testbed.testbed.{w}" for w in WORLDS}


def world_module(name: str):
    if name not in WORLD_MODULES:
        raise KeyError(f"unknown testbed world {name!r}; known: {', '.join(WORLD_MODULES)}")
    return importlib.import_module(WORLD_MODULES[name])


def split_of(task_id: str) -> str:
    return "eval" if stable_int("split", task_id) % 100 < EVAL_PERCENT else "train"


def _ids(world: str, split: str, start: int) -> Iterator[str]:
    """Every task id of `split`, enumerating `<world>-<i>` from i = start."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return (tid for i in count(start) if split_of(tid := f"{world}-{i}") == split)


def task_ids(world: str, split: str, n: int, start: int = 0) -> list[str]:
    """The first `n` task ids of `split`, enumerating `<world>-<i>` from i = start."""
    return list(islice(_ids(world, split, start), n))


def make_task(world: str, task_id: str) -> Trajectory:
    """The task record of one task id (deterministic: the id seeds everything)."""
    mod = world_module(world)
    spec = mod.generate(task_id, random.Random(stable_int(world, task_id)))
    return Trajectory(
        id=task_id,
        domain=world,
        tools=mod.TOOLS,
        messages=[Message(role="system", content=mod.SYSTEM_PROMPT),
                  Message(role="user", content=spec["user"])],
        metadata={"world": world, "world_config": spec["world_config"], "goal": spec["goal"],
                  "task_id": task_id, "split": split_of(task_id), "task": spec["task"]},
    )


def make_tasks(world: str, split: str, n: int, start: int = 0,
               kinds: list[str] | None = None) -> list[Trajectory]:
    """The first `n` tasks of `split` from `<world>-<start>` on; with `kinds`, the first `n` of
    those kinds (the others skipped)."""
    unknown = sorted(set(kinds or []) - set(world_module(world).KINDS))
    if unknown:
        raise ValueError(f"{world} has no task kinds {unknown}; its kinds: {world_module(world).KINDS}")
    tasks = (make_task(world, tid) for tid in _ids(world, split, start))
    return list(islice((t for t in tasks if not kinds or t.metadata["task"]["kind"] in kinds), n))


def describe_testbed(n_sample: int = 200) -> dict[str, Any]:
    """Counts and tools of the built-in testbed (for the README and `testbed build`'s summary)."""
    from pivotrl_testbed.testbed import ood

    worlds = {}
    for name in WORLD_MODULES:
        mod = world_module(name)
        tasks = [make_task(name, f"{name}-{i}") for i in range(n_sample)]
        kinds: dict[str, int] = {}
        for t in tasks:
            kinds[t.metadata["task"]["kind"]] = kinds.get(t.metadata["task"]["kind"], 0) + 1
        worlds[name] = {
            "tools": [t["function"]["name"] for t in mod.TOOLS],
            "n_tools": len(mod.TOOLS),
            "kinds": sorted(kinds),
            "calls_per_task": dict(sorted(mod.CALLS_PER_KIND.items())),
            "eval_fraction": sum(t.metadata["split"] == "eval" for t in tasks) / len(tasks),
            "distinct_user_texts": len({t.messages[1].content for t in tasks}) / len(tasks),
        }
    return {"worlds": worlds, "ood": {f: {"example": ood.generate(f, "train", 1, seed=0)[0].prompt}
                                      for f in ood.FAMILIES}}


# Importing the world modules registers them (after the helpers above exist: they import them).
from pivotrl_testbed.testbed import terminal, toolshop  # noqa: E402,F401
