"""Turn accuracy on held-out turns of any data set (`pivotrl evaluate --turns`).

Each turn's context is templated with the model's own chat template, the model writes one action
(or `samples` of them), and the verifier scores it against the expert's action: profiling's
sample-then-score loop (`profile.loop.sample_and_score`, through `pivotrl.scoring`). A turn's
success is the fraction of its samples with reward >= the success threshold (the binary outcome
`select` uses too).

Turn accuracy is the mean over turns. Turns of one trajectory are not independent (same task,
same user, earlier turns' context), so the 95% interval is clustered by trajectory: the variance
of the mean is estimated from per-trajectory sums of residuals (the cluster-robust "sandwich"
estimator), its ratio to the independent-turns variance is the design effect, and the interval is
Wilson's score interval at the effective sample size n / design effect. Wilson's interval stays
inside [0, 1] and is not empty at accuracy 0 or 1, where the plain normal interval collapses to a
point. The design effect is never taken below 1 (a conservative choice: with few trajectories a
negative within-trajectory correlation is mostly noise).

A turn whose prompt is longer than the engine takes (the model's context; vLLM's max_model_len; a
server's model card) is set aside before sampling, listed in the result (`too_long`: id → prompt
tokens) and left out of the accuracy: it measures the engine's context, not the policy.

Samples are seeded per turn, from (seed, turn id): a turn's result does not depend on which other
turns share its batch, or on `limit`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from pivotrl.formats.options import recorded_template_settings, template_mismatch
from pivotrl.io.records import Sample, Turn, rejects_path, sidecar_path, write_atomic
from pivotrl.io.seeds import derive_seed
from pivotrl.io.split import Split
from pivotrl.io.turn_files import read_turns
from pivotrl.io.yaml_config import field_like
from pivotrl.profile.loop import TurnSampling, sample_and_score
from pivotrl.sampling.options import SamplingOptions
from pivotrl.sampling.pipeline import longer_context_fix, prompt_limit
from pivotrl.select import SUCCESS_THRESHOLD

Z95 = 1.959963984540054  # two-sided 95% normal quantile
logger = logging.getLogger(__name__)


class TurnEvalConfig(TurnSampling):
    """Options of `pivotrl evaluate --turns` and `pivotrl compare` (CLI flags): the engine,
    sampling, verifier and format blocks as for profiling, greedy by default."""

    temperature: float = field_like(SamplingOptions, "temperature", default=0.0, note="Evaluate (ours): 0, "
                                    "the policy's most likely action; > 0 samples with `seed`.")
    samples: int = Field(1, ge=1, description="Actions sampled per turn (ours: 1, greedy); a turn's "
                         "success is the fraction of them that succeed.")
    success_threshold: float = Field(SUCCESS_THRESHOLD, description="Reward >= this is a success "
                                     "(profiling's threshold, so accuracy and pivot outcomes agree).")
    limit: int | None = Field(None, ge=1, description="Score only the first N valid turns (None: all).")


# ---------------------------------------------------------------- the interval


def wilson(p: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a proportion p observed over n (possibly fractional) trials."""
    if n <= 0:
        return 0.0, 1.0
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # min/max with p: at p = 0 or 1 rounding would otherwise leave p a hair outside its interval.
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def clustered_accuracy(values: Sequence[float], clusters: Sequence[str], z: float = Z95) -> dict[str, Any]:
    """Mean of per-turn values in [0, 1] with a 95% interval clustered by `clusters` (see the
    module docstring): accuracy, ci95, design_effect, effective_n, turns, clusters."""
    n = len(values)
    if n == 0:
        return {"accuracy": None, "ci95": None, "design_effect": None, "effective_n": 0,
                "turns": 0, "clusters": 0}
    mean = sum(values) / n
    sums: dict[str, float] = {}
    for v, c in zip(values, clusters, strict=True):
        sums[c] = sums.get(c, 0.0) + (v - mean)
    g = len(sums)
    var_iid = sum((v - mean) ** 2 for v in values) / (n * max(n - 1, 1))
    var_cluster = (g / (g - 1)) * sum(s * s for s in sums.values()) / (n * n) if g > 1 else float("inf")
    deff = max(1.0, var_cluster / var_iid) if var_iid > 0 and math.isfinite(var_cluster) else 1.0
    if g < 2:
        deff = float(n)  # one trajectory: its turns are one observation
    effective_n = n / deff
    return {"accuracy": mean, "ci95": list(wilson(mean, effective_n, z)), "design_effect": deff,
            "effective_n": effective_n, "turns": n, "clusters": g}


# ---------------------------------------------------------------- scoring


def turn_seed(seed: int, turn_id: str) -> int:
    return derive_seed("evaluate", seed, turn_id)


def score_turns(turns: Iterable[Turn], sampler, verifier, tokenizer, cfg: TurnEvalConfig,
                too_long: dict[str, int] | None = None,
                on_tokens: Callable[[int], Any] | None = None) -> Iterator[dict[str, Any]]:
    """One item per turn, in order: {id, trajectory_id, success, rewards, valid, reasons, tokens}.
    Turns whose prompt the sampler cannot take are skipped and recorded in `too_long`
    (id → prompt tokens) when given. on_tokens: `sample_and_score`'s."""
    for turn, _, row in sample_and_score(turns, sampler, verifier, tokenizer, cfg, cfg.samples, turn_seed,
                                         too_long=too_long, on_tokens=on_tokens):
        yield score_item(turn, row, cfg.success_threshold)


