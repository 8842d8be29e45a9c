"""Detached runs on an eval host: launch, list, follow, cancel, fetch.

A run lives in `{workdir}/runs/<run-id>/` on the eval host: `params.json` (what was asked),
`run.sh` (the wrapper), `events.jsonl` (the harness's stdout: JSON-line events), `log` (its
stderr), `pid` and `wrapper.pid` with their processes' start times (`pid.start`,
`wrapper.pid.start`: a pid is trusted, followed or signalled only while its process started
then, see remote/process_claims.py), `exit_code` and `results.json`. The wrapper is started
with `systemd-run` where systemd manages the host, else `setsid nohup`, so the run survives
the workstation going away.
It holds `{workdir}/runs/.lock` with flock for its whole life: one run per host at a time, and a
crashed run releases the lock by itself.
"""

from __future__ import annotations

import json
import secrets
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

from dflash_ops.core.errors import (
    DiskSpaceError,
    HostBusy,
    JobError,
    OpsError,
    RemoteCommandError,
)
from dflash_ops.core.inventory import EvalHost, Inventory
from dflash_ops.evaluation import run_ids
from dflash_ops.evaluation.pulled import store_run
from dflash_ops.evaluation.run_listing import DENIED_EXIT, Run, parse_events, runs_probe
from dflash_ops.remote import probes, process_claims
from dflash_ops.remote.connection import Host, each_eval_host, with_umask
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.remote.messages import stderr_reason
from dflash_ops.remote.process_claims import Claim, doubt, parse_claim

RUN_FILES = ("params.json", "events.jsonl", "log", "results.json", "diagnose.json")
BUSY_EXIT = 75  # the wrapper's exit code when another run holds the host's lock
FOLLOW_PID_INTERVAL_S = 0.1  # how soon `follow` sees the harness exit


class Detached(Exception):
    """The user stopped following (Ctrl-C); the remote run goes on."""

    def __init__(self, run_id: str, host: str) -> None:
        super().__init__(run_id, host)
        self.run_id, self.host = run_id, host


