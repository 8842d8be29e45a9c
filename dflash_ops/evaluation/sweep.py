"""Sweeps (`fab run-eval --steps A,B,…` or `--all-new`): which steps to evaluate, and
evaluating them across every eval host in parallel, one run per host at a time; and one step
on several named hosts at once (`fab run-eval --step N --hosts all`), by the same workers.

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
from dflash_ops.core.parallel import join_all
from dflash_ops.evaluation import jobs
from dflash_ops.evaluation.request import EvalRequest
from dflash_ops.evaluation.results import load_runs
from dflash_ops.evaluation.run import RunReporter, run_eval
from dflash_ops.staging.catalog import list_checkpoints
from dflash_ops.staging.destination import staged_status

Outcomes = dict[int, jobs.Run | Exception]  # per step: its run, or why it failed
Work = tuple[int, str | None]  # a step, and the host it must run on (None: any host)


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
    work = [(step, None) for step in steps]
    names = list(inventory.eval_hosts)
    ended = _run_work(inventory, work, names, template, reporters, stop, on_outcome)
    return {step: outcome for (step, _), outcome in ended.items()}


def run_on_hosts(
    inventory: Inventory,
    step: int,
    names: list[str],
    template: EvalRequest,
    reporters: Callable[[str], RunReporter],
) -> dict[str, jobs.Run | Exception]:
    """Evaluate `step` on each of the eval hosts `names` in parallel, the same request on
    each; per host, its run or why it failed (HostBusy when another run holds it)."""
    work = [(step, name) for name in names]
    ended = _run_work(inventory, work, names, template, reporters)
    return {name: outcome for (_, name), outcome in ended.items() if name is not None}


def _run_work(
    inventory: Inventory,
    work: list[Work],
    names: list[str],
    template: EvalRequest,
    reporters: Callable[[str], RunReporter],
    stop: threading.Event | None = None,
    on_outcome: Callable[[int, jobs.Run | Exception], None] | None = None,
) -> dict[Work, jobs.Run | Exception]:
    """Run `work` on the hosts `names`, one thread and one run at a time per host (see
    run_sweep); work that a busy host handed back and no host retook ends as HostBusy."""
    queue = _Queue(work, _staged_steps(inventory, work, names), stop)
    outcomes: dict[Work, jobs.Run | Exception] = {}

    def worker(name: str) -> None:
        reporter = reporters(name)
        while (item := queue.take(name)) is not None:
            step = item[0]
            try:
                request = replace(template, step=step, host=name)
                outcomes[item] = run_eval(inventory, request, reporter)
                queue.ran(item)
            except HostBusy as busy:
                # The step is not at fault: another host may take it; this one takes no more.
                reporter.say(f"[yellow]step {step} waits:[/] {escape(str(busy))}")
                queue.hand_back(item, busy)
                return
            except OpsError as exc:
                # the error quotes what a host said: text, not markup
                reporter.say(f"[red]step {step} failed:[/] {escape(str(exc))}")
                outcomes[item] = exc
            if on_outcome is not None:
                on_outcome(step, outcomes[item])

    # Daemon threads: Ctrl-C ends the sweep here; runs already started go on on their hosts.
    threads = [
        threading.Thread(target=worker, args=(name,), name=f"eval-{name}", daemon=True)
        for name in names
    ]
    for thread in threads:
        thread.start()
    join_all(threads)
    for item, busy in queue.left_waiting():  # every host that could take it was busy
        outcomes[item] = busy
        if on_outcome is not None:
            on_outcome(item[0], busy)
    return outcomes


def _staged_steps(inventory: Inventory, work: list[Work], names: list[str]) -> dict[str, set[int]]:
    """Per host, the steps of `work` already staged there (a host takes those first)."""
    steps = {step for step, _ in work}
    infos = [info for info in list_checkpoints(inventory) if info.step in steps]
    return {
        name: {
            step
            for step, state in staged_status(inventory, name, infos).items()
            if state == "staged"
        }
        for name in names
    }


class _Queue:
    """The work no host has taken yet, shared by the hosts' threads. A host takes work meant
    for it or for any host, a step already staged on it first; nothing once `stop` is set. A
    busy host hands its item back, to wait for another host."""

    def __init__(
        self, work: list[Work], staged: dict[str, set[int]], stop: threading.Event | None
    ) -> None:
        self.pending = list(work)
        self.staged, self.stop = staged, stop
        self.taking = threading.Lock()
        self.waiting: dict[Work, HostBusy] = {}  # handed back by a busy host, not retaken

    def take(self, name: str) -> Work | None:
        with self.taking:
            mine = [item for item in self.pending if item[1] in (None, name)]
            if not mine or (self.stop is not None and self.stop.is_set()):
                return None
            item = next((item for item in mine if item[0] in self.staged[name]), mine[0])
            self.pending.remove(item)
            return item

    def ran(self, item: Work) -> None:
        self.waiting.pop(item, None)  # a host retook it after a busy one handed it back

    def hand_back(self, item: Work, busy: HostBusy) -> None:
        with self.taking:
            self.pending.insert(0, item)
            self.waiting[item] = busy

    def left_waiting(self) -> list[tuple[Work, HostBusy]]:
        """The work still here once every thread ended that a busy host handed back."""
        return [(item, self.waiting[item]) for item in self.pending if item in self.waiting]


def require_success(outcomes: Outcomes) -> None:
    """Raise when any step of the sweep failed (each failure was reported as it happened)."""
    failed = [step for step, outcome in sorted(outcomes.items()) if isinstance(outcome, Exception)]
    if failed:
        raise OpsError(f"sweep: step(s) {', '.join(map(str, failed))} failed (see above)")
