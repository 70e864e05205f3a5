"""The `pivotrl` command line: each verb a few lines over the library (docs/DESIGN.md, contract)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from pivotrl.cli.options import (config_fields, engine_option, leave_process_group, line_progress, load_config,
                                 option, run_job)
from pivotrl.cli.tables import print_train_summary, profile_table, select_table
from pivotrl.evaluate.turns import TurnEvalConfig
from pivotrl.extract import ExtractOptions
from pivotrl.io.inputs import InputError, check_chat_template, check_input_file, check_model
from pivotrl.io.outputs import guarded_command
from pivotrl.io.records import RecordError
from pivotrl.profile.loop import ProfileConfig
from pivotrl.sampling.options import EngineConfig
from pivotrl.sampling.vllm import VLLMOptions
from pivotrl.select import SelectConfig
from pivotrl.train.config import GRPORunConfig, SFTRunConfig

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="PivotRL: RL on the pivot turns of existing agent trajectories.")
import_app = typer.Typer(no_args_is_help=True, help="Read other engines' formats back to Turns.")
app.add_typer(import_app, name="import")


def _mount_plugins(app: typer.Typer) -> None:
    """Verbs of other installed packages (the testbed's `demo`, `e2e`, `testbed`, `data`): each
    entry point in the `pivotrl.commands` group is a function that mounts its verbs on `app`, so the
    library's command line names no package above it."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="pivotrl.commands"):
        ep.load()(app)

console = Console(stderr=True, soft_wrap=True)  # messages name paths: never wrap them


@guarded_command(app, inputs=["trajectories"], outputs=["out", "eval_out"])
def extract(
    trajectories: Path = typer.Argument(..., help="Trajectory JSONL (OpenAI chat messages)."),
    out: Path = typer.Option(..., "--out", help="Turns JSONL to write."),
    eval_out: Optional[Path] = typer.Option(None, help="Where eval turns go (with --eval-fraction)."),
    eval_fraction: float = option(ExtractOptions, "eval_fraction"),
    seed: int = option(ExtractOptions, "seed"),
    keep_reasoning: bool = option(ExtractOptions, "keep_reasoning"),
    skip_content_regex: Optional[str] = option(ExtractOptions, "skip_content_regex"),
    only_tool_calls: bool = option(ExtractOptions, "only_tool_calls"),
    compact: bool = option(ExtractOptions, "compact"),
    strict: bool = typer.Option(False, help="Stop at the first bad line instead of rejecting it."),
    allow_empty: bool = typer.Option(False, help="Accept trajectories whose every turn the skip rules drop "
                                     "(0 turns); without it that is an error."),
) -> None:
    """Every assistant message of every trajectory becomes one Turn (context + expected action)."""
    from pivotrl.extract import extract_file
    from pivotrl.io.empty import EmptyResultError

    opts = ExtractOptions(keep_reasoning=keep_reasoning, skip_content_regex=skip_content_regex,
                          only_tool_calls=only_tool_calls, eval_fraction=eval_fraction, seed=seed,
                          compact=compact)
    try:
        check_input_file(trajectories, "TRAJECTORIES", "your data pipeline: one JSON conversation a line")
    except InputError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    try:
        with line_progress(console, f"extract {trajectories.name}") as advance:
            summary = extract_file(trajectories, out, opts, eval_out=eval_out, strict=strict,
                                   progress=advance, allow_empty=allow_empty)
    except RecordError as exc:
        console.print(f"[red]{escape(str(exc))}[/red] (--strict)")
        raise typer.Exit(1)
    except EmptyResultError as exc:
        if exc.result is not None:
            console.print(exc.result.table())
        console.print(f"[red]pivotrl extract: {escape(str(exc))}[/red]")
        raise typer.Exit(1) from None
    console.print(summary.table())


@guarded_command(app, inputs=["cases", "config"], outputs=["out"], with_sidecars=False)
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
    from rich.table import Table

    from pivotrl.formats.actions import parse_completion
    from pivotrl.formats.families import parser_for_model
    from pivotrl.verifiers.cases import load_config, verify_file

    if not cases.exists():
        console.print(f"[red]{cases}: no such file[/red]")
        raise typer.Exit(1)
    try:
        options = load_config(config, verifier)
        parse = parser_for_model(model, response_format) if model or response_format else parse_completion
        summary = verify_file(cases, verifier, options, out, parse=parse)
    except (KeyError, ValueError, TypeError, OSError) as exc:  # unknown verifier/format, bad config or model dir
        console.print(f"[red]pivotrl verify: {exc}[/red]")
        raise typer.Exit(1) from None
    table = Table(title=f"verify ({verifier})")
    for col in ("lines", "bad lines", "valid", "mean reward"):
        table.add_column(col, justify="right")
    table.add_row(str(summary.lines), str(summary.bad_lines), str(summary.valid),
                  f"{summary.mean_reward:.3f}")
    console.print(table)
    for reason, n in summary.reasons.most_common(8):
        console.print(f"  {n:6d}  {reason}")


@guarded_command(app, inputs=["turns", "shard_files", "config", "verifier_config"], outputs=["out"])
@config_fields(ProfileConfig, skip=("engine", "verifier_config"))
def profile(
    turns: Path = typer.Argument(..., help="Turns JSONL (from pivotrl extract)."),
    shard_files: Optional[list[Path]] = typer.Argument(None, help="With --merge: shard outputs to join."),
    out: Path = typer.Option(..., "--out", help="Profile JSONL (appended; rerun the same command to resume)."),
    model: Optional[str] = typer.Option(None, help="HF model dir: templates the prompts; hf/vllm load it."),
    config: Optional[Path] = typer.Option(None, help="YAML of ProfileConfig fields (configs/profile.yaml); "
                                          "flags override it."),
    verifier_config: Optional[Path] = typer.Option(None, help="YAML of the verifier's options."),
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
    overrides: dict | None = None,
) -> None:
    """Sample K actions per turn with the reference policy and score them.

    Shards: run `pivotrl profile TURNS --shard I/N --out p.I.jsonl …` for I in 0..N-1 (in parallel),
    then `pivotrl profile TURNS --merge --out profile.jsonl p.0.jsonl … p.N-1.jsonl`."""
    from pivotrl.io.yaml_config import read_mapping
    from pivotrl.profile.runs import profile_file
    from pivotrl.sampling import SamplerError
    from pivotrl.sampling.options import build_sampler, engine_flags
    from pivotrl.verifiers import get_verifier

    if merge or shard_files:
        return _merge_shards(turns, shard_files, out, merge)
    if model is None:
        console.print("[red]--model is required (the model dir; its tokenizer builds the prompts)[/red]")
        raise typer.Exit(2)
    try:
        check_input_file(turns, "TURNS", "`pivotrl extract`")
        check_model(model)
        if verifier_config is not None:
            overrides["verifier_config"] = read_mapping(verifier_config)
        engine = engine_flags(tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len,
                              gpu_memory_utilization=gpu_memory_utilization, dtype=dtype,
                              enable_prefix_caching=prefix_caching, api_key_env=api_key_env,
                              header=header, extra_body=extra_body)
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    cfg = load_config(console, ProfileConfig, config, **overrides)
    cfg = cfg.model_copy(update={"engine": {**cfg.engine, **engine}})
    ver = get_verifier(cfg.verifier, **cfg.verifier_config)
    try:
        sampler, tokenizer = build_sampler(cfg.backend, model, cfg.engine, base_url=cfg.base_url,
                                           batch_size=cfg.batch_size, concurrency=cfg.concurrency,
                                           served_model_name=cfg.served_model_name)
        check_chat_template(tokenizer, model)
        doc = profile_file(turns, out, sampler, ver, tokenizer, cfg, model_name=model,
                           progress=progress, console=console)
    except (SamplerError, ValueError, OSError) as exc:  # unreachable server or Hub; other settings
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1)
    except KeyboardInterrupt:
        console.print(f"[yellow]stopped; {out} keeps every finished turn — rerun the same command "
                      "to resume[/yellow]")
        raise typer.Exit(130)
    console.print(profile_table(doc, out))


