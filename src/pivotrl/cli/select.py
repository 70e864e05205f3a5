"""`pivotrl select`: keep the pivots of a Profile file (`pivotrl.select.select_file`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from pivotrl.cli.console import console, fail
from pivotrl.cli.guard import guarded
from pivotrl.cli.options import option
from pivotrl.select import SelectConfig


def select_table(stats: dict, strategy: str, out: Path) -> Table:
    table = Table(title=f"pivotrl select ({strategy}) → {out}")
    table.add_column("")
    table.add_column("turns", justify="right")
    for key in ("turns", "all_fail", "all_pass", "mixed", "mixed_but_too_easy", "kept"):
        table.add_row(key.replace("_", " "), str(stats[key]))
    for dom, d in stats["per_domain"].items():
        table.add_row(f"kept in {dom}", f"{d['kept']}/{d['turns']} ({d['kept_fraction']:.0%})")
    if (stats.get("profile_settings") or {}).get("model"):  # whose pass rates (train checks it is its --model)
        table.add_row("profiled by", str(stats["profile_settings"]["model"]))
    return table


@guarded(inputs=["profile_file"], outputs=["out"])
def select(
    profile_file: Path = typer.Argument(..., metavar="PROFILE", help="Profile JSONL (pivotrl profile)."),
    out: Path = typer.Option(..., "--out", help="Pivots JSONL (Profile records, input order)."),
    lambda_diff: float = option(SelectConfig, "lambda_diff"),
    min_std: float = option(SelectConfig, "min_std"),
    budget: Optional[int] = option(SelectConfig, "budget"),
    strategy: str = option(SelectConfig, "strategy"),
    seed: int = option(SelectConfig, "seed"),
    success_threshold: float = option(SelectConfig, "success_threshold"),
    plot: bool = typer.Option(True, help="Write PIVOTS.hist.png."),
    allow_empty: bool = typer.Option(False, help="Accept 0 pivots (every turn all-fail, all-pass or too "
                                     "easy); without it that is an error."),
) -> None:
    """Keep the pivots: mixed outcomes, not too easy (writes PIVOTS.stats.json and a histogram)."""
    from pivotrl.io.empty import EmptyResultError
    from pivotrl.select import select_file

    try:
        cfg = SelectConfig(lambda_diff=lambda_diff, min_std=min_std, budget=budget,
                           strategy=strategy, seed=seed, success_threshold=success_threshold)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    if not profile_file.is_file():
        raise fail(f"{profile_file}: no such file", 2)
    try:
        stats = select_file(profile_file, out, cfg, plot_png=plot, allow_empty=allow_empty)
    except EmptyResultError as exc:
        if isinstance(exc.result, dict):
            console.print(select_table(exc.result, strategy, out))
        raise fail(f"pivotrl select: {exc}", 1) from None
    console.print(select_table(stats, strategy, out))
    if stats["rejected_lines"]:
        console.print(f"[yellow]{stats['rejected_lines']} bad lines skipped (see rejects file)[/yellow]")
