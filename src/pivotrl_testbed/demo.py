"""`pivotrl demo`: PivotRL and its baselines on the built-in testbed, judged on paired items.

The whole experiment, top to bottom:
  1. build (or load the cached) testbed: worlds' expert trajectories, OOD tasks, the tiny base;
  2. per world: the first `profile_trajectories` expert trajectories are THE training data of
     every arm: all their turns are profiled with the base (K samples, functional verifier) and
     the pivots selected among them; SFT trains on exactly these trajectories and E2E RL on
     their tasks;
  3. beside stage 2, in the same pool, the base is scored on the dev and eval splits (disjoint
     tasks of the eval file); the planning half-widths of the headline paired differences and
     the largest rollout ratio the schedule can show are printed, before any training;
  4. per world × method × learning rate × seed (jobs.py): train from the base, checkpointing
     every `early_every` steps to `early_until`, then every `eval_every`, until the run's own dev
     score (its world's) stops improving or the `steps` cap (budget.py); score every checkpoint
     on dev as it lands (episodes, turns, OOD), item by item, in the decoding that decides
     (`select_decoding`; the other with `dev_greedy` / `dev_sampled`), and its KL to the base;
  5. choose each world's run's checkpoint and each method's lr on dev, and match the arms' dev
     frontiers (frontier.py); score the eval split at exactly those checkpoints, dev over the
     decoding grid at the chosen ones, then eval at each arm's dev-best temperature where it is
     not scored yet (decoding.py: each arm judged at its own); the
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
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterator

from pivotrl_testbed.budget import schedule_bound
from pivotrl_testbed.checkpoint_eval import (
    SPLITS,
    Evaluator,
    decoded,
    eval_targets,
    item_rows,
    merge_eval,
    unscored,
    write_jsonl,
)
from pivotrl_testbed.jobs import Job, eval_at, grid_at, run_job, temperature_at, train_job  # noqa: F401 - scripts import them here
from pivotrl.io.progress import duration, rate_text
from pivotrl.io.records import write_text_atomic


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


from pivotrl_testbed.demo_config import HEADLINE_ARMS, METHODS, PIVOT_SET_ARMS, DemoConfig  # noqa: F401 - imported from here


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


def prepare_world_in_worker(testbed: Path, out: Path, world: str, cfg: DemoConfig) -> dict[str, Any]:
    import torch

    torch.set_num_threads(cfg.threads)  # one world per worker
    return prepare_world(testbed, out, world, cfg)


def done_line(done: int, total: int, t0: float, what: str) -> str:
    """`  [3/42] toolshop/sft/lr0.0001-seed1 done; ETA 12m05s`: a stage's progress in the log."""
    return f"  [{done}/{total}] {what}; {eta_text(t0, done, total)}"


def eta_text(t0: float, done: int, total: int) -> str:
    """`ETA 12m05s` from the rate since `t0`; before the first unit, no rate to read it from."""
    if not done:
        return "ETA after the first"
    return f"ETA {duration((time.time() - t0) / done * (total - done))}"


HEARTBEAT_S = 30.0  # a long job says where it is at least this often, in the log too


def completed(futures: dict[Future, Any], t0: float, log: Callable[[str], None], what: str,
              every_s: float = HEARTBEAT_S) -> Iterator[tuple[int, Future]]:
    """(count done, future) as each of `futures` completes, like `as_completed`; while none
    completes for `every_s` seconds, a line with the count, the rate and the ETA, so a stage of
    few long units (a training run takes minutes) is never silent for longer than that."""
    pending, done = set(futures), 0
    while pending:
        finished, pending = wait(pending, timeout=every_s, return_when=FIRST_COMPLETED)
        if not finished:
            elapsed = time.time() - t0
            log(f"  … {what}: {done}/{len(futures)} done, {len(pending)} to go, "
                f"{rate_text(elapsed, done, 'unit')}, {duration(elapsed)} in; "
                f"{eta_text(t0, done, len(futures))}")
        for fut in finished:
            done += 1
            yield done, fut


