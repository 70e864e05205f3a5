"""`pivotrl demo`: PivotRL and its baselines on the built-in testbed, judged on paired items.

The whole experiment, top to bottom:
  1. build (or load the cached) testbed: worlds' expert trajectories, OOD tasks, the tiny base;
  2. per world: the first `profile_trajectories` expert trajectories are THE training data of
     every arm: all their turns are profiled with the base (K samples, functional verifier) and
     the pivots selected among them; SFT trains on exactly these trajectories and E2E RL on
     their tasks;
  3. the base is scored on the dev and eval splits (disjoint tasks of the eval file); the
     planning half-widths of the headline paired differences and the largest rollout ratio the
     schedule can show are printed, before any training;
  4. per world × method × learning rate × seed (jobs.py): train from the base, checkpointing
     every `eval_every` steps, until the run's dev score stops improving or the `steps` cap
     (budget.py); score every checkpoint on dev as it lands (episodes, turns, OOD), item by
     item, greedy and sampled (k samples at the training temperature), and its KL to the base;
  5. choose each run's checkpoint and each method's lr on dev, and match the arms' dev
     frontiers (frontier.py); score the eval split at exactly those checkpoints, and the
     decoding grid at the chosen ones (decoding.py: each arm at its dev-best temperature); the
     theory checks (theory.py, joint_theory.py); paired verdicts on eval (stats.py); collapsed
     measures and failing worlds flagged (health.py); the report (report.py, joint_report.py).
Every stage is cached on disk (a finished training job writes rows.json and items.jsonl), so a
rerun, or a rerun after a crash, redoes only unfinished work. The grid is fixed here, before any
result is seen, and is the same for every method.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pivotrl_testbed.budget import BudgetRule, schedule_bound
from pivotrl_testbed.decoding import DecodingRule
from pivotrl_testbed.checkpoint_eval import (
    Evaluator,
    decoded,
    eval_targets,
    item_rows,
    merge_eval,
    write_jsonl,
)
from pivotrl_testbed.evaluate import EvalConfig, SampledConfig
from pivotrl_testbed.frontier import FrontierConfig
from pivotrl_testbed.jobs import Job, eval_at, grid_at, run_job, train_job  # noqa: F401 - scripts import them here
from pivotrl.io.progress import duration
from pivotrl.io.records import write_text_atomic
from pivotrl.io.yaml_config import field_like, load_model
from pivotrl.verifiers.options import VerifierOptions


class _InThisProcess(Executor):
    """One worker: jobs run here, in order (nothing to start, and a debugger sees them)."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            fut.set_exception(exc)
        return fut


def workers_pool(n: int) -> Executor:
    """n worker processes, started as fresh interpreters: forking a process that holds torch's
    thread pools can deadlock the child (Python 3.14 makes spawn-like starts the default for the
    same reason)."""
    if n <= 1:
        return _InThisProcess()
    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))


METHODS = ("sft", "pivotrl", "pivotrl_no_filter", "pivotrl_random", "pivotrl_exact", "e2e_rl")
PIVOT_SET_ARMS = ("pivotrl", "pivotrl_exact", "pivotrl_random")  # sized by the pivot set
HEADLINE_ARMS = ("sft", "pivotrl", "e2e_rl")  # the paper's comparison; the rest are ablations


class DemoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt YAML key is an error, not ignored

    worlds: list[str] = Field(default_factory=lambda: ["toolshop", "terminal"],
                              description="Agentic worlds; one model is trained per world, as the "
                              "paper trains one model per domain.")
    methods: list[str] = Field(
        default_factory=lambda: ["sft", "pivotrl", "e2e_rl"], description="Arms to train (the "
        "base is always scored). The default grid holds the paper's three headline arms; the "
        "ablations (pivotrl_no_filter: every turn; pivotrl_random: random turns, as many as the "
        "pivots; pivotrl_exact: strict string-match reward) are in --full.")
    seeds: list[int] = Field(default_factory=lambda: [0], description="Training seeds (--full: 4).")
    ablation_seeds: int = Field(0, ge=0, description="The ablation arms (pivotrl_no_filter, "
                                "pivotrl_random, pivotrl_exact) train on the first N seeds only "
                                "(0: every seed). Their verdicts pair them with PivotRL on those "
                                "seeds; the headline arms' power is what the seeds are for.")
    learning_rates: list[float] = Field(
        default_factory=lambda: [1e-4], description="The lr grid, the same for every method. On "
        "the shipped base a run of the grid {1e-4, 3e-4} (1 seed, docs/RESULTS.md) chose 1e-4 on "
        "dev for every arm (3e-4 lowered every arm's dev score), so the default and --full train "
        "at 1e-4; `learning_rates: [0.0001, 0.0003]` in a --config reruns the grid. "
        "docs/DESIGN.md: keep RL at ≤ 3e-4 on these tiny models (a constant 1e-3 collapsed "
        "one-turn GRPO within 10 steps, OOD 0.96 → 0.28).")
    select_on: Literal["turn", "episode"] = Field(
        "turn", description="Dev measure that chooses each run's checkpoint and each method's lr, "
        "stops a run (`budget`) and matches the frontiers (turn accuracy: the finer one).")
    select_decoding: Literal["greedy", "sampled"] = Field(
        "sampled", description="Decoding of that dev measure (both are scored and judged). "
        "Sampled, at the training temperature: what GRPO optimises (the expected reward) and how "
        "thinking models are scored. With greedy selection on the shipped base every run stopped "
        "by step 30 while PivotRL's sampled dev score still rose (docs/RESULTS.md).")
    steps: int = Field(60, description="The cap: most optimizer steps per training run. A dev probe "
                       "(toolshop, 3 seeds): PivotRL (16 pivots/step, lr 3e-4) peaked by step 40, SFT's dev "
                       "accuracy still rose at 30 and matched it near 60.")
    e2e_steps: int = Field(150, description="E2E RL's own cap (the budget rule still stops it when "
                           "dev stops improving). At the shared cap of 60 the schedule could show "
                           "at most 2.09x fewer rollout turns for PivotRL with its profiling "
                           "(candidate D4, docs/RESULTS.md): the paper's 4x was ruled out before "
                           "any run. 150 lets E2E RL spend ~2.5x that, so the runs decide it.")
    budget: BudgetRule = Field(default_factory=BudgetRule, description="Each run stops when its dev "
                               "score has not improved for `patience` checkpoints (experiment/"
                               "budget.py), the same rule for every arm.")
    match_tolerance: float = Field(0.02, description="Frontier matching: largest dev difference for "
                                   "two checkpoints to count as matched (experiment/frontier.py).")
    decoding: DecodingRule = Field(default_factory=DecodingRule, description="The decoding "
                                   "each arm is judged at, fixed by rule: the dev-best temperature "
                                   "of a grid at its chosen checkpoints, and pass@k / pass^k at "
                                   "the training temperature (pivotrl_testbed/decoding.py).")
    sampled: SampledConfig = Field(default_factory=SampledConfig, description="Sampled scoring "
                                   "beside greedy: k samples per item at the training temperature "
                                   "(turn accuracy and OOD; episodes off: k episodes per task).")
    dev_greedy: bool = Field(False, description="Score the dev split greedily too at every "
                             "checkpoint (episodes, turns, OOD), beside the sampled scoring. Off, "
                             "nothing the demo decides loses an input: the budget rule, each "
                             "checkpoint and lr choice and the frontier's matching read the dev split "
                             "in `select_decoding`, and every verdict reads the eval split, scored "
                             "both ways where it is read. Greedy dev scoring was half of each "
                             "checkpoint's dev evaluation (terminal: 12 of 17.6 s); on, the dev "
                             "curves are drawn greedy as well. Always on with greedy selection.")
    eval_every: int = Field(10, description="Checkpoint every N steps; every checkpoint is scored "
                            "on dev, the dev-chosen one on eval (experiment/checkpoint_eval.py).")
    k: int = Field(8, description="Profiling samples per turn (the paper profiles with K samples of π0).")
    profile_trajectories: int = Field(100, description="Expert trajectories per world that every "
                                      "arm trains on: all their turns are PivotRL's candidates "
                                      "(~430 turns, the profiling cost of the 480 turns measured "
                                      "before), SFT's data and E2E RL's tasks. 0 = all of "
                                      "train.jsonl.")
    dev_tasks: int = Field(40, description="The first N tasks of each world's eval.jsonl are the "
                           "dev split (checkpoint and lr choice); the next `eval.episodes` are "
                           "the eval split the verdicts are measured on.")
    dev_ood_per_family: int = Field(40, description="OOD dev tasks per family (the first N); the "
                                    "next `eval.ood_per_family` are the eval split.")
    verifier: str = field_like(VerifierOptions, "verifier", default="state", note="Here execution-based "
                               "equivalence in the world (the testbed worlds are executable).")
    num_generations: int = Field(8, description="G rollouts per pivot (paper: 16; 8 on 2 cores).")
    pivots_per_step: int = Field(16, description="Pivots per optimizer step (batch = G × this). "
                                 "A dev probe (toolshop, 3 seeds): 4 pivots at lr ≤ 3e-4 left PivotRL flat "
                                 "(+0.014 turn accuracy); 16 at 3e-4 gained +0.057 greedy, +0.111 "
                                 "sampled by step 40. 2 pivots were too noisy (probe_pivotrl.py).")
    max_completion_length: int = Field(64, description="Tokens per one-turn rollout (a testbed "
                                       "action is < 60 tokens).")
    sft_batch_size: int = Field(8, description="Trajectories per SFT step.")
    e2e_tasks_per_step: int = Field(4, description="E2E RL: tasks per step, each with G episodes "
                                    "(as pivots_per_step: the same batch noise for both RL methods).")
    eval: EvalConfig = Field(default_factory=lambda: EvalConfig(
        episodes=100, turn_trajectories=100, ood_per_family=60, batch_size=30,
        verifiers={"toolshop": "state", "terminal": "state"}),
        description="Evaluation of a checkpoint on the eval split: greedy episodes on 100 tasks per "
        "world and turn accuracy on the expert states of the same 100 tasks, 60 OOD tasks per "
        "family: with the 40 dev tasks, the testbed's whole eval file (140 per world, 100 OOD). "
        "Every seed is scored on the same items, so their clusters set the headline interval: "
        "at 60 tasks per world it stayed ±0.0215 from 5 to 8 seeds; at 100 it is ±0.016 at 6 "
        "(docs/RESULTS.md).")
    kl_prompts: int = Field(40, description="OOD texts for KL / rank correlation to the base.")
    theory_turns: int = Field(32, description="Profiled states (half pivots, half not) in "
                              "the theory checks.")
    theory_samples: int = Field(16, description="Actions sampled per state in the theory checks.")
    workers: int = Field(2, description="Training jobs run in parallel (one per core, 1 thread each).")

    @classmethod
    def from_yaml(cls, path: Path) -> "DemoConfig":
        return load_model(cls, path)

    def cap(self, method: str) -> int:
        """The most optimizer steps a run of `method` may take."""
        return self.e2e_steps if method == "e2e_rl" else self.steps

    def full(self) -> "DemoConfig":
        """Every arm (ablations included) and four seeds, at the default's budget per run, so a
        --full run into a folder that holds the default run trains only what it adds (finished
        jobs are cached). The seeds buy little power on the headline turn accuracy: every seed
        is scored on the same eval items, whose clusters set the interval (measured on 60 eval
        tasks per world: ±0.0235 at two seeds, ±0.0216 at six, ±0.0215 at eight; on 100:
        ±0.0177 at one, ±0.0159 at six), so four keep it within ±0.021; they make the verdicts
        hold across training noise. The ablations train on the first three seeds, so each
        ablation verdict holds across seeds too: 4 × 3 headline + 3 × 3 ablation runs per world
        are the 6 × 3 + 1 × 3 of the six-seed grid, the same 2-h budget."""
        return self.model_copy(update={"seeds": list(range(4)), "methods": list(METHODS),
                                       "ablation_seeds": 3})

    def frontier_config(self) -> FrontierConfig:
        """The frontier rule on this demo's selection measure and decoding."""
        return FrontierConfig(measure=self.select_on, decoding=self.select_decoding,
                              tolerance=self.match_tolerance)

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, methods: list[str]) -> list[str]:
        unknown = sorted(set(methods) - set(METHODS))
        if unknown:
            raise ValueError(f"unknown methods {unknown}; choose from {list(METHODS)}")
        return methods


