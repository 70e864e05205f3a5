"""The tables the data and training verbs print when they finish (rich), apart from the verbs."""

from __future__ import annotations

from pathlib import Path


def profile_table(doc: dict, out: Path):
    from rich.table import Table

    run, oc = doc["runs"][-1], doc["outcomes"]
    table = Table(title=f"pivotrl profile → {out}")
    table.add_column("")
    table.add_column("value", justify="right")
    for key in ("turns_selected", "turns_done_before", "turns_profiled", "rollout_turns",
                "generated_tokens", "invalid_samples", "truncated_samples", "rejected_lines",
                "samples_per_second"):
        table.add_row(key.replace("_", " "), str(run[key]))
    for key in ("all_fail", "mixed", "all_pass"):
        table.add_row(f"turns {key.replace('_', '-')}", str(oc[key]))
    table.add_row("prompts too long (set aside, rejects file)", str(len(run.get("too_long", {}))))
    return table


def select_table(stats: dict, strategy: str, out: Path):
    from rich.table import Table

    table = Table(title=f"pivotrl select ({strategy}) → {out}")
    table.add_column("")
    table.add_column("turns", justify="right")
    for key in ("turns", "all_fail", "all_pass", "mixed", "mixed_but_too_easy", "kept"):
        table.add_row(key.replace("_", " "), str(stats[key]))
    for dom, d in stats["per_domain"].items():
        table.add_row(f"kept in {dom}", f"{d['kept']}/{d['turns']} ({d['kept_fraction']:.0%})")
    return table


def print_train_summary(console, verb: str, summary: dict) -> None:
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