def new_run_id(
    step: int, host: str, tag: str | None = None, training_run: str | None = None
) -> str:
    """`<stamp>[-<training run>]-step<N>-<host>[-<tag>]-<hex>`: a named training run is in the
    id, so two runs' same step on one host read apart in listings and in local.results."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    run = f"-{_safe(training_run)}" if training_run else ""
    suffix = f"-{_safe(tag)}" if tag else ""
    return f"{stamp}{run}-step{step}-{_safe(host)}{suffix}-{secrets.token_hex(2)}"


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)


def runs_dir(entry: EvalHost) -> str:
    return EvalLayout(entry).runs


def run_dir(entry: EvalHost, run_id: str) -> str:
    return EvalLayout(entry).run(run_id)


# --- launching -----------------------------------------------------------------------------


def wrapper_script(
    entry: EvalHost, run_id: str, command: str, private_files: Sequence[str] = ()
) -> str:
    """The shell wrapper that runs `command` in the run directory and records its exit code;
    it removes `private_files` (credentials the harness reads) however it ends."""
    lock = shlex.quote(f"{runs_dir(entry)}/.lock")
    removal = f"rm -f -- {shlex.join(private_files)}"
    return "\n".join(
        [
            "#!/bin/sh",
            "# Written by dflash-ops: run the harness detached, one run per host (flock), and",
            "# record its pid, its start time and its exit code next to its output.",
            *([f"trap {shlex.quote(removal)} EXIT"] if private_files else []),
            f"cd {shlex.quote(run_dir(entry, run_id))} || exit 1",
            "umask 077",
            process_claims.SHELL.strip(),
            "dflash_record $$ wrapper.pid",
            f"exec 9>>{lock}",
            f"flock -n 9 || {{ echo busy > refused; exit {BUSY_EXIT}; }}",
            f"{command} > events.jsonl 2> log &",
            "dflash_record $! pid",
            "wait $!",
            "code=$?",
            # Gone before the exit code says the run is over (the trap covers early exits).
            *([removal] if private_files else []),
            'echo "$code" > exit_code.tmp && mv exit_code.tmp exit_code',
            "",
        ]
    )


def launch(
    host: Host,
    entry: EvalHost,
    run_id: str,
    command: str,
    params: dict,
    private_files: Sequence[str] = (),
) -> str:
    """Start `command` detached in a new run directory; return how it was started. Refuses
    clearly when another run holds the host. `private_files` (uploaded for the run) are
    removed by the wrapper when it ends, or here when it is not started."""
    directory = run_dir(entry, run_id)
    quoted = shlex.quote(directory)
    try:
        busy = [run for run in list_runs(host, entry, unfinished=True) if not run.done]
        if busy:
            raise HostBusy(_busy_message(host.name, busy[0]))
        params = {**params, "run_id": run_id, "host": host.name, "started": time.time()}
        script = wrapper_script(entry, run_id, command, private_files)
        # Run directories are the user's own (umask 077): their logs may quote prompts and
        # paths.
        written = host.run(
            with_umask(
                "077",
                # The run directory is new, made here: only then is it ours to remove when
                # a write fails (a full disk, most likely: no half-made run is left behind).
                f"mkdir -p {shlex.quote(runs_dir(entry))} || exit 1; [ ! -e {quoted} ] || exit 3; "
                f"mkdir {quoted} || exit 1; {{ cd {quoted} && "
                f"printf '%s' {shlex.quote(json.dumps(params))} > params.json && "
                f"printf '%s' {shlex.quote(script)} > run.sh; }} || "
                f"{{ cd / && rm -rf -- {quoted}; exit 1; }}",
            ),
            check=False,
        )
        if written.exit_code == 3:
            raise JobError(
                f"{host.name}: {directory} already exists; it is not this run's and is left "
                "as it is. Run again (a new run id is drawn)."
            )
        if not written.ok:
            size = len(script) + len(json.dumps(params))
            raise _unwritable(host, entry, run_id, written.stderr, size)
    except BaseException:
        if private_files:
            host.run(f"rm -f -- {shlex.join(private_files)}", check=False)
        raise
    unit = f"dflash-eval-{run_id}"
    start = (
        'if [ -d /run/systemd/system ] && [ "$(id -u)" = 0 ] && command -v systemd-run '
        ">/dev/null; then "
        f"systemd-run --quiet --collect --unit={shlex.quote(unit)} /bin/sh {quoted}/run.sh "
        "&& echo systemd-run; "
        f"else setsid nohup /bin/sh {quoted}/run.sh </dev/null >/dev/null 2>&1 & "
        "echo setsid; fi"
    )
    launcher = host.run(start).stdout.strip()
    _wait_started(host, entry, run_id)
    return launcher


def _unwritable(host: Host, entry: EvalHost, run_id: str, stderr: str, size: int) -> OpsError:
    """One line for a run directory that could not be written (not the script it held)."""
    runs = runs_dir(entry)
    if "no space left" in stderr.lower():
        free = host.probe(probes.free_bytes(runs))
        advice = f"old staged checkpoints and feature sets: `fab prune --host {host.name}`"
        return DiskSpaceError(host.name, runs, size, free, f"run {run_id}", advice)
    return JobError(f"{host.name}: cannot write run {run_id} in {runs}: {stderr_reason(stderr)}")


def launch_and_follow(
    host: Host,
    entry: EvalHost,
    run_id: str,
    command: str,
    params: dict,
    say: Callable[[str], None],
    on_events: Callable[[str], Callable[[dict], None]],
    detach: bool = False,
    private_files: Sequence[str] = (),
) -> Run:
    """Launch `command` as run `run_id` (see `launch`), say where it started, and pass each
    harness event to what `on_events(run_id)` returns until the run ends; return its final
    state. `detach`: return as soon as it started. A Ctrl-C once the run holds the host
    raises Detached: the run goes on there, and the caller says how to reattach; `private_files`:
    see `launch`."""
    try:
        launcher = launch(host, entry, run_id, command, params, private_files)
        say(f"{host.name}: run {run_id} started ({launcher}) in {run_dir(entry, run_id)}")
        if detach:
            return wait_finished(host, entry, run_id, timeout=0)
        on_event = on_events(run_id)
        return follow(
            host,
            entry,
            run_id,
            "events.jsonl",
            lambda line: [on_event(event) for event in parse_events([line])],
        )
    except KeyboardInterrupt:
        # Ctrl-C may land while the launch is still confirming the start: once the run
        # holds the host it goes on, and the user needs to hear how to reattach.
        if start_state(host, entry, run_id) != "started":
            raise
        raise Detached(run_id, host.name) from None


def start_state(host: Host, entry: EvalHost, run_id: str) -> str:
    """Where a launched run stands: started (its wrapper holds the host's lock, or it has
    already finished), refused (another run holds the lock), waiting, or absent."""
    quoted = shlex.quote(run_dir(entry, run_id))
    probe = (
        f"cd {quoted} 2>/dev/null || {{ echo absent; exit; }}; if [ -f refused ]; then "
        "echo refused; elif [ -f pid ] || [ -f exit_code ]; then echo started; "
        "else echo waiting; fi"
    )
    return host.run(probe).stdout.strip()


def _wait_started(host: Host, entry: EvalHost, run_id: str, timeout: float = 20) -> None:
    quoted = shlex.quote(run_dir(entry, run_id))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = start_state(host, entry, run_id)
        if answer == "started":
            return
        if answer == "refused":
            holder = [
                run for run in list_runs(host, entry) if not run.done and run.run_id != run_id
            ]
            host.run(f"rm -rf -- {quoted}")
            raise HostBusy(
                _busy_message(host.name, holder[0])
                if holder
                else f"{host.name}: another run took the host's eval lock first; retry"
            )
        time.sleep(0.2)
    raise JobError(
        f"{host.name}: run {run_id} did not start within {timeout:.0f} s; see "
        f"{run_dir(entry, run_id)}/log on the host"
    )


def _busy_message(host: str, run: Run) -> str:
    return (
        f"{host} is busy with run {run.run_id} (step {run.step}, {run.state} since "
        f"{_when(run.started)}): one run per eval host at a time. Wait for it "
        f"(`fab eval-logs --id {run.run_id} --follow`), cancel it (`fab eval-cancel --id "
        f"{run.run_id}`), or use another eval host (--host)."
    )


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "?"
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# --- listing -------------------------------------------------------------------------------


def list_runs(
    host: Host, entry: EvalHost, run_id: str | None = None, unfinished: bool = False
) -> list[Run]:
    """The host's runs (run_listing.runs_probe: `run_id` alone, or the `unfinished` ones)."""
    probe = runs_probe(host.name, entry, run_id, unfinished)
    listed = host.run(probe.command, check=False)
    if listed.exit_code == DENIED_EXIT:
        raise JobError(
            f"{host.name}: cannot list the runs in {runs_dir(entry)}: "
            f"{stderr_reason(listed.stderr)}.{host.root_hint()}"
        )
    if not listed.ok:
        raise RemoteCommandError(host.name, "list the runs", listed.exit_code, listed.stderr)
    return probe.parse(listed.stdout)


