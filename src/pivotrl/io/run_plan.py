"""A run's plan, resolved before the long part starts: what it will read, how many steps of how
many items, the token budget, the epochs. Every long verb (`train`, `sft`, `e2e`, `profile`) prints
it first and writes it into its run folder with the config as used (every field, defaults and
model-derived values filled in), so a run can be read back and rerun; `--dry-run` prints it and
stops before anything is written.

It is also where a run that would do nothing stops: 0 items, 0 steps, or fewer items than one
step takes (TRL's GRPO sampler drops an incomplete batch, so such a run trains 0 steps and would
save the base model as the trained one). Such a run is an error naming why, never an exit 0;
so is one that would set aside more of its train turns than `max_dropped_fraction` (too long,
unreadable): it would train on other data than it was given.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pivotrl.io.inputs import InputError
from pivotrl.io.outputs import CONFIG_FILE, PLAN_ENDING, PLAN_FILE  # noqa: F401 - the names a run's files have
from pivotrl.io.records import write_text_atomic

DROP_WARNING = 0.05  # a plan that sets aside more of its train turns than this says so


class NothingToRun(InputError):
    """A run whose plan does nothing (no items, no steps, less than one step's items)."""


@dataclass
class Launch:
    """How a run starts: `dry_run` prints the plan and stops before anything is written; `strict`
    turns the plan's warnings (a chat-template variable the template never reads) into an error;
    `stream` is where the plan is printed (stderr); `quiet` prints nothing (a caller that runs many
    segments, as the demo does, and says itself what runs): the plan is still saved; `command` is
    the command line that started the run, as the run folder's model card names it (None: unknown)."""

    dry_run: bool = False
    strict: bool = False
    stream: TextIO | None = None
    quiet: bool = False
    command: str | None = None


@dataclass
class RunPlan:
    verb: str
    unit: str                      # what one item is: pivots, trajectories, tasks, turns
    items: int                     # items the run uses, after what was dropped
    read: int | None = None        # items read, before drops
    dropped: int = 0               # set aside (too long, bad), with the reason in the run's summary
    held_out: int = 0              # eval trajectories' items (the split), never used
    steps: int | None = None       # optimizer steps (None: a verb without steps)
    per_step: float | None = None  # items per optimizer step
    min_items: int = 1             # the fewest items a step trains on (GRPO: a whole step's pivots)
    may_be_empty: bool = False     # a shard of a file may hold none of its items
    completions_per_step: int | None = None
    token_budget: dict[str, Any] = field(default_factory=dict)
    epochs: float | None = None
    resume_from: str | None = None
    eta: str | None = None         # None: unknown until the first progress line
    details: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    turns: int | None = None       # train turns (assistant turns, PivotRL's states) the run trains on
    turns_dropped: int = 0         # train turns set aside with what was dropped
    max_dropped_fraction: float = 1.0  # more of the train turns dropped than this: the run refuses

    def __post_init__(self) -> None:
        share = self.dropped_share()
        if share is not None and share > DROP_WARNING:
            self.warnings.append(
                f"{self.turns_dropped} of {self.turns + self.turns_dropped} train turns ({share:.0%}) are "
                f"set aside ({self.dropped} {self.unit} dropped, the reasons in the run's rejects): this run "
                "trains on other turns than an arm that keeps them (raise the length cap, or fix the data)")

    def dropped_share(self) -> float | None:
        total = (self.turns or 0) + self.turns_dropped
        return self.turns_dropped / total if self.turns is not None and total else None

    def problem(self) -> str | None:
        """Why this run would do nothing; None when it does something."""
        if self.items == 0 and not self.may_be_empty:
            seen = f" ({self.read} read, {self.dropped} dropped, {self.held_out} held out)" if self.read else ""
            return f"no {self.unit} to run on{seen}"
        if self.steps == 0:
            return "the plan has 0 steps"
        share = self.dropped_share()
        if share is not None and share > self.max_dropped_fraction:
            return (f"{share:.0%} of the train turns would be set aside ({self.turns_dropped} of "
                    f"{self.turns + self.turns_dropped}; {self.dropped} {self.unit} dropped), more than "
                    f"max_dropped_fraction {self.max_dropped_fraction:g}: raise the length cap, fix the data, "
                    "or set --max-dropped-fraction 1 to train on what is left")
        if 0 < self.items < self.min_items:
            return (f"{self.items} {self.unit}, fewer than one step takes ({self.min_items} {self.unit} per "
                    f"step, and an incomplete step is dropped): the run would train 0 steps and save the "
                    f"base model as the trained one. Give more {self.unit}, or fewer per step")
        return None

    def lines(self) -> list[str]:
        read = f" (of {self.read} read" + (f", {self.dropped} dropped" if self.dropped else "") + \
            (f", {self.held_out} held out" if self.held_out else "") + ")" if self.read is not None else ""
        out = [f"{self.unit}: {self.items}{read}"]
        if self.turns is not None and self.unit != "turns":
            dropped = f" ({self.turns_dropped} set aside)" if self.turns_dropped else ""
            out.append(f"train turns: {self.turns} of {self.turns + self.turns_dropped}{dropped}")
        if self.steps is not None:
            resuming = f" (resuming from {self.resume_from})" if self.resume_from else ""
            out.append(f"steps: {self.steps}{resuming}")
        if self.per_step is not None:
            out.append(f"{self.unit} per step: {self.per_step:g}")
        if self.completions_per_step is not None:
            out.append(f"completions per step: {self.completions_per_step}")
        if self.token_budget:
            out.append("token budget: " + ", ".join(f"{k} {v}" for k, v in self.token_budget.items()))
        if self.epochs is not None:
            out.append(f"epochs: {self.epochs:.3g}")
        out += [f"{k.replace('_', ' ')}: {v}" for k, v in self.details.items()]
        out.append(f"ETA: {self.eta or 'on the first progress line'}")
        return out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolved_config(config: Any) -> dict[str, Any]:
    """Every field of `config` as used, as JSON; its path fields absolute (the file is read back
    from its own folder)."""
    data = config.model_dump(mode="json")
    for key in getattr(config, "path_fields", ()):
        value = data.get(key)
        paths = value if isinstance(value, list) else [value]
        if value and all(isinstance(p, str) and (key == "output_dir" or Path(p).exists()) for p in paths):
            absolute = [str(Path(p).resolve()) for p in paths]
            data[key] = absolute if isinstance(value, list) else absolute[0]
    return data


def check_plan(plan: RunPlan, launch: Launch | None = None) -> None:
    """Print `plan` (main process only); stop a run that would do nothing (NothingToRun) or, with
    `launch.strict`, one with warnings (InputError)."""
    launch = launch or Launch()
    if os.environ.get("RANK", "0") == "0" and not launch.quiet:
        stream = launch.stream or sys.stderr
        title = f"pivotrl {plan.verb}: {'dry run, ' if launch.dry_run else ''}plan"
        stream.write("\n".join([title, *(f"  {line}" for line in plan.lines()),
                                *(f"warning: {w}" for w in plan.warnings)]) + "\n")
        stream.flush()
    problem = plan.problem()
    if problem:
        raise NothingToRun(f"nothing to do: {problem}")
    if plan.warnings and launch.strict:
        raise InputError("; ".join(plan.warnings) + " (--strict)")


def write_plan(plan: RunPlan, config: Any, plan_path: Path, config_path: Path | None = None) -> None:
    """The plan and the config as used in `plan_path` (JSON), the config alone in `config_path`
    (YAML, a valid --config); main process only."""
    import yaml

    if os.environ.get("RANK", "0") != "0":
        return
    resolved = resolved_config(config)
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(plan_path, json.dumps({"plan": plan.as_dict(), "config": resolved}, indent=1))
    if config_path is not None:
        write_text_atomic(config_path, yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True))


def start_run(plan: RunPlan, config: Any, plan_path: Path, config_path: Path | None,
              launch: Launch | None = None) -> bool:
    """`check_plan`, then `write_plan` unless `launch.dry_run`. True when the run goes on."""
    check_plan(plan, launch)
    if launch is not None and launch.dry_run:
        return False
    write_plan(plan, config, plan_path, config_path)
    return True
