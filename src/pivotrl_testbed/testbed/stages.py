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

Every `cfg` here is a `build.TestbedConfig`, not imported: the build imports this module.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from pivotrl_testbed.testbed.pretrain import PretrainConfig

# The TestbedConfig fields a stage may change: what the mixture holds. Every other field shapes
# the worlds, the eval data, the tokenizer or the model, which a stage inherits as they are.
STAGE_DATA_FIELDS = frozenset({"n_weak", "weak_noise", "weak_habit", "weak_slips", "weak_kinds",
                               "weak_false_starts", "weak_grounding_slips", "weak_grounding_terminal", "weak_seed", "weak_task_start", "variant_seed",
                               "variant_own_share", "ood_repeat", "ood_fraction"})


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


def stage_config(cfg: Any, index: int) -> Any:
    """The config whose mixture stage `index` (0-based among `cfg.pretrain_stages`) trains on:
    `cfg` with the stage's data fields, validated as a whole."""
    dump = {**cfg.with_stages(0).model_dump(), **cfg.pretrain_stages[index].data}
    return type(cfg).model_validate(dump)


def check_stages(cfg: Any) -> Any:
    """`cfg`, when every stage's mixture config is valid; else a ValueError naming the stage."""
    for i in range(len(cfg.pretrain_stages)):
        try:
            stage_config(cfg, i)
        except ValueError as exc:
            raise ValueError(f"pretraining stage {i + 1}: {exc}") from exc
    return cfg
