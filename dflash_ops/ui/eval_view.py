"""What run-eval and the job tasks show: live progress bars for one run, host-prefixed lines
for sweeps over several hosts, and tables of runs and results.

Rendering only: LiveView and PrefixedView implement dflash_ops.evaluation.run.RunReporter and
are driven by the orchestration; they start nothing themselves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column as RichColumn

from dflash_ops.core.units import format_bytes
from dflash_ops.evaluation import jobs
from dflash_ops.evaluation.run import TransferProgress
from dflash_ops.evaluation.run_ids import short_ids
from dflash_ops.staging.relay import RelayState
from dflash_ops.ui.console import console, shown
from dflash_ops.ui.output import Column, field, render
from dflash_ops.ui.staging_view import transfer_bars

PHASES = {
    "completions": "reference completions",
    "hidden_states": "target hidden states",
    "drafter": "drafter",
    "reference_drafter": "reference drafter",
}


STATUS = "status"  # the spinner's task: what the harness is loading


class LiveView:
    """One run in the foreground: a spinner with what the harness is loading (a large target
    takes minutes), then a progress bar with time left per harness phase; at the end a
    3-line summary (`verbose`: the harness's whole summary)."""

    def __init__(self, verbose: bool = False) -> None:
        self._progress: Progress | None = None
        self.verbose = verbose

    def say(self, message: str) -> None:
        console.print(message)

    def transfers(self) -> AbstractContextManager[TransferProgress]:
        return transfer_bars()

    def starting(self, run_id: str) -> None:
        """Nothing to show: run_eval itself names a run that Ctrl-C detached."""

    def follow(self, run_id: str) -> Callable[[dict], None]:
        progress = phase_bars()
        progress.start()
        self._progress = progress
        tasks: dict[str, int] = {}

        def on_event(event: dict) -> None:
            kind = event["event"]
            if kind == "status":  # the whole message above, its start beside the spinner
                progress.console.print(f"[dim]{escape(event['message'])}[/]")
                if STATUS not in tasks:
                    tasks[STATUS] = progress.add_task("", total=None)
                label = shown(_short(event["message"], LABEL_WIDTH))
                progress.update(tasks[STATUS], description=label)
            elif kind == "progress":
                phase = event["phase"]
                if STATUS in tasks:  # loading is over once a phase counts
                    progress.remove_task(tasks.pop(STATUS))
                if phase not in tasks:
                    label = shown(PHASES.get(phase, phase))
                    tasks[phase] = progress.add_task(label, total=event["total"])
                progress.update(tasks[phase], completed=event["done"], total=event["total"])
            elif kind in ("warning", "error"):
                style = "yellow" if kind == "warning" else "red"
                message = shown(event["message"], lines=True)
                progress.console.print(f"[{style}]harness {kind}:[/] {message}")

        return on_event

    def finished(self, run: jobs.Run, summary: list[str], local_dir: Path | None) -> None:
        if self._progress is not None:
            self._progress.stop()
        show_finished(console.print, run, summary, local_dir, self.verbose)


def phase_bars(on: Console | None = None) -> Progress:
    """Bars of the harness's phases: spinner, label, bar, done/total, elapsed, time left;
    about 70 columns wide."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", table_column=RichColumn(width=LABEL_WIDTH, no_wrap=True)),
        BarColumn(bar_width=16),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=on or console,
    )


LABEL_WIDTH = 22


def _short(message: str, width: int = 60) -> str:
    """A status message on one line of at most `width` characters."""
    line = " ".join(message.split())
    return line if len(line) <= width else line[: width - 1] + "…"


class PrefixedView:
    """A run among several (a sweep, a watch): plain lines, each prefixed by its host, few
    enough that a sweep of a few steps fits a screen: what the harness loads, each phase as
    it completes, the run's end in one line; the verdict (evaluation.verdict) follows it,
    and `fab eval-status` shows where a run is meanwhile."""

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
        """A line at half of a transfer (bars would garble interleaved hosts; its end is
        the stage's own 'staged and verified' line)."""
        marks = iter((0.5,))
        next_mark = [next(marks)]

        def advance(state: RelayState) -> None:
            if next_mark[0] and state.done >= total * next_mark[0]:
                self.say(f"{label}: {state.done * 100 // max(total, 1)}% of {format_bytes(total)}")
                next_mark[0] = next(marks, None)

        return advance

    def follow(self, run_id: str) -> Callable[[dict], None]:
        completed: set[str] = set()

        def on_event(event: dict) -> None:
            if event["event"] == "progress":
                if event["done"] >= event["total"] and event["phase"] not in completed:
                    completed.add(event["phase"])
                    self.say(
                        f"{shown(PHASES.get(event['phase'], event['phase']))}: "
                        f"{event['done']}/{event['total']} done"
                    )
            elif event["event"] in ("warning", "error"):
                self.say(f"harness {event['event']}: {shown(event['message'], lines=True)}")
            elif event["event"] == "status":
                self.say(shown(event["message"], lines=True))

        return on_event

    def finished(self, run: jobs.Run, summary: list[str], local_dir: Path | None) -> None:
        """One line: its state (a success's numbers come in the verdict line after it)."""
        pulled = f"; results pulled to {shown(local_dir)}" if local_dir is not None else ""
        self.say(state_line(run) + pulled)


def show_finished(
    say: Callable[[str], None],
    run: jobs.Run,
    summary: list[str],
    local_dir: Path | None,
    verbose: bool = False,
) -> None:
    """The run's state, its headline numbers and where its results are (3 lines); `verbose`:
    every line of the harness's summary."""
    say(state_line(run))
    for line in summary if verbose else summary[:1]:
        say(f"  {escape(line)}")
    more = "; -v for the whole summary" if len(summary) > 1 and not verbose else ""
    if local_dir is not None:
        say(f"results pulled to {shown(local_dir)}{more}")


def state_line(run: jobs.Run) -> str:
    """'run ID succeeded (exit code 0)', coloured by the outcome."""
    style = "green" if run.state == "succeeded" else "red"
    return f"[{style}]run {shown(run.run_id)} {run.state}[/] (exit code {run.exit_code})"


def run_progress(run: jobs.Run) -> str:
    """Where the harness is ('drafter 12/40') or, once done, its τ macro ('τ 3.210')."""
    event = run.last_event or {}
    if event.get("event") == "done":
        tau = (event.get("summary") or {}).get("tau_macro")
        return f"τ {tau:.3f}" if isinstance(tau, (int, float)) else "done"
    if event.get("event") == "progress":
        return f"{event.get('phase')} {event.get('done')}/{event.get('total')}"
    return ""


def step_line(
    step: int, outcome: jobs.Run | Exception | str, verdicts: Mapping[str, str] | None = None
) -> str:
    """One line per step at the end of a sweep or a watch pass: its verdict (`verdicts`, by
    run id: evaluation.verdict) or its τ, or why not (an exception, or what to say when the
    run itself is not known)."""
    if isinstance(outcome, str):
        return f"step {step}: {outcome}"
    if isinstance(outcome, Exception):
        reason = str(outcome).splitlines()[0] if str(outcome) else type(outcome).__name__
        return f"step {step}: [red]failed[/]: {shown(reason)}"
    result = run_progress(outcome) if outcome.state == "succeeded" else outcome.state
    if outcome.state == "succeeded" and verdicts and outcome.run_id in verdicts:
        result = verdicts[outcome.run_id]
    where = f"on {shown(outcome.host)} (run {shown(outcome.run_id)})"
    return f"step {step}: {shown(result or outcome.state)} {where}"


STATE_STYLES = {
    "running": "cyan",
    "starting": "cyan",
    "succeeded": "green",
    "failed": "red",
    "lost": "red",
    "broken": "red",
    "cancelled": "yellow",
    "unverified": "yellow",
}


def status_records(runs: list[jobs.Run], now: float | None = None) -> list[dict]:
    """`fab eval-status`'s runs, newest first, as plain values (its --format json/csv)."""
    now = time.time() if now is None else now
    ids = short_ids(run.run_id for run in runs)
    records = []
    for run in sorted(runs, key=lambda run: run.started or 0, reverse=True):
        event = run.last_event or {}
        summary = event.get("summary") or {}
        records.append(
            {
                "run_id": run.run_id,
                "short_id": ids[run.run_id],
                "host": run.host,
                "kind": run.params.get("kind") or "eval",
                "step": run.step,
                "state": run.state,
                "exit_code": run.exit_code,
                "started": run.started,
                "duration_s": round((run.finished or now) - run.started) if run.started else None,
                "progress": run_progress(run) or None,
                "tau_macro": summary.get("tau_macro"),
                "problem": run.problem,
            }
        )
    return records


def _started(record: dict) -> str:
    if not record["started"]:
        return "?"
    return time.strftime("%m-%d %H:%M", time.localtime(record["started"]))


STATUS_COLUMNS = [
    Column("id", field("short_id"), keep=10),
    Column("step", lambda r: "features" if r["kind"] == "features" else field("step")(r), keep=9),
    Column("host", field("host"), keep=7),
    Column("state", field("state"), keep=10),
    Column("progress", lambda r: r["progress"] or "", keep=8),
    Column("started", _started, keep=5),
    Column("took", lambda r: format_duration(r["duration_s"]), keep=6, right=True),
    Column("exit", lambda r: "" if r["exit_code"] is None else str(r["exit_code"]), keep=2),
    Column("run id", field("run_id"), keep=3),
    # why a run failed, or is not what its files say (a stale or unverifiable pid file)
    Column("problem", lambda r: r["problem"] or "", keep=4),
]


def show_runs(runs: list[jobs.Run], fmt: str, wide: bool) -> None:
    """`fab eval-status`: newest first."""
    records = status_records(runs)
    if not records and fmt == "table":
        console.print("no runs yet: start one with `fab run-eval --step N`")
        return
    render(
        records,
        STATUS_COLUMNS,
        fmt,
        console=console,
        title="runs (evaluations and feature extractions), newest first",
        wide=wide,
        style=lambda record: STATE_STYLES.get(record["state"]),
    )


def format_duration(seconds: float | None) -> str:
    """'45 s', '12 min', '3.2 h'."""
    if seconds is None:
        return "?"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
