"""The `pivotrl` command line: the app and its verbs, one module each (`pivotrl.cli.<verb>`), each
a few lines over the library (docs/DESIGN.md, contract)."""

from __future__ import annotations

import typer

from pivotrl.cli import compare, evaluate, export, extract, profile, select, serve, train, verify

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="PivotRL: RL on the pivot turns of existing agent trajectories.")
import_app = typer.Typer(no_args_is_help=True, help="Read other engines' formats back to Turns.")

for verb in (extract.extract, verify.verify, profile.profile, select.select, train.train, train.sft,
             evaluate.evaluate, compare.compare, export.export, serve.serve):
    app.command()(verb)
import_app.command("nemo-gym")(export.import_nemo_gym)
import_app.command("verl")(export.import_verl)
app.add_typer(import_app, name="import")


@app.callback()
def _quiet_console(ctx: typer.Context) -> None:
    """Every verb (the plugins' too) runs with the libraries' progress bars off (cli.console)."""
    from pivotrl.cli.console import quiet_libraries

    ctx.call_on_close(quiet_libraries())


def _mount_plugins(app: typer.Typer) -> None:
    """Verbs of other installed packages (the testbed's `demo`, `e2e`, `testbed`, `data`): each
    entry point in the `pivotrl.commands` group is a function that mounts its verbs on `app`, so the
    library's command line names no package above it."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="pivotrl.commands"):
        ep.load()(app)


_mount_plugins(app)

if __name__ == "__main__":
    app()
