"""`pivotrl demo`: PivotRL and its baselines on the built-in testbed, judged on frontiers.

The whole experiment, top to bottom:
  1. build (or load the cached) testbed: worlds' expert trajectories, OOD tasks, the tiny base;
  2. per world: extract the expert turns, profile them with the base (K samples, functional
     verifier), select the pivots;
  3. per world × method × learning rate × seed: train from the base for `steps` optimizer steps,
     checkpointing every `eval_every`; evaluate every checkpoint in-domain (multi-turn episodes
     on eval tasks), OOD, and its KL to the base on OOD text;
  4. the Theorem 3.2 check on the profiled states; the report (report.py).
Every stage is cached on disk (a finished training job writes rows.json), so a rerun, or a rerun
after a crash, redoes only unfinished work. The grid is fixed here, before any result is seen,
and is the same for every method.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from pivotrl.experiment.evaluate import EvalConfig
from pivotrl.yaml_config import load_model

METHODS = ("sft", "pivotrl", "pivotrl_no_filter", "pivotrl_random", "pivotrl_exact", "e2e_rl")
PIVOT_SET_ARMS = ("pivotrl", "pivotrl_exact", "pivotrl_random")  # sized by the pivot set


class DemoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt YAML key is an error, not ignored

    worlds: list[str] = Field(default_factory=lambda: ["toolshop", "terminal"],
                              description="Agentic worlds; one model is trained per world, as the "
                              "paper trains one model per domain.")
    seeds: list[int] = Field(default_factory=lambda: [0], description="Training seeds (--full: 3).")
    learning_rates: list[float] = Field(
        default_factory=lambda: [1e-4, 3e-4], description="The lr grid, the same for every method. "
        "docs/DESIGN.md: keep RL at ≤ 3e-4 on these tiny models. Measured on this testbed: "
        "a constant 1e-3 collapsed one-turn GRPO within 10 steps (OOD 0.96 → 0.28), so the grid "
        "is 1e-4–3e-4; --full adds 3e-5.")
    headline_lr: float = Field(3e-4, description="The lr of the report's headline table and "
                               "ablations: the grid's largest, where a short budget moves every "
                               "method most. The frontiers use every lr.")
    steps: int = Field(30, description="Optimizer steps per training run (sized for the default "
                       "demo on 2 cores; --full: 80).")
    eval_every: int = Field(10, description="Checkpoint and evaluate every N steps.")
    k: int = Field(8, description="Profiling samples per turn (the paper profiles with K samples of π0).")
    profile_turns: int = Field(480, description="Candidate turns profiled per world (the first N "
                               "of the SFT data's turns; ~120 pivots in toolshop. 120 turns gave "
                               "32 pivots, too few states to generalise from).")
    verifier: str = Field("state", description="Functional verifier: execution-based equivalence "
                          "in the world (the testbed worlds are executable).")
    num_generations: int = Field(8, description="G rollouts per pivot (paper: 16; 8 on 2 cores).")
    pivots_per_step: int = Field(4, description="Pivots per optimizer step (batch = G × this). "
                                 "Measured (scripts/probe_pivotrl.py, toolshop): with 2 pivots "
                                 "(16 completions) a step's gradient was so noisy that held-out "
                                 "turn accuracy fell at lr 3e-4; 4 pivots at 1e-4 raised it.")
    max_completion_length: int = Field(64, description="Tokens per one-turn rollout (a testbed "
                                       "action is < 60 tokens).")
    sft_batch_size: int = Field(8, description="Trajectories per SFT step.")
    e2e_tasks_per_step: int = Field(4, description="E2E RL: tasks per step, each with G episodes "
                                    "(as pivots_per_step: the same batch noise for both RL methods).")
    eval: EvalConfig = Field(default_factory=lambda: EvalConfig(
        episodes=30, turn_trajectories=30, ood_per_family=30, batch_size=30,
        verifiers={"toolshop": "state", "terminal": "state"}),
        description="Checkpoint evaluation: greedy episodes on 30 eval tasks and turn accuracy "
        "on the expert states of the same 30 tasks (in-domain), OOD families.")
    kl_prompts: int = Field(40, description="OOD texts for KL / rank correlation to the base.")
    theory_turns: int = Field(32, description="Profiled states in the Theorem 3.2 check.")
    workers: int = Field(2, description="Training jobs run in parallel (one per core, 1 thread each).")

    @classmethod
    def from_yaml(cls, path: Path) -> "DemoConfig":
        return load_model(cls, path)

    def full(self) -> "DemoConfig":
        """More seeds, learning rates, steps and eval tasks. Estimated ~6 h on 2 cores from the
        default run's per-step costs (not yet run); configs/demo_3seeds.yaml is the cheaper
        step: the default grid with 3 seeds (~1.5 h)."""
        return self.model_copy(update={
            "seeds": [0, 1, 2], "learning_rates": [3e-5, 1e-4, 3e-4], "steps": 80,
            "eval_every": 20, "profile_turns": 960,
            "eval": self.eval.model_copy(update={"episodes": 100, "turn_trajectories": 100,
                                                 "ood_per_family": 100})})


@dataclass(frozen=True)
class Job:
    world: str
    method: str
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.world}/{self.method}/lr{self.lr:g}-seed{self.seed}"


def say(msg: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(f"[bold cyan]demo[/] {msg}")


# ------------------------------------------------------------------ stage 2: turns → pivots


def prepare_world(testbed: Path, out: Path, world: str, cfg: DemoConfig) -> dict[str, Any]:
    """Extract, profile (resumable) and select the pivots of one world with the base model."""
    from pivotrl.extract import ExtractOptions, extract_file
    from pivotrl.profiling import ProfileConfig, profile_file
    from pivotrl.records import iter_valid, Turn, write_atomic
    from pivotrl.sampling import get_sampler
    from pivotrl.pivots import SelectConfig, select_file
    from pivotrl.verifiers import get_verifier

    wdir = out / "data" / world
    wdir.mkdir(parents=True, exist_ok=True)
    stats_file = wdir / "pivots.stats.json"
    if stats_file.exists() and (wdir / "pivots.jsonl").exists():
        return json.loads(stats_file.read_text())
    all_turns = wdir / "all_turns.jsonl"
    extract_file(testbed / world / "train.jsonl", all_turns, ExtractOptions())
    turns = wdir / "turns.jsonl"
    write_atomic(turns, (t for i, t in enumerate(iter_valid(all_turns, Turn)) if i < cfg.profile_turns))
    pcfg = ProfileConfig(k=cfg.k, verifier=cfg.verifier, seed=0,
                         max_new_tokens=cfg.max_completion_length)
    sampler = get_sampler("hf", str(testbed / "base"), batch_size=64, device="cpu")
    profile_file(turns, wdir / "profile.jsonl", sampler, get_verifier(cfg.verifier),
                 sampler.tokenizer, pcfg, model_name=str(testbed / "base"), progress=False)
    stats = select_file(wdir / "profile.jsonl", wdir / "pivots.jsonl", SelectConfig())
    n_profiled = sum(1 for _ in open(wdir / "profile.jsonl"))
    stats["profile_rollout_turns"] = n_profiled * cfg.k
    stats_file.write_text(json.dumps(stats, indent=2))
    return stats


def prepare_world_1thread(testbed: Path, out: Path, world: str, cfg: DemoConfig) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # one world per core
    return prepare_world(testbed, out, world, cfg)


# ------------------------------------------------------------------ stage 3: one training job


def train_job(job: Job, testbed: Path, out: Path, cfg: DemoConfig) -> Path:
    """Train one run; checkpoints land in job_dir/checkpoint-<step>. Returns job_dir."""
    from pivotrl.train.config import GRPORunConfig, SFTRunConfig

    job_dir = out / "runs" / job.name
    base = str(testbed / "base")
    common = dict(model=base, output_dir=job_dir, learning_rate=job.lr, max_steps=cfg.steps,
                  save_steps=cfg.eval_every, seed=job.seed, logging_steps=1, warmup_steps=0)
    trl_only = dict(precision="fp32", lr_scheduler_type="constant_with_warmup")
    if job.method == "sft":
        from pivotrl.train.sft import train_sft

        train_sft(SFTRunConfig(data=testbed / job.world / "train.jsonl",
                               per_device_train_batch_size=cfg.sft_batch_size, **common, **trl_only))
    elif job.method == "e2e_rl":
        from pivotrl.train.config import E2ERunConfig
        from pivotrl.experiment.e2e import train_e2e

        train_e2e(E2ERunConfig(world=job.world, tasks=testbed / job.world / "train.jsonl",
                               num_generations=cfg.num_generations,
                               tasks_per_step=cfg.e2e_tasks_per_step,
                               max_completion_length=cfg.max_completion_length, **common))
    else:
        wdir = out / "data" / job.world
        pivot_set = {"pivotrl": "pivots", "pivotrl_exact": "pivots",
                     "pivotrl_no_filter": "all", "pivotrl_random": "random"}[job.method]
        from pivotrl.train.grpo import train

        train(GRPORunConfig(
            pivots=wdir / "pivots.jsonl", turns=wdir / "profile.jsonl", pivot_set=pivot_set,
            verifier="exact" if job.method == "pivotrl_exact" else cfg.verifier,
            num_generations=cfg.num_generations,
            per_device_train_batch_size=cfg.num_generations * cfg.pivots_per_step,
            max_completion_length=cfg.max_completion_length, **common, **trl_only))
    return job_dir


def rollout_turns_at(job: Job, step: int, job_dir: Path, cfg: DemoConfig,
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
    profiling = pivot_stats["profile_rollout_turns"] if job.method in ("pivotrl", "pivotrl_exact") else 0
    return rollouts + profiling


# ------------------------------------------------------------------ evaluation


class Evaluator:
    """Loads the testbed's eval sets and the base once per process."""

    def __init__(self, testbed: Path, cfg: DemoConfig):
        from pivotrl.experiment.evaluate import load_ood_eval, load_trajectories, ood_texts
        from pivotrl.experiment.testbed.tiny import load_tiny

        self.cfg, self.testbed = cfg, testbed
        self.base, self.tokenizer = load_tiny(testbed / "base")
        self.ood = load_ood_eval(testbed, cfg.eval.ood_per_family)
        self.kl_texts = ood_texts(self.tokenizer, self.ood[:: max(1, len(self.ood) // cfg.kl_prompts)])
        n = cfg.eval.episodes and cfg.eval.turn_trajectories and max(cfg.eval.episodes,
                                                                      cfg.eval.turn_trajectories)
        self.trajs = {w: load_trajectories(testbed / w / "eval.jsonl", n) for w in cfg.worlds}

    def __call__(self, model_dir: Path | None, world: str) -> dict[str, Any]:
        from pivotrl.experiment.evaluate import evaluate_ood, evaluate_world, ood_logprob_stats
        from pivotrl.experiment.testbed.tiny import load_tiny

        model, tok = (self.base, self.tokenizer) if model_dir is None else load_tiny(model_dir)
        ind = evaluate_world(model, tok, world, self.trajs[world], self.cfg.eval)
        ood = evaluate_ood(model, tok, self.ood, self.cfg.eval.batch_size)
        kl = (ood_logprob_stats(model, self.base, tok, self.kl_texts) if model_dir is not None
              else {"kl": 0.0, "rank_corr": 1.0})
        return {"in_domain": ind, "ood": ood, "kl_to_base": kl["kl"], "rank_corr": kl["rank_corr"]}


def run_job(job: Job, testbed: Path, out: Path, cfg: DemoConfig,
            pivot_stats: dict[str, Any]) -> list[dict[str, Any]]:
    """Train + evaluate every checkpoint of one job; cached in job_dir/rows.json."""
    import torch

    torch.set_num_threads(1)
    job_dir = out / "runs" / job.name
    done = job_dir / "rows.json"
    if done.exists():
        return json.loads(done.read_text())
    t0 = time.time()
    train_job(job, testbed, out, cfg)
    train_s = time.time() - t0
    evaluator = Evaluator(testbed, cfg)
    rows = []
    for step in range(cfg.eval_every, cfg.steps + 1, cfg.eval_every):
        ckpt = job_dir / f"checkpoint-{step}"
        if not ckpt.exists() and step == cfg.steps:
            ckpt = job_dir  # the e2e loop writes its last step as the final model only
        if not (ckpt / "config.json").exists():
            raise FileNotFoundError(f"{job.name}: no checkpoint at step {step} ({ckpt})")
        rows.append({"method": job.method, "world": job.world, "seed": job.seed, "lr": job.lr,
                     "step": step,
                     "rollout_turns": rollout_turns_at(job, step, job_dir, cfg, pivot_stats),
                     **evaluator(ckpt, job.world)})
    rows[-1]["train_seconds"] = train_s
    rows[-1]["eval_seconds"] = time.time() - t0 - train_s
    tmp = done.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows))
    tmp.replace(done)
    return rows


# ------------------------------------------------------------------ the whole demo


def record_invocation(out: Path, seconds: float, *, trained: int, jobs: int) -> list[dict[str, Any]]:
    """Append this invocation to OUT/invocations.json and return them all: the report states
    the time of every run that built the folder, not only a cached rerun's seconds."""
    path = out / "invocations.json"
    runs = json.loads(path.read_text()) if path.exists() else []
    runs.append({"finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "wall_seconds": round(seconds, 1),
                 "jobs_trained": trained, "jobs": jobs})
    path.write_text(json.dumps(runs, indent=1))
    return runs


def run_demo(out: Path, cfg: DemoConfig, *, testbed: Path | None = None,
             testbed_config=None, log: Callable[[str], None] = say) -> dict[str, Any]:
    from pivotrl.records import Profile, iter_valid
    from pivotrl.experiment.report import write_report
    from pivotrl.experiment.testbed.build import build_testbed
    from pivotrl.experiment.testbed.tiny import load_tiny
    from pivotrl.experiment.theory import gradient_vs_std

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    testbed = testbed or out / "testbed"
    log(f"1/4 testbed in {testbed} (cached after the first build)")
    info = build_testbed(testbed, testbed_config, progress=lambda m: log(f"  build: {m}"))
    log(f"  testbed ready ({'cached' if info.get('cached') else 'built'})")

    log(f"2/4 {', '.join(cfg.worlds)}: extract, profile {cfg.profile_turns} turns with the base "
        f"(K={cfg.k}, verifier {cfg.verifier}), select; one world per worker")
    pivot_stats = {}
    with ProcessPoolExecutor(max_workers=min(cfg.workers, len(cfg.worlds))) as pool:
        futures = {w: pool.submit(prepare_world_1thread, testbed, out, w, cfg) for w in cfg.worlds}
        for world, fut in futures.items():
            pivot_stats[world] = s = fut.result()
            log(f"  {world}: {s.get('turns')} turns, {s.get('kept')} pivots "
                f"({s.get('all_fail')} all-fail, {s.get('all_pass')} all-pass, {s.get('mixed')} mixed)")

    evaluator = Evaluator(testbed, cfg)
    rows: list[dict[str, Any]] = []
    base_cache = out / "runs" / "base_rows.json"
    if base_cache.exists():
        rows += json.loads(base_cache.read_text())
    else:
        base_rows = []
        for world in cfg.worlds:
            ev = evaluator(None, world)
            for seed in cfg.seeds:
                base_rows.append({"method": "base", "world": world, "seed": seed, "lr": 0.0,
                                  "step": 0, "rollout_turns": 0, **ev})
        base_cache.parent.mkdir(parents=True, exist_ok=True)
        base_cache.write_text(json.dumps(base_rows))
        rows += base_rows

    jobs = [Job(w, m, lr, s) for s in cfg.seeds for lr in cfg.learning_rates for w in cfg.worlds
            for m in METHODS]
    for world in cfg.worlds:
        if not pivot_stats[world].get("kept"):
            # Nothing to train on: the base never, or always, solves these turns. Said, not hidden.
            log(f"  {world}: no pivots, so the pivot-set arms (pivotrl, pivotrl_exact, "
                "pivotrl_random) are not trained there")
            jobs = [j for j in jobs if not (j.world == world and j.method in PIVOT_SET_ARMS)]
    # Longest first (E2E episodes, then one-turn GRPO, then SFT), so no long job starts last and
    # leaves a core idle at the end; the order never changes what a job computes.
    jobs.sort(key=lambda j: {"e2e_rl": 0, "sft": 2}.get(j.method, 1))
    log(f"3/4 {len(jobs)} training runs × {cfg.steps // cfg.eval_every} checkpoints, "
        f"{cfg.workers} at a time")
    t_jobs = time.time()
    trained = sum(not (out / "runs" / j.name / "rows.json").exists() for j in jobs)
    with ProcessPoolExecutor(max_workers=cfg.workers) as pool:
        futures = {pool.submit(run_job, j, testbed, out, cfg, pivot_stats[j.world]): j for j in jobs}
        for i, fut in enumerate(as_completed(futures), start=1):
            job = futures[fut]
            rows += fut.result()
            per_job = (time.time() - t_jobs) / i
            log(f"  [{i}/{len(jobs)}] {job.name} done; ETA {per_job * (len(jobs) - i) / 60:.1f} min")

    log("4/4 theory checks and report")
    theory_file = out / "theory.json"
    if theory_file.exists():
        theory = json.loads(theory_file.read_text())
    else:
        model, tok = load_tiny(testbed / "base")
        profiles = []
        for world in cfg.worlds:
            profiles += list(iter_valid(out / "data" / world / "profile.jsonl", Profile))[
                : cfg.theory_turns // len(cfg.worlds)]
        theory = gradient_vs_std(model, tok, profiles)
        theory_file.write_text(json.dumps(theory))
    invocations = record_invocation(out, time.time() - start, trained=trained, jobs=len(jobs))
    results = write_report(rows, out, seeds=cfg.seeds, headline_lr=cfg.headline_lr,
                           wall_seconds=time.time() - start, theory=theory,
                           pivot_stats=pivot_stats, config=cfg.model_dump(mode="json"),
                           invocations=invocations)
    log(f"done in {(time.time() - start) / 60:.1f} min: {out / 'report.md'}")
    return results
