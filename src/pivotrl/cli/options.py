"""Command-line options from config models: each default and description is written once, on the
pydantic field, and the CLI cannot drift from it. `config_fields` gives a verb one `--field value`
option per field of its config (TRL's `TrlParser` and Hydra's overrides do the same), collected into
an `overrides` dict; precedence is the config's own (`from_yaml`): defaults < YAML < command line."""

from __future__ import annotations

import functools
import inspect
import types
import typing
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Optional

import typer
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TextColumn, TimeElapsedColumn

CONFIG_PANEL = "Config fields (each overrides the --config YAML)"


def field_default(info: FieldInfo) -> Any:
    return info.get_default(call_default_factory=True)


def option(model: type[BaseModel], field: str, *decls: str, help: str | None = None):
    """A typer option whose default and help come from a config model's field."""
    info = model.model_fields[field]
    return typer.Option(field_default(info), *decls, help=escape(help or info.description or ""))


def engine_option(model: type[BaseModel], field: str, *decls: str):
    """An engine flag (`ProfileConfig.engine` key) that stays None unless given, with the engine
    options model's help and default (`vllm: … (default: X)`)."""
    return typer.Option(None, *decls, help=f"{model.__name__.removesuffix('Options').lower()}: "
                        f"{model.model_fields[field].description} {default_of(model, field)}")


def default_of(model: type[BaseModel], field: str) -> str:
    """`(default: X)` for options that stay None so that a YAML config can set them."""
    info = model.model_fields[field]
    return "(required)" if info.is_required() else f"(default: {field_default(info)})"


def _plain(annotation: Any) -> Any:
    """`X | None` → X; anything the command line cannot hold as one value → str (read as YAML)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = args[0] if len(args) == 1 else str
    if annotation in (bool, int, float, str, Path):
        return annotation
    return str  # Literal (pydantic checks the value), dict, list, nested models


def _is_mapping(annotation: Any) -> bool:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    return (annotation is dict or typing.get_origin(annotation) is dict
            or (isinstance(annotation, type) and issubclass(annotation, BaseModel)))


def mapping_value(flag: str, text: str) -> dict[str, Any]:
    """A dict-valued flag (`--chat-template-kwargs`, `--verifier-config`, `--trl-overrides`,
    `--lora`): inline YAML or JSON (`'{enable_thinking: false}'`, `'{"beta": 0.04}'`), or the path
    of a YAML/JSON file holding the mapping."""
    from pivotrl.io.yaml_config import read_mapping

    try:
        is_file = Path(text).is_file()
    except OSError:  # inline text longer than a file name may be
        is_file = False
    if is_file:
        try:
            return read_mapping(text)
        except ValueError as exc:
            raise typer.BadParameter(f"{flag}: {exc}") from None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise typer.BadParameter(f"{flag}: not YAML or JSON: {exc}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise typer.BadParameter(f"{flag}: expected a mapping, inline YAML or JSON "
                                 f"(e.g. '{{enable_thinking: false}}') or a YAML file; got {text!r}")
    return value


def _parse(flag: str, annotation: Any, value: Any) -> Any:
    """A str given for a structured field is YAML (`--lora '{enabled: true}'`, `--data '[a, b]'`);
    a mapping may also be a file (`mapping_value`)."""
    if not isinstance(value, str) or _plain(annotation) is not str or annotation is str:
        return value
    origin = typing.get_origin(annotation)
    if origin is typing.Literal or (origin in (typing.Union, types.UnionType)
                                    and str in typing.get_args(annotation)):
        return value
    if _is_mapping(annotation):
        return mapping_value(flag, value)
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise typer.BadParameter(f"{flag}: not YAML: {exc}") from None


def config_fields(model: type[BaseModel], *, skip: tuple[str, ...] = ()):
    """Decorate a verb that takes `overrides: dict`: every field of `model` that is not already one
    of the verb's parameters (nor in `skip`) becomes an option `--field-name`, default None (not
    given), help = the field's description and default. Only given options reach `overrides`."""
    def wrap(fn):
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.name != "overrides"]
        taken = {p.name for p in own} | set(skip)
        extra = []
        for name, info in model.model_fields.items():
            if name in taken:
                continue
            kind = _plain(info.annotation)
            flag = "--" + name.replace("_", "-")
            decls = [f"{flag}/--no-{name.replace('_', '-')}"] if kind is bool else [flag]
            help_text = f"{info.description or ''} {default_of(model, name)}".strip()
            if _is_mapping(info.annotation):
                help_text += " Inline YAML or JSON, or a YAML file."
            # Help is rich markup: a description's `pivotrl[vllm]` must not read as a style tag.
            help_text = escape(help_text)
            extra.append(inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[kind],
                default=typer.Option(None, *decls, help=help_text, rich_help_panel=CONFIG_PANEL)))

        @functools.wraps(fn)
        def command(**kwargs):
            overrides = {}
            for p in extra:
                value = kwargs.pop(p.name, None)
                if value is not None:
                    flag = "--" + p.name.replace("_", "-")
                    overrides[p.name] = _parse(flag, model.model_fields[p.name].annotation, value)
            return fn(**kwargs, overrides=overrides)

        command.__signature__ = sig.replace(parameters=own + extra)
        return command
    return wrap


