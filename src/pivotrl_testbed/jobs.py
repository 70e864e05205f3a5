"""The demo's stage 4: one training job (world × method × lr × seed) trained under the budget
rule (`budget.py`) with every checkpoint scored on dev as it lands, and the eval split scored
at a chosen checkpoint.

A job trains in segments, one per checkpoint step (`DemoConfig.checkpoint_steps`), each resuming the last checkpoint (the trainer's
for SFT and PivotRL, the E2E loop's own for E2E RL). After each checkpoint is scored on dev the
rule decides whether the job goes on, on this job's own dev score: the same arm's job in another
world never stops it (budget.py says why).
Each checkpoint's dev scores are cached beside it (dev-step<N>.json), and a finished job writes
rows.json, so a rerun, or a rerun after a crash, redoes only unfinished work."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pivotrl_testbed.budget import stop_step
from pivotrl_testbed.checkpoint_eval import (
    EVAL_KEYS,
    Evaluator,
    decoded,
    item_rows,
    score_dev,
    write_jsonl,
)
from pivotrl_testbed.demo_config import HEADLINE_ARMS, PROFILED_ARMS
from pivotrl_testbed.stats import checkpoint_scores
from pivotrl.io.records import read_jsonl, write_text_atomic


@dataclass(frozen=True)
class Job:
    world: str
    method: str
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.world}/{self.method}/lr{self.lr:g}-seed{self.seed}"


def train_job(job: Job, testbed: Path, out: Path, cfg: Any, until: int | None = None) -> Path:
    """Train one run to step `until` (default: its cap, `cfg.cap(method)`), continuing from its last
    checkpoint when there is one; checkpoints land in job_dir/checkpoint-<step>. Returns
    job_dir. Every arm trains on the same trajectories (data/<world>/trajectories.jsonl) or
    their turns."""
    from pivotrl.train.config import GRPORunConfig, SFTRunConfig

    job_dir = out / "runs" / job.name
    wdir = out / "data" / job.world
    base = str(testbed / "base")
    # Continue from a checkpoint; a folder without one holds only a start that was stopped early.
    resume = any(job_dir.glob("checkpoint-*"))
    common = dict(model=base, output_dir=job_dir, learning_rate=job.lr,
                  max_steps=cfg.cap(job.method) if until is None else until, save_steps=cfg.save_every(),
                  seed=job.seed, logging_steps=1, warmup_steps=0, resume=resume, overwrite=not resume)
    trl_only = dict(precision="fp32", lr_scheduler_type="constant_with_warmup")
    # The demo says what it trains; each segment's plan is saved in its folder, not printed.
    from pivotrl.io.run_plan import Launch

    quiet = Launch(quiet=True)
    if job.method == "sft":
        from pivotrl.train.sft import train_sft

        train_sft(SFTRunConfig(data=wdir / "trajectories.jsonl",
                               per_device_train_batch_size=cfg.sft_batch_size, **common, **trl_only),
                  launch=quiet)
    elif job.method == "e2e_rl":
        from pivotrl_testbed.e2e import E2ERunConfig, train_e2e

        train_e2e(E2ERunConfig(world=job.world, tasks=wdir / "trajectories.jsonl",
                               num_generations=cfg.num_generations,
                               tasks_per_step=cfg.e2e_tasks_per_step,
                               max_completion_length=cfg.max_completion_length, **common), launch=quiet)
    else:
        from pivotrl.train.grpo import train

        pivots = wdir / "pivots.jsonl"
        strategy = {"pivotrl_no_filter": "all", "pivotrl_random": "random"}.get(job.method)
        if strategy is not None:
            # The ablations' training states are `pivotrl select --strategy all|random` over the
            # same profile, random drawing as many turns as the pivot arm trains on (one file per
            # job: parallel jobs never share a writer).
            from pivotrl.io.turn_files import iter_pivots
            from pivotrl.select import SelectConfig, select_file

            chosen = wdir / f"pivots.{job.method}.lr{job.lr:g}.seed{job.seed}.jsonl"
            size = len(iter_pivots(pivots)) if strategy == "random" else None
            select_file(wdir / "profile.jsonl", chosen, SelectConfig(strategy=strategy, seed=job.seed, budget=size),
                        plot_png=False, allow_empty=True)
            pivots = chosen
        exact = job.method == "pivotrl_exact"  # the paper's strict string-match ablation
        train(GRPORunConfig(
            pivots=pivots, verifier="exact" if exact else cfg.verifier,
            verifier_config={"strict": True} if exact else {},
            num_generations=cfg.num_generations,
            per_device_train_batch_size=cfg.num_generations * cfg.pivots_per_step,
            max_completion_length=cfg.max_completion_length, **common, **trl_only), launch=quiet)
    return job_dir


def rollout_turns_at(job: Job, step: int, job_dir: Path, cfg: Any,
                     pivot_stats: dict[str, Any]) -> int:
    """Model turns generated up to `step`: profiling (pivot arms) + rollouts. SFT generates none."""
    if job.method == "sft":
        return 0
    if job.method == "e2e_rl":
        done = 0
        for line in open(job_dir / "metrics.jsonl"):
            row = json.loads(line)
            if row.get("step", 0) <= step:
                done = max(done, int(row.get("rollout_turns", 0)))
        return done
    rollouts = cfg.num_generations * cfg.pivots_per_step * step
    profiling = pivot_stats["profile_rollout_turns"] if job.method in PROFILED_ARMS else 0
    return rollouts + profiling


def tokens_at(job: Job, step: int, job_dir: Path) -> dict[str, int]:
    """`train_tokens` and `rollout_tokens` (pivotrl.train.tokens) up to `step`: the counters the
    trainer logged at that step in metrics.jsonl; a counter it did not log there (an older run)
    is left out, never guessed. SFT generates nothing: 0 rollout tokens."""
    got: dict[str, int] = {"rollout_tokens": 0} if job.method == "sft" else {}
    metrics = job_dir / "metrics.jsonl"
    for line in (metrics.read_text().splitlines() if metrics.exists() else []):
        row = json.loads(line)
        if row.get("step") == step:
            got.update({k: int(row[k]) for k in ("train_tokens", "rollout_tokens") if k in row})
    return got


def checkpoint_dir(job: Job, out: Path, step: int) -> Path | None:
    """The model dir of a job's checkpoint at `step`, None when not trained (yet)."""
    ckpt = out / "runs" / job.name / f"checkpoint-{step}"
    return ckpt if (ckpt / "config.json").exists() else None


