"""Pass rates that came with NeMo-Gym rows, as the Profile records `pivotrl select` reads, so a
data set profiled by its publisher (NVIDIA's `Nemotron-RL-Agentic-*-Pivot-v1`) needs no
re-profiling to be selected.

Such a row carries, beside the NeMo-Gym request and action:

    "trajectory_id": 146, "meta_info": {"turn": 2, "step": 3, "assistant_depth": 4},
    "qwen_235b_info": {"rewards": [0, 1, ...], "reward_mean": ..., "reward_std": ...},
    "pass_rate": 0.40625, "pass_rate_total": 32, "pass_rate_passed": 13

(`info` {turn, step, depth} in the function-calling set). The record shape (`imported_profile`):

- the K outcomes are the `<model>_info.rewards` list when the row has one: each reward one Sample
  (completion "", the text was not published; valid; reason "imported: <model>_info.rewards");
- else `pass_rate_passed` of `pass_rate_total`: that many Samples of reward 1 and the rest of
  reward 0 (NeMo-Gym's `ng_reward_profile` counts a rollout as passed at its pass threshold);
- when both are present and their pass rates differ, the rewards list wins: it names the model that produced it
  and holds every outcome, while the pass_rate fields name no model (in the published rows they
  come from another run, with another K). The disagreement is counted in the import summary;
- reward mean and population std are computed from the outcomes (`make_profile`, as profiling
  does), and `metadata["imported_profile"]` says which model and field they came from.

PivotRL assumes the policy being trained did the profiling: the stats name the model
(`profiled_by`), and `pivotrl train` warns when `--model` is another one; re-profiling with
`pivotrl profile` is the fix.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from pivotrl.io.records import Profile, Sample, Turn

# `<model>_info` blocks with a rewards list; `meta_info` / `info` are the row's position.
_MODEL_INFO = re.compile(r"^(?P<model>.+)_info$")
_POSITION_KEYS = ("meta_info", "info")  # the row's position (nemo_gym.row_position)
UNNAMED_MODEL = "unnamed (pass_rate fields)"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def model_rewards(row: dict[str, Any]) -> tuple[str, list[float]] | None:
    """(model, rewards) of the first `<model>_info` block with a rewards list of numbers."""
    for key, value in row.items():
        match = _MODEL_INFO.match(key)
        if match and key not in _POSITION_KEYS and isinstance(value, dict):
            rewards = value.get("rewards")
            if isinstance(rewards, list) and rewards and all(_number(r) for r in rewards):
                return match["model"], [float(r) for r in rewards]
    return None


def pass_counts(row: dict[str, Any]) -> tuple[int, int] | None:
    """(passed, total) when the row has a consistent pair of NeMo-Gym pass-rate counts."""
    passed, total = row.get("pass_rate_passed"), row.get("pass_rate_total")
    if isinstance(passed, int) and isinstance(total, int) and 0 <= passed <= total and total > 0:
        return passed, total
    return None


def imported_profile(turn: Turn, row: dict[str, Any], notes: Counter) -> Turn | Profile:
    """`turn` as a Profile when `row` carries pass rates (the shape in the module docstring),
    else `turn` unchanged; `notes` counts what the summary shows (sources, disagreements)."""
    from pivotrl.profile.loop import make_profile
    from pivotrl.select import SUCCESS_THRESHOLD

    named, counts = model_rewards(row), pass_counts(row)
    if named is not None:
        model, rewards = named
        source = f"{model}_info.rewards"
        wins = sum(r >= SUCCESS_THRESHOLD for r in rewards)
        # Rates, not counts: the two often come from runs with different K.
        if counts is not None and abs(counts[0] / counts[1] - wins / len(rewards)) > 1e-9:
            notes[f"pass_rate differs from {source} (the rewards list is used)"] += 1
    elif counts is not None:
        model, source = UNNAMED_MODEL, "pass_rate_passed of pass_rate_total"
        passed, total = counts
        rewards = [1.0] * passed + [0.0] * (total - passed)
    else:
        return turn
    notes[f"pass rates from {source}"] += 1
    samples = [Sample(completion="", reward=r, valid=True, reason=f"imported: {source}") for r in rewards]
    profile = make_profile(turn, samples)
    profile.metadata = {**profile.metadata, "imported_profile": {"model": model, "source": source}}
    return profile


def profiled_by(models: Counter) -> str | None:
    """The one model that produced a file's imported pass rates; several are joined."""
    return ", ".join(sorted(models)) if models else None
