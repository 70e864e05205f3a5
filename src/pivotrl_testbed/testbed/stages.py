"""Further pretraining stages: the base's weights trained on, on a remade mixture.

A testbed base is pretrained for hours (`pretrain.py`); what the pretraining mixture should be is
found by building candidates and measuring them (docs/RESULTS.md, "Candidates"). A stage lets a
candidate be one finished build's recipe *plus* a change of mixture, so a recipe that nearly
meets the acceptance criteria is adjusted in minutes instead of rebuilt from scratch, and stays a
recipe anyone can rebuild: `pivotrl testbed build --config C --no-shipped-base` runs the first
stage and then each further one; `--base-from DIR` takes the weights of the finished build of
`C` with only its first k stages (`TestbedConfig.with_stages(k)`) and runs the rest.

A stage changes only what the mixture is made of (`STAGE_DATA_FIELDS`: the weak expert, its
tasks, the variants' names, the OOD repeats), relative to the build's own fields, not to the
stage before; never the worlds, the tokenizer or the model, which are the first stage's. Its weak trajectories are drawn anew (under `data`'s fields; give it a new
`weak_task_start` for tasks the base has not seen) and written to `pretrain/stage<N>/`; its OOD
tasks are the build's own non-agentic ones and its agentic-format ones remade under the stage's
variants. It trains with a fresh optimizer and its own schedule (`pretrain`); its loop state is
checkpointed like the first stage's, so a killed build resumes inside the stage it was in.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, field_validator

from pivotrl_testbed.testbed.pretrain import PretrainConfig

if TYPE_CHECKING:
    from pivotrl_testbed.testbed.build import TestbedConfig

# The TestbedConfig fields a stage may change: what the mixture holds. Every other field shapes
# the worlds, the eval data, the tokenizer or the model, which a stage inherits as they are.
STAGE_DATA_FIELDS = frozenset({"n_weak", "weak_noise", "weak_habit", "weak_slips", "weak_kinds",
                               "weak_false_starts", "weak_seed", "weak_task_start", "variant_seed",
                               "variant_own_share", "ood_repeat"})


class PretrainStage(BaseModel):
    """One further pretraining stage (module doc)."""

    data: dict[str, Any] = Field(default_factory=dict, description="TestbedConfig fields whose "
                                 "values this stage's mixture uses instead of the build's "
                                 "(only STAGE_DATA_FIELDS).")
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig, description="The stage's "
                                     "loop: steps, peak learning rate and schedule (a fresh "
                                     "AdamW, warmup then cosine to 10%), seed.")

    @field_validator("data")
    @classmethod
    def _mixture_fields_only(cls, data: dict[str, Any]) -> dict[str, Any]:
        other = sorted(set(data) - STAGE_DATA_FIELDS)
        if other:
            raise ValueError(f"a pretraining stage cannot change {other}: it may change only "
                             f"{sorted(STAGE_DATA_FIELDS)} (the tokenizer, model and worlds "
                             "are the first stage's)")
        return data


def stage_config(cfg: "TestbedConfig", index: int) -> "TestbedConfig":
    """The config whose mixture stage `index` (0-based among `cfg.pretrain_stages`) trains on:
    `cfg` with the stage's data fields, validated as a whole."""
    from pivotrl_testbed.testbed.build import TestbedConfig

    dump = {**cfg.with_stages(0).model_dump(), **cfg.pretrain_stages[index].data}
    return TestbedConfig.model_validate(dump)


def check_stages(cfg: "TestbedConfig") -> "TestbedConfig":
    """`cfg`, when every stage's mixture config is valid; else a ValueError naming the stage."""
    for i in range(len(cfg.pretrain_stages)):
        try:
            stage_config(cfg, i)
        except ValueError as exc:
            raise ValueError(f"pretraining stage {i + 1}: {exc}") from exc
    return cfg


def stage_mixture(out: Path, cfg: "TestbedConfig", index: int,
                  say: Callable[[str], None]) -> tuple[dict[str, list], list]:
    """Stage `index`'s weak trajectories by world (written to `out/pretrain/stage<N>/`) and its
    OOD training tasks."""
    from pivotrl.io.records import write_atomic
    from pivotrl_testbed.testbed.build import agentic_tasks, weak_trajectories
    from pivotrl_testbed.testbed.ood import load_ood

    scfg = stage_config(cfg, index)
    weak = {}
    for w in cfg.worlds:
        say(f"stage {index + 1}: weak trajectories: {w}")
        weak[w] = weak_trajectories(scfg, w)
        write_atomic(out / "pretrain" / f"stage{index + 1}" / f"{w}.jsonl", weak[w])
    plain = [t for t in load_ood(out / "ood" / "train.jsonl")
             if t.family not in cfg.agentic_ood_families]
    return weak, plain + agentic_tasks(scfg)["train"]


def run_stages(out: Path, cfg: "TestbedConfig", model, tokenizer, say: Callable[[str], None],
               log_file: Path | None = None, live: Callable[[str], None] | None = None,
               first: int = 0) -> list[dict[str, Any]]:
    """Train `model` (the weights after `first` further stages) through the rest of `cfg`'s
    stages, in place; returns those stages' pretraining stats, with their mixtures' counts."""
    from pivotrl_testbed.testbed.build import pretrain_base
    from pivotrl_testbed.testbed.criteria import in_domain_examples, world_list_examples

    stats = []
    for i, stage in enumerate(cfg.pretrain_stages[first:], first):
        weak, ood_train = stage_mixture(out, cfg, i, say)
        scfg = stage_config(cfg, i).model_copy(update={"pretrain": stage.pretrain})
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
