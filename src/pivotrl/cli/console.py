"""Where the verbs speak: one stderr console (messages name paths: never wrapped) and `fail`,
an error line and an exit status."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True, soft_wrap=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `message` in red (as text, never markup: paths and `pip install 'x[y]'` hold
    brackets) and return the exit to raise: `raise fail("…", 2)`."""
    console.print(f"[red]{escape(message)}[/red]")
    return typer.Exit(code)
