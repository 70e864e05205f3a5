"""The verb of a training run: `pivotrl train`, `pivotrl sft`, and the testbed's `pivotrl e2e` are
each one `training_verb` over their run config and their library function (a plugin mounts its own
the same way, from its entry point). A run config in (pivotrl.io.run_config: defaults < YAML < flags), the
plan printed and saved (pivotrl.io.run_plan; `--dry-run` stops there), errors as one line, Ctrl-C as
the exact command that continues or restarts the run (exit 130), a summary out."""

from __future__ import annotations

import importlib
import os
import re
import shlex
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from pivotrl.cli.console import console
from pivotrl.cli.options import config_fields, leave_process_group, load_run_config, run_job
from pivotrl.io.run_config import split_warning
from pivotrl.io.run_plan import Launch

__all__ = ["DRY_RUN", "STRICT", "given_command", "interrupted", "run_training_verb", "training_verb"]

DRY_RUN = typer.Option(False, "--dry-run", help="Print the run's plan (items, steps, items and completions "
                       "per step, token budget, epochs) and stop: nothing is trained, deleted or written.")
STRICT = typer.Option(False, "--strict", help="A chat_template_kwargs key the model's chat template never "
                      "reads is an error (default: a warning).")


def given_command(ctx: typer.Context | None, *, drop: Iterable[str] = (), add: Iterable[str] = ()) -> str:
    """The command line of the verb running in `ctx` as the user gave it (every parameter given on
    the command line, as parsed), less the parameters named in `drop`, plus the words `add`."""
    if ctx is None:
        return " ".join(["the same command", *add])
    words = ["pivotrl", *ctx.command_path.split()[1:]]
    dropped = set(drop)
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)
        if param.name in dropped or getattr(source, "name", "") not in ("COMMANDLINE", "ENVIRONMENT"):
            continue
        value = ctx.params.get(param.name)
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if param.param_type_name == "argument":
            words += [str(v) for v in values]
        elif getattr(param, "is_flag", False) and param.secondary_opts:
            words.append(param.opts[0] if value else param.secondary_opts[0])
        elif getattr(param, "is_flag", False):
            words += [param.opts[0]] if value else []
        else:
            for v in values:
                words += [param.opts[0], str(v)]
    return shlex.join([*words, *add])


def last_checkpoint(folder: str | Path) -> str | None:
    """The newest checkpoint-N folder of a run folder; None when there is none."""
    found = [(int(m.group(1)), p.name) for p in Path(folder).glob("checkpoint-*")
             if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name))]
    return max(found)[1] if found else None


def interrupted(cfg: Any, ctx: typer.Context | None = None) -> str:
    """What a stopped run says, read when it stops: after a checkpoint, the command that continues
    it (`--resume`); before the first one there is nothing to resume from, so the command that
    starts it again (`--overwrite`: the folder holds the stopped run's metrics and log)."""
    out, every = cfg.output_dir, cfg.save_steps
    checkpoint = last_checkpoint(out)
    given = ("resume", "overwrite")  # replaced by the one the next run needs (a YAML's turned off)
    if checkpoint:
        again = given_command(ctx, drop=given, add=["--resume"] + (["--no-overwrite"] if cfg.overwrite else []))
        return (f"stopped. {out} keeps {checkpoint}, the last checkpoint (one every save_steps = {every} "
                f"steps), and the metrics and log so far. Continue the run with:\n  {again}")
    again = given_command(ctx, drop=given, add=["--overwrite"] + (["--no-resume"] if cfg.resume else []))
    return (f"stopped before the first checkpoint (one every save_steps = {every} steps): there is nothing to "
            f"resume from; {out} keeps the metrics and log so far. Start the run again with:\n  {again}")


def print_summary(verb: str, summary: dict) -> None:
    if os.environ.get("RANK", "0") != "0":  # one summary under accelerate launch
        return
    if summary.get("dry_run"):
        console.print(f"pivotrl {verb}: dry run, nothing trained or written (run it without --dry-run)")
        return
    table = Table(title=f"pivotrl {verb}")
    table.add_column("field")
    table.add_column("value")
    for key, value in summary.items():
        if key == "dropped" and isinstance(value, list):
            value = f"{len(value)}" + (f" (first: {value[0][0]}: {value[0][1]})" if value else "")
        table.add_row(key, escape(str(value)))
    console.print(table)


def run_training_verb(verb: str, config_model: type, config: Path | None, overrides: dict[str, Any] | None,
                      run: Callable[..., dict], *, dry_run: bool = False, strict: bool = False,
                      raw_data: Callable[[Any], Any] | None = None, ctx: typer.Context | None = None) -> None:
    """The body of a training verb: `run(cfg, launch=...)` on the assembled run config.
    raw_data: the run's trajectory files, for a verb that reads raw trajectories (it warns when
    no split keeps the held-out ones out)."""
    cfg = load_run_config(console, config_model, config, **(overrides or {}))
    if raw_data is not None and os.environ.get("RANK", "0") == "0":
        warning = split_warning(verb, cfg.split, raw_data(cfg))
        if warning:
            console.print(f"[yellow]warning: {escape(warning)}[/yellow]")
    launch = Launch(dry_run=dry_run, strict=strict, command=given_command(ctx) if ctx is not None else None)
    print_summary(verb, run_job(console, verb, lambda: run(cfg, launch=launch), lambda: interrupted(cfg, ctx)))
    leave_process_group()


def training_verb(verb: str, config_model: type, run: str, doc: str, example: str,
                  raw_data: str | None = None) -> Callable[..., None]:
    """The typer verb `verb`: `--config` (a run YAML of `config_model`, e.g. `example`), one flag
    per field, `--dry-run`, `--strict`; it calls `run` ("module:function", imported when the verb
    runs, so `--help` loads no trainer) as `run(cfg, launch=...)`. raw_data: the config field naming
    raw trajectory files (the split warning). `doc` is the verb's help."""
    def command(ctx: typer.Context, config: Optional[Path] = typer.Option(
                    None, "--config", help=f"Run YAML of {config_model.__name__} fields (its relative "
                    f"paths are relative to its folder); flags override it ({example})."),
                dry_run: bool = DRY_RUN, strict: bool = STRICT, overrides: dict | None = None) -> None:
        module, name = run.split(":")
        run_training_verb(verb, config_model, config, overrides, getattr(importlib.import_module(module), name),
                          dry_run=dry_run, strict=strict,
                          raw_data=(lambda cfg: getattr(cfg, raw_data)) if raw_data else None, ctx=ctx)

    command.__name__ = command.__qualname__ = verb
    command.__doc__ = doc
    return config_fields(config_model)(command)
