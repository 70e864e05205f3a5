"""Turn accuracy on held-out turns of any data set (`pivotrl evaluate --turns`).

Each turn's context is templated with the model's own chat template, the model writes one action
(or `samples` of them), and the verifier scores it against the expert's action through the one
scoring path (`pivotrl.scoring`, via `profile.loop.score_samples`): a turn's success is the fraction
of its samples with reward >= the success threshold (the binary outcome `select` uses too).

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
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from pivotrl.formats.chat import prompt_text
from pivotrl.formats.families import parser_for
from pivotrl.io.records import Turn, rejects_path, sidecar_path, write_atomic
from pivotrl.io.seeds import derive_seed
from pivotrl.io.split import Split
from pivotrl.io.turn_files import chunks, read_turns
from pivotrl.profile.loop import score_samples
from pivotrl.sampling.base import SamplingParams
from pivotrl.sampling.options import EngineConfig
from pivotrl.sampling.pipeline import prompt_limit, split_too_long
from pivotrl.select import SUCCESS_THRESHOLD

Z95 = 1.959963984540054  # two-sided 95% normal quantile


class TurnEvalConfig(EngineConfig):
    """Options of `pivotrl evaluate --turns` and `pivotrl compare` (CLI flags); the engine's
    (`--backend hf|vllm|openai` and its options) are EngineConfig's, as for profiling."""

    verifier: str = Field("toolcall", description="Verifier name (pivotrl.verifiers registry), as "
                          "for profiling and the GRPO reward.")
    verifier_config: dict[str, Any] = Field(default_factory=dict, description="The verifier's options.")
    samples: int = Field(1, ge=1, description="Actions sampled per turn (ours: 1, greedy); a turn's "
                         "success is the fraction of them that succeed.")
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy (ours: evaluation scores the "
                               "policy's most likely action); > 0 samples with `seed`.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus mass (1.0 = off).")
    max_new_tokens: int | None = Field(None, ge=1, description="Tokens per action; None: the model's "
                                       "budget (pivotrl.formats.families.token_budget), as profiling.")
    seed: int = Field(0, description="Base seed; turn t samples with derive('evaluate', seed, t.id).")
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra chat-template "
                                                 "variables; use the ones training used (ours: none).")
    response_format: str | None = Field(None, description="Tool-call format of the completions; None: "
                                        "detected from the chat template (pivotrl.formats.families).")
    success_threshold: float = Field(SUCCESS_THRESHOLD, description="Reward >= this is a success "
                                     "(profiling's threshold, so accuracy and pivot outcomes agree).")
    limit: int | None = Field(None, ge=1, description="Score only the first N valid turns (None: all).")
    chunk_turns: int = Field(64, ge=1, description="Turns per sampler call (memory only, not results).")

    def sampling(self, tokenizer: Any) -> SamplingParams:
        from pivotrl.formats.families import token_budget

        budget = self.max_new_tokens or token_budget(tokenizer, self.chat_template_kwargs,
                                                     self.response_format)
        return SamplingParams(max_new_tokens=budget, temperature=self.temperature,
                              top_p=self.top_p, seed=self.seed)


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
                too_long: dict[str, int] | None = None) -> Iterator[dict[str, Any]]:
    """One item per turn, in order: {id, trajectory_id, success, rewards, valid, reasons, tokens}.
    Turns whose prompt the sampler cannot take are skipped and recorded in `too_long`
    (id → prompt tokens) when given."""
    params = cfg.sampling(tokenizer)
    parse = parser_for(tokenizer, cfg.response_format, cfg.chat_template_kwargs)
    limit = prompt_limit(sampler)
    for chunk in chunks(turns, cfg.chunk_turns):
        prompts = [prompt_text(tokenizer, t.context, t.tools, cfg.chat_template_kwargs) for t in chunk]
        fits, over = split_too_long(prompts, tokenizer, limit)
        if too_long is not None:
            too_long.update({chunk[i].id: n for i, n in over.items()})
        chunk, prompts = [chunk[i] for i in fits], [prompts[i] for i in fits]
        if not chunk:
            continue
        completions = sampler.sample(prompts, cfg.samples, params,
                                     seeds=[turn_seed(cfg.seed, t.id) for t in chunk])
        for turn, row in zip(chunk, score_samples(verifier, chunk, completions, parse), strict=True):
            wins = [s.reward >= cfg.success_threshold for s in row]
            yield {"id": turn.id, "trajectory_id": turn.trajectory_id or turn.id,
                   "success": sum(wins) / len(wins), "rewards": [s.reward for s in row],
                   "valid": [s.valid for s in row], "reasons": [s.reason for s in row],
                   "truncated": sum(s.finish_reason == "length" for s in row),
                   "completions": [s.completion for s in row]}


def summarize(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Turn accuracy with its clustered interval, plus mean reward and invalid/truncated counts."""
    out = clustered_accuracy([it["success"] for it in items], [it["trajectory_id"] for it in items])
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
                        progress: Callable[[int, int], Any] | None = None) -> dict[str, Any]:
    """Score the turns of `turns_path`; write RESULT.json (`out_path`), the scored turns
    (RESULT.items.jsonl) and bad lines (RESULT.rejects.jsonl). Returns the result dict.
    `split`: score only turns of its eval trajectories (the others are counted, not scored).
    `progress(done, total)` is called after each scored turn."""
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
    for item in score_turns(chosen, sampler, verifier, tokenizer, cfg, too_long):
        items.append(item)
        if progress is not None:
            progress(len(items) + len(too_long), len(chosen))
    if not items:
        raise ValueError(f"{turns_path}: every prompt is longer than the engine takes "
                         f"({prompt_limit(sampler)} tokens; {len(too_long)} turns)")
    result = {"model": model_name, "turns_file": str(turns_path), "settings": cfg.model_dump(),
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
