"""Evaluate a checkpoint on the built-in testbed: in-domain episodes, per-turn accuracy, OOD.

For any HF checkpoint dir (base, SFT, PivotRL, E2E RL) and a testbed dir from `pivotrl testbed
build`, `evaluate_checkpoint` measures
- in-domain, per world: episode success on the eval tasks (`episodes.run_episodes` with a
  `ModelPolicy`: same chat template and action parser as training; greedy decoding by default,
  or sampling at `temperature` with a fixed seed), and per-turn accuracy on the expert's states
  of the same eval trajectories (one action per state, scored by the world's verifier:
  `toolcall` for toolshop, `shell` for terminal);
- OOD, per family: exact-match accuracy of a greedy answer on the OOD eval tasks (the
  agentic-format families, `testbed/agentic_ood.py`, asked with a world's system prompt and
  tool list, through the same chat template as the worlds);
each rate with a 95% Wilson score interval.

With a BFCL trajectories file (`pivotrl data bfcl --out F`), `evaluate_bfcl` adds one in-domain
entry per category, `"bfcl_<category>"`, in the same shape: episodes driven by the same runner in
BFCL's executable backends (`make_world("bfcl")`), every user turn delivered in order (held-out
functions added at their turn), BFCL's step limit per user turn, success = BFCL's own
`multi_turn_checker`. The JSON shape is a contract (docs/DESIGN.md):
`{"in_domain": {world: {"success", "ci95", "episodes", "turn_accuracy", ...}},
  "ood": {family: {"accuracy", "ci95", "n"}}}`, and `write_result` puts a markdown table next to it.

`evaluate_world` and `evaluate_ood` also return per-item outcomes on request (`items=[]`), the
rows the demo's paired verdicts are computed from; how far a checkpoint moved from the base on
OOD text is drift.py's.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from pivotrl.io.records import Trajectory, iter_valid, write_text_atomic
from pivotrl.io.yaml_config import field_like
from pivotrl.sampling.options import SamplingOptions
from pivotrl.evaluate.turns import wilson as turn_wilson
from pivotrl_testbed.health import episode_failure, reason_failure

DEFAULT_VERIFIERS = {"toolshop": "toolcall", "terminal": "shell"}


def _bfcl_step_limit() -> int:
    try:
        from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT
        return int(MAXIMUM_STEP_LIMIT)
    except Exception:  # noqa: BLE001 - BFCL not installed: its value in bfcl-eval 2026.3.23
        return 20


BFCL_STEP_LIMIT = _bfcl_step_limit()


class EvalConfig(BaseModel):
    """What `pivotrl testbed evaluate` measures. Defaults keep a CPU evaluation of the tiny model to
    about a minute."""

    episodes: int = Field(100, description="Eval tasks (episodes) per world; 0 = all in eval.jsonl.")
    turn_trajectories: int = Field(50, description="Eval trajectories per world whose expert "
                                                   "states are scored for turn accuracy; 0 = none.")
    ood_per_family: int = Field(100, description="OOD eval tasks per family; 0 = all.")
    max_turns: int = Field(8, description="Episode turn limit (testbed tasks need at most 6).")
    max_new_tokens: int = Field(96, description="Completion cap per turn (a testbed action is "
                                                "< 60 tokens with the testbed tokenizer).")
    temperature: float = field_like(SamplingOptions, "temperature", default=0.0,
                                    note="Ours: 0 (deterministic); > 0 samples with `seed` fixed.")
    seed: int = Field(0, description="Sampling seed (used only when temperature > 0).")
    batch_size: int = Field(32, description="Prompts per generate() call.")
    verifiers: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_VERIFIERS),
                                      description="Verifier per world for turn accuracy.")
    bfcl_max_new_tokens: int = Field(512, description="Completion cap per BFCL turn (calls with "
                                                      "long arguments, e.g. file contents, need more "
                                                      "than a testbed action).")
    bfcl_step_limit: int = Field(BFCL_STEP_LIMIT, description="Tool steps per user turn before "
                                 "BFCL force-quits the episode (bfcl_eval MAXIMUM_STEP_LIMIT).")
    bfcl_max_turns: int = Field(0, description="Model turns per BFCL episode; 0 = no cap beyond "
                                               "BFCL's per-turn step limit (BFCL has none).")


class SampledConfig(BaseModel):
    """Sampled scoring, beside greedy: GRPO raises the expected reward under sampling, SFT
    sharpens the mode, so a measure read only greedily can hide what one arm optimised. Each
    item's outcome is the mean success over `k` samples at the training rollouts' temperature;
    the i-th of the k × n prompts (an item's k samples side by side) is sampled with
    derive_seed(seed, 0, i), so the same items give the same draws in every run."""

    k: int = Field(4, ge=0, description="Samples per item; 0 = greedy scoring only.")
    temperature: float = field_like(SamplingOptions, "temperature", gt=0,
                                    note="Here the training rollouts' (GRPORunConfig.temperature).")
    seed: int = Field(0, description="Base seed of the per-prompt sampling seeds.")
    measures: list[Literal["turn", "ood", "episode"]] = Field(
        default_factory=lambda: ["turn", "ood"], description="Measures scored sampled too. "
        "Episodes cost k whole multi-turn episodes per task, so they are off by default.")


def item_means(values: Sequence[float], k: int) -> list[float]:
    """Per-item means of a flat list holding each item's k values side by side."""
    return [sum(values[i:i + k]) / k for i in range(0, len(values), k)]


# ---------------------------------------------------------------- statistics


def wilson(successes: float, n: int) -> tuple[float, float]:
    """95% Wilson score interval of `successes` out of `n` (the core's rule, evaluate.turns.wilson)."""
    return turn_wilson(min(1.0, max(0.0, successes / n)) if n > 0 else 0.0, n)


def _rate(k: float, n: int) -> tuple[float, list[float]]:
    lo, hi = wilson(k, n)
    value = k / n if n else 0.0
    return value, [min(lo, value), max(hi, value)]


# ---------------------------------------------------------------- in-domain


def load_trajectories(path: Path, limit: int = 0) -> list[Trajectory]:
    out = []
    for traj in iter_valid(path, Trajectory):
        out.append(traj)
        if limit and len(out) >= limit:
            break
    return out


def task_of(traj: Trajectory) -> Trajectory:
    """The task an episode starts from: the trajectory's messages before its first assistant turn."""
    head = []
    for m in traj.messages:
        if m.role == "assistant":
            break
        head.append(m)
    return traj.model_copy(update={"messages": head})


def evaluate_world(model, tokenizer, world: str, trajectories: Sequence[Trajectory],
                   cfg: EvalConfig, items: list[dict[str, Any]] | None = None,
                   sampled: SampledConfig | None = None) -> dict[str, Any]:
    """Episode success and turn accuracy in one world. With `items` (a list), one row per scored
    item is appended to it: {"measure": "episode"|"turn", "item", "cluster", "outcome"}, the
    cluster being the task (episodes) or the trajectory (turns) the item belongs to. Greedy (or
    `cfg.temperature`), or with `sampled` each item's mean success over its k samples, for the
    measures `sampled.measures` names (the others are left out)."""
    from pivotrl_testbed.episodes import ModelPolicy, run_episodes

    k = sampled.k if sampled else 1
    temperature, seed = (sampled.temperature, sampled.seed) if sampled else (cfg.temperature, cfg.seed)

    def policy() -> ModelPolicy:  # one per measure: a measure's draws never depend on another's
        return ModelPolicy(model, tokenizer, max_new_tokens=cfg.max_new_tokens,
                           temperature=temperature, seed=seed, batch_size=cfg.batch_size)

    out: dict[str, Any] = {}
    if not sampled or "episode" in sampled.measures:
        tasks = [task_of(t) for t in (trajectories[:cfg.episodes] if cfg.episodes else trajectories)]
        results = run_episodes(world, [t for t in tasks for _ in range(k)], policy(),
                               max_turns=cfg.max_turns)
        wins = item_means([float(r.success) for r in results], k)
        if items is not None:
            failed = [episode_failure(r.trajectory.messages, r.trajectory.metadata.get("notes", []))
                      for r in results]
            items += [{"measure": "episode", "item": t.id, "cluster": t.id, "outcome": w,
                       **_failure(failed[i * k:(i + 1) * k])}
                      for i, (t, w) in enumerate(zip(tasks, wins, strict=True))]
        success, ci = _rate(sum(wins), len(wins))
        out.update({"success": success, "ci95": ci, "episodes": len(wins),
                    "model_turns": sum(r.model_turns for r in results),
                    "invalid_actions": sum(r.invalid_actions for r in results)})
    if cfg.turn_trajectories and (not sampled or "turn" in sampled.measures):
        out.update(evaluate_turns(policy(), trajectories[:cfg.turn_trajectories],
                                  cfg.verifiers.get(world, "toolcall"), items, k))
    return out


def _failure(causes: Sequence[str | None]) -> dict[str, str]:
    """{"failure": the first world failure among an item's samples} or {} (`health`)."""
    cause = next((c for c in causes if c), None)
    return {"failure": cause} if cause else {}


def turn_kind(turn: Any) -> str:
    """"tool_call" when the expert's action at this state calls a tool, else "message"."""
    return "tool_call" if getattr(turn.expected, "tool_calls", None) else "message"


@functools.cache
def shared_verifier(name: str) -> Any:
    """One verifier per name per process: a checkpoint's greedy and sampled scoring, and every
    later checkpoint's, ask about the same expert turns, so the verifier's caches (the expert's
    outcome per turn, on every probe) are reused. Safe: a verifier is a function of (turn,
    action) and caches only what depends on the turn."""
    from pivotrl.verifiers import get_verifier

    return get_verifier(name)


def evaluate_turns(policy, trajectories: Sequence[Trajectory], verifier: str,
                   items: list[dict[str, Any]] | None = None, k: int = 1) -> dict[str, Any]:
    """Turn accuracy on expert states, by the library's rule (`pivotrl.evaluate.turns`, what
    `pivotrl evaluate --turns` reports): the policy's action at every assistant turn of
    `trajectories` (k actions each, side by side), read in the model's own format, scored against
    the expert's by the named verifier; a turn's outcome is the fraction of its actions with
    reward >= the success threshold, and the interval is clustered by trajectory. Item rows also
    carry the turn's `position` in its trajectory and its `kind` (`turn_kind`), for the report's
    where-does-it-gain breakdown."""
    from pivotrl.evaluate.turns import turn_accuracy as accuracy_rule
    from pivotrl.evaluate.turns import turn_success
    from pivotrl.formats.actions import parse_completion
    from pivotrl.formats.options import FormatOptions
    from pivotrl_testbed.episodes import expert_turns, turn_accuracy

    turns = expert_turns(list(trajectories))
    tokenizer = getattr(policy, "tokenizer", None)  # scripted policies (tests) write Hermes/JSON
    parse = FormatOptions().parser(tokenizer) if tokenizer is not None else parse_completion
    acc = turn_accuracy(policy, [t for t in turns for _ in range(k)], shared_verifier(verifier), parse=parse)
    outcomes = [turn_success(acc.rewards[i * k:(i + 1) * k]) for i in range(len(turns))]
    if items is not None:
        failed = [reason_failure(r) for r in acc.reasons]
        items += [{"measure": "turn", "item": t.id, "cluster": t.trajectory_id, "outcome": r,
                   "position": t.turn, "kind": turn_kind(t), **_failure(failed[i * k:(i + 1) * k])}
                  for i, (t, r) in enumerate(zip(turns, outcomes, strict=True))]
    summary = accuracy_rule(outcomes, [t.trajectory_id or t.id for t in turns])
    return {"turn_accuracy": summary["accuracy"] if turns else 0.0, "turn_ci95": summary["ci95"],
            "turns": len(turns), "turn_invalid": acc.invalid}


# ---------------------------------------------------------------- BFCL multi-turn


def bfcl_category(traj: Trajectory) -> str:
    cat = traj.metadata.get("category")
    if isinstance(cat, str) and cat:
        return cat
    return (traj.domain or "unknown").removeprefix("bfcl_")


def bfcl_sample(trajectories: Sequence[Trajectory], per_category: int = 0) -> dict[str, list[Trajectory]]:
    """The first `per_category` tasks of each category, in file order (0 = all)."""
    out: dict[str, list[Trajectory]] = {}
    for traj in trajectories:
        group = out.setdefault(bfcl_category(traj), [])
        if not per_category or len(group) < per_category:
            group.append(traj)
    return out


def evaluate_bfcl(model, tokenizer, path: str | Path, cfg: EvalConfig,
                  progress=None) -> dict[str, dict[str, Any]]:
    """`{"bfcl_<category>": {"success", "ci95", "episodes", ...}}` on a BFCL trajectories file
    (`cfg.episodes` tasks per category, 0 = all). Whole trajectories are given to the runner,
    which delivers their later user turns itself."""
    import pivotrl_testbed.bfcl_world  # noqa: F401 - registers the "bfcl" world
    from pivotrl_testbed.episodes import ModelPolicy, run_episodes

    out: dict[str, dict[str, Any]] = {}
    for category, tasks in bfcl_sample(load_trajectories(Path(path)), cfg.episodes).items():
        if progress:
            progress(f"BFCL episodes: {category} ({len(tasks)})")
        policy = ModelPolicy(model, tokenizer, max_new_tokens=cfg.bfcl_max_new_tokens,
                             temperature=cfg.temperature, seed=cfg.seed, batch_size=cfg.batch_size)
        results = run_episodes("bfcl", tasks, policy, max_turns=cfg.bfcl_max_turns,
                               max_steps_per_turn=cfg.bfcl_step_limit)
        k = sum(r.success for r in results)
        success, ci = _rate(k, len(results))
        out[f"bfcl_{category}"] = {
            "success": success, "ci95": ci, "episodes": len(results),
            "model_turns": sum(r.model_turns for r in results),
            "invalid_actions": sum(r.invalid_actions for r in results),
            "overlong_prompts": policy.overlong_prompts,
            "user_turns": sum(r.trajectory.metadata.get("user_turns", 1) for r in results),
        }
    return out


# ---------------------------------------------------------------- OOD


def ood_answers(model, tokenizer, prompts: Sequence[Any], max_new_tokens: int = 16,
                batch_size: int = 64, temperature: float = 0.0, seed: int = 0,
                tools: Sequence[list[dict[str, Any]]] | None = None) -> list[str]:
    """Answers to single-turn prompts with the model's chat template, through ModelPolicy (the
    worlds' own prompting): a prompt is a user message's text or a list of messages, each with
    its tool list in `tools` (none by default). Greedy, or sampled at `temperature` (the i-th
    prompt with seed derive_seed(seed, 0, i), ModelPolicy's)."""
    from pivotrl.io.records import Message
    from pivotrl_testbed.episodes import ModelPolicy

    policy = ModelPolicy(model, tokenizer, max_new_tokens=max_new_tokens, batch_size=batch_size,
                         temperature=temperature, seed=seed)
    return policy.act_batch([[Message(role="user", content=p)] if isinstance(p, str) else list(p)
                             for p in prompts], list(tools or [[] for _ in prompts]))


def evaluate_ood(model, tokenizer, tasks: Sequence[Any], batch_size: int = 64,
                 items: list[dict[str, Any]] | None = None,
                 sampled: "SampledConfig | None" = None) -> dict[str, Any]:
    """Accuracy per OOD family; with `items`, one row per task is appended (each task is its own
    cluster: OOD problems are independent draws). Greedy, or with `sampled` the mean success of
    its k samples per task (`SampledConfig`). Agentic-format tasks (`agentic_ood`) are asked
    with their system prompt and tool list and scored by their own checker (a tool call or an
    unparseable completion scores 0); the others are one user message without tools."""
    from pivotrl_testbed.testbed.agentic_ood import reply_text, score

    k = sampled.k if sampled else 1
    max_new = max(8, max(len(tokenizer(reply_text(t))["input_ids"]) for t in tasks) + 4) if tasks else 8
    repeated = [t for t in tasks for _ in range(k)]  # a task's samples side by side
    temperature, seed = (sampled.temperature, sampled.seed) if sampled else (0.0, 0)
    answers = ood_answers(model, tokenizer, [getattr(t, "messages", None) or t.prompt for t in repeated],
                          max_new, batch_size, temperature, seed,
                          [getattr(t, "tools", None) or [] for t in repeated])
    hits = item_means([float(score(t, a)) for t, a in zip(repeated, answers)], k)
    by_family: dict[str, list[float]] = {}
    for task, hit in zip(tasks, hits):
        by_family.setdefault(task.family, []).append(hit)
        if items is not None:
            items.append({"measure": "ood", "item": task.id, "cluster": task.id, "outcome": hit})
    rates = {family: _rate(sum(hits), len(hits)) for family, hits in by_family.items()}
    return {f: {"accuracy": acc, "ci95": ci, "n": len(by_family[f])} for f, (acc, ci) in rates.items()}


def load_ood_eval(testbed: Path, per_family: int = 0) -> list[Any]:
    """The testbed's OOD eval tasks, the first `per_family` of each family (0 = all), agentic
    ones (`agentic_ood`) with their system prompt and tool list."""
    from pivotrl_testbed.testbed.ood import load_ood

    tasks, counts = [], {}
    for t in load_ood(testbed / "ood" / "eval.jsonl"):
        counts[t.family] = counts.get(t.family, 0) + 1
        if not per_family or counts[t.family] <= per_family:
            tasks.append(t)
    return tasks


# ---------------------------------------------------------------- whole checkpoint


def testbed_worlds(testbed: Path) -> list[str]:
    return sorted(p.parent.name for p in testbed.glob("*/eval.jsonl") if p.parent.name != "ood")


def evaluate_model(model, tokenizer, testbed: str | Path | None, cfg: EvalConfig | None = None,
                   progress=None, bfcl: str | Path | None = None) -> dict[str, Any]:
    """The contract JSON for an in-memory model (used by `build` for the base, and the demo).
    `testbed` and `bfcl` (a BFCL trajectories file) are each optional."""
    cfg = cfg or EvalConfig()
    start = time.time()
    result: dict[str, Any] = {"in_domain": {}, "ood": {}}
    if testbed is not None:
        testbed = Path(testbed)
        for world in testbed_worlds(testbed):
            if progress:
                progress(f"episodes: {world}")
            n = max(cfg.episodes, cfg.turn_trajectories) if cfg.episodes and cfg.turn_trajectories else 0
            trajs = load_trajectories(testbed / world / "eval.jsonl", n)
            result["in_domain"][world] = evaluate_world(model, tokenizer, world, trajs, cfg)
        if (testbed / "ood" / "eval.jsonl").exists():
            if progress:
                progress("OOD tasks")
            result["ood"] = evaluate_ood(model, tokenizer, load_ood_eval(testbed, cfg.ood_per_family),
                                         cfg.batch_size * 2)
    if bfcl is not None:
        result["in_domain"].update(evaluate_bfcl(model, tokenizer, bfcl, cfg, progress))
    result["config"] = cfg.model_dump()
    result["seconds"] = round(time.time() - start, 1)
    return result


def evaluate_checkpoint(model_dir: str | Path, testbed: str | Path | None = None,
                        cfg: EvalConfig | None = None, progress=None,
                        bfcl: str | Path | None = None) -> dict[str, Any]:
    """Load any HF checkpoint dir (on the GPU when there is one) and evaluate it."""
    from pivotrl_testbed.testbed.tiny import load_tiny

    model, tokenizer = load_tiny(model_dir)
    try:
        import torch

        if torch.cuda.is_available():
            model = model.to("cuda")
    except Exception:  # noqa: BLE001 - no usable GPU: stay on the CPU
        pass
    result = evaluate_model(model, tokenizer, testbed, cfg, progress, bfcl=bfcl)
    result["model"] = str(model_dir)
    return result


def summary(result: dict[str, Any]) -> dict[str, float]:
    """Mean in-domain success over worlds, mean OOD accuracy over the non-agentic families and,
    apart (never pooled with them), over the agentic-format ones when there are any."""
    from pivotrl_testbed.testbed.agentic_ood import mean_by_kind

    ind = [v["success"] for v in result.get("in_domain", {}).values()]
    return {"in_domain": sum(ind) / len(ind) if ind else 0.0, "ood": 0.0,
            **mean_by_kind(result.get("ood", {}))}


def markdown(result: dict[str, Any], title: str = "Evaluation") -> str:
    def pct(x: float) -> str:
        return f"{100 * x:.1f}"

    lines = [f"# {title}", ""]
    if result.get("model"):
        lines += [f"Model: `{result['model']}`", ""]
    lines += ["## In-domain (eval tasks)", "",
              "| world | episode success % | 95% CI | episodes | turn accuracy % | turns |",
              "|---|---|---|---|---|---|"]
    for world, v in result.get("in_domain", {}).items():
        ta = pct(v["turn_accuracy"]) if "turn_accuracy" in v else "–"
        lines.append(f"| {world} | {pct(v['success'])} | {pct(v['ci95'][0])}–{pct(v['ci95'][1])} "
                     f"| {v['episodes']} | {ta} | {v.get('turns', '–')} |")
    lines += ["", "## Out-of-domain", "", "| family | accuracy % | 95% CI | n |", "|---|---|---|---|"]
    for family, v in result.get("ood", {}).items():
        lines.append(f"| {family} | {pct(v['accuracy'])} | {pct(v['ci95'][0])}–{pct(v['ci95'][1])} "
                     f"| {v['n']} |")
    s = summary(result)
    agentic = (f", mean agentic-format OOD accuracy {pct(s['agentic_ood'])}%" if "agentic_ood" in s else "")
    lines += ["", f"Mean in-domain success {pct(s['in_domain'])}%, mean OOD accuracy {pct(s['ood'])}% "
              f"(non-agentic families){agentic}.",
              "Intervals: 95% Wilson score intervals over episodes / tasks.", ""]
    return "\n".join(lines)


def write_result(result: dict[str, Any], out: str | Path) -> tuple[Path, Path]:
    """RESULT.json (atomically) and RESULT.md next to it."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(result, indent=2) + "\n")
    md = out.with_suffix(".md")
    md.write_text(markdown(result), encoding="utf-8")
    return out, md
