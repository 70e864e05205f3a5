"""`pivotrl evaluate`: turn accuracy of a model on held-out turns
(`pivotrl.evaluate.turns.evaluate_turns_file`), and the input checks `compare --model` shares."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from pivotrl.cli.console import console, fail
from pivotrl.cli.guard import guarded
from pivotrl.cli.options import engine_option, option
from pivotrl.evaluate.turns import TurnEvalConfig, items_path, result_rejects_path
from pivotrl.sampling.options import EngineConfig
from pivotrl.sampling.vllm import VLLMOptions


def result_table(result: dict[str, Any], title: str) -> Table:
    table = Table(title=title)
    for col in ("turn acc %", "95% CI (clustered)", "turns", "trajectories", "design effect",
                "invalid samples"):
        table.add_column(col)
    lo, hi = result["ci95"]
    table.add_row(f"{100 * result['accuracy']:.1f}", f"{100 * lo:.1f}–{100 * hi:.1f}",
                  str(result["turns"]), str(result["clusters"]), f"{result['design_effect']:.2f}",
                  f"{result['invalid_samples']}/{result['samples']}")
    return table


def check_inputs(models: Sequence[Path], turns: Path, verifier: str, verifier_config: Path | None,
                 options: dict[str, Any]):
    """(TurnEvalConfig, verifier) from the command line; a bad input exits 2 naming it."""
    from pivotrl.io.inputs import check_input_file, check_model
    from pivotrl.io.yaml_config import build_model, read_mapping
    from pivotrl.verifiers import get_verifier

    try:
        for m in models:
            check_model(m)
        check_input_file(turns, "--turns", "`pivotrl extract --eval-fraction F` (TURNS.eval.jsonl)")
        vopts = read_mapping(verifier_config) if verifier_config else {}
        cfg = build_model(TurnEvalConfig, {"verifier": verifier, "verifier_config": vopts, **options},
                          "options")
        return cfg, get_verifier(cfg.verifier, **cfg.verifier_config)
    except (KeyError, ValueError, TypeError, OSError) as exc:  # unknown verifier, bad options
        raise fail(f"pivotrl evaluate: {exc}", 2) from None


@guarded(inputs=["turns", "verifier_config"], outputs=["out"], with_sidecars=False)
def evaluate(
    model: Path = typer.Option(..., "--model", help="Checkpoint dir (HF format: model + tokenizer)."),
    turns: Path = typer.Option(..., "--turns", help="Held-out Turn JSONL of any data set."),
    out: Path = typer.Option(..., "--out", help="RESULT.json (per-turn results go to RESULT.items.jsonl)."),
    verifier: str = typer.Option("toolcall", help="The verifier."),
    verifier_config: Optional[Path] = typer.Option(None, help="The verifier's YAML options."),
    temperature: float = option(TurnEvalConfig, "temperature"),
    seed: int = option(TurnEvalConfig, "seed"),
    backend: str = option(EngineConfig, "backend"),
    base_url: str = option(EngineConfig, "base_url"),
    served_model_name: Optional[str] = option(EngineConfig, "served_model_name"),
    batch_size: int = option(EngineConfig, "batch_size"),
    max_model_len: Optional[int] = engine_option(VLLMOptions, "max_model_len"),
    split: Optional[Path] = typer.Option(None, help="The split file of `pivotrl extract --eval-fraction` "
                                         "(default: the one beside TURNS); only turns of its eval "
                                         "trajectories are scored."),
) -> None:
    """Turn accuracy of a model on held-out turns, with an interval clustered by trajectory."""
    from pivotrl.evaluate import turns as turn_eval
    from pivotrl.io.inputs import check_chat_template
    from pivotrl.io.progress import ProgressLog
    from pivotrl.io.records import sidecar_path
    from pivotrl.io.split import resolve_split
    from pivotrl.sampling import SamplerError

    engine = {"max_model_len": max_model_len} if max_model_len else {}
    cfg, ver = check_inputs([model], turns, verifier, verifier_config,
                            dict(temperature=temperature, seed=seed, backend=backend, base_url=base_url,
                                 served_model_name=served_model_name, batch_size=batch_size, engine=engine))
    try:
        held_out = resolve_split(split, turns)
    except ValueError as exc:
        raise fail(f"pivotrl evaluate --turns: {exc}", 2) from None
    log = ProgressLog("evaluate", None, unit="turn", every_s=30.0, log_file=sidecar_path(out, ".log", ".json"))
    try:
        sampler, tokenizer = cfg.build_sampler(str(model))
        check_chat_template(tokenizer, model)
        result = turn_eval.evaluate_turns_file(turns, out, sampler, ver, tokenizer, cfg, model_name=str(model),
                                               split=held_out,
                                               progress=lambda done, total: log.update(done, total=total))
    except (SamplerError, ValueError) as exc:
        raise fail(str(exc), 1) from None
    except KeyboardInterrupt:
        console.print(f"[yellow]stopped; nothing written to {out}: rerun the same command (it scores "
                      "every turn again)[/yellow]")
        raise typer.Exit(130) from None
    Console().print(result_table(result, f"{model} on {turns}"))
    console.print(f"wrote {out} and {items_path(out)} ({result['seconds']} s)"
                  + (f"; bad lines: {result_rejects_path(out)}" if result["rejected_lines"] else "")
                  + (f"; {len(result['too_long'])} prompts longer than the engine takes "
                     f"({result['prompt_limit']} tokens) set aside" if result["too_long"] else ""))
