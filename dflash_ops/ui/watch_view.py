"""`fab watch`'s front door and view: builds the request as run-eval does, runs the watch
(dflash_ops.evaluation.watch) and shows it as timestamped lines, each run's lines prefixed by
its host. Ctrl-C (or SIGTERM, as `systemctl --user stop` sends) stops at once and says how to
follow the runs still going on their hosts; exit status 130 then, 1 when a step failed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from dflash_ops.core.errors import OpsError
from dflash_ops.core.inventory import Inventory
from dflash_ops.evaluation import jobs
from dflash_ops.evaluation.verdict import verdicts
from dflash_ops.evaluation.watch import PassOutcome, Watch, WatchOptions, parse_interval
from dflash_ops.evaluation.webhook import Webhook
from dflash_ops.remote.connection import Host
from dflash_ops.ui.console import console, shown
from dflash_ops.ui.eval_commands import request_from, warn_if_incomparable
from dflash_ops.ui.eval_view import PrefixedView, step_line

STOPPING_WEBHOOK_WAIT_S = 2.0  # after Ctrl-C, for posts still queued: stopping stays prompt
WEBHOOK_ENV = "DFLASH_WATCH_WEBHOOK"  # keeps a URL with credentials out of argv and history


class _TrackedView(PrefixedView):
    """A host's runs, remembering which are being launched and which have started and not
    finished (to name on Ctrl-C)."""

    def __init__(
        self,
        host: str,
        running: dict[str, str],
        launching: dict[str, str],
        ended: dict[int, jobs.Run],
    ) -> None:
        super().__init__(host)
        self._running = running
        self._launching = launching
        self._ended = ended

    def starting(self, run_id: str) -> None:
        self._launching[run_id] = self.host

    def follow(self, run_id: str) -> Callable[[dict], None]:
        self._launching.pop(run_id, None)
        self._running[run_id] = self.host
        return super().follow(run_id)

    def finished(self, run: jobs.Run, summary: list[str], local_dir: Path | None) -> None:
        self._running.pop(run.run_id, None)
        if run.step is not None:
            self._ended[run.step] = run
        super().finished(run, summary, local_dir)


class WatchView:
    """Implements dflash_ops.evaluation.watch.WatchReporter with plain, timestamped lines
    (they read well in a terminal, tmux and the journal alike)."""

    def __init__(self, results_root: Path | None = None) -> None:
        self.results_root = results_root  # where the runs are pulled: their verdicts
        self.running: dict[str, str] = {}  # run id → host, for runs started and not finished
        self.launching: dict[str, str] = {}  # run id → host, launched but not confirmed yet
        self.ended: dict[int, jobs.Run] = {}  # step → its run, as runs end (for the pass's lines)

    def say(self, message: str) -> None:
        console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {message}")

    def host(self, name: str) -> PrefixedView:
        return _TrackedView(name, self.running, self.launching, self.ended)

    def pass_done(self, outcome: PassOutcome, next_in_s: float | None) -> None:
        parts = [
            f"{label} {', '.join(map(str, steps))}"
            for label, steps in (
                ("evaluated", outcome.evaluated),
                ("failed", outcome.failed),
                ("skipped", outcome.skipped),
                ("still running on a host", outcome.in_flight),
                ("waiting for a free eval host", outcome.waiting),
            )
            if steps
        ]
        if outcome.error is None and not parts:
            parts = ["nothing new"]
        elif outcome.error is not None:
            parts.append("could not look (see above)")
        after = (
            f"; next look in {_duration(next_in_s)} (Ctrl-C stops)" if next_in_s is not None else ""
        )
        ends = {step: "evaluated" for step in outcome.evaluated}
        ends |= {step: "failed (see above)" for step in outcome.failed}
        ends |= {step: "given up (see above)" for step in outcome.skipped}
        ended = {step: self.ended.pop(step, None) for step in ends}
        found = {}
        if self.results_root is not None:
            found = verdicts(self.results_root, [run.run_id for run in ended.values() if run])
        for step, otherwise in sorted(ends.items()):
            self.say("  " + step_line(step, ended[step] or otherwise, found))
        self.say(f"pass {outcome.number}: {'; '.join(parts)}{after}")


def watch_command(
    inventory: Inventory,
    *,
    interval: str,
    retries: int,
    once: bool,
    max_passes: int | None,
    webhook: str | None,
    options: Mapping[str, object],
) -> None:
    """`fab watch`; `options`: the runs' request options from the task's flags, as run-eval's
    (run.request_options)."""
    template = request_from(inventory, options, step=0, host=None)
    warn_if_incomparable(inventory, template)
    timing = WatchOptions(parse_interval(interval), retries, 1 if once else max_passes)
    view = WatchView(inventory.local.results)
    url = webhook or os.environ.get(WEBHOOK_ENV)
    hook = Webhook(url, view.say) if url else None
    watch = Watch(inventory, template, view, timing, hook)
    hosts = ", ".join(inventory.eval_hosts)
    run = f" (training run {inventory.training_run})" if inventory.training_run else ""
    # From its first line on, a Ctrl-C stops the watch with the summary below: one that
    # lands while the line is written (the moment a reader sees it) is no exception.
    try:
        with _sigterm_as_interrupt():
            view.say(
                f"watching {inventory.trainer_name}'s checkpoints{run} every "
                f"{_duration(timing.interval_s)}; "
                f"evaluating on {hosts}; state in {watch.state.path}"
                + (f"; notifying {hook.shown}" if hook else "")
            )
            outcomes = watch.run()
    except KeyboardInterrupt:
        _show_stopped(view, inventory)
        if hook is not None:
            hook.close(STOPPING_WEBHOOK_WAIT_S)
        raise SystemExit(130) from None
    if hook is not None:
        hook.close()
    _require_no_failures(outcomes)


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (what `systemctl --user stop` sends) stops the watch like Ctrl-C, meanwhile."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _show_stopped(view: WatchView, inventory: Inventory) -> None:
    """Say that the watch stopped and name every run that goes on without it; a run whose
    launch was not confirmed yet is looked up on its host (it may hold the host already)."""
    console.print("\n[yellow]watch stopped[/]: no further step is started.")
    going_on = dict(view.running)
    for run_id, host in sorted(view.launching.items()):
        if _launched(inventory, host, run_id):
            going_on[run_id] = host
    for run_id, host in sorted(going_on.items()):
        run_id = shown(run_id)
        console.print(f"  run {run_id} goes on on {host}: fab eval-logs --id {run_id} --follow")
    if going_on:
        console.print(
            "  `fab eval-status` lists runs; a restarted watch pulls them when they end and "
            "does not start them again (or pull now: fab fetch-results)"
        )


def _launched(inventory: Inventory, host_name: str, run_id: str) -> bool:
    """Whether a run whose launch was interrupted started (or is about to) on its host."""
    _, entry = inventory.eval_host(host_name)
    host = Host(inventory, host_name)
    try:
        return jobs.start_state(host, entry, run_id) in ("started", "waiting")
    except OpsError as exc:
        console.print(
            f"  run {shown(run_id)} was being launched on {host_name}, which did not answer "
            f"({shown(exc)}): "
            "`fab eval-status` shows whether it started"
        )
        return False
    finally:
        host.close()


def _require_no_failures(outcomes: list[PassOutcome]) -> None:
    failed = sorted({s for o in outcomes for s in (*o.failed, *o.skipped)})
    blind = [o.number for o in outcomes if o.error is not None]
    problems = [f"step(s) {', '.join(map(str, failed))} failed (see above)"] if failed else []
    if blind:
        problems.append(f"pass(es) {', '.join(map(str, blind))} could not run")
    if problems:
        raise OpsError("watch: " + "; ".join(problems))


def _duration(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 3600:g} h" if seconds % 3600 == 0 else f"{seconds / 60:g} min"
    return f"{seconds:g} s"
