"""`pivotrl evaluate`: turn accuracy of a model on held-out turns
(`pivotrl.evaluate.turns.evaluate_turns_file`), and the input checks `compare --model` shares."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pivotrl.cli.console import console, fail
from pivotrl.cli.guard import guarded
from pivotrl.cli.options import config_fields, engine_option
from pivotrl.evaluate.turns import TurnEvalConfig, items_path, result_rejects_path
from pivotrl.io.records import sidecar_path
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


def run_settings(config: Path | None) -> dict[str, Any]:
    """The options `--config` gives evaluate and compare: a YAML of TurnEvalConfig fields is taken
    whole; a run config of `pivotrl profile` or `train` gives what must match how the model was
    profiled and trained (chat-template kwargs, response format, verifier and its options, the
    token budget: `max_new_tokens`, or train's `max_completion_length`), and nothing else
    (evaluation keeps its own greedy sampling). A key of none of these configs is an error."""
    from pivotrl.formats.options import FormatOptions
    from pivotrl.io.yaml_config import read_mapping
    from pivotrl.verifiers.options import VerifierOptions

    from pivotrl.profile.loop import ProfileConfig
    from pivotrl.train.config import GRPORunConfig, SFTRunConfig

    if config is None:
        return {}
    data = read_mapping(config)
    if isinstance(data.get("settings"), dict) and "turns_file" in data:
        # An evaluate RESULT.json: score this model as that one was, so `compare` pairs the two.
        from pivotrl.evaluate.compare import SCORING_SETTINGS

        return {k: v for k, v in data["settings"].items() if k in SCORING_SETTINGS}
    if set(data) <= set(TurnEvalConfig.model_fields):
        return data
    known = set().union(*(m.model_fields for m in (TurnEvalConfig, ProfileConfig, GRPORunConfig, SFTRunConfig)))
    if unknown := sorted(set(data) - known):  # a misspelt key is an error, never silently dropped
        raise ValueError(f"{config}: {', '.join(unknown)}: not a field of TurnEvalConfig, nor of a "
                         "profile or train run config")
    shared = set(FormatOptions.model_fields) | set(VerifierOptions.model_fields) | {"max_new_tokens"}
    out = {k: v for k, v in data.items() if k in shared}
    if data.get("max_completion_length") is not None:
        out["max_new_tokens"] = data["max_completion_length"]
    return out


# The settings a model's own run recorded (formats.options.SETTINGS_FILE) that evaluate uses
# unless told otherwise: the prompts it was trained on, its tool-call format, its token budget.
RECORDED_SETTINGS = ("chat_template_kwargs", "response_format", "max_new_tokens")


def recorded_run_settings(model: Path) -> dict[str, Any]:
    """What `model`'s run recorded of RECORDED_SETTINGS ({} for a model pivotrl did not train)."""
    from pivotrl.formats.options import recorded_template_settings

    recorded = recorded_template_settings(model) or {}
    return {k: recorded[k] for k in RECORDED_SETTINGS if recorded.get(k) not in (None, {})}


def check_inputs(models: Sequence[Path], turns: Path, config: Path | None, options: dict[str, Any],
                 recorded: dict[str, Any] | None = None):
    """(TurnEvalConfig, verifier, where each of RECORDED_SETTINGS came from) from the model's
    recorded settings, `--config` and the flags (defaults < recorded < config < flags); a bad
    input exits 2 naming it."""
    from pivotrl.io.inputs import check_input_file, check_model
    from pivotrl.io.yaml_config import build_model
    from pivotrl.sampling.options import check_backend_flags

    try:
        for m in models:
            check_model(m)
        check_input_file(turns, "--turns", "`pivotrl extract --eval-fraction F` (TURNS.eval.jsonl)")
        from_config = run_settings(config)
        layers = (("flags", options), ("--config", from_config),
                  ("the model's template_settings.json", recorded or {}))
        settings_from = {key: next((name for name, given in layers if key in given), "default")
                         for key in RECORDED_SETTINGS}
        cfg = build_model(TurnEvalConfig, {**(recorded or {}), **from_config, **options},
                          config if config is not None else "options")
        check_backend_flags(cfg.backend, {**options, "engine": cfg.engine})
        return cfg, cfg.build_verifier(), settings_from
    except (KeyError, ValueError, TypeError, OSError) as exc:  # unknown verifier, bad options
        raise fail(f"pivotrl evaluate: {exc}", 2) from None


CONFIG_HELP = ("YAML of TurnEvalConfig fields, or the run config of `pivotrl profile` / `train`: its "
               "chat-template kwargs, response format, verifier and token budget are used, so the model "
               "is scored as it was trained; or an earlier RESULT.json: its scoring settings are used, so "
               "`compare` pairs the two. Flags override it.")


def result_files(out: Path) -> list[Path]:
    """What evaluate writes beside RESULT.json: its items, rejects and progress log."""
    return [items_path(out), result_rejects_path(out), sidecar_path(out, ".log", ".json")]


@guarded(inputs=["turns", "config", "split"], folders=["model"], outputs=["out"], beside=result_files)
@config_fields(TurnEvalConfig, skip=("engine",))
def evaluate(
    model: Path = typer.Option(..., "--model", help="Checkpoint dir (HF format: model + tokenizer)."),
    turns: Path = typer.Option(..., "--turns", help="Held-out Turn JSONL of any data set."),
    out: Path = typer.Option(..., "--out", help="RESULT.json (per-turn results go to RESULT.items.jsonl)."),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP),
    max_model_len: Optional[int] = engine_option(VLLMOptions, "max_model_len"),
    split: Optional[Path] = typer.Option(None, help="The split file of `pivotrl extract --eval-fraction` "
                                         "(default: the one beside TURNS); only turns of its eval "
                                         "trajectories are scored."),
    overwrite: bool = typer.Option(False, help="Replace a RESULT that holds an earlier result (and its "
                                   "items, rejects and log); without it that is an error."),
    overrides: dict | None = None,
) -> None:
    """Turn accuracy of a model on held-out turns, with an interval clustered by trajectory."""
    from pivotrl.evaluate import turns as turn_eval
    from pivotrl.io.inputs import check_chat_template
    from pivotrl.io.outputs import OutputExistsError, claim_output
    from pivotrl.io.progress import ProgressLog, TokenCount
    from pivotrl.io.records import sidecar_path
    from pivotrl.io.split import resolve_split
    from pivotrl.profile.loop import budget_notes
    from pivotrl.sampling import SamplerError

    if max_model_len:
        overrides["engine"] = {"max_model_len": max_model_len}
    cfg, ver, settings_from = check_inputs([model], turns, config, overrides, recorded_run_settings(model))
    try:
        held_out = resolve_split(split, turns)
    except ValueError as exc:
        raise fail(f"pivotrl evaluate --turns: {exc}", 2) from None
    try:
        claim_output(out, resume=False, overwrite=overwrite, resumable=False, companions=result_files(out))
    except OutputExistsError as exc:
        raise fail(f"pivotrl evaluate: {exc}", 1) from None
    log = ProgressLog("evaluate", None, unit="turn", every_s=30.0, log_file=sidecar_path(out, ".log", ".json"))
    tokens = TokenCount()

    def on_tokens(k: int) -> None:  # a line moves while a chunk of long samples is drawn
        tokens.add(k)
        log.note(log.done, tokens.text())

    try:
        sampler, tokenizer = cfg.build_sampler(str(model))
        check_chat_template(tokenizer, model)
        recorded = settings_from["max_new_tokens"] == "the model's template_settings.json"
        for note in budget_notes(cfg, sampler, tokenizer, cfg.samples, "evaluate",
                                 "as the model's run recorded it" if recorded else None):
            console.print(escape(note), style="yellow" if note.startswith("warning") else None)
        with log.running():
            result = turn_eval.evaluate_turns_file(
                turns, out, sampler, ver, tokenizer, cfg, model_name=str(model), split=held_out,
                settings_from=settings_from, on_tokens=on_tokens,
                progress=lambda done, total: log.update(done, tokens.text(), total=total))
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
