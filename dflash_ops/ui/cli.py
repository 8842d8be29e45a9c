"""`dflash-ops results …`: look at pulled results without Fabric or an inventory."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from dflash_ops.core.errors import OpsError
from dflash_ops.core.text import inert
from dflash_ops.ui.output import FORMATS

RESULTS = click.option(
    "--results",
    "results_root",
    type=click.Path(path_type=Path),
    default=Path("results"),
    show_default=True,
    help="directory holding one sub-directory per pulled run",
)

FORMAT = click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="table",
    show_default=True,
    help="output format",
)


@click.group()
def main() -> None:
    """dflash-ops command line (the Fabric tasks are the main interface: `fab --list`)."""


@main.group()
def results() -> None:
    """Pulled evaluation results."""


@results.command("compare")
@RESULTS
@click.option("--steps", help="only these steps, comma-separated")
@click.option("--tag", help="only runs with this tag")
@click.option("--allow-mixed", is_flag=True, help="also show the other comparability groups' runs")
@click.option(
    "--plots",
    type=click.Path(path_type=Path),
    help="also write the PNG plots, into this directory",
)
@click.option("--report", is_flag=True, help="also write the HTML report (RESULTS/report.html)")
@click.option("--samples", is_flag=True, help="also print each run's decoded drafts")
@click.option("--run", "training_run", help="only this training run's results")
@FORMAT
@click.option("--wide", is_flag=True, help="every column (default: a compact table)")
@click.option(
    "--group",
    help="compare this comparability group: its number (default 1) or key (k3f9a1b2c)",
)
@click.option("--baseline", help="compare the group of this run (id or unique part)")
def compare_command(
    results_root: Path,
    steps: str | None,
    tag: str | None,
    allow_mixed: bool,
    plots: Path | None,
    samples: bool,
    training_run: str | None,
    fmt: str,
    wide: bool,
    group: str | None,
    baseline: str | None,
    report: bool,
) -> None:
    """Table across steps and runs (τ, DDTree τ, per-position acceptance, reference); writes
    nothing unless asked (--plots, --report)."""
    from dflash_ops.ui.compare_commands import show_comparison

    _guarded(
        lambda: show_comparison(
            results_root,
            steps,
            tag,
            allow_mixed,
            plots,
            samples,
            training_run,
            fmt=fmt,
            wide=wide,
            group=group,
            baseline=baseline,
            with_report=report,
        )
    )


@results.command("export")
@RESULTS
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="CSV or JSON file, by its suffix (default: RESULTS/export.csv)",
)
@click.option("--steps", help="only these steps, comma-separated")
@click.option("--tag", help="only runs with this tag")
@click.option("--run", "training_run", help="only this training run's results")
def export_command(
    results_root: Path,
    out: Path | None,
    steps: str | None,
    tag: str | None,
    training_run: str | None,
) -> None:
    """One tidy table: a row per run × prompt set × metric (pandas: read_csv)."""
    from dflash_ops.ui.compare_commands import export_results

    _guarded(lambda: export_results(results_root, out, steps, tag, training_run))


@results.command("report")
@RESULTS
@click.option("--steps", help="only these steps, comma-separated")
@click.option("--tag", help="only runs with this tag")
@click.option(
    "--out", type=click.Path(path_type=Path), help="HTML file (default: RESULTS/report.html)"
)
@click.option("--run", "training_run", help="only this training run's results")
def report_command(
    results_root: Path,
    steps: str | None,
    tag: str | None,
    out: Path | None,
    training_run: str | None,
) -> None:
    """One self-contained HTML report of the pulled runs."""
    from dflash_ops.ui.compare_commands import write_report

    _guarded(lambda: write_report(results_root, steps, tag, out, training_run))


@results.command("list")
@RESULTS
def list_command(results_root: Path) -> None:
    """Every pulled run with its state."""
    from dflash_ops.evaluation.results import load_runs

    def show() -> None:
        for run in load_runs(results_root):
            tau = run.metrics["tau_macro"] if run.results else None
            line = (
                f"{run.run_id}  step {run.step}  {run.run.get('state')}"
                + (f"  τ {tau:.3f}" if tau is not None else "")
                + (f"  ({run.problem})" if run.problem else "")
            )
            click.echo(inert(line))

    _guarded(show)


def _guarded(action) -> None:
    try:
        action()
    except OpsError as exc:
        click.echo(f"error: {inert(str(exc))}", err=True)
        sys.exit(1)
