"""The one YAML loader: a YAML file -> a mapping -> a pydantic config, with errors that name the
file and the field (`path: field.sub: message`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)


def read_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML file's top-level mapping (an empty file is `{}`); ValueError names the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping, got {type(data).__name__}")
    return data


def validation_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())


def build_model(cls: type[ModelT], data: dict[str, Any], source: str | Path) -> ModelT:
    """`cls.model_validate(data)`, with a ValueError naming `source` and each bad field."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{source}: {validation_message(exc)}") from None


def load_model(cls: type[ModelT], path: str | Path, **overrides: Any) -> ModelT:
    """A pydantic config from a YAML file, with keyword overrides applied on top."""
    return build_model(cls, {**read_mapping(path), **overrides}, path)