def find_run(
    hosts: dict[str, tuple[Host, EvalHost]], run_id: str | None
) -> tuple[Host, EvalHost, Run]:
    """The run this id names (the id, its short id, any unique part: run_ids.match) on any of
    the hosts; None: the only running run, else the newest one."""
    found = [(host, entry, run) for host, entry in hosts.values() for run in list_runs(host, entry)]
    where = f"on {', '.join(hosts)}"
    if not found:
        raise JobError(f"no runs {where} yet; start one with `fab run-eval --step N`")
    if run_id is not None:
        chosen = run_ids.match([run.run_id for _, _, run in found], run_id, where)
        return next(match for match in found if match[2].run_id == chosen)
    running = [match for match in found if not match[2].done]
    if len(running) > 1:
        names = ", ".join(f"{run.run_id} ({host.name})" for host, _, run in running)
        raise JobError(f"several runs are running ({names}); pass --id with one of them")
    return running[0] if running else max(found, key=lambda match: match[2].started or 0)


# --- following -----------------------------------------------------------------------------


def follow(
    host: Host, entry: EvalHost, run_id: str, file: str, on_line: Callable[[str], None]
) -> Run:
    """Stream `file` of the run (from its start) until the run ends; return its final state.

    Reading stops when the harness process exits; the caller's Ctrl-C stops only this
    reader, never the remote run."""
    directory = shlex.quote(run_dir(entry, run_id))
    quoted = shlex.quote(file)
    # Followed only while the pid file names the run's own harness (see process_claims);
    # otherwise the file is printed as it is. tail checks the pid every -s seconds (default
    # 1, a second added to every run).
    command = (
        f"{process_claims.SHELL}cd {directory} || exit 1; "
        "while [ ! -f pid ] && [ ! -f exit_code ]; do sleep 0.2; "
        f"done; touch {quoted}; dflash_claim pid; "
        f'if [ "$dflash_verdict" = live ]; then '
        f"exec tail -n +1 -F -s {FOLLOW_PID_INTERVAL_S} "
        f'--pid="$dflash_pid" {quoted} 2>/dev/null; fi; '
        f"exec tail -n +1 {quoted} 2>/dev/null"
    )
    reader = subprocess.Popen(
        host.ssh_argv(command),
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        bufsize=1,
    )
    try:
        assert reader.stdout is not None
        for line in reader.stdout:
            on_line(line.rstrip("\n"))
    finally:
        if reader.poll() is None:
            reader.terminate()
        reader.wait()
    return wait_finished(host, entry, run_id)


def wait_finished(host: Host, entry: EvalHost, run_id: str, timeout: float = 15) -> Run:
    """The run's state once its wrapper has recorded the exit code (it does so right after
    the harness exits)."""
    deadline = time.monotonic() + timeout
    while True:
        run = _one_run(host, entry, run_id)
        if run.done or time.monotonic() > deadline:
            return run
        time.sleep(0.3)