def _merge_shards(turns: Path, shard_files: Optional[list[Path]], out: Path, merge: bool) -> None:
    from pivotrl.profile.runs import MergeError, merge_profiles

    if not merge:
        console.print("[red]extra arguments are only for --merge[/red]")
        raise typer.Exit(2)
    if not shard_files:
        console.print("[red]--merge needs the shard files after TURNS[/red]")
        raise typer.Exit(2)
    try:
        doc = merge_profiles(turns, shard_files, out)
    except MergeError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1)
    console.print(f"merged {len(shard_files)} shards → {out}: {doc['outcomes']}")


@guarded_command(app, inputs=["profile_file"], outputs=["out"])
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
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2)
    if not profile_file.is_file():
        console.print(f"[red]{profile_file}: no such file[/red]")
        raise typer.Exit(2)
    try:
        stats = select_file(profile_file, out, cfg, plot_png=plot, allow_empty=allow_empty)
    except EmptyResultError as exc:
        if isinstance(exc.result, dict):
            console.print(select_table(exc.result, strategy, out))
        console.print(f"[red]pivotrl select: {escape(str(exc))}[/red]")
        raise typer.Exit(1) from None
    console.print(select_table(stats, strategy, out))
    if stats["rejected_lines"]:
        console.print(f"[yellow]{stats['rejected_lines']} bad lines skipped (see rejects file)[/yellow]")


