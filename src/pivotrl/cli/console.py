"""Where the verbs speak: one stderr console (messages name paths: never wrapped), `fail`, an
error line and an exit status, and `quiet_libraries`: the console is pivotrl's own lines."""

from __future__ import annotations

from collections.abc import Callable

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True, soft_wrap=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `message` in red (as text, never markup: paths and `pip install 'x[y]'` hold
    brackets) and return the exit to raise: `raise fail("…", 2)`."""
    console.print(f"[red]{escape(message)}[/red]")
    return typer.Exit(code)


# The switches of the libraries' progress bars: each reads its environment variable when it is
# imported (transformers follows the Hub's), and has functions for when it already is.
BAR_ENV = ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")


def quiet_libraries() -> Callable[[], None]:
    """Turn off the progress bars the libraries under the verbs draw on stderr (transformers'
    `Loading weights` / `Writing model shards`, datasets' `Generating train split`, the Hub's
    downloads) and return the function that turns them back on. Each verb prints its own
    progress lines (rate, ETA, reward or loss; pivotrl.io.progress) and keeps them in its log
    file; a redrawn bar between them leaves a pipe or a SLURM log unreadable. Library warnings
    still reach the console. Libraries not imported yet are not imported for this (transformers
    alone takes seconds): their environment switch is set, which processes started by
    `accelerate launch` inherit too."""
    import os
    import sys

    saved = {key: os.environ.get(key) for key in BAR_ENV}
    os.environ.update({key: "1" for key in BAR_ENV})
    undo: list[Callable[[], None]] = []
    if "transformers" in sys.modules:
        import transformers.utils.logging as hf_logging

        if hf_logging.is_progress_bar_enabled():
            hf_logging.disable_progress_bar()
            undo.append(hf_logging.enable_progress_bar)
    if "datasets" in sys.modules:
        import datasets

        if not datasets.are_progress_bars_disabled():
            datasets.disable_progress_bars()
            undo.append(datasets.enable_progress_bars)
    if "huggingface_hub" in sys.modules:
        import huggingface_hub.utils as hub

        if not hub.are_progress_bars_disabled():
            hub.disable_progress_bars()
            undo.append(hub.enable_progress_bars)

    def restore() -> None:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for turn_on in undo:
            turn_on()

    return restore