def dev_score(items: list[dict[str, Any]], cfg: Any) -> float:
    """The budget rule's score of one checkpoint: its mean dev outcome on the selection measure
    and decoding (stats.checkpoint_scores; one checkpoint's rows in, one score out)."""
    scores = checkpoint_scores(decoded(items, cfg.select_decoding), split="dev", measure=cfg.select_on)
    return next(iter(scores.values())) if scores else 0.0


def run_job(job: Job, testbed: Path, out: Path, cfg: Any, pivot_stats: dict[str, Any],
            start: float | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train one job under the budget rule from the base's dev score `start`, scoring each
    checkpoint on dev as it lands; cached in job_dir/rows.json and job_dir/items.jsonl (written
    before rows.json, so rows.json marks a finished job). The last row records where and why
    the job stopped (`stop_step`, `stop_reason`)."""
    import torch

    torch.set_num_threads(cfg.threads)
    job_dir = out / "runs" / job.name
    done = job_dir / "rows.json"
    cap = cfg.cap(job.method)
    train_s, eval_s = 0.0, 0.0
    if done.exists() and (job_dir / "items.jsonl").exists():
        # dev only: eval scores live beside, per chosen checkpoint (`score_chosen`)
        rows = [{k: v for k, v in r.items() if k not in EVAL_KEYS} for r in json.loads(done.read_text())]
        items = [r for r in read_jsonl(job_dir / "items.jsonl") if r["split"] == "dev"]
        scores = [(s, dev_score([r for r in items if r["step"] == s], cfg))
                  for s in sorted({r["step"] for r in items})]
        if stop_step(scores, cfg.budget, cap=cap, start=start, every=cfg.eval_every)[0] == rows[-1].get("stop_step"):
            return rows, items
        # Stopped where this rule would not stop it (the rule or the cap changed since): it goes
        # on from its last checkpoint, its scored ones reread from their caches below.
        train_s, eval_s = rows[-1].get("train_seconds") or 0.0, rows[-1].get("eval_seconds") or 0.0
    key = dict(method=job.method, world=job.world, seed=job.seed, lr=job.lr)
    rows, items, scores = [], [], []
    evaluator, stop, why = None, None, "running"
    for step in cfg.checkpoint_steps(job.method):
        cache = job_dir / f"dev-step{step}.json"
        if cache.exists():
            got = json.loads(cache.read_text())
        else:
            t0 = time.time()
            if checkpoint_dir(job, out, step) is None:
                train_job(job, testbed, out, cfg, until=step)
            t1 = time.time()
            ckpt = checkpoint_dir(job, out, step)
            if ckpt is None:  # never score the base in a checkpoint's place
                raise FileNotFoundError(f"{job.name}: training left no checkpoint at step {step}")
            evaluator = evaluator or Evaluator(testbed, cfg)
            got_rows, got_items = score_dev(
                key, {step: ckpt}, evaluator,
                lambda s: {"rollout_turns": rollout_turns_at(job, s, job_dir, cfg, pivot_stats),
                           **tokens_at(job, s, job_dir)})
            got = {"row": got_rows[0], "items": got_items}
            write_text_atomic(cache, json.dumps(got))
            train_s, eval_s = train_s + t1 - t0, eval_s + time.time() - t1
        rows.append(got["row"])
        items += got["items"]
        scores.append((step, dev_score(got["items"], cfg)))
        stop, why = stop_step(scores, cfg.budget, cap=cap, start=start, every=cfg.eval_every)
        if stop is not None:
            break
    rows[-1].update(train_seconds=train_s, eval_seconds=eval_s, stop_step=stop, stop_reason=why)
    write_jsonl(job_dir / "items.jsonl", items)
    write_text_atomic(done, json.dumps(rows))
    return rows, items


def eval_at(job: Job, step: int, testbed: Path, out: Path,
            cfg: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One checkpoint on the eval split: (its rates, item rows); cached beside the job."""
    import torch

    torch.set_num_threads(cfg.threads)
    cache = out / "runs" / job.name / f"eval-step{step}.json"
    if cache.exists():
        got = json.loads(cache.read_text())
        return got["row"], got["items"]
    ckpt = checkpoint_dir(job, out, step)
    if ckpt is None:
        raise FileNotFoundError(f"{job.name}: no checkpoint at step {step}")
    row, scored = Evaluator(testbed, cfg)(ckpt, job.world, ("eval",))
    items = item_rows(scored, method=job.method, world=job.world, seed=job.seed, lr=job.lr, step=step)
    row = {k: row[k] for k in EVAL_KEYS if k in row}
    write_text_atomic(cache, json.dumps({"row": row, "items": items}))
    return row, items


def grid_at(job: Job | None, world: str, step: int, testbed: Path, out: Path,
            cfg: Any) -> list[dict[str, Any]]:
    """The decoding rule's dev side (`Evaluator.grid`) at one chosen checkpoint, or at the base
    (`job` None: step 0 of every seed, scored once whatever the seeds); item rows, cached
    beside the job. pass@k only at the base and the headline arms' first `decoding.pass_seeds`
    seeds: no verdict reads it, and the ablations are judged on turn accuracy alone."""
    with_pass = job is None or (job.method in HEADLINE_ARMS
                                and job.seed in cfg.decoding.seeds_with_pass(cfg.seeds))
    return _cached_rows(job, world, step, testbed, out, cfg, "dev-grid",
                        lambda ev, ckpt: ev.grid(ckpt, world, cfg.decoding, with_pass))


def temperature_at(job: Job | None, world: str, step: int, temperature: float, testbed: Path,
                   out: Path, cfg: Any) -> list[dict[str, Any]]:
    """The eval split at an arm's dev-best temperature (`Evaluator.at_temperature`) at one of its
    chosen checkpoints, or at the base (`job` None); item rows, cached beside the job."""
    return _cached_rows(job, world, step, testbed, out, cfg, f"eval-T{temperature:g}",
                        lambda ev, ckpt: ev.at_temperature(ckpt, world, temperature, cfg.decoding))


def _cached_rows(job: Job | None, world: str, step: int, testbed: Path, out: Path, cfg: Any,
                 what: str, score: Callable[[Evaluator, Path | None], list[dict[str, Any]]]
                 ) -> list[dict[str, Any]]:
    """`score(evaluator, checkpoint)` at one checkpoint (the base's: None), cached as `what`
    beside the job, as item rows (the base's under every seed)."""
    import torch

    torch.set_num_threads(cfg.threads)
    name = job.name if job is not None else "base"
    cache = out / "runs" / name / (f"{what}-step{step}.json" if job is not None else f"{world}.{what}.json")
    if cache.exists():
        scored = json.loads(cache.read_text())
    else:
        ckpt = None if job is None else checkpoint_dir(job, out, step)
        if job is not None and ckpt is None:
            raise FileNotFoundError(f"{job.name}: no checkpoint at step {step}")
        scored = score(Evaluator(testbed, cfg), ckpt)
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cache, json.dumps(scored))
    if job is None:
        return [r for s in cfg.seeds for r in item_rows(scored, method="base", world=world,
                                                         seed=s, lr=0.0, step=0)]
    return item_rows(scored, method=job.method, world=job.world, seed=job.seed, lr=job.lr, step=step)
