"""`fab watch`: follow training. Every interval, list the trainer's complete checkpoints and
evaluate the new ones with the sweep machinery (dflash_ops.evaluation.sweep) over the eval
hosts, with the same request as `fab run-eval` (request.build_request).

State lives beside the results, in `<results>/watch-state.json` (`watch-state-<tag>.json`
for a tagged series; `watch-state@<run>.json`, `watch-state-<tag>@<run>.json` for a named
training run's), written atomically after every step:

    {"version": 1, "tag": null,
     "evaluated": {"2000": "<run id>", …},      # steps done, with the run that did them
     "attempts": {"4000": 1, …},                # failed attempts of steps not done yet
     "skipped": {"6000": "<last error>", …}}    # steps that failed 1 + retries times

A step counts as done when the state says so or when a successful run of it (of the same
training run, and with the same tag when one is given) is among the local results, so a
restart — or a `run-eval` by hand — never runs a step twice. Each pass first pulls finished
runs from the eval hosts and leaves alone the steps still running there (launched by a watch
that was stopped): they are neither re-launched nor counted as failures. A step that finds
every eval host busy with another run (by hand, another series) waits for the next pass
without spending an attempt: only a run that failed counts against `retries`.

Stopping: `stop()` (or the front door on Ctrl-C) ends the wait between passes at once and
lets no host take another step; runs already started go on, detached, on their hosts.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from dflash_eval.contract.reading import overall_interval
from dflash_eval.contract.schema import Results
from rich.markup import escape

from dflash_ops.core.arguments import parse_number
from dflash_ops.core.errors import HostBusy, OpsError, ResultsError, WatchError
from dflash_ops.core.files import write_atomic
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.parallel import wait_for
from dflash_ops.core.records import Record, RecordError, read_json_file, validate
from dflash_ops.evaluation import jobs, sweep
from dflash_ops.evaluation.groups import key_fields
from dflash_ops.evaluation.request import EvalRequest, run_flag
from dflash_ops.evaluation.results import load_runs, read_results
from dflash_ops.evaluation.run import RunReporter
from dflash_ops.evaluation.tracking import after_pull
from dflash_ops.evaluation.webhook import Webhook
from dflash_ops.remote.connection import each_eval_host
from dflash_ops.staging.catalog import list_checkpoints

STATE_VERSION = 1
DEFAULT_INTERVAL_S = 600.0
DEFAULT_RETRIES = 2
ERROR_CHARS = 500  # of a failure's message kept in the state and the webhook payload


MAX_INTERVAL = 7 * 24 * 3600  # a week between passes at most


def parse_interval(text: str | int | float) -> float:
    """`90s`, `10m`, `1h`, `1h30m` or plain seconds → seconds."""
    value = str(text).strip().lower()
    units = {"h": 3600, "m": 60, "s": 1, "": 1}
    parts = re.fullmatch(r"((?:\d+(?:\.\d+)?[hms])+|\d+(?:\.\d+)?)", value)
    if not parts:
        raise WatchError(f"--interval: expected e.g. 90s, 10m, 1h30m or seconds, found {text!r}")
    seconds = sum(
        float(number) * units[unit]
        for number, unit in re.findall(r"(\d+(?:\.\d+)?)([hms]?)", value)
    )
    # One parser bounds it: a wait the clock can hold (1e400 s is infinite, 1e300 overflows).
    return parse_number("--interval", seconds, minimum=0, maximum=MAX_INTERVAL, unit="seconds")


class StateRecord(Record):
    """The watch state file as written by `WatchState.save` (steps as JSON's string keys)."""

    evaluated: dict[str, str]
    attempts: dict[str, int]
    skipped: dict[str, str]


@dataclass
class WatchState:
    path: Path
    tag: str | None
    evaluated: dict[int, str] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)

    @staticmethod
    def file_for(results: Path, tag: str | None, training_run: str | None = None) -> Path:
        # '@' is in neither a cleaned tag nor a run name: no two series share a file.
        series = f"-{re.sub(r'[^A-Za-z0-9_.-]', '_', tag)}" if tag else ""
        run = f"@{training_run}" if training_run else ""
        return results / f"watch-state{series}{run}.json"

    @classmethod
    def load(cls, results: Path, tag: str | None, training_run: str | None = None) -> WatchState:
        path = cls.file_for(results, tag, training_run)
        if not path.exists():
            return cls(path, tag)
        try:
            data = validate(read_json_file(path, path.name), path.name, StateRecord)
            return cls(
                path,
                tag,
                {int(step): run_id for step, run_id in data.evaluated.items()},
                {int(step): count for step, count in data.attempts.items()},
                {int(step): error for step, error in data.skipped.items()},
            )
        except (RecordError, ValueError) as exc:
            raise WatchError(
                f"{path}: cannot read the watch state ({exc}). Move it aside to start afresh: "
                "steps with successful local results are still not evaluated again."
            ) from None

    def save(self) -> None:
        """Write the state atomically: a crash leaves the old file or the new, never half."""
        data = {
            "version": STATE_VERSION,
            "tag": self.tag,
            "evaluated": {str(s): r for s, r in sorted(self.evaluated.items())},
            "attempts": {str(s): n for s, n in sorted(self.attempts.items())},
            "skipped": {str(s): e for s, e in sorted(self.skipped.items())},
        }
        write_atomic(self.path, json.dumps(data, indent=2) + "\n")


