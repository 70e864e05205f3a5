"""Command-line options from config models: each default and description is written once, on the
pydantic field, and the CLI cannot drift from it. `config_fields` gives a verb one `--field value`
option per field of its config (TRL's `TrlParser` and Hydra's overrides do the same; the flags
come from `pivotrl.io.run_config.flag_specs`), collected into an `overrides` dict; `load_run_config`
assembles the run config (`pivotrl.io.run_config`: defaults < YAML < command line)."""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TextColumn, TimeElapsedColumn

from pivotrl.io.run_config import assemble_run_config, default_of, field_default, flag_specs, flag_value

CONFIG_PANEL = "Config fields (each overrides the --config YAML)"


def option(model: type[BaseModel], field: str, *decls: str, help: str | None = None):
    """A typer option whose default and help come from a config model's field."""
    info = model.model_fields[field]
    return typer.Option(field_default(info), *decls, help=escape(help or info.description or ""))


def engine_option(model: type[BaseModel], field: str, *decls: str):
    """An engine flag (`ProfileConfig.engine` key) that stays None unless given, with the engine
    options model's help and default (`vllm: … (default: X)`)."""
    return typer.Option(None, *decls, help=f"{model.__name__.removesuffix('Options').lower()}: "
                        f"{model.model_fields[field].description} {default_of(model, field)}")


def config_fields(model: type[BaseModel], *, skip: tuple[str, ...] = ()):
    """Decorate a verb that takes `overrides: dict`: every field of `model` that is not already one
    of the verb's parameters (nor in `skip`) becomes an option (`pivotrl.io.run_config.flag_specs`),
    default None (not given). Only given options reach `overrides`."""
    def wrap(fn):
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.name != "overrides"]
        specs = {s.name: s for s in flag_specs(model, {p.name for p in own} | set(skip))}
        # Help is rich markup: a description's `pivotrl[vllm]` must not read as a style tag.
        extra = [inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[s.kind],
                                   default=typer.Option(None, *s.decls, help=escape(s.help),
                                                        rich_help_panel=CONFIG_PANEL))
                 for s in specs.values()]

        @functools.wraps(fn)
        def command(**kwargs):
            overrides = {}
            for name, spec in specs.items():
                value = kwargs.pop(name, None)
                if value is not None:
                    try:
                        overrides[name] = flag_value(spec, value)
                    except ValueError as exc:
                        raise typer.BadParameter(str(exc)) from None
            return fn(**kwargs, overrides=overrides)

        command.__signature__ = sig.replace(parameters=own + extra)
        return command
    return wrap


def load_run_config(console: Console, config_model: type[BaseModel], config: Path | None, /, **overrides: Any):
    """The run config (`pivotrl.io.run_config.assemble_run_config`: defaults < YAML < flags); a bad
    file or field is a one-line error naming it (exit 2), never a traceback. Positional-only, so
    that fields named `model` or `config` reach the overrides."""
    try:
        return assemble_run_config(config_model, config, overrides)
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


def run_job(console: Console, verb: str, job: Callable[[], Any], stopped: str | Callable[[], str]) -> Any:
    """`job()` with a user's mistake (a ValueError or OSError: a bad path, no usable data, a model
    the Hub does not have) as one line naming it, exit 2 for a bad input and 1 otherwise, and
    Ctrl-C as `stopped` (the command that continues or restarts the run; a callable is read when
    the run stops), exit 130. PIVOTRL_TRACEBACK=1 shows the traceback."""
    import os

    from pivotrl.io.inputs import InputError

    try:
        return job()
    except KeyboardInterrupt:
        console.print(f"[yellow]{escape(stopped() if callable(stopped) else stopped)}[/yellow]")
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

