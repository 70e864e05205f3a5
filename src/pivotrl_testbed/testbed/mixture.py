"""What the testbed's base pretrains on, and the loop that pretrains it: the weak expert's
trajectories (in the variants), the OOD tasks as one-turn chats, each further stage's remade
mixture (`stages.py`), and `pretrain.py`'s loop with a checkpoint, a log and progress.

Every `cfg` here is a `build.TestbedConfig`, not imported: the build imports this module.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pivotrl.io.records import write_atomic
from pivotrl_testbed.testbed.stages import stage_config


def trajectories(world: str, split: str, n: int, seed: int, expert_cfg=None, start: int = 0,
                  workers: int = 4, kinds: list[str] | None = None):
    from pivotrl_testbed.testbed.experts import run_expert
    from pivotrl_testbed.testbed.tasks import make_tasks

    tasks = make_tasks(world, split, n, start, kinds)
    with ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(lambda t: run_expert(t, seed, expert_cfg), tasks))


def pretrain_examples(weak: dict[str, list], ood_tasks: list, ood_repeat: int = 1,
                      ood_fraction: float = 1.0) -> list[dict[str, Any]]:
    """The base's mixture: the OOD training tasks as one-turn chats (each family's first
    `ood_fraction` of them, `ood_repeat` times; an agentic-format one with its system prompt and
    tool list) + the weak trajectories. A task
    with an opening (a false start and its error) trains its reply alone: `context_messages`
    marks the messages before it as context (`pretrain.encode_examples`)."""
    from pivotrl_testbed.testbed.agentic_ood import expected_reply

    def example(t) -> dict[str, Any]:
        ex = {"messages": [m.model_dump(exclude_none=True) for m in t.messages]
              + [expected_reply(t).model_dump(exclude_none=True)], "tools": t.tools}
        return {**ex, "context_messages": len(t.messages)} if t.opening else ex

    if ood_fraction < 1.0:
        by_family: dict[str, list] = {}
        for t in ood_tasks:
            by_family.setdefault(t.family, []).append(t)
        ood_tasks = [t for tasks in by_family.values() for t in tasks[:math.ceil(ood_fraction * len(tasks))]]
    examples = [example(t) for t in ood_tasks] * ood_repeat
    for trajs in weak.values():
        examples += [{"messages": t.messages, "tools": t.tools} for t in trajs]
    return examples


def weak_trajectories(cfg, world: str) -> list:
    """The weak expert's pretraining trajectories of `world` (in the variants, with `variants`)."""
    from pivotrl_testbed.testbed.experts import ExpertConfig
    from pivotrl_testbed.testbed.variants import translate_all

    weak = ExpertConfig(noise=cfg.weak_noise, habit=cfg.weak_habit, slips=cfg.weak_slips,
                        false_starts=cfg.weak_false_starts, grounding_slips=cfg.weak_grounding_slips,
                        grounding_terminal=cfg.weak_grounding_terminal)
    trajs = trajectories(world, "train", cfg.n_weak, cfg.weak_seed, weak,
                          cfg.weak_task_start, cfg.workers, cfg.weak_kinds.get(world))
    return translate_all(trajs, world, cfg.variant_spec()) if cfg.variants else trajs


def agentic_tasks(cfg) -> dict[str, list]:
    """{split: tasks} of the config's agentic-format OOD families: train tasks under the build's
    variants of the worlds (its variant seed and name space), eval tasks under the worlds' own
    tool lists and system prompts (`agentic_ood.offers`); `held_out_world`'s open with the false
    start when the weak expert has them."""
    from pivotrl_testbed.testbed import agentic_ood

    return {split: [t for f in cfg.agentic_ood_families
                    for t in agentic_ood.generate(f, split, n, 0, cfg.worlds, cfg.variant_spec(),
                                                  false_starts=cfg.weak_false_starts > 0)]
            for split, n in (("train", cfg.ood_train), ("eval", cfg.ood_eval))}


