"""`pivotrl profile`: K samples per turn scored by the verifier (`pivotrl.profile.runs`), shards
and their merge, a live bar on a terminal and the summary table."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from pivotrl.cli.console import console, fail
from pivotrl.cli.guard import guarded
from pivotrl.cli.options import config_fields, engine_option, load_run_config
from pivotrl.cli.run_verb import DRY_RUN, STRICT, given_command
from pivotrl.profile.loop import ProfileConfig, budget_notes
from pivotrl.io.run_plan import Launch
from pivotrl.sampling.vllm import VLLMOptions


def profile_table(doc: dict, out: Path) -> Table:
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


@contextmanager
def progress_bar(show: bool):
    """A live bar on a terminal, yielding the `on_progress(done, total, rate)` hook of
    `profile_file`; None elsewhere (a pipe, a SLURM log: the run prints plain lines instead)."""
    if not (show and console.is_terminal):
        yield None
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("turns · {task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
                  TimeRemainingColumn(), console=console, transient=False) as bar:
        task = bar.add_task("profiling", total=None, rate="")
        yield lambda done, total, rate: bar.update(task, completed=done, total=total, rate=rate)


@guarded(inputs=["turns", "shard_files", "config"], folders=["model"], outputs=["out"])
@config_fields(ProfileConfig, skip=("engine",))
def profile(
    ctx: typer.Context,
    turns: Path = typer.Argument(..., help="Turns JSONL (from pivotrl extract)."),
    shard_files: Optional[list[Path]] = typer.Argument(None, help="With --merge: shard outputs to join."),
    out: Path = typer.Option(..., "--out", help="Profile JSONL (appended; rerun the same command with --resume to continue)."),
    model: Optional[str] = typer.Option(None, help="HF model dir: templates the prompts; hf/vllm load it."),
    config: Optional[Path] = typer.Option(None, help="YAML of ProfileConfig fields (configs/profile.yaml); "
                                          "flags override it."),
    merge: bool = typer.Option(False, help="Join SHARD_FILES into --out, checking every turn of TURNS "
                               "appears exactly once."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    tensor_parallel_size: Optional[int] = engine_option(VLLMOptions, "tensor_parallel_size"),
    max_model_len: Optional[int] = engine_option(VLLMOptions, "max_model_len"),
    gpu_memory_utilization: Optional[float] = engine_option(VLLMOptions, "gpu_memory_utilization"),
    dtype: Optional[str] = engine_option(VLLMOptions, "dtype"),
    prefix_caching: Optional[bool] = engine_option(VLLMOptions, "enable_prefix_caching",
                                                   "--prefix-caching/--no-prefix-caching"),
    api_key_env: Optional[str] = typer.Option(None, help="openai: env variable of the API key (OPENAI_API_KEY)."),
    header: Optional[list[str]] = typer.Option(None, "--header", help="openai: 'Name: value' (repeat)."),
    extra_body: Optional[str] = typer.Option(None, help="openai: JSON object merged into every request."),
    dry_run: bool = DRY_RUN,
    strict: bool = STRICT,
    overrides: dict | None = None,
) -> None:
    """Sample K actions per turn with the reference policy and score them.

    Shards: run `pivotrl profile TURNS --shard I/N --out p.I.jsonl …` for I in 0..N-1 (in parallel),
    then `pivotrl profile TURNS --merge --out profile.jsonl p.0.jsonl … p.N-1.jsonl`."""
    from pivotrl.io.empty import EmptyResultError
    from pivotrl.io.inputs import check_chat_template, check_input_file, check_model
    from pivotrl.io.records import rejects_path
    from pivotrl.profile.runs import profile_file
    from pivotrl.sampling import SamplerError
    from pivotrl.sampling.options import build_sampler, check_backend_flags, engine_flags
    from pivotrl.sampling.pipeline import longer_context_fix

    if merge or shard_files:
        return _merge_shards(turns, shard_files, out, merge)
    if model is None:
        raise fail("--model is required (the model dir; its tokenizer builds the prompts)", 2)
    try:
        check_input_file(turns, "TURNS", "`pivotrl extract`")
        check_model(model)
        engine = engine_flags(tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len,
                              gpu_memory_utilization=gpu_memory_utilization, dtype=dtype,
                              enable_prefix_caching=prefix_caching, api_key_env=api_key_env,
                              header=header, extra_body=extra_body)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    cfg = load_run_config(console, ProfileConfig, config, **overrides)
    cfg = cfg.model_copy(update={"engine": {**cfg.engine, **engine}})
    try:
        check_backend_flags(cfg.backend, {**overrides, "engine": cfg.engine})
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    try:
        ver = cfg.build_verifier()
        if dry_run:  # the plan needs the tokenizer only: no model is loaded, nothing written
            from pivotrl.formats.chat import load_tokenizer

            tokenizer = load_tokenizer(model)
            check_chat_template(tokenizer, model)
            start_profile(turns, out, cfg, tokenizer, model, Launch(dry_run=True, strict=strict))
            console.print("pivotrl profile: dry run, nothing sampled or written (run it without --dry-run)")
            return
        sampler, tokenizer = build_sampler(cfg.backend, model, cfg.engine, base_url=cfg.base_url,
                                           batch_size=cfg.batch_size, concurrency=cfg.concurrency,
                                           served_model_name=cfg.served_model_name)
        check_chat_template(tokenizer, model)
        for note in budget_notes(cfg, sampler, tokenizer, cfg.k, "profile"):
            console.print(escape(note), style="yellow" if note.startswith("warning") else None)
        start_profile(turns, out, cfg, tokenizer, model, Launch(strict=strict))
        with progress_bar(progress) as on_progress:
            doc = profile_file(turns, out, sampler, ver, tokenizer, cfg, model_name=model,
                               progress=progress, on_progress=on_progress)
    except EmptyResultError as exc:  # every prompt set aside: the counts, then the cause and its fix
        if isinstance(exc.result, dict):
            console.print(profile_table(exc.result, out))
        raise fail(f"pivotrl profile: {exc}", 1) from None
    except (SamplerError, ValueError, OSError) as exc:  # unreachable server or Hub; other settings
        raise fail(str(exc), 1) from None
    except KeyboardInterrupt:
        again = given_command(ctx, drop=("resume", "overwrite"), add=["--resume"])
        console.print(f"[yellow]stopped; {escape(str(out))} keeps every finished turn. Continue the run "
                      f"with:\n  {escape(again)}[/yellow]")
        raise typer.Exit(130) from None
    console.print(profile_table(doc, out))
    if too_long := doc["runs"][-1].get("too_long"):
        console.print(f"[yellow]{len(too_long)} prompts longer than the engine takes set aside "
                      f"({escape(str(rejects_path(out)))}): {escape(longer_context_fix(sampler))}[/yellow]")


def start_profile(turns: Path, out: Path, cfg: ProfileConfig, tokenizer, model: str, launch) -> None:
    """Print the run's plan; unless a dry run, claim --out (pivotrl.io.outputs: an earlier run's
    results only with --resume or --overwrite) and write the plan and config as used beside it."""
    from pivotrl.io.outputs import claim_output
    from pivotrl.io.records import rejects_path, sidecar_path, stats_path
    from pivotrl.profile.plan import profile_plan
    from pivotrl.io.run_plan import PLAN_ENDING, check_plan, write_plan

    plan = profile_plan(turns, out, cfg, tokenizer, model)
    check_plan(plan, launch)
    if launch.dry_run:
        return
    claim_output(out, resume=cfg.resume, overwrite=cfg.overwrite,
                 companions=[stats_path(out), sidecar_path(out, ".log"), rejects_path(out)])
    write_plan(plan, cfg, sidecar_path(out, PLAN_ENDING))


def _merge_shards(turns: Path, shard_files: Optional[list[Path]], out: Path, merge: bool) -> None:
    from pivotrl.profile.runs import MergeError, merge_profiles

    if not merge:
        raise fail("extra arguments are only for --merge", 2)
    if not shard_files:
        raise fail("--merge needs the shard files after TURNS", 2)
    try:
        doc = merge_profiles(turns, shard_files, out)
    except MergeError as exc:
        raise fail(str(exc), 1) from None
    console.print(f"merged {len(shard_files)} shards → {out}: {doc['outcomes']}")
