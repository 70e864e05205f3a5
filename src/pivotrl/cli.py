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
def train() -> None:
    """GRPO on pivots (TRL GRPOTrainer)."""
    not_ready("train", 6)


@app.command()
def sft() -> None:
    """The SFT baseline on the same trajectories (TRL SFTTrainer)."""
    not_ready("sft", 6)


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