@app.command()
@config_fields(GRPORunConfig)
def train(config: Optional[Path] = typer.Option(None, "--config", help="Run YAML of GRPORunConfig fields; "
                                                "flags override it (configs/train_testbed.yaml)."),
          overrides: dict | None = None) -> None:
    """GRPO on pivots (TRL GRPOTrainer); works under `accelerate launch` too. Give a run YAML, or the
    required fields as flags: `pivotrl train --pivots P --model M --output-dir D`."""
    from pivotrl.train.grpo import train as run_grpo

    cfg = load_config(console, GRPORunConfig, config, **overrides)
    print_train_summary(console, "train", _run_training("train", run_grpo, cfg))
    leave_process_group()


def _run_training(verb: str, run, cfg):
    return run_job(console, verb, lambda: run(cfg),
                   f"stopped. {cfg.output_dir} keeps a checkpoint-N/ every save_steps ({cfg.save_steps}): "
                   "rerun the same command with --resume to continue from the last one")


@app.command()
@config_fields(SFTRunConfig)
def sft(config: Optional[Path] = typer.Option(None, "--config", help="Run YAML of SFTRunConfig fields; "
                                              "flags override it (configs/sft_testbed.yaml)."),
        overrides: dict | None = None) -> None:
    """The SFT baseline on the same trajectories (TRL SFTTrainer, loss on assistant turns only). Give
    a run YAML, or the required fields as flags: `pivotrl sft --data T --model M --output-dir D`."""
    from pivotrl.train.sft import train_sft

    cfg = load_config(console, SFTRunConfig, config, **overrides)
    print_train_summary(console, "sft", _run_training("sft", train_sft, cfg))
    leave_process_group()


@guarded_command(app, inputs=["turns", "verifier_config"], outputs=["out"], with_sidecars=False)
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
    from pivotrl.evaluate.turns import cli_evaluate_turns

    engine = {"max_model_len": max_model_len} if max_model_len else {}
    raise typer.Exit(cli_evaluate_turns(console, model, turns, out, None, verifier, verifier_config,
                                        split=split, temperature=temperature, seed=seed, backend=backend,
                                        base_url=base_url, served_model_name=served_model_name,
                                        batch_size=batch_size, engine=engine))


@guarded_command(app, inputs=["turns", "verifier_config", "result"], outputs=["out"], with_sidecars=False)
@config_fields(TurnEvalConfig, skip=("verifier_config", "engine", "chunk_turns", "base_url",
                                     "served_model_name", "concurrency"))
