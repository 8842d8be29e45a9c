"""What run-eval and the job tasks show: live progress bars for one run, host-prefixed lines
for sweeps over several hosts, and tables of runs and results.

Rendering only: LiveView and PrefixedView implement dflash_ops.evaluation.run.RunReporter and
are driven by the orchestration; they start nothing themselves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dflash_ops.core.units import format_bytes
from dflash_ops.evaluation import jobs
from dflash_ops.evaluation.results import TRAINING_RUN, Comparison, dataset_rows, table_rows
from dflash_ops.evaluation.run import TransferProgress
from dflash_ops.staging.relay import RelayState
from dflash_ops.ui.console import console
from dflash_ops.ui.staging_view import transfer_bars

PHASES = {
    "completions": "reference completions",
    "hidden_states": "target hidden states",
    "drafter": "drafter",
    "reference_drafter": "reference drafter",
}


class LiveView:
    """One run in the foreground: a progress bar per harness phase."""

    def __init__(self) -> None:
        self._progress: Progress | None = None

    def say(self, message: str) -> None:
        console.print(message)

    def transfers(self) -> AbstractContextManager[TransferProgress]:
        return transfer_bars()

    def starting(self, run_id: str) -> None:
        """Nothing to show: run_eval itself names a run that Ctrl-C detached."""

    def follow(self, run_id: str) -> Callable[[dict], None]:
        progress = Progress(
            TextColumn("{task.description:<24}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        progress.start()
        self._progress = progress
        tasks: dict[str, int] = {}

        def on_event(event: dict) -> None:
            kind = event["event"]
            if kind == "progress":
                phase = event["phase"]
                if phase not in tasks:
                    tasks[phase] = progress.add_task(PHASES.get(phase, phase), total=event["total"])
                progress.update(tasks[phase], completed=event["done"], total=event["total"])
            elif kind == "warning":
                progress.console.print(f"[yellow]harness warning:[/] {event['message']}")
            elif kind == "error":
                progress.console.print(f"[red]harness error:[/] {event['message']}")

        return on_event

    def finished(self, run: jobs.Run, summary: list[str], local_dir: Path | None) -> None:
        if self._progress is not None:
            self._progress.stop()
        show_finished(console.print, run, summary, local_dir)


class PrefixedView:
    """A run among several (a sweep): plain lines, each prefixed by its host."""

    _lock = threading.Lock()

    def __init__(self, host: str) -> None:
        self.host = host

    def say(self, message: str) -> None:
        with self._lock:
            console.print(f"[bold]{self.host:>8}[/] │ {message}")

    def starting(self, run_id: str) -> None:
        """Nothing to show yet: the line comes when the start is confirmed."""

    @contextmanager
    def transfers(self) -> Iterator[TransferProgress]:
        yield self._milestones

    def _milestones(self, label: str, total: int) -> Callable[[RelayState], None]:
        """A line at half and at all of a transfer (bars would garble interleaved hosts)."""
        marks = iter((0.5, 1.0))
        next_mark = [next(marks)]

        def advance(state: RelayState) -> None:
            if next_mark[0] and state.done >= total * next_mark[0]:
                self.say(f"{label}: {state.done * 100 // max(total, 1)}% of {format_bytes(total)}")
                next_mark[0] = next(marks, None)

        return advance

    def follow(self, run_id: str) -> Callable[[dict], None]:
        reported: dict[str, int] = {}

        def on_event(event: dict) -> None:
            if event["event"] == "progress":
                quarter = event["done"] * 4 // max(event["total"], 1)
                if reported.get(event["phase"]) != quarter:
                    reported[event["phase"]] = quarter
                    self.say(
                        f"{PHASES.get(event['phase'], event['phase'])}: "
                        f"{event['done']}/{event['total']}"
                    )
            elif event["event"] in ("warning", "error"):
                self.say(f"harness {event['event']}: {event['message']}")

        return on_event

    def finished(self, run: jobs.Run, summary: list[str], local_dir: Path | None) -> None:
        show_finished(self.say, run, summary, local_dir)


def show_finished(
    say: Callable[[str], None], run: jobs.Run, summary: list[str], local_dir: Path | None
) -> None:
    style = "green" if run.state == "succeeded" else "red"
    say(f"[{style}]run {run.run_id} {run.state}[/] (exit code {run.exit_code})")
    for line in summary:
        say(f"  {line}")
    if local_dir is not None:
        say(f"results pulled to {local_dir}")


def runs_table(runs: list[jobs.Run]) -> Table:
    table = Table(title="runs (evaluations and feature extractions)", title_justify="left")
    for column in ("run", "host", "step", "state", "exit", "started", "duration"):
        table.add_column(column)
    styles = {
        "running": "cyan",
        "succeeded": "green",
        "failed": "red",
        "lost": "red",
        "broken": "red",
        "cancelled": "yellow",
        "starting": "cyan",
    }
    for run in runs:
        end = run.finished or time.time()
        duration = f"{end - run.started:.0f} s" if run.started else "?"
        started = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started))
            if run.started
            else run.problem or "?"
        )
        table.add_row(
            run.run_id,
            run.host,
            "features" if run.params.get("kind") == "features" else str(run.step),
            f"[{styles.get(run.state, 'white')}]{run.state}[/]",
            "" if run.exit_code is None else str(run.exit_code),
            started,
            duration,
        )
    if not runs:
        table.caption = "no runs yet: start one with `fab run-eval --step N`"
    return table


def comparison_table(comparison: Comparison) -> Table:
    header, cells = table_rows(comparison)
    table = Table(
        title="comparison (tree-b: DDTree τ at budget b; acc@k: P(slot k | slots < k))",
        title_justify="left",
    )
    for column in header:
        table.add_column(
            column,
            justify="left" if column in ("run", TRAINING_RUN, "host", "comparable") else "right",
            no_wrap=column == "run",
        )
    for row in cells:
        styled = [*row[:-1], row[-1] if row[-1] == "yes" else f"[bold red]{row[-1]}[/]"]
        table.add_row(*styled)
    return table


def dataset_table(comparison: Comparison) -> Table | None:
    """τ, DDTree τ and acceptance per prompt set with 95 % intervals (None when no run has
    intervals)."""
    header, cells = dataset_rows(comparison)
    if not cells:
        return None
    table = Table(
        title="per prompt set, with 95 % bootstrap confidence intervals over prompts",
        title_justify="left",
    )
    for column in header:
        left = ("run", TRAINING_RUN, "prompt set")
        table.add_column(column, justify="left" if column in left else "right")
    for row in cells:
        flagged = row[0] in comparison.differences
        table.add_row(*(f"[red]{cell}[/]" if flagged else cell for cell in row))
    return table
