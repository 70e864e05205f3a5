"""`pivotrl verify`: score a file of cases with a verifier (`pivotrl.evaluate.cases.verify_file`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from pivotrl.cli.console import console, fail
from pivotrl.cli.guard import guarded


@guarded(inputs=["cases", "config"], outputs=["out"], beside=None)
def verify(cases: Path = typer.Argument(..., help="Verify cases JSONL (Turn + candidate/completion)."),
           verifier: str = typer.Option("toolcall", help="Verifier name."),
           config: Optional[Path] = typer.Option(None, help="YAML verifier config."),
           out: Optional[Path] = typer.Option(None, help="Output JSONL (default: stdout)."),
           model: Optional[str] = typer.Option(None, help="Model or tokenizer dir: 'completion' texts are "
                                               "parsed in its chat template's format (default: Hermes/JSON)."),
           response_format: Optional[str] = typer.Option(None, help="Override the detected format: hermes, "
                                                         "qwen-xml, glm, deepseek, harmony, response-template.")
           ) -> None:
    """Score every case; one {"id","reward","valid","reason"} line per input line, in order."""
    from pivotrl.evaluate.cases import load_verifier_options, verify_file
    from pivotrl.formats.actions import parse_completion
    from pivotrl.formats.families import parser_for_model

    if not cases.exists():
        raise fail(f"{cases}: no such file", 1)
    try:
        options = load_verifier_options(config, verifier)
        parse = parser_for_model(model, response_format) if model or response_format else parse_completion
        summary = verify_file(cases, verifier, options, out if out is not None else sys.stdout, parse=parse)
    except (KeyError, ValueError, TypeError, OSError) as exc:  # unknown verifier/format, bad config or model dir
        raise fail(f"pivotrl verify: {exc}", 1) from None
    table = Table(title=f"verify ({verifier})")
    for col in ("lines", "bad lines", "valid", "mean reward"):
        table.add_column(col, justify="right")
    table.add_row(str(summary.lines), str(summary.bad_lines), str(summary.valid),
                  f"{summary.mean_reward:.3f}")
    console.print(table)
    for reason, n in summary.reasons.most_common(8):
        console.print(f"  {n:6d}  {reason}")