def turn_success(rewards: Sequence[float], success_threshold: float = SUCCESS_THRESHOLD) -> float:
    """A turn's success: the fraction of its samples whose reward is >= the threshold (with a
    shaped verifier, a reward of 0.4 is a failure, not 0.4 of a success)."""
    return sum(r >= success_threshold for r in rewards) / len(rewards)


def score_item(turn: Turn, row: Sequence[Sample], success_threshold: float = SUCCESS_THRESHOLD) -> dict[str, Any]:
    """A scored turn: its success (the fraction of its samples with reward >= the threshold) and
    the samples' rewards, validity, reasons, truncation and text."""
    return {"id": turn.id, "trajectory_id": turn.trajectory_id or turn.id,
            "success": turn_success([s.reward for s in row], success_threshold),
            "rewards": [s.reward for s in row],
            "valid": [s.valid for s in row], "reasons": [s.reason for s in row],
            "truncated": sum(s.finish_reason == "length" for s in row),
            "completions": [s.completion for s in row]}


def turn_accuracy(successes: Sequence[float], clusters: Sequence[str]) -> dict[str, Any]:
    """THE turn accuracy: the mean of per-turn successes (`turn_success`) with its 95% interval
    clustered by trajectory (`clustered_accuracy`). `evaluate --turns`, `compare` and the testbed's
    demo all report this one."""
    return clustered_accuracy(successes, clusters)


def summarize(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Turn accuracy with its clustered interval, plus mean reward and invalid/truncated counts."""
    out = turn_accuracy([it["success"] for it in items], [it["trajectory_id"] for it in items])
    samples = [r for it in items for r in it["rewards"]]
    out.update(mean_reward=sum(samples) / len(samples) if samples else None, samples=len(samples),
               invalid_samples=sum(not v for it in items for v in it["valid"]),
               truncated_samples=sum(it["truncated"] for it in items))
    return out


def items_path(out: str | Path) -> Path:
    """`result.json` → `result.items.jsonl` (one scored turn per line), next to it."""
    return sidecar_path(out, ".items.jsonl", ".json")


def result_rejects_path(out: str | Path) -> Path:
    """`result.json` → `result.rejects.jsonl` (the Turn file's bad lines), next to it."""
    return rejects_path(Path(out).with_suffix(".jsonl"))


def evaluate_turns_file(turns_path: str | Path, out_path: str | Path, sampler, verifier, tokenizer,
                        cfg: TurnEvalConfig, *, model_name: str = "", split: Split | None = None,
                        progress: Callable[[int, int], Any] | None = None,
                        settings_from: dict[str, str] | None = None,
                        on_tokens: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Score the turns of `turns_path`; write RESULT.json (`out_path`), the scored turns
    (RESULT.items.jsonl) and bad lines (RESULT.rejects.jsonl). Returns the result dict.
    `split`: score only turns of its eval trajectories (the others are counted, not scored).
    `progress(done, total)` is called after each scored turn. `settings_from`: where the caller
    took the template settings and budget from, recorded in the result. on_tokens:
    `sample_and_score`'s (tokens as they are drawn)."""
    turns_path, out_path = Path(turns_path), Path(out_path)
    outputs = (out_path, items_path(out_path), result_rejects_path(out_path))
    if turns_path.resolve() in {p.resolve() for p in outputs}:
        raise ValueError(f"{turns_path}: an output of evaluate would overwrite this input")
    t0 = time.perf_counter()
    turns, rejects = read_turns(turns_path)
    chosen = [t for _, t in turns]
    held_out = split.eval_ids() if split is not None else None
    if held_out is not None:
        kept = [t for t in chosen if (t.trajectory_id or t.id) in held_out]
        if chosen and not kept:
            raise ValueError(f"{turns_path}: none of its {len(chosen)} turns belongs to an eval "
                             "trajectory of the split; evaluate the held-out file (TURNS.eval.jsonl)")
        not_held_out, chosen = len(chosen) - len(kept), kept
    chosen = chosen[: cfg.limit]
    if not chosen:
        raise ValueError(f"{turns_path}: no valid turns ({len(rejects)} bad lines)")
    too_long: dict[str, int] = {}
    items = []
    for item in score_turns(chosen, sampler, verifier, tokenizer, cfg, too_long, on_tokens):
        items.append(item)
        if progress is not None:
            progress(len(items) + len(too_long), len(chosen))
    if not items:
        raise ValueError(f"{turns_path}: every prompt is longer than the engine takes "
                         f"({prompt_limit(sampler)} tokens; {len(too_long)} turns): "
                         f"{longer_context_fix(sampler)}")
    # The budget as used (None in the config means the model's own): a result says how it was scored.
    settings = {**cfg.model_dump(), "max_new_tokens": cfg.sampling(tokenizer).max_new_tokens}
    trained = recorded_template_settings(model_name) if model_name else None
    warning = template_mismatch(cfg.format_options(), trained, "evaluate", "training") if trained else None
    if warning:
        logger.warning(warning)
    result = {"model": model_name, "turns_file": str(turns_path), "settings": settings,
              **({"settings_from": settings_from} if settings_from else {}),
              **({"warnings": [warning]} if warning else {}),
              "rejected_lines": len(rejects), "prompt_limit": prompt_limit(sampler),
              "too_long": too_long, **summarize(items),
              "seconds": round(time.perf_counter() - t0, 3)}
    if held_out is not None:
        result["split"] = {"eval_trajectories": len(held_out), "turns_not_held_out": not_held_out}
    write_atomic(items_path(out_path), items)
    if rejects:
        write_atomic(result_rejects_path(out_path), [r.to_json() for r in rejects])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2))
    return result