def _one_run(host: Host, entry: EvalHost, run_id: str) -> Run:
    for run in list_runs(host, entry, run_id):
        if run.run_id == run_id:
            return run
    raise JobError(f"{host.name}: run {run_id} not found under {runs_dir(entry)}")


def log_tail(host: Host, entry: EvalHost, run_id: str, lines: int = 30) -> str:
    path = shlex.quote(f"{run_dir(entry, run_id)}/log")
    return host.run(f"tail -n {int(lines)} {path} 2>/dev/null || true").stdout


# --- cancelling and fetching ---------------------------------------------------------------


def cancel(host: Host, entry: EvalHost, run: Run) -> None:
    """SIGTERM to the run's harness, and only when the host finds that its pid file names the
    run's own harness (see process_claims), checked in the same command as the signal."""
    if run.exit_code is not None or run.state == "cancelled":
        raise JobError(f"run {run.run_id} on {host.name} already {run.state}; nothing to cancel")
    directory = run_dir(entry, run.run_id)
    answer = host.run(
        f"{process_claims.SHELL}cd {shlex.quote(directory)} || exit 1; dflash_claim pid; "
        'if [ "$dflash_verdict" = live ]; then '
        'touch cancelled && kill -TERM "$dflash_pid" && echo signalled; '
        f"else echo {process_claims.SAID}; fi",
        check=False,
    )
    if not answer.ok:
        raise JobError(
            f"{host.name}: cannot cancel the run in {directory}: {stderr_reason(answer.stderr)}"
        )
    if answer.stdout.strip() != "signalled":
        raise JobError(_not_signalled(host.name, directory, parse_claim(answer.stdout)))


def _not_signalled(host: str, directory: str, claim: Claim) -> str:
    why = doubt(claim, "pid", host) or {
        "none": "it has not started its harness yet; retry in a moment",
        "gone": f"not running: its harness (process {claim.pid}) has ended",
    }.get(claim.verdict, claim.verdict)
    return f"{host}: nothing signalled for the run in {directory}: {why}"


def fetch(host: Host, entry: EvalHost, run: Run, results_root: Path) -> Path | None:
    """Copy a finished run's files into `results_root/<run-id>/` (whole or not at all, see
    dflash_ops.evaluation.pulled); None when it was already there, so fetching twice changes
    nothing."""
    if (results_root / run.run_id / "run.json").exists():
        return None
    remote = run_dir(entry, run.run_id)
    files = {}
    for name in RUN_FILES:
        try:
            data = host.download(f"{remote}/{name}")
        except OSError as exc:
            raise RemoteCommandError(host.name, f"get {remote}/{name}", 1, str(exc)) from None
        if data is not None:  # a failed run has no results.json: none is written here either
            files[name] = data
    summary = {
        "run_id": run.run_id,
        "host": host.name,
        "state": run.state,
        "tag": run.params.get("tag"),
        "training_run": run.params.get("training_run"),
        "exit_code": run.exit_code,
        "step": run.step,
        "started": run.started,
        "finished": run.finished,
        "remote_dir": remote,
        "problem": run.problem,
    }
    files["run.json"] = (json.dumps(summary, indent=2) + "\n").encode()
    return store_run(results_root, run.run_id, files)


# --- across every eval host ----------------------------------------------------------------


def all_runs(inventory: Inventory) -> list[Run]:
    """Every run on every eval or features host (evaluations and feature extractions),
    oldest first."""
    runs = []
    for name, entry in inventory.harness_hosts.items():
        host = Host(inventory, name)
        try:
            runs += list_runs(host, entry)
        finally:
            host.close()
    return sorted(runs, key=lambda run: run.started or 0)


def locate(inventory: Inventory, run_id: str | None) -> tuple[Host, EvalHost, Run]:
    """The run with this id (or unique part; None: the running or newest one) on any eval or
    features host, with its host left open for what the caller does next."""
    hosts = {
        name: (Host(inventory, name), entry) for name, entry in inventory.harness_hosts.items()
    }
    return find_run(hosts, run_id)


def fetch_finished(inventory: Inventory, on_pulled: Callable[[str, Run], None]) -> int:
    """Pull every finished run not pulled yet from every eval host into the inventory's
    local results; `on_pulled(host, run)` after each. Returns how many were pulled."""
    pulled = 0
    for host, entry in each_eval_host(inventory):
        for run in list_runs(host, entry):
            if run.done and fetch(host, entry, run, inventory.local.results):
                on_pulled(host.name, run)
                pulled += 1
    return pulled
