"""`trl_overrides`: the TRL settings pivotrl does not model, passed to TRL's GRPOConfig / SFTConfig.

One door for each setting. A number pivotrl models (num_generations, beta, max_completion_length,
learning_rate, ...) feeds what pivotrl derives from it: the batch and the step count, the prompt
cap, the vLLM length, the re-profiling budget. Set behind pivotrl's back, TRL would run one value
while every derived number followed the other (e.g. `num_generations: 4` as an override: TRL
samples 4 per pivot, pivotrl still sizes the batch and the schedule for 16). So a key that names a
pivotrl setting, by its name or under TRL's name for it, is refused with the flag to use; a key that
is no field of TRL's config is refused too (a misspelt key is never a silently dropped setting); and
each value is checked against the TRL field's type (YAML reads `3e-4` as a string: it becomes the
float it means, or the error names the key).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

# TRL fields pivotrl sets from one of its own fields of another name (TRL name -> pivotrl field).
TRL_NAMES = {"num_train_epochs": "num_epochs", "bf16": "precision", "resume_from_checkpoint": "resume",
             "overwrite_output_dir": "overwrite", "vllm_max_model_length": "max_prompt_length"}

# TRL fields pivotrl sets itself and offers no setting for, each with the reason.
SET_BY_PIVOTRL = {
    "save_strategy": "checkpoints are written every save_steps",
    "use_cpu": "the device is the machine's (a GPU when there is one)",
    "disable_tqdm": "progress lines (progress_seconds) replace the bar",
    "ignore_data_skip": "a resumed run skips the batches it trained (the uninterrupted run's order)",
    "log_completions": "metrics.jsonl holds the run's metrics",
    "packing": "SFT rows arrive tokenized, one trajectory per row",
    "completion_only_loss": "SFT rows arrive with their labels masked (assistant_only_loss)",
}


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


@functools.cache
def trl_config_class(name: str) -> type:
    import trl

    return getattr(trl, name)


@functools.cache
def _field_types(trl_config: type) -> dict[str, Any]:
    hints = typing.get_type_hints(trl_config)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(trl_config)}


def refusal(key: str, run_fields: set[str]) -> str | None:
    """Why `key` cannot be a TRL override of a run whose config has `run_fields`; None when it can."""
    if key in run_fields:
        return f"{key!r} is a pivotrl setting: use {flag(key)} (or `{key}:` in the run YAML)"
    if key in TRL_NAMES and TRL_NAMES[key] in run_fields:
        field = TRL_NAMES[key]
        return f"{key!r} is pivotrl's {field}: use {flag(field)} (or `{field}:` in the run YAML)"
    if key in SET_BY_PIVOTRL:
        return f"{key!r} is set by pivotrl ({SET_BY_PIVOTRL[key]})"
    return None


def _typed(key: str, value: Any, annotation: Any, cls_name: str) -> Any:
    """`value` as TRL's field type (pydantic's lax rules: "3e-4" -> 3e-4, "4" -> 4); ValueError
    naming the key when it is not one."""
    from pydantic import TypeAdapter, ValidationError
    from pydantic.errors import PydanticSchemaGenerationError

    try:
        adapter = TypeAdapter(annotation)
    except PydanticSchemaGenerationError:  # a type pydantic cannot check: TRL checks it
        return value
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        first = exc.errors()[0]["msg"]
        shown = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
        raise ValueError(f"{key}: {value!r} is not a {shown} (TRL's {cls_name}.{key}): {first}") from None


def checked_trl_overrides(overrides: dict[str, Any], cls_name: str, run_fields: set[str]) -> dict[str, Any]:
    """The overrides with each value as TRL's field type. ValueError naming every refused key:
    not a field of TRL's `cls_name`, a pivotrl setting (the flag to use), or a value of the wrong
    type."""
    if not overrides:
        return {}
    types = _field_types(trl_config_class(cls_name))
    unknown = sorted(k for k in overrides if k not in types)
    if unknown:
        raise ValueError(f"{', '.join(map(repr, unknown))} {'is not a field' if len(unknown) == 1 else 'are not fields'}"
                         f" of TRL's {cls_name}")
    refused = [why for k in overrides if (why := refusal(k, run_fields))]
    if refused:
        raise ValueError("; ".join(refused) + " (trl_overrides holds only what pivotrl does not model)")
    return {k: _typed(k, v, types[k], cls_name) for k, v in overrides.items()}