def score_chosen(jobs: list[Job], rows: list[dict], items: list[dict], testbed: Path, out: Path,
                 cfg: DemoConfig, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Choose on dev (the report's rule), then score the eval split at exactly those
    checkpoints, and the decoding rule's dev side at the chosen ones and the base; their rates go
    into `rows` in place. Then, each arm's dev-best temperature known, the eval split there
    where it is not scored yet (decoding.py: the only temperature the rule reads eval at).
    Returns the item rows scored here."""
    from pivotrl_testbed.decoding import dev_best, dev_cells
    from pivotrl_testbed.frontier import matched_sides
    from pivotrl_testbed.report import chosen_sides
    from pivotrl_testbed.testbed.agentic_ood import split_kinds

    chosen = chosen_sides(items, cfg.select_on, cfg.seeds, cfg.select_decoding)
    # The report's frontier reads the non-agentic OOD families only: match on the same rows.
    targets = eval_targets(chosen, jobs, matched_sides(split_kinds(items), rows, cfg.frontier_config()))
    grid = [(job, job.world, step) for job, step in eval_targets(chosen, jobs)]
    grid += [(None, w, 0) for w in cfg.worlds]
    log(f"  the eval split at the {len(targets)} dev-chosen and frontier-matched checkpoints; "
        f"dev over the decoding grid (T = {', '.join(f'{t:g}' for t in cfg.decoding.temperatures)}) "
        f"at the {len(grid)} chosen ones and the base's; pass@k from {cfg.decoding.pass_samples} "
        f"samples there on seeds {cfg.decoding.seeds_with_pass(cfg.seeds)}")
    got: list[dict[str, Any]] = []
    with workers_pool(cfg.workers) as pool:
        t0 = time.time()
        futures = {pool.submit(eval_at, job, step, testbed, out, cfg): (job, step) for job, step in targets}
        futures.update({pool.submit(grid_at, job, world, step, testbed, out, cfg): (job, step, world)
                        for job, world, step in grid})
        for i, fut in completed(futures, t0, log, "eval split and decoding grid"):
            if len(futures[fut]) == 3:
                job, step, world = futures[fut]
                got += fut.result()
                what = f"decoding grid on dev: {job.name if job else f'base {world}'} step {step}"
            else:
                job, step = futures[fut]
                row, scored = fut.result()
                merge_eval(rows, dict(method=job.method, world=job.world, seed=job.seed, lr=job.lr),
                           step, row)
                got += scored
                what = f"eval split: {job.name} step {step}"
            log(done_line(i, len(futures), t0, what))
        train_t = cfg.sampled.temperature
        best = dev_best(dev_cells(items + got, chosen, cfg.decoding.temperatures, train_t, cfg.select_on))

        def checkpoints(arm: str) -> list[tuple[Job | None, str, int]]:
            if arm == "base":
                return [(None, w, 0) for w in cfg.worlds]
            return [(job, job.world, step) for job, step in eval_targets({arm: chosen[arm]}, jobs)]

        extra = [(job, world, step, t) for arm, t in best.items()
                 if unscored(cfg, t, "eval", tuple(cfg.decoding.measures))
                 for job, world, step in checkpoints(arm)]
        log("  dev-best temperatures: " + ", ".join(f"{m} {t:g}" for m, t in best.items())
            + (f"; the eval split at the {len(extra)} chosen checkpoints of arms whose dev-best is "
               "a temperature not yet scored on eval" if extra else ""))
        t0 = time.time()
        later = {pool.submit(temperature_at, job, world, step, t, testbed, out, cfg): (job, world, step, t)
                 for job, world, step, t in extra}
        for i, fut in completed(later, t0, log, "eval split at the dev-best temperatures"):
            job, world, step, t = later[fut]
            got += fut.result()
            log(done_line(i, len(later), t0, f"eval split at T {t:g}: "
                          f"{job.name if job else f'base {world}'} step {step}"))
    return got


# ------------------------------------------------------------------ the whole demo


def code_version() -> dict[str, Any]:
    """The git commit this code runs at and whether its tracked files are unchanged, read from
    the checkout that holds this module (None for both outside a git checkout, e.g. a wheel):
    a result names the code that made it."""
    import subprocess

    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            got = subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True,
                                 timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return got.stdout.strip() if got.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "clean_tree": None if changed is None else changed == ""}


def record_invocation(out: Path, seconds: float, *, trained: int, jobs: int,
                      code: dict[str, Any]) -> list[dict[str, Any]]:
    """Append this invocation to OUT/invocations.json and return them all: the report states
    the time of every run that built the folder, not only a cached rerun's seconds, and the
    code (`code_version`, read when the invocation started) each ran."""
    path = out / "invocations.json"
    runs = json.loads(path.read_text()) if path.exists() else []
    runs.append({"finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "wall_seconds": round(seconds, 1),
                 "jobs_trained": trained, "jobs": jobs, **code})
    path.write_text(json.dumps(runs, indent=1))
    return runs


def prepare_and_score_base(testbed: Path, out: Path, cfg: DemoConfig, log: Callable[[str], None]
                           ) -> tuple[dict[str, Any], list[dict], list[dict], dict[str, float]]:
    """Stages 2 and 3 in one pool: each world's data profiled and its pivots selected
    (`prepare_world`), the base scored on both splits (`score_base`) and its side of the
    decoding grid (`grid_at`). Neither stage reads the other (profiling samples the base on the
    train trajectories, scoring reads the dev and eval splits), so the worker that finishes its
    world's profile first goes on to the base's scoring instead of idling (one core idled 34 s
    on a 4-layer base when the stages ran one after the other, docs/RESULTS.md). Returns the
    pivot stats and `base_rows`' rows, items and seconds."""
    log(f"2/5 {', '.join(cfg.worlds)}: the first {cfg.profile_trajectories or 'all'} train "
        f"trajectories per world are every arm's data; profile all their turns with the base "
        f"(K={cfg.k}, verifier {cfg.verifier}), select; one world per worker")
    log(f"3/5 beside it, the base on dev ({cfg.dev_tasks} tasks/world)"
        + (" and eval; then planning half-widths" if cfg.eval_split else " (an lr-tuning run: dev only)"))
    pivot_stats = {}
    with workers_pool(cfg.workers) as pool:
        prepared = {w: pool.submit(prepare_world_in_worker, testbed, out, w, cfg) for w in cfg.worlds}
        scored = {w: pool.submit(score_base, testbed, out, w, cfg) for w in cfg.worlds}
        grids = [pool.submit(grid_at, None, w, 0, testbed, out, cfg) for w in cfg.worlds
                 if cfg.eval_split]  # the decoding grid serves the judging on eval
        every = {**{f: w for w, f in prepared.items()}, **{f: None for f in (*scored.values(), *grids)}}
        for _, fut in completed(every, time.time(), log, "profiling and the base's scoring"):
            if (world := every[fut]) is not None:
                pivot_stats[world] = s = fut.result()
                log(f"  {world}: {s.get('trajectories')} trajectories, {s.get('turns')} turns, "
                    f"{s.get('kept')} pivots ({s.get('all_fail')} all-fail, {s.get('all_pass')} "
                    f"all-pass, {s.get('mixed')} mixed, {s.get('unverifiable')} unverifiable)")
        pivot_stats = {w: pivot_stats[w] for w in cfg.worlds}  # in the config's order
        scored_by_world = {w: fut.result() for w, fut in scored.items()}
        for fut in grids:
            fut.result()  # an error here is the run's, not a silent gap; read from its cache later
    return (pivot_stats, *base_rows(scored_by_world, cfg))


def score_base(testbed: Path, out: Path, world: str, cfg: DemoConfig) -> dict[str, Any]:
    """The base scored on both splits of `world` (`Evaluator`), cached in runs/base/<world>.json
    with the seconds it took; on dev alone in an lr-tuning run (`eval_split` off), cached apart
    so a later run into the same folder scores eval too."""
    import torch

    torch.set_num_threads(cfg.threads)  # one world per worker
    cache = out / "runs" / "base" / (f"{world}.json" if cfg.eval_split else f"{world}.dev.json")
    if cache.exists():
        return json.loads(cache.read_text())
    t0 = time.time()
    row, got = Evaluator(testbed, cfg)(None, world, SPLITS if cfg.eval_split else ("dev",))
    scored = {"row": row, "items": got, "seconds": round(time.time() - t0, 1)}
    write_text_atomic(cache, json.dumps(scored))
    return scored


def base_rows(scored_by_world: dict[str, dict[str, Any]], cfg: DemoConfig
              ) -> tuple[list[dict], list[dict], dict[str, float]]:
    """The base, scored once per world (`score_base`, cached whatever the seeds), repeated under
    every seed of `cfg`: it is every seed's step 0. Also {world: seconds its scoring took} (0
    when a cache written without it was reused): `plan_jobs`'s cost of a world."""
    rows, items, seconds = [], [], {}
    for world, scored in scored_by_world.items():
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
    ablation_worlds = set(cfg.ablation_worlds or cfg.worlds)
    jobs = [Job(w, m, lr, s) for s in cfg.seeds for w in cfg.worlds for m in cfg.methods
            for lr in cfg.lrs(m)
            if m in HEADLINE_ARMS or (s in ablation_seeds and w in ablation_worlds)]
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

    log(f"4/5 {len(jobs)} training runs, a checkpoint every {cfg.early_every} steps to "
        f"{cfg.early_until}, then every {cfg.eval_every}, until dev "
        f"stops improving ({cfg.budget.patience * cfg.eval_every} steps without a gain) or step {cfg.steps} "
        f"(E2E RL: {cfg.cap('e2e_rl')}); {cfg.workers} at a time")
    start = {w: dev_score([r for r in base_items if r["world"] == w and r["seed"] == cfg.seeds[0]], cfg)
             for w in cfg.worlds if any(r["world"] == w for r in base_items)}
    t_jobs, rows = time.time(), []
    items: list[dict[str, Any]] = []
    with workers_pool(cfg.workers) as pool:
        futures = {pool.submit(run_job, j, testbed, out, cfg, pivot_stats[j.world], start.get(j.world)): j
                   for j in jobs}
        for i, fut in completed(futures, t_jobs, log, "training runs"):
            job = futures[fut]
            job_rows, job_items = fut.result()
            rows, items = rows + job_rows, items + job_items
            log(done_line(i, len(jobs), t_jobs, f"{job.name} done"))
    return rows, items


def log_power(power: list[dict[str, Any]], log: Callable[[str], None]) -> None:
    for p in power:
        log(f"  {p['measure']}: {p['items']} eval items in {p['clusters']} clusters, base rate "
            f"{p['rate']:.3f}: paired 95% half-width about ±{p['half_width']:.3f} "
            f"(MDE at 80% power {p['mde_80']:.3f}; ±{p['worst_half_width']:.3f} at rate 0.5), "
            f"whatever the seeds: they are scored on the same items")


def theory_checks(out: Path, testbed: Path, cfg: DemoConfig, dev_items: list[dict],
                  rows: list[dict]) -> dict[str, Any]:
    """The theory checks (`theory.run_theory`) and Theorem 3.3 at the frontier's matched
    checkpoints. Both read only the dev split's choices, so they run beside the eval split's
    scoring, in a process of their own."""
    import torch

    from pivotrl_testbed.joint_theory import matched_preferences
    from pivotrl_testbed.theory import run_theory

    torch.set_num_threads(cfg.threads)
    theory = run_theory(out, testbed, cfg, decoded(dev_items, cfg.select_decoding))
    theory["matched_preferences"] = matched_preferences(out, testbed, cfg, dev_items, rows)
    return theory


def run_demo(out: Path, cfg: DemoConfig, *, testbed: Path | None = None,
             testbed_config=None, log: Callable[[str], None] = say) -> dict[str, Any]:
    from pivotrl_testbed.health import flags as health_flags
    from pivotrl_testbed.report import write_report
    from pivotrl_testbed.report_md import code_line
    from pivotrl_testbed.stats import paired_halfwidth
    from pivotrl_testbed.testbed.agentic_ood import split_kinds
    from pivotrl_testbed.testbed.build import build_testbed, load_testbed_config

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    start, code = time.time(), code_version()
    out.mkdir(parents=True, exist_ok=True)
    log = logged_to(out / "demo.log", log)
    log(f"code: {code_line(code)}")
    testbed = testbed or out / "testbed"
    log(f"1/5 testbed in {testbed} (cached after the first build)")
    testbed_config = cfg.sized_testbed(testbed_config or load_testbed_config(None))
    info = build_testbed(testbed, testbed_config, progress=lambda m: log(f"  build: {m}"))
    log(f"  testbed ready ({'cached' if info.get('cached') else 'built'})")
    pivot_stats, rows, items, world_cost = prepare_and_score_base(testbed, out, cfg, log)
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
    if not cfg.eval_split:
        from pivotrl_testbed.lr_tuning import write_lr_choice

        log("5/5 lr-tuning run: each method's lr and checkpoints chosen on dev; the eval split "
            "is not scored")
        write_jsonl(out / "items.jsonl", items)
        choice = write_lr_choice(out, items, cfg, log)
        record_invocation(out, time.time() - start, trained=trained, jobs=len(jobs), code=code)
        log(f"done in {(time.time() - start) / 60:.1f} min: {out / 'lr_choice.json'}")
        return {"lr_choice": choice}

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
    invocations = record_invocation(out, time.time() - start, trained=trained, jobs=len(jobs), code=code)
    results = write_report(rows, items, out, seeds=cfg.seeds, select_on=cfg.select_on,
                           wall_seconds=time.time() - start, theory=theory, power=power,
                           pivot_stats=pivot_stats, config=cfg.model_dump(mode="json"),
                           invocations=invocations, frontier=cfg.frontier_config(),
                           decoding=cfg.decoding, train_temperature=cfg.sampled.temperature,
                           health=flagged, schedule_bound=bound,
                           caps={m: cfg.cap(m) for m in cfg.methods})
    log(f"done in {(time.time() - start) / 60:.1f} min: {out / 'report.md'}")
    return results