def say(msg: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(f"[bold cyan]demo[/] {msg}")


def logged_to(path: Path, log: Callable[[str], None]) -> Callable[[str], None]:
    """`log`, each line also appended to `path` with a timestamp (the record a run left behind,
    kept across resumes: a rerun appends)."""
    def both(msg: str) -> None:
        with path.open("a", encoding="utf-8") as fh:
            fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}\n")
        log(msg)
    return both


# ------------------------------------------------------------------ stage 2: the data, the pivots


def prepare_world(testbed: Path, out: Path, world: str, cfg: DemoConfig) -> dict[str, Any]:
    """The world's training trajectories (every arm's data), all their turns profiled with the
    base (resumable), and the pivots selected among them."""
    from pivotrl.extract import ExtractOptions, extract_file
    from pivotrl.io.records import Trajectory, iter_valid, write_atomic
    from pivotrl.profile.loop import ProfileConfig
    from pivotrl.profile.runs import profile_file
    from pivotrl.sampling import get_sampler
    from pivotrl.select import SelectConfig, select_file
    from pivotrl.verifiers import get_verifier

    wdir = out / "data" / world
    wdir.mkdir(parents=True, exist_ok=True)
    stats_file = wdir / "pivots.stats.json"
    if stats_file.exists() and (wdir / "pivots.jsonl").exists():
        cached = json.loads(stats_file.read_text())
        if cached.get("trajectories") is None or not (wdir / "trajectories.jsonl").exists():
            # Its profile holds turns outside the shared trajectories; resuming would mix them in.
            raise ValueError(f"{wdir}: prepared by an earlier demo whose pivots were not drawn "
                             "from every arm's trajectories; use a new --out folder")
        return cached
    n = cfg.profile_trajectories
    trajs = [t for i, t in enumerate(iter_valid(testbed / world / "train.jsonl", Trajectory))
             if not n or i < n]
    write_atomic(wdir / "trajectories.jsonl", trajs)
    summary = extract_file(wdir / "trajectories.jsonl", wdir / "turns.jsonl", ExtractOptions())
    pcfg = ProfileConfig(k=cfg.k, verifier=cfg.verifier, seed=0,
                         max_new_tokens=cfg.max_completion_length, resume=True)  # a stopped demo continues
    sampler = get_sampler("hf", str(testbed / "base"), batch_size=64, device="cpu")
    profile_file(wdir / "turns.jsonl", wdir / "profile.jsonl", sampler, get_verifier(cfg.verifier),
                 sampler.tokenizer, pcfg, model_name=str(testbed / "base"), progress=False)
    # a world without pivots is a finding the report states (its pivot arms are skipped), not a failure
    stats = select_file(wdir / "profile.jsonl", wdir / "pivots.jsonl", SelectConfig(), allow_empty=True)
    n_profiled = sum(1 for _ in open(wdir / "profile.jsonl"))
    stats["trajectories"] = len(trajs)
    stats["extracted_turns"] = summary.turns_train
    stats["profile_rollout_turns"] = n_profiled * cfg.k
    stats_file.write_text(json.dumps(stats, indent=2))
    return stats


