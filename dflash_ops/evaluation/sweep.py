"""Sweeps (`fab run-eval --steps A,B,…` or `--all-new`): which steps to evaluate, and
evaluating them across every eval host in parallel, one run per host at a time.

Each run is one `run_eval` (dflash_ops.evaluation.run), shown through its host's
`RunReporter`; nothing here imports a view.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

from rich.markup import escape

from dflash_ops.core.errors import HostBusy, OpsError
from dflash_ops.core.inventory import Inventory
from dflash_ops.evaluation import jobs
from dflash_ops.evaluation.request import EvalRequest
from dflash_ops.evaluation.results import load_runs
from dflash_ops.evaluation.run import RunReporter, run_eval
from dflash_ops.staging.catalog import list_checkpoints
from dflash_ops.staging.destination import staged_status

Outcomes = dict[int, jobs.Run | Exception]  # per step: its run, or why it failed


def choose_steps(
    inventory: Inventory, step: int | None, steps: list[int] | None, all_new: bool
) -> list[int] | None:
    """The steps of a sweep (explicit `steps`, else every new one with `all_new`), or None
    for a single run of `step`; refuses a request that names no step at all."""
    sweep = steps or (new_steps(inventory) if all_new else None)
    if sweep is None and step is None:
        raise OpsError("pass --step N (or --steps A,B,… / --all-new for a sweep)")
    return sweep


def new_steps(inventory: Inventory) -> list[int]:
    """Complete checkpoints on the trainer (of the inventory's training run) without a
    successful local result (of that run) yet."""
    evaluated = {
        run.step
        for run in load_runs(inventory.local.results)
        if run.results and run.training_run == inventory.training_run
    }
    return [
        info.step
        for info in list_checkpoints(inventory)
        if info.complete and info.step not in evaluated
    ]


def run_sweep(
    inventory: Inventory,
    steps: list[int],
    template: EvalRequest,
    reporters: Callable[[str], RunReporter],
    stop: threading.Event | None = None,
    on_outcome: Callable[[int, jobs.Run | Exception], None] | None = None,
) -> Outcomes:
    """Evaluate `steps` across every eval host in parallel, one run per host at a time. A
    host takes a step it already has staged first, else the next step (and stages it).
    `reporters(host)` gives the reporter that shows that host's runs. Once `stop` is set no
    host takes another step; `on_outcome(step, outcome)` is called as each step ends (from
    its host's thread), so a caller can record progress before the whole sweep is over. A
    host that another run holds hands its step back to the others and takes no more; a step
    no host could take ends as that HostBusy."""
    infos = [info for info in list_checkpoints(inventory) if info.step in steps]
    staged = {
        name: {
            step
            for step, state in staged_status(inventory, name, infos).items()
            if state == "staged"
        }
        for name in inventory.eval_hosts
    }
    pending = list(steps)
    taking = threading.Lock()
    outcomes: Outcomes = {}
    waiting: dict[int, HostBusy] = {}  # steps handed back by a busy host, not retaken

    def next_step(name: str) -> int | None:
        with taking:
            if not pending or (stop is not None and stop.is_set()):
                return None
            step = next((s for s in pending if s in staged[name]), pending[0])
            pending.remove(step)
            return step

    def worker(name: str) -> None:
        reporter = reporters(name)
        while (step := next_step(name)) is not None:
            try:
                request = replace(template, step=step, host=name)
                outcomes[step] = run_eval(inventory, request, reporter)
                waiting.pop(step, None)
            except HostBusy as busy:
                # The step is not at fault: another host may take it; this one takes no more.
                reporter.say(f"[yellow]step {step} waits:[/] {escape(str(busy))}")
                with taking:
                    pending.insert(0, step)
                    waiting[step] = busy
                return
            except OpsError as exc:
                # the error quotes what a host said: text, not markup
                reporter.say(f"[red]step {step} failed:[/] {escape(str(exc))}")
                outcomes[step] = exc
            if on_outcome is not None:
                on_outcome(step, outcomes[step])

    # Daemon threads: Ctrl-C ends the sweep here; runs already started go on on their hosts.
    threads = [
        threading.Thread(target=worker, args=(name,), name=f"eval-{name}", daemon=True)
        for name in inventory.eval_hosts
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for step in pending:
        if step in waiting:  # every host that could take it was busy
            outcomes[step] = waiting[step]
            if on_outcome is not None:
                on_outcome(step, waiting[step])
    return outcomes


def require_success(outcomes: Outcomes) -> None:
    """Raise when any step of the sweep failed (each failure was reported as it happened)."""
    failed = [step for step, outcome in sorted(outcomes.items()) if isinstance(outcome, Exception)]
    if failed:
        raise OpsError(f"sweep: step(s) {', '.join(map(str, failed))} failed (see above)")
