"""One place assembles a run config: the config model's defaults < the run YAML < the command
line's flags. A path in the YAML is relative to the YAML's folder (a run file works from any
directory); a path given as a flag is relative to the working directory, as usual. Every field of
the model is one flag (`--field-name`, `--flag/--no-flag` for a bool), generated here from the
field, so a default and its help are written once, on the field.

The library's verbs (`pivotrl train`, `sft`, `profile`, `evaluate`, `compare`) and the testbed's
(`pivotrl e2e`) all use it: `pivotrl.cli.options.config_fields` turns `flag_specs` into options,
`assemble_run_config` builds the config. Nothing here draws or exits: a bad value is a ValueError
naming the flag, file or field.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo


def field_default(info: FieldInfo) -> Any:
    return info.get_default(call_default_factory=True)


def default_of(model: type[BaseModel], field: str) -> str:
    """`(default: X)` for options that stay None so that a YAML config can set them."""
    info = model.model_fields[field]
    return "(required)" if info.is_required() else f"(default: {field_default(info)})"


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def plain_type(annotation: Any) -> Any:
    """`X | None` → X; anything the command line cannot hold as one value → str (read as YAML)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = args[0] if len(args) == 1 else str
    if annotation in (bool, int, float, str, Path):
        return annotation
    return str  # Literal (pydantic checks the value), dict, list, nested models


def is_mapping(annotation: Any) -> bool:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    return (annotation is dict or typing.get_origin(annotation) is dict
            or (isinstance(annotation, type) and issubclass(annotation, BaseModel)))


@dataclass(frozen=True)
class FlagSpec:
    """One config field as a command-line flag."""

    name: str          # the field
    decls: tuple[str, ...]  # `--field-name`, or `--field/--no-field` for a bool
    kind: type         # what the command line parses the value as (bool, int, float, str, Path)
    help: str          # the field's description and default
    annotation: Any    # the field's type (a structured value arrives as text: `flag_value`)


def flag_specs(model: type[BaseModel], taken: set[str] = frozenset()) -> list[FlagSpec]:
    """A flag for every field of `model` not in `taken` (a verb's own parameters)."""
    specs = []
    for name, info in model.model_fields.items():
        if name in taken:
            continue
        kind = plain_type(info.annotation)
        flag = flag_name(name)
        decls = (f"{flag}/--no-{name.replace('_', '-')}",) if kind is bool else (flag,)
        help_text = f"{info.description or ''} {default_of(model, name)}".strip()
        if is_mapping(info.annotation):
            help_text += " Inline YAML or JSON, or a YAML file."
        specs.append(FlagSpec(name, decls, kind, help_text, info.annotation))
    return specs


def mapping_value(flag: str, text: str) -> dict[str, Any]:
    """A dict-valued flag (`--chat-template-kwargs`, `--verifier-config`, `--trl-overrides`,
    `--lora`): inline YAML or JSON (`'{enable_thinking: false}'`, `'{"adam_beta2": 0.95}'`), or
    the path of a YAML/JSON file holding the mapping. ValueError names the flag."""
    from pivotrl.io.yaml_config import read_mapping

    try:
        is_file = Path(text).is_file()
    except OSError:  # inline text longer than a file name may be
        is_file = False
    if is_file:
        try:
            return read_mapping(text)
        except ValueError as exc:
            raise ValueError(f"{flag}: {exc}") from None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{flag}: not YAML or JSON: {exc}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{flag}: expected a mapping, inline YAML or JSON "
                         f"(e.g. '{{enable_thinking: false}}') or a YAML file; got {text!r}")
    return value


def flag_value(spec: FlagSpec, value: Any) -> Any:
    """A flag's value for its field: a str given for a structured field is YAML (`--lora
    '{enabled: true}'`, `--data '[a, b]'`); a mapping may also be a file (`mapping_value`)."""
    annotation, flag = spec.annotation, spec.decls[0].split("/")[0]
    if not isinstance(value, str) or spec.kind is not str or annotation is str:
        return value
    origin = typing.get_origin(annotation)
    if origin is typing.Literal or (origin in (typing.Union, types.UnionType)
                                    and str in typing.get_args(annotation)):
        return value
    if is_mapping(annotation):
        return mapping_value(flag, value)
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise ValueError(f"{flag}: not YAML: {exc}") from None


def assemble_run_config(model: type[BaseModel], yaml_path: str | Path | None, flags: dict[str, Any]):
    """The run config: `model`'s defaults < the YAML at `yaml_path` (None: none; its relative
    paths resolved against its folder) < `flags` (None values: not given). ValueError naming the
    file (or "command line") and each bad field."""
    return model.from_yaml(yaml_path, **flags)


def split_warning(verb: str, split: Any, data: Any) -> str | None:
    """What `sft` and `e2e` say when they read raw trajectories without a split (they would train on
    the held-out ones too); None when there is one (given, or beside the data)."""
    from pivotrl.io.split import find_split, no_split_warning

    try:
        found = split is not None or find_split(data) is not None
    except ValueError:  # several candidates: the stage itself says so
        return None
    return None if found else no_split_warning(verb, data)