def pretrain_base(cfg, tokenizer, weak: dict, ood_train: list,
                  say: Callable[[str], None], checkpoint: Path | None = None,
                  log_file: Path | None = None, live: Callable[[str], None] | None = None, *,
                  model=None, checkpoint_key: str | None = None,
                  label: str = "pretraining the base"):
    """`model` (default: a fresh tiny model, seeded init) pretrained on the mixture; returns
    (model, stats). With `checkpoint`, the loop saves its state there and resumes a killed build
    of this config (`checkpoint_key`, default its hash); `log_file` gets rate and ETA every 30 s,
    `live` a line every 5 s (a progress bar's text; default `say`)."""
    import torch

    from pivotrl.io.progress import ProgressLog
    from pivotrl_testbed.testbed.pretrain import pretrain
    from pivotrl_testbed.testbed.tiny import build_model

    say(label)
    torch.set_num_threads(cfg.pretrain.threads)
    model = model if model is not None else build_model(tokenizer, cfg.model)
    last, log = [0.0], []

    def on_step(step: int, loss: float) -> None:
        if not log:  # opened at the first step run, so a resumed build's rate counts new steps
            log.append(ProgressLog(f"{label}: step", cfg.pretrain.steps,
                                   log_file=log_file, echo=False, start=step - 1))
        log[0].update(step, f"loss {loss:.3f}")
        if time.time() - last[0] > 5 or step == cfg.pretrain.steps:
            last[0] = time.time()
            (live or say)(f"{log[0].line(step)} · loss {loss:.3f}")

    stats = pretrain(model, tokenizer, pretrain_examples(weak, ood_train, cfg.ood_repeat, cfg.ood_fraction),
                     cfg.pretrain, on_step, checkpoint=checkpoint,
                     checkpoint_key=checkpoint_key or cfg.digest())
    if stats["resumed_from"]:
        say(f"{label}: resumed at step {stats['resumed_from']}")
    return model, stats


def stage_mixture(out: Path, scfg: Any, index: int,
                  say: Callable[[str], None]) -> tuple[dict[str, list], list]:
    """Stage `index`'s weak trajectories by world (written to `out/pretrain/stage<N>/`) and its
    OOD training tasks; `scfg` is its mixture's config (`stages.stage_config`)."""
    from pivotrl_testbed.testbed.ood import load_ood

    weak = {}
    for w in scfg.worlds:
        say(f"stage {index + 1}: weak trajectories: {w}")
        weak[w] = weak_trajectories(scfg, w)
        write_atomic(out / "pretrain" / f"stage{index + 1}" / f"{w}.jsonl", weak[w])
    plain = [t for t in load_ood(out / "ood" / "train.jsonl")
             if t.family not in scfg.agentic_ood_families]
    return weak, plain + agentic_tasks(scfg)["train"]


def run_stages(out: Path, cfg: Any, model, tokenizer, say: Callable[[str], None],
               log_file: Path | None = None, live: Callable[[str], None] | None = None,
               first: int = 0) -> list[dict[str, Any]]:
    """Train `model` (the weights after `first` further stages) through the rest of `cfg`'s
    stages, in place; returns those stages' pretraining stats, with their mixtures' counts."""
    from pivotrl_testbed.testbed.criteria import in_domain_examples, world_list_examples

    stats = []
    for i, stage in enumerate(cfg.pretrain_stages[first:], first):
        scfg = stage_config(cfg, i).model_copy(update={"pretrain": stage.pretrain})
        weak, ood_train = stage_mixture(out, scfg, i, say)
        _, got = pretrain_base(scfg, tokenizer, weak, ood_train, say,
                               checkpoint=out / "pretrain" / f"state_stage{i + 1}.pt",
                               log_file=log_file, live=live, model=model,
                               checkpoint_key=f"{cfg.digest()}:stage{i + 1}",
                               label=f"stage {i + 1}: pretraining")
        stats.append({**got, "data": stage.data,
                      "counts": {f"pretrain/{w}": len(v) for w, v in weak.items()},
                      "in_domain": {w: in_domain_examples(w, v) for w, v in weak.items()},
                      "world_lists": {w: world_list_examples(w, v) for w, v in weak.items()}})
    return stats
