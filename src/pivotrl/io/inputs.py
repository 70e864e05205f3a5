"""Checks of what a user hands a verb (a model folder, an input file, a tracker), made before any
work starts. Each failure is an InputError whose message names the fix; the command line prints
it as one line, never a traceback."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pivotrl.io.empty import input_problem


class InputError(ValueError):
    """A user's input is wrong; the message says what to do instead."""


MODEL_FOLDER = "a model folder holds config.json, the weights and the tokenizer files"


def _looks_local(model: str) -> bool:
    """A path, not a Hub id (`org/name`): it starts like a path, has no or several slashes, or
    its first part is a folder here (a mistyped `runs/pivotrl2` is not a Hub repo)."""
    if model.startswith((".", "/", "~")) or "\\" in model or model.count("/") != 1:
        return True
    return Path(model.split("/")[0]).expanduser().is_dir()


def check_model(model: str | Path, flag: str = "--model") -> None:
    """A local model folder must hold config.json; a name that is neither a folder here nor a
    Hub id (`org/name`) is an error. A Hub id is left to the loader."""
    text = str(model)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"{flag} {text}: a folder, but not a model ({MODEL_FOLDER}; "
                             "a run's OUTPUT_DIR or one of its checkpoint-N/ folders is one)")
        return
    if path.exists():
        raise InputError(f"{flag} {text}: a file, not a model folder ({MODEL_FOLDER})")
    if _looks_local(text):
        raise InputError(f"{flag} {text}: no such folder (give the path of a model folder — "
                         f"{MODEL_FOLDER} — or a Hub id such as Qwen/Qwen3-8B)")


def check_input_file(path: str | Path | None, flag: str, made_by: str = "") -> None:
    """An input JSONL must exist and be JSON Lines (`io.empty.input_problem`: not a folder, Parquet
    or an archive); otherwise an error naming what writes it."""
    if path is None:
        return
    path = Path(path)
    hint = f" ({made_by} writes it)" if made_by else ""
    if not path.exists():
        raise InputError(f"{flag} {path}: no such file{hint}")
    if (problem := input_problem(path)) is not None:
        raise InputError(f"{flag} {path}: {problem}{hint}")


TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def check_tracker(report_to: str) -> None:
    """`report_to: tensorboard|wandb` needs its package, checked when the config is read rather
    than after the data are loaded."""
    package = TRACKER_PACKAGES.get(report_to)
    if package and importlib.util.find_spec(package) is None:
        raise InputError(f"report_to: {report_to} needs the {package} package: "
                         f"pip install 'pivotrl[{report_to}]' (or report_to: none; metrics.jsonl "
                         "is always written)")


def check_chat_template(tokenizer, model: str | Path) -> None:
    """Prompts are the model's own chat template applied to a turn's context: a tokenizer without
    one (a base model's) cannot render them, whatever response format is set."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(f"{model}: the tokenizer has no chat template, so no prompt can be rendered: "
                         "use the chat/instruct version of the model, or put the template it was "
                         "trained with in the folder as chat_template.jinja")