def compare(
    out: Path = typer.Option(..., "--out", help="RESULT.json; with --model each model's own result goes "
                             "next to it (RESULT.model-I.json and its items)."),
    turns: Optional[Path] = typer.Option(None, "--turns", help="Held-out Turn JSONL (e.g. extract --eval-out)."),
    model: Optional[list[Path]] = typer.Option(None, "--model", help="Model dir, scored on --turns; repeat: "
                                               "--model A --model B (a before b)."),
    result: Optional[list[Path]] = typer.Option(None, "--result", help="Instead: RESULT.json files of "
                                                "`evaluate --turns` (one job per model, any backend); repeat."),
    verifier_config: Optional[Path] = typer.Option(None, help="YAML of the verifier's options."),
    max_model_len: Optional[int] = engine_option(VLLMOptions, "max_model_len"),
    overrides: dict | None = None,
) -> None:
    """Paired comparison of models on your held-out turns: per-turn success of each (as `evaluate
    --turns`), the difference a − b on the turns both scored, a 95% interval from the paired
    bootstrap over trajectories, and a verdict (met: a better, not met: b better, within noise)."""
    from pivotrl.evaluate.compare import compare_models, compare_results, compare_table
    from pivotrl.evaluate.turns import check_inputs
    from pivotrl.sampling import SamplerError

    model, result = model or [], result or []
    if bool(model) == bool(result) or len(model or result) < 2 or (model and turns is None):
        console.print("[red]compare needs at least two --model (with --turns), or at least two --result "
                      "(a before b)[/red]")
        raise typer.Exit(2)
    if overrides.get("backend") == "openai":
        console.print("[red]compare --model loads each model itself: --backend hf or vllm (for a server, "
                      "run evaluate --turns per model and compare --result)[/red]")
        raise typer.Exit(2)
    try:
        if result:
            doc = compare_results(result, out)
        else:
            if max_model_len:
                overrides["engine"] = {"max_model_len": max_model_len}
            checked = check_inputs(console, model, turns, overrides.pop("verifier", "toolcall"),
                                   verifier_config, overrides)
            if checked is None:
                raise typer.Exit(2)
            with console.status(f"scoring {len(model)} models on {turns.name}"):
                doc = compare_models(turns, [str(m) for m in model], out, checked[1], checked[0])
    except (SamplerError, ValueError, OSError) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    Console().print(compare_table(doc))
    for m in doc["models"]:
        acc = "–" if m["accuracy"] is None else f"{100 * m['accuracy']:.1f}%"
        console.print(f"{m['model']}: turn accuracy {acc} on {m['turns']} turns"
                      + (f" ({m['too_long']} prompts too long, set aside)" if m["too_long"] else "")
                      + f" → {m['result']}")
    console.print(f"wrote {out}")


@guarded_command(app, inputs=["turns"], outputs=["out"])
def export(turns: Path = typer.Argument(..., help="Turns or pivots JSONL."),
           format: str = typer.Option(..., "--format", help="nemo-gym (JSONL rows) or verl (parquet)."),
           out: Path = typer.Option(..., "--out", help="Output file."),
           ability: str = typer.Option("agent", help="verl `ability` column."),
           agent_name: Optional[str] = typer.Option(None, help="nemo-gym: agent_ref.name (the Gym config's "
                                                    "agent block); verl: the agent loop (single_turn_agent)."),
           parallel_calls: str = typer.Option("batch", help="nemo-gym: several calls -> function_call_batch "
                                              "(batch) or the rejects file (reject).")) -> None:
    """Write Turns/pivots as NeMo-Gym rows or verl parquet (+ the tool config verl reads)."""
    from pivotrl.export import cli_export

    if code := cli_export(console, turns, format, out, ability=ability, agent_name=agent_name,
                          parallel_calls=parallel_calls):
        raise typer.Exit(code)


@guarded_command(import_app, "nemo-gym", inputs=["rows"], outputs=["out"])
def import_nemo_gym(rows: Path = typer.Argument(..., help="NeMo-Gym rows JSONL."),
                    out: Path = typer.Option(..., "--out", help="Turns JSONL to write.")) -> None:
    """NeMo-Gym pivot rows back to Turns."""
    from pivotrl.export import cli_import

    if code := cli_import(console, rows, out):
        raise typer.Exit(code)


@app.command()
def serve(
    model: str = typer.Option(..., help="HF model dir (or name) to serve."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind (loopback by default)."),
    port: int = typer.Option(8000, help="TCP port."),
    batch_size: int = typer.Option(64, help="Sequences per generate call."),
    served_model_name: Optional[str] = typer.Option(None, help="Name in /v1/models (default: the --model value)."),
    max_tokens_limit: Optional[int] = typer.Option(None, help="Largest max_tokens (default: the context)."),
    max_request_tokens: int = typer.Option(65536, help="Largest n x max_tokens x prompts of one request."),
) -> None:
    """An OpenAI-compatible endpoint around a local HF model (/health, /v1/models, /v1/completions,
    /v1/chat/completions, streaming too), e.g. for `pivotrl profile --backend openai` or a judge on a CPU."""
    from pivotrl.sampling.serve import serve as run_server

    try:
        check_model(model)
    except InputError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    console.print(f"serving {model} at http://{host}:{port}/v1")
    run_server(model, host=host, port=port, batch_size=batch_size, served_name=served_model_name,
               max_tokens_limit=max_tokens_limit, max_request_tokens=max_request_tokens)


_mount_plugins(app)

if __name__ == "__main__":
    app()