def load_config(console: Console, config_model: type[BaseModel], config: Path | None, /, **overrides: Any):
    """`config_model.from_yaml(config, **overrides)`; a bad file or field is a one-line error
    naming it (exit 2), never a traceback. Positional-only, so that fields named `model` or
    `config` reach the overrides."""
    try:
        return config_model.from_yaml(config, **overrides)
    except (ValueError, OSError) as exc:  # pydantic's ValidationError is a ValueError
        console.print(f"[red]{escape(str(exc))}[/red]")  # `pip install 'pivotrl[x]'` is no markup
        raise typer.Exit(2) from None


@contextmanager
def line_progress(console: Console, description: str):
    """A rich progress line for streaming jobs: lines done and time; yields `advance(lineno)`."""
    with Progress(TextColumn("{task.description}"), TextColumn("{task.completed} lines"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task(description, total=None)
        yield lambda lineno: progress.update(task, completed=lineno)


def run_job(console: Console, verb: str, job: Callable[[], Any], stopped: str) -> Any:
    """`job()` with a user's mistake (a ValueError or OSError: a bad path, no usable data, a model
    the Hub does not have) as one line naming it, exit 2 for a bad input and 1 otherwise, and
    Ctrl-C as `stopped` (how to resume), exit 130. PIVOTRL_TRACEBACK=1 shows the traceback."""
    import os

    from pivotrl.io.inputs import InputError

    try:
        return job()
    except KeyboardInterrupt:
        console.print(f"[yellow]{escape(stopped)}[/yellow]")
        raise typer.Exit(130) from None
    except (ValueError, OSError) as exc:
        if os.environ.get("PIVOTRL_TRACEBACK"):
            raise
        console.print(f"[red]pivotrl {verb}: {escape(str(exc))}[/red]")
        raise typer.Exit(2 if isinstance(exc, (InputError, FileNotFoundError)) else 1) from None


def leave_process_group() -> None:
    """Ends a rank of a multi-process run (`accelerate launch`) once its work is saved: destroys
    the process group (on every rank, after a barrier), runs the atexit handlers, flushes, and
    exits without interpreter finalization. At finalization gloo's worker threads can still hold
    tensors whose release needs the GIL; the process then aborts (SIGABRT, "terminate called
    without an active exception") after a run that succeeded, and the launcher reports the whole
    run as failed. Called only after success: destroying the group while another rank is still
    in a collective can hang (torchtitan destroys it on success only, for the same reason).
    A no-op in a single process."""
    import atexit
    import logging
    import os
    import sys

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    dist.destroy_process_group()
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

