"""What each arm spent, beside what it gained: the report's compute block.

A comparison of arms that leaves out their cost says more than it measured: PivotRL trained ~10×
SFT's seconds and profiled thousands of samples before its first step, and no report said so
(docs/RESULTS.md). Per arm, at its dev-chosen checkpoints (means over seeds, sums over worlds):

- `rollout_turns`: model turns generated up to the chosen step, the paper's compute unit
  (PivotRL's include its profiling; SFT generates none);
- `profiling_samples`: the K samples per turn PivotRL's selection drew from the base, once per
  world (pivot-set arms only);
- `train_seconds`: wall seconds of training up to the chosen step, pro-rated from the run's
  training seconds to its last step (training time grows with steps; scoring is left out, every
  arm is scored the same way); `train_seconds_run`, the whole run's, beside it;
- `training_tokens`: tokens the optimizer's forward + backward passes ran up to the chosen step,
  the `train_tokens` counter the trainer logged at that step (pivotrl.train.tokens): over every
  forward pass a backward follows, the non-padding tokens of the batch the model ran (the whole
  trajectory per SFT row; prompt + completion per GRPO sequence, or, under PivotRL's shared-prefix
  loss, each distinct prompt once per micro-batch plus every completion with its last prompt
  token, since that is what it computes; E2E RL's packed episode sequences, once per iteration);
- `rollout_tokens`: the tokens the policy generated in training rollouts up to the chosen step
  (SFT: 0; PivotRL's profiling samples are not in it, they are `profiling_samples`);
- `pivotrl_over_e2e`: PivotRL's rollout turns, training seconds, training tokens and rollout
  tokens as a fraction of E2E RL's.

A run whose rows predate the token counters has none at its chosen step: its arm's tokens are
None ("not recorded", named in the block's `note`), never 0 and never pro-rated from another step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from statistics import mean
from typing import Any

from pivotrl_testbed.demo_config import PROFILED_ARMS
from pivotrl_testbed.stats import step_of

TOKEN_KEYS = {"training_tokens": "train_tokens", "rollout_tokens": "rollout_tokens"}  # block ← row
RATIO_KEYS = ("rollout_turns", "train_seconds", *TOKEN_KEYS)


def arm_compute(rows: list[dict[str, Any]], side: dict[str, Any],
                pivot_stats: dict[str, Any]) -> dict[str, Any] | None:
    """One arm's compute at its chosen checkpoints (module doc), or None without rows there."""
    runs: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["method"] == side["method"] and math.isclose(float(r["lr"]), float(side["lr"])) \
                and step_of(side, r["world"], int(r["seed"])) is not None:
            runs[(r["world"], int(r["seed"]))].append(r)
    if not runs:
        return None
    turns, secs, whole = defaultdict(float), defaultdict(float), defaultdict(float)
    tokens: dict[str, dict[int, float] | None] = {k: defaultdict(float) for k in TOKEN_KEYS}
    for (world, seed), got in runs.items():
        got.sort(key=lambda r: int(r["step"]))
        chosen = step_of(side, world, seed)
        at = next((r for r in got if int(r["step"]) == chosen), None)
        if at is None:
            continue
        last = next((r for r in reversed(got) if "train_seconds" in r), None)
        turns[seed] += float(at.get("rollout_turns", 0))
        for key, row_key in TOKEN_KEYS.items():
            if tokens[key] is not None and row_key in at:
                tokens[key][seed] += float(at[row_key])
            else:  # one run without the count: the arm's sum over worlds is unknown
                tokens[key] = None
        if last is not None:
            whole[seed] += float(last["train_seconds"])
            secs[seed] += float(last["train_seconds"]) * chosen / max(1, int(last["step"]))
    profiling = (sum(s.get("profile_rollout_turns", 0) for s in pivot_stats.values())
                 if side["method"] in PROFILED_ARMS else 0)
    return {"rollout_turns": mean(turns.values()) if turns else None,
            "profiling_samples": profiling,
            "train_seconds": mean(secs.values()) if secs else None,
            "train_seconds_run": mean(whole.values()) if whole else None,
            **{key: mean(got.values()) if got else None for key, got in tokens.items()}}


def compute_block(rows: list[dict[str, Any]], chosen: dict[str, dict[str, Any]],
                  pivot_stats: dict[str, Any]) -> dict[str, Any]:
    """{"arms": {method: arm_compute}, "pivotrl_over_e2e": {...} or None, "note": the arms whose
    tokens were not recorded, or None}."""
    arms = {m: got for m, side in chosen.items() if m != "base"
            and (got := arm_compute(rows, side, pivot_stats)) is not None}

    def frac(key: str) -> float | None:
        a, b = (arms.get("pivotrl") or {}).get(key), (arms.get("e2e_rl") or {}).get(key)
        return a / b if a is not None and b else None

    ratio = {k: frac(k) for k in RATIO_KEYS} if "pivotrl" in arms and "e2e_rl" in arms else None
    missing = [m for m, c in arms.items() if c["training_tokens"] is None or c["rollout_tokens"] is None]
    note = (f"training and rollout tokens were not recorded for {', '.join(missing)} (runs trained "
            "before the trainers counted them)") if missing else None
    return {"arms": arms, "pivotrl_over_e2e": ratio, "note": note}
