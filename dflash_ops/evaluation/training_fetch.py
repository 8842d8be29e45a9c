"""Read training runs' metrics logs from the trainer and store the values at the evaluated
steps with the pulled results (training_metrics.TRAINING_FILE in each run's directory).

The log is read where the checkpoints are: inside the training environment (pct/docker
exec, or through the container's host-side rootfs), one round trip per training run, its
bytes base64-encoded (an event file is binary) and bounded by MAX_LOG_BYTES. A log that is
missing, unreadable or malformed, or that has not reached a step yet, is one line through
`say`: the evaluation and its results are never affected, and the next `fab fetch-results`
reads the log again for every run still without its values.
"""

from __future__ import annotations

import base64
import binascii
import json
import shlex
import time
from collections.abc import Callable, Collection
from pathlib import Path

from rich.markup import escape

from dflash_ops.core.errors import InventoryError, MetricsLogError, OpsError
from dflash_ops.core.files import write_atomic
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.metrics_log import MetricsLog
from dflash_ops.core.units import format_bytes
from dflash_ops.evaluation.results import RunResult, load_run, load_runs
from dflash_ops.evaluation.training_log import Logged, values_at
from dflash_ops.evaluation.training_metrics import TRAINING_FILE, values_of
from dflash_ops.remote.connection import Host
from dflash_ops.remote.containers import environment_of
from dflash_ops.remote.messages import stderr_reason

MAX_LOG_BYTES = 64 << 20  # scalars of a long run fit many times over; histograms may not
FILE_MARK = "@@dflash-ops-file"
_MISSING, _EMPTY_DIR, _NOT_A_FILE, _TOO_LARGE = 3, 4, 5, 6


def log_of(inventory: Inventory, training_run: str | None) -> MetricsLog | None:
    """The metrics log the inventory names for a training run (None: none, or the run is no
    longer in the inventory)."""
    try:
        return inventory.for_run(training_run).trainer.metrics
    except InventoryError:
        return None


def read_command(path: str, directory_allowed: bool) -> str:
    """Print each file of the log (a TensorBoard directory: its event files, by name) as a
    FILE_MARK line with its name, then its bytes in base64."""
    events = '"$p"/events.out.tfevents.*'
    directory = (
        f'set -- {events}; [ -e "$1" ] || exit {_EMPTY_DIR}'
        if directory_allowed
        else f"exit {_NOT_A_FILE}"
    )
    return (
        f"p={shlex.quote(path)}; "
        f'if [ -d "$p" ]; then {directory}; '
        f'elif [ -e "$p" ]; then set -- "$p"; else exit {_MISSING}; fi; '
        'total=0; for f; do s=$(stat -c %s -- "$f") || exit 1; total=$((total + s)); done; '
        f'if [ "$total" -gt {MAX_LOG_BYTES} ]; then echo "$total"; exit {_TOO_LARGE}; fi; '
        f'for f; do printf \'%s %s\\n\' {FILE_MARK} "${{f##*/}}"; base64 < "$f" || exit 1; done'
    )


def parse_files(output: str) -> list[tuple[str, bytes]]:
    """read_command's output → (file name, bytes) of each file."""
    files: list[tuple[str, list[str]]] = []
    for line in output.splitlines():
        if line.startswith(FILE_MARK + " "):
            files.append((line[len(FILE_MARK) + 1 :], []))
        elif files:
            files[-1][1].append(line)
    return [(name, base64.b64decode("".join(lines), validate=True)) for name, lines in files]


def read_log(inventory: Inventory, log: MetricsLog) -> list[tuple[str, bytes]]:
    """The bytes of the log's file(s), read in the trainer's training environment."""
    trainer = inventory.trainer
    env = environment_of(trainer.container)
    host = Host(inventory, inventory.trainer_name)
    where = f"{host.name}:{log.path} ({env.description})"
    try:
        command = read_command(env.host_path(log.path), log.format == "tensorboard")
        result = host.run(env.wrap(command), check=False)
    finally:
        host.close()
    problems = {
        _MISSING: "no such file; check the inventory's metrics.path",
        _EMPTY_DIR: "a directory without events.out.tfevents.* files",
        _NOT_A_FILE: f"a directory; format {log.format} reads one file",
    }
    if result.exit_code in problems:
        raise MetricsLogError(f"{where}: {problems[result.exit_code]}")
    if result.exit_code == _TOO_LARGE:
        answer = result.stdout.strip()
        size = format_bytes(int(answer)) if answer.isdigit() else "too large"
        raise MetricsLogError(
            f"{where}: {size}, more than the {format_bytes(MAX_LOG_BYTES)} read; log the "
            "scalars to a file of their own"
        )
    if not result.ok:
        raise MetricsLogError(f"{where}: cannot be read: {stderr_reason(result.stderr)}")
    try:
        return [(f"{where} {name}", data) for name, data in parse_files(result.stdout)]
    except (binascii.Error, ValueError):
        raise MetricsLogError(f"{where}: the trainer's answer was garbled; try again") from None


def attach(
    inventory: Inventory,
    results_root: Path,
    say: Callable[[str], None],
    only: Collection[str] | None = None,
) -> int:
    """Store the training metrics of every pulled successful run (or of the runs `only`
    names) that has none yet and whose training run names a metrics log; the runs given
    values. A run flagged not comparable (set_anchors) gets none, whoever asks. Never
    raises for a log's sake: each problem is one line through `say`."""
    waiting: dict[str | None, list[RunResult]] = {}
    pulled = load_runs(results_root) if only is None else [load_run(results_root / i) for i in only]
    for run in pulled:
        wanted = run.results is not None and run.flag is None and run.step is not None
        if wanted and not values_of(run.directory):
            waiting.setdefault(run.training_run, []).append(run)
    stored = 0
    for training_run, runs in waiting.items():
        log = log_of(inventory, training_run)
        if log is None:
            continue
        try:
            logged = values_at(log, read_log(inventory, log), {run.step for run in runs})
        except OpsError as exc:
            say(f"{_said(training_run)}: {escape(str(exc))} (the results are unaffected)")
            continue
        stored += _store_each(runs, training_run, log, logged, say)
    return stored


def _store_each(
    runs: list[RunResult],
    training_run: str | None,
    log: MetricsLog,
    logged: Logged,
    say: Callable[[str], None],
) -> int:
    """Write each run's values; say what its step lacks. The runs given values."""
    stored = 0
    for run in runs:
        values = logged.get(run.step, {})
        missing = [field for field in log.fields if field not in values]
        if missing:
            again = "" if values else " yet; fab fetch-results reads it again"
            say(
                f"{_said(training_run)}: {log.path} logs no {', '.join(missing)} at step "
                f"{run.step}{again}"
            )
        if not values:
            continue
        try:
            _store(run, training_run, log, values)
        except OSError as exc:
            say(f"{_said(training_run)}: cannot write {run.directory}: {exc.strerror}")
            continue
        stored += 1
    return stored


def _said(training_run: str | None) -> str:
    return f"training metrics of {training_run}" if training_run else "training metrics"


def _store(run: RunResult, training_run: str | None, log: MetricsLog, values: dict) -> None:
    record = {
        "step": run.step,
        "training_run": training_run,
        "log": {"path": log.path, "format": log.format},
        "values": {field: values[field] for field in log.fields if field in values},
        "read": time.time(),
    }
    write_atomic(run.directory / TRAINING_FILE, json.dumps(record, indent=2) + "\n")
