"""The `pivotrl` command line: each verb a few lines over the library (DESIGN.md, contract)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import Progress, TextColumn, TimeElapsedColumn

from pivotrl.records import RecordError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="PivotRL: RL on the pivot turns of existing agent trajectories.")
testbed_app = typer.Typer(no_args_is_help=True, help="The built-in testbed: worlds, tiny model.")
data_app = typer.Typer(no_args_is_help=True, help="Real data sets turned into Trajectory files.")
import_app = typer.Typer(no_args_is_help=True, help="Read other engines' formats back to Turns.")
app.add_typer(testbed_app, name="testbed")
app.add_typer(data_app, name="data")
app.add_typer(import_app, name="import")

console = Console(stderr=True)


@contextmanager
def line_progress(description: str):
    """A rich progress line for streaming jobs: lines done and rate; yields `advance(lineno)`."""
    with Progress(TextColumn("{task.description}"), TextColumn("{task.completed} lines"),
                  TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(description, total=None)
        yield lambda lineno: progress.update(task, completed=lineno)


def not_ready(verb: str, issue: int) -> None:
    """Verbs whose issue is not done say so plainly and fail; they never print fake output."""
    console.print(f"[red]pivotrl {verb} is not implemented yet (issue #{issue}).[/red]")
    raise typer.Exit(2)


@app.command()
def extract(
    trajectories: Path = typer.Argument(..., help="Trajectory JSONL (OpenAI chat messages)."),
    out: Path = typer.Option(..., "--out", help="Turns JSONL to write."),
    eval_out: Optional[Path] = typer.Option(None, help="Where eval turns go (with --eval-fraction)."),
    eval_fraction: float = typer.Option(0.0, help="Fraction of trajectories (by id) held out."),
    seed: int = typer.Option(0, help="Seed of the train/eval split."),
    keep_reasoning: bool = typer.Option(False, help="Keep earlier turns' reasoning_content in context."),
    skip_content_regex: Optional[str] = typer.Option(None, help="Skip turns whose text matches."),
    only_tool_calls: bool = typer.Option(False, help="Keep only turns whose expert action calls a tool."),
    strict: bool = typer.Option(False, help="Stop at the first bad line instead of rejecting it."),
) -> None:
    """Every assistant message of every trajectory becomes one Turn (context + expected action)."""
    from pivotrl.extract import ExtractOptions, extract_file

    opts = ExtractOptions(keep_reasoning=keep_reasoning, skip_content_regex=skip_content_regex,
                          only_tool_calls=only_tool_calls, eval_fraction=eval_fraction, seed=seed)
    if not trajectories.exists():
        console.print(f"[red]{trajectories}: no such file[/red]")
        raise typer.Exit(2)
    try:
        with line_progress(f"extract {trajectories.name}") as advance:
            summary = extract_file(trajectories, out, opts, eval_out=eval_out, strict=strict,
                                   progress=advance)
    except RecordError as exc:
        console.print(f"[red]{exc}[/red] (--strict)")
        raise typer.Exit(1)
    console.print(summary.table())
    if summary.read == 0:
        raise typer.Exit(1)


@app.command()
def verify(cases: Path = typer.Argument(..., help="Verify cases JSONL (Turn + candidate/completion)."),
           verifier: str = typer.Option("toolcall", help="Verifier name."),
           config: Optional[Path] = typer.Option(None, help="YAML verifier config."),
           out: Optional[Path] = typer.Option(None, help="Output JSONL (default: stdout).")) -> None:
    """Score every case; one {"id","reward","valid","reason"} line per input line, in order."""
    not_ready("verify", 3)


@app.command()
def profile() -> None:
    """Sample K actions per turn with the reference policy and score them."""
    not_ready("profile", 5)


@app.command()
def select() -> None:
    """Keep the pivots: mixed outcomes, not too easy."""
    not_ready("select", 5)


@app.command()
def train(
    config: Path = typer.Option(..., "--config", help="Run YAML (pivotrl.train.config.GRPORunConfig)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in output_dir."),
    max_steps: Optional[int] = typer.Option(None, help="Override max_steps."),
    output_dir: Optional[Path] = typer.Option(None, help="Override output_dir."),
    learning_rate: Optional[float] = typer.Option(None, help="Override learning_rate."),
    pivot_set: Optional[str] = typer.Option(None, help="Override pivot_set: pivots | all | random."),
    verifier: Optional[str] = typer.Option(None, help="Override the verifier name."),
    seed: Optional[int] = typer.Option(None, help="Override seed."),
) -> None:
    """GRPO on pivots (TRL GRPOTrainer); works under `accelerate launch` too."""
    from pivotrl.train.config import GRPORunConfig
    from pivotrl.train.grpo import train as run_grpo

    cfg = GRPORunConfig.from_yaml(config, resume=resume or None, max_steps=max_steps,
                                  output_dir=output_dir, learning_rate=learning_rate,
                                  pivot_set=pivot_set, verifier=verifier, seed=seed)
    summary = run_grpo(cfg)
    _print_train_summary("train", summary)


def _print_train_summary(verb: str, summary: dict) -> None:
    import os

    if os.environ.get("RANK", "0") != "0":  # one summary under accelerate launch
        return
    from rich.table import Table

    table = Table(title=f"pivotrl {verb}")
    table.add_column("field")
    table.add_column("value")
    for key, value in summary.items():
        if key == "dropped":
            value = f"{len(value)}" + (f" (first: {value[0][0]}: {value[0][1]})" if value else "")
        table.add_row(key, str(value))
    console.print(table)


@app.command()
def sft(
    config: Path = typer.Option(..., "--config", help="Run YAML (pivotrl.train.config.SFTRunConfig)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in output_dir."),
    max_steps: Optional[int] = typer.Option(None, help="Override max_steps."),
    output_dir: Optional[Path] = typer.Option(None, help="Override output_dir."),
    learning_rate: Optional[float] = typer.Option(None, help="Override learning_rate."),
    seed: Optional[int] = typer.Option(None, help="Override seed."),
) -> None:
    """The SFT baseline on the same trajectories (TRL SFTTrainer, loss on assistant turns only)."""
    from pivotrl.train.config import SFTRunConfig
    from pivotrl.train.sft import train_sft

    cfg = SFTRunConfig.from_yaml(config, resume=resume or None, max_steps=max_steps,
                                 output_dir=output_dir, learning_rate=learning_rate, seed=seed)
    _print_train_summary("sft", train_sft(cfg))


@app.command()
def evaluate() -> None:
    """In-domain episode success and OOD accuracy of a checkpoint."""
    not_ready("evaluate", 4)


@app.command()
def demo() -> None:
    """The whole method and its baselines on the built-in testbed, with a report."""
    not_ready("demo", 7)


@app.command()
def export() -> None:
    """Write Turns/pivots as NeMo-Gym rows or verl parquet."""
    not_ready("export", 2)


@import_app.command("nemo-gym")
def import_nemo_gym() -> None:
    """NeMo-Gym pivot rows back to Turns."""
    not_ready("import nemo-gym", 2)


@data_app.command("bfcl")
def data_bfcl() -> None:
    """BFCL multi-turn ground truth as Trajectory records."""
    not_ready("data bfcl", 2)


@testbed_app.command("build")
def testbed_build() -> None:
    """Build the testbed: worlds' data, OOD tasks and the tiny base model."""
    not_ready("testbed build", 4)


@app.command()
def serve() -> None:
    """An OpenAI-compatible endpoint around a local HF model."""
    not_ready("serve", 5)


if __name__ == "__main__":
    app()
