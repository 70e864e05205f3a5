"""The one YAML loader: a YAML file -> a mapping -> a pydantic config, with errors that name the
file and the field (`path: field.sub: message`), and the one precedence rule of every config
(`YamlConfig.from_yaml`: defaults < YAML < command line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

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


def validation_message(exc: ValidationError, cls: type[BaseModel] | None = None) -> str:
    """Each bad field as `field.sub: message`; a misspelt key of `cls` (or of a nested config)
    with the field it is closest to, as the command line's flags do."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}"
                     f"{_did_you_mean(cls, e['loc']) if e['type'] == 'extra_forbidden' else ''}"
                     for e in exc.errors())


def _did_you_mean(cls: type[BaseModel] | None, loc: tuple[Any, ...]) -> str:
    import difflib

    model = cls
    for part in loc[:-1]:  # down to the config block that holds the misspelt key
        info = model.model_fields.get(str(part)) if model is not None else None
        annotation = getattr(info, "annotation", None)
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    if model is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def build_model(cls: type[ModelT], data: dict[str, Any], source: str | Path) -> ModelT:
    """`cls.model_validate(data)`, with a ValueError naming `source` and each bad field."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{source}: {validation_message(exc, cls)}") from None


def load_model(cls: type[ModelT], path: str | Path, **overrides: Any) -> ModelT:
    """A pydantic config from a YAML file, with keyword overrides applied on top."""
    return build_model(cls, {**read_mapping(path), **overrides}, path)


def field_like(block: type[BaseModel], name: str, *, note: str = "", **changes: Any) -> Any:
    """The field `name` of an options block, re-declared in a config that needs another default or
    bound (`changes`: default=…, ge=…); its description is the block's, with `note` added. So a
    field's help is written once even where a stage's default differs."""
    info = block.model_fields[name]
    description = f"{info.description} {note}".strip()
    default = {"default": changes.pop("default")} if "default" in changes else {}
    return FieldInfo.merge_field_infos(info, Field(**changes), description=description, **default)


class YamlConfig(BaseModel):
    """A config with the one precedence rule: field defaults < a YAML file < keyword overrides (the
    command line's `--field value`). A misspelt key is an error, never a silently ignored setting.
    `path_fields` are resolved against the YAML's folder, so a run file works from any directory."""

    model_config = ConfigDict(extra="forbid")
    path_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_yaml(cls, path: str | Path | None = None, **overrides: Any):
        """Load `path` (None: defaults only) and apply `overrides` (None values: not given)."""
        data: dict[str, Any] = {}
        if path is not None:
            path = Path(path)
            data = read_mapping(path)
            for key in cls.path_fields:
                value = data.get(key)
                if isinstance(value, list):
                    data[key] = [v if Path(str(v)).is_absolute() else str(path.parent / str(v)) for v in value]
                elif value and not Path(str(value)).is_absolute():
                    candidate = path.parent / str(value)
                    # "model" may be a hub id: resolve it only when the relative path exists
                    if key != "model" or candidate.exists():
                        data[key] = str(candidate)
        # Overrides come last; their paths are relative to the working directory, as usual.
        data.update({k: v for k, v in overrides.items() if v is not None})
        return build_model(cls, data, path if path is not None else "command line")
