"""The experiment's command-line verbs: `pivotrl demo`, `pivotrl e2e`, `pivotrl testbed build`,
`pivotrl data bfcl`. `register` mounts them on the main command; the project publishes it as an
entry point in the `pivotrl.commands` group, so the library's command line never names this package."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import Progress, TextColumn, TimeElapsedColumn

testbed_app = typer.Typer(no_args_is_help=True, help="The built-in testbed: worlds, tiny model.")
data_app = typer.Typer(no_args_is_help=True, help="Real data sets turned into Trajectory files.")
console = Console(stderr=True, soft_wrap=True)  # messages name paths: never wrap them


def demo(out: Path = typer.Option(Path("pivotrl_demo"), help="Output folder (cache + report)."),
         full: bool = typer.Option(False, help="Every arm, every world of the testbed, 3 seeds; the ablations in toolshop (the target: 2 h on 2 cores)."),
         testbed: Optional[Path] = typer.Option(None, help="Testbed folder (default OUT/testbed)."),
         workers: Optional[int] = typer.Option(None, help="Training jobs in parallel."),
         config: Optional[Path] = typer.Option(None, help="DemoConfig YAML (default: the built-in "
                                               "grid, as in configs/demo.yaml); --full applies on top.")) -> None:
    """The whole method and its baselines on the built-in testbed, with a report."""
    from pivotrl_testbed.demo import DemoConfig, run_demo

    try:
        cfg = DemoConfig.from_yaml(config) if config else DemoConfig()
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2)
    cfg = cfg.full() if full else cfg
    if workers:
        cfg = cfg.model_copy(update={"workers": workers})
    run_demo(out, cfg, testbed=testbed)
    if cfg.eval_split:
        console.print(f"report: {out / 'report.md'}  results: {out / 'results.json'}")
    else:
        console.print(f"lr choice: {out / 'lr_choice.json'} (an lr-tuning run: dev only)")


@data_app.command("bfcl")
def data_bfcl(out: Path = typer.Option(..., "--out", help="Trajectory JSONL to write."),
              categories: Optional[list[str]] = typer.Option(
                  None, "--categories", help="base, miss_func, miss_param, long_context (repeat; default all)."
              )) -> None:
    """BFCL multi-turn ground truth as Trajectory records (expert calls + real backend outputs)."""
    from rich.progress import Progress

    from pivotrl_testbed.bfcl import CATEGORIES, load_category, write_bfcl

    chosen = [c for item in (categories or list(CATEGORIES)) for c in item.split(",") if c]
    unknown = [c for c in chosen if c not in CATEGORIES]
    if unknown:
        console.print(f"[red]unknown categories {unknown}; known: {', '.join(CATEGORIES)}[/red]")
        raise typer.Exit(2)
    total = sum(len(load_category(c)) for c in chosen)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("BFCL tasks", total=total)
        summary = write_bfcl(out, chosen, on_task=lambda _: progress.advance(task))
    console.print(summary.table())
    console.print(f"wrote {out}")


@testbed_app.command("build")
def testbed_build(
    out: Path = typer.Option(..., "--out", help="Output dir (base/, <world>/, ood/, build.json)."),
    config: Optional[Path] = typer.Option(None, "--config", help="Testbed YAML (default: built-in "
                                          "defaults, the same as configs/testbed.yaml)."),
    quick: bool = typer.Option(False, "--quick", help="A much smaller build (tests, smoke runs)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if a build with this config exists."),
    shipped_base: bool = typer.Option(True, "--shipped-base/--no-shipped-base", help="Use the package's "
                                      "built base when it is exactly what pretraining would make here."),
    base_from: Optional[Path] = typer.Option(None, "--base-from", help="Use the base of the finished "
                                             "build in this folder (its base/ and build.json, e.g. a "
                                             "candidate's weights kept in git) instead of pretraining; "
                                             "an error when it is not what this config would pretrain."),
) -> None:
    """Build the testbed: worlds' data, OOD tasks and the tiny base model (cached)."""
    from pivotrl_testbed.testbed.build import BUILD_LOG, build_testbed, load_testbed_config

    try:
        cfg = load_testbed_config(config)
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2)
    if quick:
        cfg = cfg.quick()
    console.print(f"progress, with rate and ETA: {out / BUILD_LOG}")
    with Progress(TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("testbed", total=None)
        try:
            info = build_testbed(out, cfg, force=force, use_shipped_base=shipped_base,
                                 base_from=base_from, progress=lambda m: bar.update(task, description=m))
        except ValueError as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(2)
    if info.get("cached"):
        console.print(f"{out}: already built with this config (build.json hash "
                      f"{info['config_hash']}); nothing to do (--force rebuilds)")
    base = info["base"]
    for world, v in base["in_domain"].items():
        console.print(f"base {world}: episode success {v['success']:.2f} "
                      f"[{v['ci95'][0]:.2f}, {v['ci95'][1]:.2f}] over {v['episodes']}, "
                      f"turn accuracy {v.get('turn_accuracy', float('nan')):.2f}")
    for family, v in base["ood"].items():
        console.print(f"base ood/{family}: accuracy {v['accuracy']:.2f} over {v['n']}")
    console.print(f"{info['parameters']:,} parameters; build {info['build_seconds']} s -> {out}")


@testbed_app.command("evaluate")
def testbed_evaluate(
    model: Path = typer.Option(..., "--model", help="Checkpoint dir (HF format: model + tokenizer)."),
    testbed: Optional[Path] = typer.Option(None, "--testbed", help="Dir written by `pivotrl testbed build`."),
    out: Path = typer.Option(..., "--out", help="RESULT.json (a RESULT.md table is written next to it)."),
    bfcl: Optional[Path] = typer.Option(None, "--bfcl", help="BFCL trajectories (`pivotrl data bfcl --out F`): "
                                        "adds in_domain.bfcl_<category>, judged by BFCL's multi_turn_checker."),
    episodes: Optional[int] = typer.Option(None, "--episodes", help="Episodes per world (EvalConfig)."),
    turn_trajectories: Optional[int] = typer.Option(None, "--turn-trajectories",
                                                    help="Expert trajectories per world scored turn by turn."),
    ood_per_family: Optional[int] = typer.Option(None, "--ood", help="OOD tasks per family."),
    temperature: Optional[float] = typer.Option(None, help="0 = greedy."),
    seed: Optional[int] = typer.Option(None, help="Base seed of the episodes and samples."),
) -> None:
    """Episode success, turn accuracy and OOD accuracy of a checkpoint on the testbed (and BFCL)."""
    from rich.table import Table

    from pivotrl.io.outputs import OutputPathError, check_outputs
    from pivotrl_testbed.evaluate import EvalConfig, evaluate_checkpoint, write_result

    if testbed is None and bfcl is None:
        console.print("[red]give --testbed DIR, --bfcl FILE, or both[/red]")
        raise typer.Exit(2)
    for path, what in ((model, "--model"), (testbed, "--testbed")):
        if path is not None and not path.is_dir():
            console.print(f"[red]{what} {path}: not a directory[/red]")
            raise typer.Exit(2)
    if bfcl is not None and not bfcl.is_file():
        console.print(f"[red]--bfcl {bfcl}: not a file (write one with `pivotrl data bfcl --out F`)[/red]")
        raise typer.Exit(2)
    try:
        check_outputs([bfcl], [out], input_folders=[model, testbed])
    except OutputPathError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2)
    given = {"episodes": episodes, "turn_trajectories": turn_trajectories, "ood_per_family": ood_per_family,
             "temperature": temperature, "seed": seed}
    cfg = EvalConfig(**{k: v for k, v in given.items() if v is not None})
    with console.status("evaluating") as status:
        result = evaluate_checkpoint(model, testbed, cfg, progress=lambda m: status.update(m), bfcl=bfcl)
    json_path, md_path = write_result(result, out)
    table = Table(title=f"{model}")
    for col in ("task", "score %", "95% CI", "n", "turn acc %"):
        table.add_column(col)
    for world, v in result["in_domain"].items():
        ta = f"{100 * v['turn_accuracy']:.1f}" if "turn_accuracy" in v else "–"
        table.add_row(world, f"{100 * v['success']:.1f}",
                      f"{100 * v['ci95'][0]:.1f}–{100 * v['ci95'][1]:.1f}", str(v["episodes"]), ta)
    for family, v in result["ood"].items():
        table.add_row(f"ood/{family}", f"{100 * v['accuracy']:.1f}",
                      f"{100 * v['ci95'][0]:.1f}–{100 * v['ci95'][1]:.1f}", str(v["n"]), "")
    Console().print(table)
    console.print(f"wrote {json_path} and {md_path} ({result['seconds']} s)")


def register(app: typer.Typer) -> None:
    """Mount the testbed's verbs on `pivotrl` (entry point `pivotrl.commands: testbed`)."""
    from pivotrl.cli.run_verb import training_verb
    from pivotrl_testbed.e2e_config import E2ERunConfig

    app.command()(demo)
    app.command("e2e")(training_verb(
        "e2e", E2ERunConfig, "pivotrl_testbed.e2e:train_e2e", example="configs/e2e_testbed.yaml", raw_data="tasks",
        doc="""The end-to-end RL baseline: GRPO over whole episodes in a registered world, reward = the
        world's success. Give a run YAML, or the required fields as flags:
        `pivotrl e2e --tasks T --model M --output-dir D`."""))
    app.add_typer(testbed_app, name="testbed")
    app.add_typer(data_app, name="data")
