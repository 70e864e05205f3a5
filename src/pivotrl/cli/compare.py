"""`pivotrl compare`: models paired on the same held-out turns (`pivotrl.evaluate.compare`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from pivotrl.cli.console import console, fail
from pivotrl.cli.evaluate import CONFIG_HELP, check_inputs
from pivotrl.cli.guard import guarded
from pivotrl.cli.options import config_fields, engine_option
from pivotrl.evaluate.turns import TurnEvalConfig
from pivotrl.sampling.vllm import VLLMOptions


def compare_table(doc: dict[str, Any]) -> tuple[Table, dict[str, str]]:
    """The pairs, each model by a short label (#1, #2, … in order of appearance: a table cuts
    long names at the terminal's width), and the labels (name → label) for the legend."""
    labels: dict[str, str] = {}
    for p in doc["pairs"]:
        for name in (p["a"], p["b"]):
            labels.setdefault(name, f"#{len(labels) + 1}")
    table = Table(title=f"pivotrl compare on {doc['turns_file']}")
    for col in ("a", "b", "diff a − b (pts)", "95% CI (paired by trajectory)", "reading", "turns paired"):
        table.add_column(col)
    for p in doc["pairs"]:
        ci = p["ci95"]
        reading = {"met": f"{labels[p['a']]} better", "not met": f"{labels[p['b']]} better"}.get(
            p["verdict"], p["verdict"])
        table.add_row(labels[p["a"]], labels[p["b"]], "–" if p["diff"] is None else f"{100 * p['diff']:+.1f}",
                      "–" if ci is None else f"{100 * ci[0]:+.1f} … {100 * ci[1]:+.1f}",
                      reading, str(p["pairs"]))
    return table, labels


@guarded(inputs=["turns", "config", "result"], outputs=["out"], with_sidecars=False)
@config_fields(TurnEvalConfig, skip=("engine", "chunk_turns", "base_url", "served_model_name", "concurrency"))
def compare(
    out: Path = typer.Option(..., "--out", help="RESULT.json; with --model each model's own result goes "
                             "next to it (RESULT.model-I.json and its items)."),
    turns: Optional[Path] = typer.Option(None, "--turns", help="Held-out Turn JSONL (e.g. extract --eval-out)."),
    model: Optional[list[Path]] = typer.Option(None, "--model", help="Model dir, scored on --turns; repeat: "
                                               "--model A --model B (a before b)."),
    result: Optional[list[Path]] = typer.Option(None, "--result", help="Instead: RESULT.json files of "
                                                "`evaluate --turns` (one job per model, any backend); repeat."),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP),
    max_model_len: Optional[int] = engine_option(VLLMOptions, "max_model_len"),
    overrides: dict | None = None,
) -> None:
    """Paired comparison of models on your held-out turns: per-turn success of each (as `evaluate
    --turns`), the difference a − b on the turns both scored, a 95% interval from the paired
    bootstrap over trajectories, and a verdict (met: a better, not met: b better, within noise)."""
    from pivotrl.evaluate.compare import compare_models, compare_results
    from pivotrl.sampling import SamplerError

    model, result = model or [], result or []
    if bool(model) == bool(result) or len(model or result) < 2 or (model and turns is None):
        raise fail("compare needs at least two --model (with --turns), or at least two --result "
                   "(a before b)", 2)
    if overrides.get("backend") == "openai":
        raise fail("compare --model loads each model itself: --backend hf or vllm (for a server, "
                   "run evaluate --turns per model and compare --result)", 2)
    try:
        if result:
            doc = compare_results(result, out)
        else:
            if max_model_len:
                overrides["engine"] = {"max_model_len": max_model_len}
            cfg, ver, _ = check_inputs(model, turns, config, overrides)
            with console.status(f"scoring {len(model)} models on {turns.name}"):
                doc = compare_models(turns, [str(m) for m in model], out, ver, cfg)
    except (SamplerError, ValueError, OSError) as exc:
        raise fail(str(exc), 1) from None
    table, labels = compare_table(doc)
    Console().print(table)
    for m in doc["models"]:
        acc = "–" if m["accuracy"] is None else f"{100 * m['accuracy']:.1f}%"
        label = f"{labels[m['model']]} = " if m["model"] in labels else ""
        console.print(f"{label}{m['model']}: turn accuracy {acc} on {m['turns']} turns"
                      + (f" ({m['too_long']} prompts too long, set aside)" if m["too_long"] else "")
                      + f" → {m['result']}")
    console.print(f"wrote {out}")
