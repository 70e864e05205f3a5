"""`pivotrl export` (Turns → NeMo-Gym rows or verl parquet) and `pivotrl import nemo-gym|verl`
(rows → Turns), over `pivotrl.export`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from pivotrl.cli.console import console, fail
from pivotrl.cli.guard import guarded
from pivotrl.cli.options import option
from pivotrl.export import FORMATS, REJECTED, ExportSummary
from pivotrl.extract import ExtractOptions


def export_table(summary: ExportSummary, title: str) -> Table:
    table = Table(title=title)
    table.add_column("")
    table.add_column("count", justify="right")
    table.add_row("lines read", str(summary.read))
    table.add_row("records written", str(summary.written))
    table.add_row("lines rejected", str(len(summary.rejects)))
    for reason, n in summary.reasons().most_common():
        table.add_row(f"  {reason}", str(n))
    for note, n in summary.notes.most_common():
        table.add_row(note, str(n))
    for (kind, verifier), n in sorted(summary.by_kind.items()):
        table.add_row(f"kind {kind}: " + (verifier if verifier == REJECTED else f"verified by {verifier}"), str(n))
    for domain, n in sorted(summary.by_domain.items()):
        table.add_row(f"domain {domain}", str(n))
    for warning, n in summary.warnings.most_common():
        table.add_row(f"warning: {warning}", str(n))
    return table


def _report(summary: ExportSummary, title: str, out: Path) -> None:
    from pivotrl.io.records import rejects_path

    console.print(export_table(summary, title))
    for path in summary.files:
        console.print(f"wrote {path}")
    if summary.rejects:
        console.print(f"rejected lines: {rejects_path(out)}")
    if summary.written == 0:
        raise typer.Exit(1)


@guarded(inputs=["turns"], outputs=["out"])
def export(turns: Path = typer.Argument(..., help="Turns or pivots JSONL."),
           format: str = typer.Option(..., "--format", help="nemo-gym (JSONL rows) or verl (parquet)."),
           out: Path = typer.Option(..., "--out", help="Output file."),
           ability: str = typer.Option("agent", help="verl `ability` column."),
           agent_name: Optional[str] = typer.Option(None, help="nemo-gym: agent_ref.name (the Gym config's "
                                                    "agent block); verl: the agent loop (single_turn_agent)."),
           parallel_calls: str = typer.Option("batch", help="nemo-gym: several calls -> function_call_batch "
                                              "(batch) or the rejects file (reject).")) -> None:
    """Write Turns/pivots as NeMo-Gym rows or verl parquet (+ the tool config verl reads)."""
    from pivotrl.export import export_file

    if format not in FORMATS:
        raise fail(f"unknown --format {format!r}; use one of: {', '.join(FORMATS)}", 2)
    if not turns.is_file():
        raise fail(f"{turns}: no such file", 2)
    try:
        summary = export_file(turns, out, format, ability=ability, agent_name=agent_name,
                              parallel_calls=parallel_calls)
    except ValueError as exc:  # a bad --parallel-calls, an output that is the input
        raise fail(str(exc), 2) from None
    _report(summary, f"export {format} → {out}", out)


@guarded(inputs=["rows"], outputs=["out"])
def import_nemo_gym(rows: Path = typer.Argument(..., help="NeMo-Gym rows JSONL."),
                    out: Path = typer.Option(..., "--out", help="Turns JSONL to write (Profile records where "
                                             "the rows carry pass rates: `pivotrl select` reads them)."),
                    eval_fraction: float = option(ExtractOptions, "eval_fraction"),
                    seed: int = option(ExtractOptions, "seed")) -> None:
    """NeMo-Gym pivot rows back to Turns; rows with pass rates (NVIDIA's pivot sets) become
    profiles that `pivotrl select` reads without profiling."""
    from pivotrl.export import import_nemo_gym as read_rows

    _import(read_rows, "nemo-gym", rows, out, eval_fraction, seed)


@guarded(inputs=["rows"], outputs=["out"])
def import_verl(rows: Path = typer.Argument(..., help="verl parquet (or JSONL of the same rows)."),
                out: Path = typer.Option(..., "--out", help="Turns JSONL to write."),
                eval_fraction: float = option(ExtractOptions, "eval_fraction"),
                seed: int = option(ExtractOptions, "seed")) -> None:
    """verl rows back to Turns: those `pivotrl export --format verl` wrote, or others whose
    ground truth is the expert's assistant message (the context is then the row's prompt)."""
    from pivotrl.export import import_verl as read_rows

    _import(read_rows, "verl", rows, out, eval_fraction, seed)


def _import(read, fmt: str, src: Path, out: Path, eval_fraction: float, seed: int) -> None:
    from pivotrl.io.empty import EmptyResultError

    if not src.is_file():
        raise fail(f"{src}: no such file", 2)
    try:
        summary = read(src, out, eval_fraction=eval_fraction, seed=seed)
    except EmptyResultError as exc:
        if isinstance(exc.result, ExportSummary):
            console.print(export_table(exc.result, f"import {fmt} → {out}"))
        raise fail(f"pivotrl import {fmt}: {exc}", 1) from None
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    _report(summary, f"import {fmt} → {out}", out)
