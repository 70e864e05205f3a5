"""The rescue test: does the step a base gets wrong decide its tasks?

A base can have headroom on single turns and none on whole tasks: a wrong step it recovers from
within the episode costs it nothing (docs/RESULTS.md: S2's false start). The test, on a policy's
greedy episodes of some tasks:

- the **deciding step** of an episode is its first action the world's verifier does not accept
  as the expert's action at the same state (the expert reads the same context: `experts.
  expert_message`); an episode without one has none;
- **self-rescue**: of the episodes with a deciding step, the share that succeed anyway (the policy
  recovered from its own wrong step);
- **rescue**: of the failed episodes, the share that succeed when the episode is replayed with
  the policy's own actions up to the deciding step, the expert's action there, and the policy's
  greedy actions after it. A failed episode without a deciding step counts as not rescued.

High rescue and low self-rescue say the step is where tasks are won or lost, so an arm that
learns it finishes more tasks. `testbed/task_criteria.py` reads the counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pivotrl.formats.actions import render_action
from pivotrl.io.records import Message, Trajectory, Turn, message_text
from pivotrl.scoring import score_actions
from pivotrl_testbed.episodes import act_batch, run_episodes


def _user_text(messages: Sequence[Message]) -> str:
    return next((message_text(m) for m in messages if m.role == "user"), "")


class ForcedTurns:
    """`policy`, except at given assistant turns of given tasks (by user text), where it answers
    the given text: a replay of recorded actions with one of them replaced."""

    def __init__(self, policy: Any, forced: dict[str, dict[int, str]]):
        self.policy, self.forced = policy, forced

    def act_batch(self, contexts: list[list[Message]], tools: list[list[dict[str, Any]]]) -> list[str]:
        out: list[str | None] = []
        for c in contexts:
            turns = self.forced.get(_user_text(c), {})
            out.append(turns.get(sum(m.role == "assistant" for m in c)))
        rest = [i for i, text in enumerate(out) if text is None]
        got = act_batch(self.policy, [contexts[i] for i in rest], [tools[i] for i in rest]) if rest else []
        for i, text in zip(rest, got):
            out[i] = text
        return [t or "" for t in out]

    def act(self, context: list[Message], tools: list[dict[str, Any]]) -> str:
        return self.act_batch([context], [tools])[0]


def deciding_step(world: str, task: Trajectory, episode: Trajectory, verifier: Any,
                  expert_seed: int = 0) -> tuple[int, Message, Message] | None:
    """(assistant ordinal, the episode's action, the expert's action) at the episode's first
    action the verifier rejects against the expert's at the same context, or None."""
    from pivotrl_testbed.testbed.experts import expert_message

    params = task.metadata["task"]
    ordinal = 0
    for idx, m in enumerate(episode.messages):
        if m.role != "assistant":
            continue
        context = list(episode.messages[:idx])
        expert = expert_message(world, params, context, expert_seed)
        turn = Turn(id=f"{episode.id}/{ordinal}", trajectory_id=episode.id, turn=ordinal,
                    domain=world, tools=list(task.tools), context=context, expected=expert,
                    metadata={**task.metadata, "message_index": idx})
        if score_actions(verifier, [turn], [m])[0].reward < 1.0:
            return ordinal, m, expert
        ordinal += 1
    return None


def rescue_test(world: str, tasks: Sequence[Trajectory], policy: Any, verifier: Any,
                expert_seed: int = 0) -> dict[str, Any]:
    """The test of the module doc on `tasks` (task records or expert trajectories of `world`),
    `policy` acting greedily: {"counts": {"episodes", "failed", "departed", "self_rescued",
    "rescued"}, "episodes": [one row per episode with a deciding step or a failure]}."""
    results = run_episodes(world, tasks, policy)
    rows, forced = [], {}
    for task, res in zip(tasks, results):
        step = deciding_step(world, task, res.trajectory, verifier, expert_seed)
        row = {"task": task.id, "success": res.success, "step": None if step is None else step[0]}
        if step is not None:
            row["action"], row["expert"] = render_action(step[1]), render_action(step[2])
            if not res.success:
                mine = [m for m in res.trajectory.messages if m.role == "assistant"][:step[0]]
                forced[task.id] = {**{i: render_action(m) for i, m in enumerate(mine)},
                                   step[0]: render_action(step[2])}
        if step is not None or not res.success:
            rows.append(row)
    # One replay per task: tasks may share a user text (terminal's requests without parameters),
    # and the forced turns are found by it.
    for task in tasks:
        if task.id in forced:
            res = run_episodes(world, [task], ForcedTurns(policy, {_user_text(task.messages): forced[task.id]}))[0]
            next(r for r in rows if r["task"] == task.id)["rescued"] = res.success
    counts = {"episodes": len(results), "failed": sum(not r.success for r in results),
              "departed": sum(r["step"] is not None for r in rows),
              "self_rescued": sum(r["step"] is not None and r["success"] for r in rows),
              "rescued": sum(bool(r.get("rescued")) for r in rows)}
    return {"counts": counts, "episodes": rows}
