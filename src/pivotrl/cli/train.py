"""`pivotrl train` (GRPO on pivots) and `pivotrl sft` (the SFT baseline): a run config in, a
checkpoint folder and a summary table out."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from pivotrl.cli.console import console
from pivotrl.cli.options import config_fields, leave_process_group, load_config, run_job
from pivotrl.train.config import GRPORunConfig, SFTRunConfig


def print_train_summary(verb: str, summary: dict) -> None:
    if os.environ.get("RANK", "0") != "0":  # one summary under accelerate launch
        return
    table = Table(title=f"pivotrl {verb}")
    table.add_column("field")
    table.add_column("value")
    for key, value in summary.items():
        if key == "dropped":
            value = f"{len(value)}" + (f" (first: {value[0][0]}: {value[0][1]})" if value else "")
        table.add_row(key, str(value))
    console.print(table)


def warn_without_split(verb: str, split, data) -> None:
    """`sft` and `e2e` read raw trajectories: without a split they train on the held-out ones too."""
    from pivotrl.io.split import find_split, no_split_warning

    try:
        found = split is not None or find_split(data) is not None
    except ValueError:  # several candidates: the stage itself says so
        return
    if not found and os.environ.get("RANK", "0") == "0":
        console.print(f"[yellow]warning: {escape(no_split_warning(verb, data))}[/yellow]")


def _run_training(verb: str, run, cfg):
    return run_job(console, verb, lambda: run(cfg),
                   f"stopped. {cfg.output_dir} keeps a checkpoint-N/ every save_steps ({cfg.save_steps}): "
                   "rerun the same command with --resume to continue from the last one")


@config_fields(GRPORunConfig)
def train(config: Optional[Path] = typer.Option(None, "--config", help="Run YAML of GRPORunConfig fields; "
                                                "flags override it (configs/train_testbed.yaml)."),
          overrides: dict | None = None) -> None:
    """GRPO on pivots (TRL GRPOTrainer); works under `accelerate launch` too. Give a run YAML, or the
    required fields as flags: `pivotrl train --pivots P --model M --output-dir D`."""
    from pivotrl.train.grpo import train as run_grpo

    cfg = load_config(console, GRPORunConfig, config, **overrides)
    print_train_summary("train", _run_training("train", run_grpo, cfg))
    leave_process_group()


@config_fields(SFTRunConfig)
def sft(config: Optional[Path] = typer.Option(None, "--config", help="Run YAML of SFTRunConfig fields; "
                                              "flags override it (configs/sft_testbed.yaml)."),
        overrides: dict | None = None) -> None:
    """The SFT baseline on the same trajectories (TRL SFTTrainer, loss on assistant turns only). Give
    a run YAML, or the required fields as flags: `pivotrl sft --data T --model M --output-dir D`."""
    from pivotrl.train.sft import train_sft

    cfg = load_config(console, SFTRunConfig, config, **overrides)
    warn_without_split("sft", cfg.split, cfg.data)
    print_train_summary("sft", _run_training("sft", train_sft, cfg))
    leave_process_group()