@dataclass
class WatchOptions:
    interval_s: float = DEFAULT_INTERVAL_S
    retries: int = DEFAULT_RETRIES  # further attempts after a step's first failure
    max_passes: int | None = None  # None: until stopped


@dataclass
class PassOutcome:
    number: int
    evaluated: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # given up on in this pass
    in_flight: list[int] = field(default_factory=list)  # running on a host: left alone
    waiting: list[int] = field(default_factory=list)  # every host busy: tried next pass
    error: OpsError | None = None  # the pass itself could not run (e.g. trainer unreachable)


class WatchReporter(Protocol):
    """How a watch shows itself: a view implements this, the watch calls it."""

    def say(self, message: str) -> None:
        """One line for the user (rich markup allowed)."""

    def host(self, name: str) -> RunReporter:
        """The reporter for the runs on eval host `name`."""

    def pass_done(self, outcome: PassOutcome, next_in_s: float | None) -> None:
        """A pass ended; the next starts in `next_in_s` seconds (None: this was the last)."""


class Watch:
    """Evaluates new checkpoints pass after pass; `run()` until stopped or `max_passes`."""

    def __init__(
        self,
        inventory: Inventory,
        template: EvalRequest,
        reporter: WatchReporter,
        options: WatchOptions,
        webhook: Webhook | None = None,
    ) -> None:
        self.inventory = inventory
        self.template = template
        self.reporter = reporter
        self.options = options
        self.webhook = webhook
        self.state = WatchState.load(inventory.local.results, template.tag, inventory.training_run)
        self.stopping = threading.Event()
        self._recording = threading.Lock()

    def stop(self) -> None:
        """End the wait at once; hosts take no further step (started runs go on)."""
        self.stopping.set()

    def run(self) -> list[PassOutcome]:
        outcomes: list[PassOutcome] = []
        try:
            while not self.stopping.is_set():
                outcomes.append(self.one_pass(len(outcomes) + 1))
                last = self.options.max_passes is not None and (
                    len(outcomes) >= self.options.max_passes
                )
                if last or self.stopping.is_set():
                    self.reporter.pass_done(outcomes[-1], None)
                    break
                self.reporter.pass_done(outcomes[-1], self.options.interval_s)
                wait_for(self.stopping, self.options.interval_s)
        except KeyboardInterrupt:
            self.stop()  # the sweep's threads take no further step while the process ends
            raise
        return outcomes

    def one_pass(self, number: int) -> PassOutcome:
        """Pull what finished, then evaluate the complete checkpoints not done yet. A pass
        that cannot run (trainer or host unreachable) is reported; the next one tries again."""
        outcome = PassOutcome(number)
        try:
            outcome.in_flight = self._pull_finished_and_find_running()
            todo = self._steps_to_evaluate(set(outcome.in_flight))
            if todo:
                hosts = ", ".join(self.inventory.eval_hosts)
                self.reporter.say(f"pass {number}: evaluating step(s) {_steps(todo)} over {hosts}")
                sweep.run_sweep(
                    self.inventory,
                    todo,
                    self.template,
                    self.reporter.host,
                    stop=self.stopping,
                    on_outcome=lambda step, result: self._record(outcome, step, result),
                )
        except OpsError as exc:
            outcome.error = exc
            self.reporter.say(f"[red]watch pass {number} failed:[/] {escape(str(exc))}")
        return outcome

    def _pull_finished_and_find_running(self) -> list[int]:
        """Bring home finished runs of this series; the steps of runs still going."""
        running, pulled = [], []
        for host, entry in each_eval_host(self.inventory):
            for run in jobs.list_runs(host, entry):
                ours = self._ours(run.params.get("tag"), run.params.get("training_run"))
                if not ours or run.step is None:
                    continue
                if not run.done:
                    running.append(run.step)
                elif jobs.fetch(host, entry, run, self.inventory.local.results):
                    self.reporter.say(f"{host.name}: pulled {run.run_id} ({run.state})")
                    pulled += [run.run_id] if run.state == "succeeded" else []
        after_pull(self.inventory, pulled, self.reporter.say, self.template.wandb)
        return sorted(set(running))

    def _steps_to_evaluate(self, in_flight: set[int]) -> list[int]:
        succeeded = {
            run.step
            for run in load_runs(self.inventory.local.results)
            if run.results and self._ours(run.tag, run.training_run)
        }
        done = succeeded | set(self.state.evaluated) | set(self.state.skipped) | in_flight
        return [
            info.step
            for info in list_checkpoints(self.inventory)
            if info.complete and info.step not in done
        ]

    def _ours(self, tag: str | None, training_run: str | None) -> bool:
        """Whether a run belongs to this watch's series: of its training run, and with its
        tag when it has one."""
        if training_run != self.inventory.training_run:
            return False
        return self.template.tag is None or tag == self.template.tag

    def _record(self, outcome: PassOutcome, step: int, result: jobs.Run | Exception) -> None:
        """Called from a host's thread as each step ends: state first, then the news."""
        with self._recording:
            state = self.state
            if isinstance(result, HostBusy):
                # Another run holds the hosts: the step has not been tried, so no attempt
                # is spent on it.
                outcome.waiting.append(step)
                self.reporter.say(f"step {step} waits for a free eval host; tried next pass")
            elif isinstance(result, Exception):
                error = str(result)[:ERROR_CHARS]
                state.attempts[step] = attempts = state.attempts.get(step, 0) + 1
                given_up = attempts > self.options.retries
                if given_up:
                    state.skipped[step] = error
                    state.attempts.pop(step)
                (outcome.skipped if given_up else outcome.failed).append(step)
                state.save()
                self._tell_failure(step, attempts, given_up, error)
            else:
                state.evaluated[step] = result.run_id
                state.attempts.pop(step, None)
                outcome.evaluated.append(step)
                state.save()
                self._notify(self._success_payload(step, result))

    def _tell_failure(self, step: int, attempts: int, given_up: bool, error: str) -> None:
        allowed = 1 + self.options.retries
        if given_up:
            self.reporter.say(
                f"[red]step {step} skipped[/] after {attempts} failed attempt(s); evaluate it "
                f"by hand (fab run-eval --step {step}{run_flag(self.inventory)}) or remove it "
                "from `skipped` in "
                f"{self.state.path} for the watch to try again"
            )
        else:
            self.reporter.say(
                f"[yellow]step {step} failed[/] (attempt {attempts} of {allowed}); "
                "tried again next pass"
            )
        self._notify(
            {
                **self._payload("skipped" if given_up else "failed", step),
                "attempts": attempts,
                "error": error,
            }
        )

    def _success_payload(self, step: int, run: jobs.Run) -> dict:
        payload = {**self._payload("evaluated", step), "run_id": run.run_id, "host": run.host}
        results_file = self.inventory.local.results / run.run_id / "results.json"
        try:
            return {**payload, **results_news(read_results(results_file))}
        except ResultsError:
            return payload  # the news goes out without numbers rather than not at all

    def _payload(self, event: str, step: int) -> dict:
        return {
            "source": "dflash-ops watch",
            "event": event,
            "tag": self.template.tag,
            **({"training_run": run} if (run := self.inventory.training_run) else {}),
            "step": step,
            "failures": {
                **{str(s): {"attempts": n} for s, n in sorted(self.state.attempts.items())},
                **{str(s): {"skipped": True} for s in sorted(self.state.skipped)},
            },
        }

    def _notify(self, payload: dict) -> None:
        if self.webhook is not None:
            self.webhook.post(payload)


def results_news(results: Results) -> dict:
    """What the webhook says of a run's results: τ (its interval, where the harness computed
    intervals) and the comparability key it joins, with the settings the key names."""
    news = {"tau_macro": results["metrics"]["tau_macro"], **key_fields(results)}
    interval = overall_interval(results)
    if interval:
        news["tau_macro"] = interval["value"]
        news["tau_macro_ci"] = [interval["low"], interval["high"]]
    return news


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps))
