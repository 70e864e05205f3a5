"""The plans of `pivotrl train` and `pivotrl sft` (pivotrl.io.run_plan): what a run will train on,
in how many steps of how many items, read off the run config once its model-derived values
(token budget, prompt cap, batch) are filled in."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pivotrl.formats.template_vars import unread_kwargs_warning
from pivotrl.io.run_plan import CONFIG_FILE, PLAN_FILE, Launch, RunPlan, start_run
from pivotrl.train.config import GRPORunConfig, SFTRunConfig


def _epochs(steps: int, per_step: float, items: int) -> float | None:
    return steps * per_step / items if items else None


def grpo_plan(cfg: GRPORunConfig, tokenizer: Any, items: int, dropped: int, held_out: int, steps: int,
              world: int = 1, resume_from: str | None = None) -> RunPlan:
    """GRPO's plan: `items` trainable pivots (after `dropped` and `held_out`), `steps` optimizer
    steps of `cfg.pivots_per_step(world)` pivots with num_generations completions each. Each pivot
    is one train turn."""
    per_step = cfg.pivots_per_step(world)
    warning = unread_kwargs_warning(tokenizer, cfg.chat_template_kwargs, cfg.model)
    return RunPlan(
        verb="train", unit="pivots", items=items, read=items + dropped + held_out, dropped=dropped,
        held_out=held_out, steps=steps, per_step=per_step, min_items=math.ceil(per_step),
        completions_per_step=cfg.per_device_train_batch_size * world * cfg.gradient_accumulation_steps,
        token_budget={"max_completion_length": cfg.max_completion_length,
                      "max_prompt_length": cfg.max_prompt_length},
        epochs=_epochs(steps, per_step, items), resume_from=resume_from,
        details={"completions_per_pivot": cfg.num_generations, "processes": world},
        warnings=[warning] if warning else [], turns=items, turns_dropped=dropped,
        max_dropped_fraction=cfg.max_dropped_fraction)


def sft_plan(cfg: SFTRunConfig, tokenizer: Any, items: int, dropped: int, held_out: int, steps: int,
             world: int = 1, resume_from: str | None = None, turns: tuple[int, int] | None = None) -> RunPlan:
    """SFT's plan: `items` trajectories, `steps` optimizer steps (a smaller last batch trains);
    `turns`: the assistant turns of the kept and of the dropped trajectories."""
    per_step = cfg.per_device_train_batch_size * world * cfg.gradient_accumulation_steps
    warning = unread_kwargs_warning(tokenizer, cfg.chat_template_kwargs, cfg.model)
    return RunPlan(
        verb="sft", unit="trajectories", items=items, read=items + dropped + held_out, dropped=dropped,
        held_out=held_out, steps=steps, per_step=per_step, token_budget={"max_length": cfg.max_length},
        epochs=_epochs(steps, per_step, items), resume_from=resume_from,
        details={"processes": world}, warnings=[warning] if warning else [],
        turns=turns[0] if turns else None, turns_dropped=turns[1] if turns else 0,
        max_dropped_fraction=cfg.max_dropped_fraction)


def resumed_eta(metrics: Path, steps_left: int) -> str | None:
    """The time a resumed run has left, at the median step time its metrics.jsonl recorded; None
    when it recorded none."""
    import json
    import statistics

    from pivotrl.io.progress import duration

    try:
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    times = [r["step_time"] for r in rows if isinstance(r, dict) and isinstance(r.get("step_time"), (int, float))]
    if not times:
        return None
    return f"{duration(statistics.median(times) * steps_left)} ({steps_left} steps at the earlier run's median step time)"


def begin_training(plan: RunPlan, cfg: Any, launch: Launch | None) -> bool:
    """`pivotrl.io.run_plan.start_run` for a run folder (the plan and config in OUTPUT_DIR); a resumed
    run's ETA from the step times it has recorded."""
    out = Path(cfg.output_dir)
    if plan.resume_from and plan.steps is not None and plan.eta is None:
        done = int(plan.resume_from.rsplit("-", 1)[1])
        plan.eta = resumed_eta(out / "metrics.jsonl", max(plan.steps - done, 0))
    return start_run(plan, cfg, out / PLAN_FILE, out / CONFIG_FILE, launch)