def prepare_world_1thread(testbed: Path, out: Path, world: str, cfg: DemoConfig) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)  # one world per core
    return prepare_world(testbed, out, world, cfg)


def done_line(done: int, total: int, t0: float, what: str) -> str:
    """`  [3/42] toolshop/sft/lr0.0001-seed1 done; ETA 12m05s`: a stage's progress in the log."""
    eta = (time.time() - t0) / done * (total - done)
    return f"  [{done}/{total}] {what}; ETA {duration(eta)}"


def score_chosen(jobs: list[Job], rows: list[dict], items: list[dict], testbed: Path, out: Path,
                 cfg: DemoConfig, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Choose on dev (the report's rule), then score the eval split at exactly those
    checkpoints, and the decoding rule's grid at the chosen ones and the base; their rates go
    into `rows` in place. Returns the item rows scored here."""
    from pivotrl_testbed.frontier import matched_sides
    from pivotrl_testbed.report import chosen_sides
    from pivotrl_testbed.testbed.agentic_ood import split_kinds

    chosen = chosen_sides(items, cfg.select_on, cfg.seeds, cfg.select_decoding)
    # The report's frontier reads the non-agentic OOD families only: match on the same rows.
    targets = eval_targets(chosen, jobs, matched_sides(split_kinds(items), rows, cfg.frontier_config()))
    grid = [(job, job.world, step) for job, step in eval_targets(chosen, jobs)]
    grid += [(None, w, 0) for w in cfg.worlds]
    log(f"  the eval split at the {len(targets)} dev-chosen and frontier-matched checkpoints; "
        f"the decoding grid (T = {', '.join(f'{t:g}' for t in cfg.decoding.temperatures)}, "
        f"pass@k from {cfg.decoding.pass_samples} samples) at the {len(grid)} chosen ones and "
        "the base's")
    got: list[dict[str, Any]] = []
    t0 = time.time()
    with workers_pool(cfg.workers) as pool:
        futures = {pool.submit(eval_at, job, step, testbed, out, cfg): (job, step) for job, step in targets}
        futures.update({pool.submit(grid_at, job, world, step, testbed, out, cfg): (job, step, world)
                        for job, world, step in grid})
        for i, fut in enumerate(as_completed(futures), start=1):
            if len(futures[fut]) == 3:
                job, step, world = futures[fut]
                got += fut.result()
                what = f"decoding grid: {job.name if job else f'base {world}'} step {step}"
            else:
                job, step = futures[fut]
                row, scored = fut.result()
                merge_eval(rows, dict(method=job.method, world=job.world, seed=job.seed, lr=job.lr),
                           step, row)
                got += scored
                what = f"eval split: {job.name} step {step}"
            log(done_line(i, len(futures), t0, what))
    return got


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


def prepare_all(testbed: Path, out: Path, cfg: DemoConfig, log: Callable[[str], None]) -> dict[str, Any]:
    log(f"2/5 {', '.join(cfg.worlds)}: the first {cfg.profile_trajectories or 'all'} train "
        f"trajectories per world are every arm's data; profile all their turns with the base "
        f"(K={cfg.k}, verifier {cfg.verifier}), select; one world per worker")
    pivot_stats = {}
    with workers_pool(min(cfg.workers, len(cfg.worlds))) as pool:
        futures = {w: pool.submit(prepare_world_1thread, testbed, out, w, cfg) for w in cfg.worlds}
        for world, fut in futures.items():
            pivot_stats[world] = s = fut.result()
            log(f"  {world}: {s.get('trajectories')} trajectories, {s.get('turns')} turns, "
                f"{s.get('kept')} pivots ({s.get('all_fail')} all-fail, {s.get('all_pass')} "
                f"all-pass, {s.get('mixed')} mixed, {s.get('unverifiable')} unverifiable)")
    return pivot_stats


def base_rows(out: Path, testbed: Path, cfg: DemoConfig
              ) -> tuple[list[dict], list[dict], dict[str, float]]:
    """The base scored once per world on both splits (cached per world, whatever the seeds) and
    repeated under every seed of `cfg`: it is every seed's step 0. Also {world: seconds its
    scoring took} (0 when a cache written without it was reused): `plan_jobs`'s cost of a world."""
    evaluator = None
    rows, items, seconds = [], [], {}
    for world in cfg.worlds:
        cache = out / "runs" / "base" / f"{world}.json"
        if cache.exists():
            scored = json.loads(cache.read_text())
        else:
            evaluator = evaluator or Evaluator(testbed, cfg)
            t0 = time.time()
            row, got = evaluator(None, world)
            scored = {"row": row, "items": got, "seconds": round(time.time() - t0, 1)}
            write_text_atomic(cache, json.dumps(scored))
        seconds[world] = scored.get("seconds", 0.0)
        for seed in cfg.seeds:
            key = dict(method="base", world=world, seed=seed, lr=0.0, step=0)
            rows.append({**key, "rollout_turns": 0, **scored["row"]})
            items += item_rows(scored["items"], **key)
    return rows, items, seconds


def plan_jobs(cfg: DemoConfig, pivot_stats: dict[str, Any], log: Callable[[str], None],
              world_cost: dict[str, float] | None = None) -> list[Job]:
    """Every training run, longest first as far as it can be told beforehand: E2E RL (whole
    episodes), then one-turn GRPO, then SFT, and within each the costlier world first
    (`world_cost`: the seconds the base's scoring took there, a measure of what a step and a
    checkpoint cost in that world). A long job started last leaves a core idle at the end: the
    terminal world's PivotRL run, started last, ran alone for its last 3.6 of the default's 21
    minutes. The order never changes what a job computes."""
    ablation_seeds = set(cfg.seeds[:cfg.ablation_seeds or None])
    jobs = [Job(w, m, lr, s) for s in cfg.seeds for lr in cfg.learning_rates for w in cfg.worlds
            for m in cfg.methods if m in HEADLINE_ARMS or s in ablation_seeds]
    for world in cfg.worlds:
        if not pivot_stats[world].get("kept"):
            # Nothing to train on: the base never, or always, solves these turns. Said, not hidden.
            log(f"  {world}: no pivots, so the pivot-set arms (pivotrl, pivotrl_exact, "
                "pivotrl_random) are not trained there")
            jobs = [j for j in jobs if not (j.world == world and j.method in PIVOT_SET_ARMS)]
    cost = world_cost or {}
    jobs.sort(key=lambda j: ({"e2e_rl": 0, "sft": 2}.get(j.method, 1), -cost.get(j.world, 0.0)))
    return jobs


def run_jobs(jobs: list[Job], testbed: Path, out: Path, cfg: DemoConfig, pivot_stats: dict[str, Any],
             log: Callable[[str], None], base_items: list[dict] = ()) -> tuple[list[dict], list[dict]]:
    """Every job, each from its world's base dev score (the budget rule's first bar)."""
    from pivotrl_testbed.jobs import dev_score

    log(f"4/5 {len(jobs)} training runs, a checkpoint every {cfg.eval_every} steps until dev "
        f"stops improving ({cfg.budget.patience} checkpoints without a gain) or step {cfg.steps} "
        f"(E2E RL: {cfg.cap('e2e_rl')}); {cfg.workers} at a time")
    start = {w: dev_score([r for r in base_items if r["world"] == w and r["seed"] == cfg.seeds[0]], cfg)
             for w in cfg.worlds if any(r["world"] == w for r in base_items)}
    t_jobs, rows = time.time(), []
    items: list[dict[str, Any]] = []
    with workers_pool(cfg.workers) as pool:
        futures = {pool.submit(run_job, j, testbed, out, cfg, pivot_stats[j.world], start.get(j.world)): j
                   for j in jobs}
        for i, fut in enumerate(as_completed(futures), start=1):
            job = futures[fut]
            job_rows, job_items = fut.result()
            rows, items = rows + job_rows, items + job_items
            log(done_line(i, len(jobs), t_jobs, f"{job.name} done"))
    return rows, items


def log_power(power: list[dict[str, Any]], log: Callable[[str], None]) -> None:
    for p in power:
        log(f"  {p['measure']}: {p['items']} eval items in {p['clusters']} clusters, base rate "
            f"{p['rate']:.3f}: paired 95% half-width ≤ ±{p['half_width']:.3f} "
            f"(MDE at 80% power {p['mde_80']:.3f}; ±{p['worst_half_width']:.3f} at rate 0.5) "
            f"with {p['seeds']} seed(s)")


def theory_checks(out: Path, testbed: Path, cfg: DemoConfig, dev_items: list[dict],
                  rows: list[dict]) -> dict[str, Any]:
    """The theory checks (`theory.run_theory`) and Theorem 3.3 at the frontier's matched
    checkpoints. Both read only the dev split's choices, so they run beside the eval split's
    scoring, in a process of their own."""
    import torch

    from pivotrl_testbed.joint_theory import matched_preferences
    from pivotrl_testbed.theory import run_theory

    torch.set_num_threads(1)
    theory = run_theory(out, testbed, cfg, decoded(dev_items, cfg.select_decoding))
    theory["matched_preferences"] = matched_preferences(out, testbed, cfg, dev_items, rows)
    return theory


def run_demo(out: Path, cfg: DemoConfig, *, testbed: Path | None = None,
             testbed_config=None, log: Callable[[str], None] = say) -> dict[str, Any]:
    from pivotrl_testbed.health import flags as health_flags
    from pivotrl_testbed.report import write_report
    from pivotrl_testbed.stats import paired_halfwidth
    from pivotrl_testbed.testbed.agentic_ood import split_kinds
    from pivotrl_testbed.testbed.build import build_testbed

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    log = logged_to(out / "demo.log", log)
    testbed = testbed or out / "testbed"
    log(f"1/5 testbed in {testbed} (cached after the first build)")
    info = build_testbed(testbed, testbed_config, progress=lambda m: log(f"  build: {m}"))
    log(f"  testbed ready ({'cached' if info.get('cached') else 'built'})")
    pivot_stats = prepare_all(testbed, out, cfg, log)

    log(f"3/5 the base on dev ({cfg.dev_tasks} tasks/world) and eval; planning half-widths")
    rows, items, world_cost = base_rows(out, testbed, cfg)
    power = [p for m in ("turn", "episode", "ood", "agentic_ood")  # the two OOD kinds apart
             if (p := paired_halfwidth(split_kinds(decoded(items, cfg.select_decoding)), measure=m,
                                       seeds=len(cfg.seeds)))]
    log_power(power, log)
    bound = schedule_bound(cfg, pivot_stats, rows)
    if bound:
        log(f"  the largest rollout ratio this schedule can show (PivotRL at its first checkpoint, "
            f"E2E RL at its cap of {cfg.cap('e2e_rl')} steps, episodes as long as the base's): "
            f"{bound['with_profiling']:.2f}× with profiling, {bound['without_profiling']:.2f}× "
            f"without (the paper claims 4×)")

    jobs = plan_jobs(cfg, pivot_stats, log, world_cost)
    trained = sum(not (out / "runs" / j.name / "rows.json").exists() for j in jobs)
    job_rows, job_items = run_jobs(jobs, testbed, out, cfg, pivot_stats, log, items)
    rows, items = rows + job_rows, items + job_items

    log("5/5 checkpoints chosen on dev; the eval split there; theory checks; paired verdicts; report")
    # A process of its own beside the eval split's workers (a pool starts its processes as tasks
    # arrive: one task, one process); in this process when the demo runs one job at a time.
    with workers_pool(2 if cfg.workers > 1 else 1) as side:
        dev_items = [r for r in items if r["split"] == "dev"]
        theory_future = side.submit(theory_checks, out, testbed, cfg, dev_items, rows)
        items += score_chosen(jobs, rows, items, testbed, out, cfg, log)
        write_jsonl(out / "items.jsonl", items)
        theory = theory_future.result()
    flagged = health_flags(items, info)
    for f in flagged:
        log(f"  WARNING ({f['kind']}): {f['why']}")
    invocations = record_invocation(out, time.time() - start, trained=trained, jobs=len(jobs))
    results = write_report(rows, items, out, seeds=cfg.seeds, select_on=cfg.select_on,
                           wall_seconds=time.time() - start, theory=theory, power=power,
                           pivot_stats=pivot_stats, config=cfg.model_dump(mode="json"),
                           invocations=invocations, frontier=cfg.frontier_config(),
                           decoding=cfg.decoding, train_temperature=cfg.sampled.temperature,
                           health=flagged, schedule_bound=bound)
    log(f"done in {(time.time() - start) / 60:.1f} min: {out / 'report.md'}")
    return results
