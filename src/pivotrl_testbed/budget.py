"""The demo's training budget: every run trains until its own dev score stops improving.

A fixed step count can stop one arm before it settles (SFT still rising) and leave another long
flat; comparing them then compares budgets, not methods. The rule, fixed before any result and
applied to every run (method, world, lr, seed) alike, is RULE below (the report prints it).

Each world's run is its own run: it stops on its own world's dev score alone, never where the
same arm's run in another world stopped. Each world's model is trained and deployed alone (the
paper trains one model per domain), and its checkpoint is chosen alone (stats.choose); a stop
pooled across worlds let one world's plateau stop the other world's still-improving run.

`stop_step` is the rule as a pure function; `jobs.run_job` applies it as a run trains and
records the stop step and the reason in the run's last row; the report shows them per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

RULE = ("Checkpoints come every `early_every` steps up to `early_until`, then every `eval_every` "
        "steps, up to `steps` (the cap). After each, the run's "
        "dev score (its mean outcome on the dev items of the selection measure and decoding, in "
        "its world) is read. A checkpoint improves when its score exceeds the best earlier score "
        "by more than `min_improvement` (the first checkpoint is compared with the base's score). "
        "The run stops at the first checkpoint that ends `patience` × `eval_every` steps without "
        "an improvement (`patience` checkpoints at the regular spacing), or at the cap. Each "
        "world's run stops on its own dev score, whatever the same arm's run in another world "
        "does. Checkpoints after the stop are never trained, so no choice can land there. The "
        "same rule for every arm.")


class BudgetRule(BaseModel):
    """When a run stops (module doc)."""

    model_config = ConfigDict(extra="forbid")

    patience: int = Field(2, ge=1, description="Checkpoints in a row without an improvement "
                          "that stop a run.")
    min_improvement: float = Field(0.0, ge=0, description="How much a dev score must exceed the "
                                   "best before it to count as an improvement.")


def stop_step(scores: Sequence[tuple[int, float]], rule: BudgetRule, *, cap: int,
              start: float | None = None, every: int | None = None) -> tuple[int | None, str]:
    """(the step the run stops at, why) from its dev scores so far, [(step, score)] in step
    order; (None, "running") when the rule lets it go on. `start`: the base's score, the bar the
    first checkpoint must clear (None: the first checkpoint sets the bar). `every`: the regular
    checkpoint spacing; a plateau is then `patience` × `every` steps since the last improvement
    (from step 0 when the base sets the bar), so denser early checkpoints do not stop a run
    sooner; None: `patience` checkpoints."""
    best, since, best_step = start, 0, 0
    for step, score in scores:
        if best is None or score > best + rule.min_improvement + 1e-12:
            best, since, best_step = score, 0, step
        else:
            since += 1
        if (since >= rule.patience if every is None
                else since and step - best_step >= rule.patience * every):
            return step, f"plateau: {rule.patience} checkpoints without a dev improvement"
        if step >= cap:
            return step, "cap"
    return None, "running"


def largest_rollout_ratio(cfg: Any, pivot_stats: dict[str, Any],
                          turns_per_episode: dict[str, float]) -> dict[str, float] | None:
    """The largest "E2E RL's rollout turns / PivotRL's" the schedule can show, before training.

    The ratio is read at checkpoints: PivotRL can at best reach E2E RL's target at its first
    checkpoint (`checkpoint_steps("pivotrl")[0]` steps of G one-turn rollouts on `pivots_per_step` pivots, plus its
    profiling), and E2E RL can at most spend its cap (`cap("e2e_rl")` × `e2e_tasks_per_step` × G
    episodes of `turns_per_episode` model turns each), summed over worlds as the report sums
    them. A schedule whose bound is below the paper's 4× decides the claim before any run.
    None when no world has pivots or an episode length is unknown."""
    worlds = [w for w, s in pivot_stats.items() if s.get("kept")]
    if not worlds or any(w not in turns_per_episode for w in cfg.worlds):
        return None
    g = cfg.num_generations
    e2e = sum(cfg.cap("e2e_rl") * cfg.e2e_tasks_per_step * g * turns_per_episode[w] for w in cfg.worlds)
    first = cfg.checkpoint_steps("pivotrl")[0]
    bare = sum(first * cfg.pivots_per_step * g for _ in worlds)
    profiling = sum(pivot_stats[w].get("profile_rollout_turns", 0) for w in worlds)
    return {"with_profiling": e2e / (bare + profiling), "without_profiling": e2e / bare,
            "e2e_turns_at_cap": e2e, "pivotrl_turns_at_first_checkpoint": bare + profiling,
            "profiling_turns": profiling}


def schedule_bound(cfg: Any, pivot_stats: dict[str, Any],
                   base: list[dict[str, Any]]) -> dict[str, float] | None:
    """`largest_rollout_ratio` for a demo config, E2E RL's episodes as long as the base's greedy
    eval episodes (`base`: the base's checkpoint rows; model turns per episode, per world)."""
    if "e2e_rl" not in cfg.methods or "pivotrl" not in cfg.methods:
        return None
    per_episode = {r["world"]: r["in_domain"]["model_turns"] / r["in_domain"]["episodes"]
                   for r in base if r.get("in_domain", {}).get("episodes")}
    return largest_rollout_ratio(cfg, pivot_stats, per_episode)


def at_cap(steps: dict, cap: int) -> bool:
    """Whether any chosen step of a side (`steps`: {world: {seed: step}}, or any nesting of it)
    is its run's cap: a run chosen at its cap may have had more to gain, so the cap, not the
    rule, chose it (raise the cap and rerun)."""
    return any(at_cap(v, cap) if isinstance(v, dict) else int(v) >= cap for v in steps.values())


def capped_flags(chosen: dict[str, dict[str, Any]], caps: dict[str, int]) -> list[dict[str, str]]:
    """The report's warnings (`health` shape) for every arm with a chosen checkpoint at its cap."""
    return [{"kind": "chosen at the cap",
             "why": f"{m}: a dev-chosen checkpoint is at its cap of {caps[m]} steps; the cap, not "
                    "the dev score, stopped it: raise the cap and rerun"}
            for m, side in sorted(chosen.items()) if m in caps and at_cap(side["steps"], caps[m])]
