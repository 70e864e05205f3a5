"""`pivotrl extract`: trajectories → turns (`pivotrl.extract.extract_file`) and its summary table."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from pivotrl.cli.console import console, fail
from pivotrl.cli.guard import guarded
from pivotrl.cli.options import line_progress, option
from pivotrl.extract import ExtractOptions, ExtractSummary


def extract_table(s: ExtractSummary) -> Table:
    t = Table(title="pivotrl extract", show_header=False)
    t.add_column()
    t.add_column(overflow="fold")  # a long path is folded onto the next line, never cut short
    t.add_row("lines read", f"{s.read} = {s.trajectories} processed + "
              f"{sum(s.rejects.values())} rejected + {s.blank} blank (skipped)")
    t.add_row("trajectories", f"{s.trajectories} ({s.trajectories_eval} held out for eval)")
    t.add_row("turns written", f"{s.turns_train} train, {s.turns_eval} eval")
    for domain, n in sorted(s.per_domain.items()):
        t.add_row(f"  turns in {domain}", str(n))
    for reason, n in s.skipped.most_common():
        t.add_row(f"  skipped: {reason}", str(n))
    if s.split_file:
        t.add_row("split (train/eval ids)", s.split_file)
    t.add_row("rejected lines", f"{sum(s.rejects.values())} → {s.rejects_file}")
    for reason, n in s.rejects.most_common(10):
        t.add_row(f"  {reason[:70]}", str(n))
    for i, line in enumerate(s.first_rejects):
        t.add_row("first rejected lines" if i == 0 else "", escape(line[:300]))
    return t


@guarded(inputs=["trajectories"], outputs=["out", "eval_out"])
def extract(
    trajectories: Path = typer.Argument(..., help="Trajectory JSONL (OpenAI chat messages)."),
    out: Path = typer.Option(..., "--out", help="Turns JSONL to write."),
    eval_out: Optional[Path] = typer.Option(None, help="Where eval turns go (with --eval-fraction)."),
    eval_fraction: float = option(ExtractOptions, "eval_fraction"),
    seed: int = option(ExtractOptions, "seed"),
    keep_reasoning: bool = option(ExtractOptions, "keep_reasoning"),
    skip_content_regex: Optional[str] = option(ExtractOptions, "skip_content_regex"),
    only_tool_calls: bool = option(ExtractOptions, "only_tool_calls"),
    compact: bool = option(ExtractOptions, "compact"),
    max_rejects: int = typer.Option(0, help="Rejected lines allowed (-1: any number): with more, extract "
                                    "exits 1 after writing its outputs and the rejects file."),
    strict: bool = typer.Option(False, help="Stop at the first bad line instead of rejecting it."),
    allow_empty: bool = typer.Option(False, help="Accept trajectories whose every turn the skip rules drop "
                                     "(0 turns); without it that is an error."),
) -> None:
    """Every assistant message of every trajectory becomes one Turn (context + expected action)."""
    from pivotrl.extract import extract_file
    from pivotrl.io.empty import EmptyResultError
    from pivotrl.io.inputs import InputError, check_input_file
    from pivotrl.io.records import RecordError

    opts = ExtractOptions(keep_reasoning=keep_reasoning, skip_content_regex=skip_content_regex,
                          only_tool_calls=only_tool_calls, eval_fraction=eval_fraction, seed=seed,
                          compact=compact, max_rejects=max_rejects)
    try:
        check_input_file(trajectories, "TRAJECTORIES", "your data pipeline: one JSON conversation a line")
    except InputError as exc:
        raise fail(str(exc), 2) from None
    try:
        with line_progress(console, f"extract {trajectories.name}") as advance:
            summary = extract_file(trajectories, out, opts, eval_out=eval_out, strict=strict,
                                   progress=advance, allow_empty=allow_empty)
    except RecordError as exc:
        raise fail(f"{exc} (--strict)", 1) from None
    except EmptyResultError as exc:
        if isinstance(exc.result, ExtractSummary):
            console.print(extract_table(exc.result))
        raise fail(f"pivotrl extract: {exc}", 1) from None
    console.print(extract_table(summary))
    for warning in summary.warnings:
        console.print(f"[yellow]warning: {escape(warning)}[/yellow]")
