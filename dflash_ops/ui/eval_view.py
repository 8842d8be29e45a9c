"""What run-eval and the job tasks show: live progress bars for one run, host-prefixed lines
for sweeps over several hosts, and tables of runs and results."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dflash_ops.core.inventory import Inventory
from dflash_ops.core.units import format_bytes
from dflash_ops.evaluation import jobs
from dflash_ops.evaluation.results import Comparison, table_rows
from dflash_ops.remote.connection import Host, each_eval_host
from dflash_ops.staging.relay import RelayState
from dflash_ops.staging.stage import StageOptions, stage
from dflash_ops.ui.console import console
from dflash_ops.ui.staging_view import run_stage

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

    def stage(self, inventory: Inventory, step: int, host: str) -> str:
        staged = run_stage(
            inventory,
            step=step,
            latest=False,
            to=[host],
            dry_run=False,
            via="stream",
            two_hop=False,
            resume=True,
            verify=False,
            margin=None,
        )
        return staged[-1].path

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

    def stage(self, inventory: Inventory, step: int, host: str) -> str:
        def factory(label: str, total: int) -> Callable[[RelayState], None]:
            marks = iter((0.5, 1.0))
            next_mark = [next(marks)]

            def advance(state: RelayState) -> None:
                if next_mark[0] and state.done >= total * next_mark[0]:
                    self.say(
                        f"{label}: {state.done * 100 // max(total, 1)}% of {format_bytes(total)}"
                    )
                    next_mark[0] = next(marks, None)

            return advance

        options = StageOptions(report=self.say, progress_factory=factory)
        return stage(inventory, step, [host], options=options)[-1].path

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
    table = Table(title="eval runs", title_justify="left")
    for column in ("run", "host", "step", "state", "exit", "started", "duration"):
        table.add_column(column)
    styles = {
        "running": "cyan",
        "succeeded": "green",
        "failed": "red",
        "lost": "red",
        "cancelled": "yellow",
        "starting": "cyan",
    }
    for run in runs:
        end = run.finished or time.time()
        duration = f"{end - run.started:.0f} s" if run.started else "?"
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started or 0))
        table.add_row(
            run.run_id,
            run.host,
            str(run.step),
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
            justify="left" if column in ("run", "host", "comparable") else "right",
            no_wrap=column == "run",
        )
    for row in cells:
        styled = [*row[:-1], row[-1] if row[-1] == "yes" else f"[bold red]{row[-1]}[/]"]
        table.add_row(*styled)
    return table


def show_comparison(
    results_root: Path,
    steps: list[int] | None = None,
    tag: str | None = None,
    allow_mixed: bool = False,
    plots: Path | None = None,
) -> Comparison:
    """Print the comparison table and write the plots; refuse to mix incomparable runs
    unless `allow_mixed` (and then flag them)."""
    from dflash_ops.evaluation.results import ResultsError, compare, load_runs, plot

    comparison = compare(load_runs(results_root), steps, tag)
    console.print(comparison_table(comparison))
    if comparison.mixed:
        what = sorted({name for names in comparison.differences.values() for name in names})
        message = (
            f"{len(comparison.differences)} run(s) differ from the latest run in "
            f"{', '.join(what)}: their numbers are not comparable"
        )
        if not allow_mixed:
            raise ResultsError(
                f"{message}. Narrow the selection (--steps/--tag) or pass "
                "--allow-mixed to show them flagged."
            )
        console.print(f"[yellow]warning:[/] {message} (flagged above; left out of the plots)")
    for path in plot(comparison, plots or results_root / "plots"):
        console.print(f"plot: {path}")
    return comparison


def run_eval_command(
    inventory: Inventory,
    *,
    step: int,
    steps: str | None,
    all_new: bool,
    host: str | None,
    harness_flags: dict,
    reference: bool,
    prompts: str | None,
    sglang: bool,
    strip_optimizer: bool,
    tag: str | None,
    detach: bool,
) -> None:
    """`fab run-eval`: one step in the foreground, or a sweep over several steps/hosts."""
    from dflash_ops.core.errors import OpsError
    from dflash_ops.evaluation.run import (
        Detached,
        EvalRequest,
        new_steps,
        run_eval,
        run_sweep,
    )
    from dflash_ops.ui.cli import parse_steps

    args = [str(part) for flag, value in harness_flags.items() if value for part in (flag, value)]
    if prompts and not Path(prompts).is_file():
        raise OpsError(f"--prompts: {prompts} is not a file on this workstation")
    request = EvalRequest(
        step=step,
        host=host,
        harness_args=args,
        reference=reference,
        prompts=Path(prompts) if prompts else None,
        sglang=sglang,
        strip_optimizer=strip_optimizer,
        tag=tag,
        detach=detach,
    )
    sweep = parse_steps(steps) or (new_steps(inventory) if all_new else None)
    if sweep is not None:
        if not sweep:
            console.print("nothing to evaluate: every complete checkpoint has a result")
            return
        console.print(
            f"sweep: steps {', '.join(map(str, sweep))} over {', '.join(inventory.eval_hosts)}"
        )
        try:
            outcomes = run_sweep(inventory, sweep, request, PrefixedView)
        except KeyboardInterrupt:
            console.print(
                "\n[yellow]sweep interrupted[/]: runs already started go on on their "
                "hosts; `fab eval-status` shows them, `fab fetch-results` pulls them"
            )
            raise SystemExit(130) from None
        failed = [s for s, outcome in sorted(outcomes.items()) if isinstance(outcome, Exception)]
        if failed:
            raise OpsError(f"sweep: step(s) {', '.join(map(str, failed))} failed (see above)")
        return
    if not step:
        raise OpsError("pass --step N (or --steps A,B,… / --all-new for a sweep)")
    try:
        run_eval(inventory, request, LiveView())
    except Detached as detached:
        console.print(
            f"\n[yellow]detached[/]: run {detached.run_id} goes on on "
            f"{detached.host}. Reattach: fab eval-logs --run {detached.run_id} "
            "--follow; pull results later: fab fetch-results"
        )
        raise SystemExit(130) from None


def _eval_hosts(inventory: Inventory) -> dict:
    """Every eval host, kept open (the one holding the run is used afterwards)."""
    return {name: (Host(inventory, name), entry) for name, entry in inventory.eval_hosts.items()}


def show_status(inventory: Inventory) -> None:
    runs = [run for host, entry in each_eval_host(inventory) for run in jobs.list_runs(host, entry)]
    console.print(runs_table(sorted(runs, key=lambda run: run.started or 0)))


def show_logs(inventory: Inventory, run_id: str, follow: bool) -> None:
    host, entry, run = jobs.find_run(_eval_hosts(inventory), run_id)
    if follow:
        try:
            final = jobs.follow(host, entry, run.run_id, "log", console.print)
        except KeyboardInterrupt:
            console.print(f"\n[yellow]stopped following[/]; run {run.run_id} goes on")
            raise SystemExit(130) from None
        show_finished(console.print, final, [], None)
        return
    console.print(jobs.log_tail(host, entry, run.run_id, lines=100_000), end="")


def cancel_run(inventory: Inventory, run_id: str) -> None:
    host, entry, run = jobs.find_run(_eval_hosts(inventory), run_id)
    jobs.cancel(host, entry, run)
    final = jobs.wait_finished(host, entry, run.run_id)
    console.print(f"run {run.run_id} on {host.name}: {final.state}")


def fetch_all(inventory: Inventory) -> None:
    pulled = 0
    for host, entry in each_eval_host(inventory):
        for run in jobs.list_runs(host, entry):
            if run.done and jobs.fetch(host, entry, run, inventory.local.results):
                console.print(f"{host.name}: pulled {run.run_id} ({run.state})")
                pulled += 1
    console.print(
        f"{pulled} run(s) pulled into {inventory.local.results}"
        if pulled
        else "nothing new to pull"
    )
