"""Detached runs on an eval host: launch, list, follow, cancel, fetch.

A run lives in `{workdir}/runs/<run-id>/` on the eval host: `params.json` (what was asked),
`run.sh` (the wrapper), `events.jsonl` (the harness's stdout: JSON-line events), `log` (its
stderr), `pid`, `exit_code` and `results.json`. The wrapper is started with `systemd-run` where
systemd manages the host, else `setsid nohup`, so the run survives the workstation going away.
It holds `{workdir}/runs/.lock` with flock for its whole life: one run per host at a time, and a
crashed run releases the lock by itself.
"""

from __future__ import annotations

import json
import secrets
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from dflash_ops.core.errors import OpsError, RemoteCommandError
from dflash_ops.core.files import PRIVATE_DIR_MODE, make_dirs, write_atomic
from dflash_ops.core.inventory import EvalHost, Inventory
from dflash_ops.core.records import RecordError, parse_record
from dflash_ops.evaluation.records import RunParams
from dflash_ops.remote.connection import Host, each_eval_host, stderr_reason, with_umask
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.remote.probes import Probe

RUN_FILES = ("params.json", "events.jsonl", "log", "results.json")
BUSY_EXIT = 75  # the wrapper's exit code when another run holds the host's lock
DENIED_EXIT = 77  # the runs listing's exit code when the login may not enter the runs dir
PARAMS_BYTES = 1 << 20  # params.json read back at most (the tool writes a few hundred bytes)


class JobError(OpsError):
    """A run could not be launched, found or followed."""


class Detached(Exception):
    """The user stopped following (Ctrl-C); the remote run goes on."""

    def __init__(self, run_id: str, host: str) -> None:
        super().__init__(run_id, host)
        self.run_id, self.host = run_id, host


@dataclass(frozen=True)
class Run:
    run_id: str
    host: str
    state: str  # starting | running | succeeded | failed | cancelled | lost | broken
    exit_code: int | None
    params: dict
    finished: float | None  # epoch seconds when exit_code was written
    problem: str | None = None  # why its files cannot be read (state "broken")

    @property
    def step(self) -> int | None:
        return self.params.get("step")

    @property
    def started(self) -> float | None:
        return self.params.get("started")

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled", "lost", "broken")


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


def wrapper_script(entry: EvalHost, run_id: str, command: str) -> str:
    """The shell wrapper that runs `command` in the run directory and records its exit code."""
    lock = shlex.quote(f"{runs_dir(entry)}/.lock")
    return "\n".join(
        [
            "#!/bin/sh",
            "# Written by dflash-ops: run the harness detached, one run per host (flock), and",
            "# record its pid and exit code next to its output.",
            f"cd {shlex.quote(run_dir(entry, run_id))} || exit 1",
            "umask 077",
            "echo $$ > wrapper.pid",
            f"exec 9>>{lock}",
            f"flock -n 9 || {{ echo busy > refused; exit {BUSY_EXIT}; }}",
            f"{command} > events.jsonl 2> log &",
            "echo $! > pid.tmp && mv pid.tmp pid",
            "wait $!",
            "echo $? > exit_code.tmp && mv exit_code.tmp exit_code",
            "",
        ]
    )


def launch(host: Host, entry: EvalHost, run_id: str, command: str, params: dict) -> str:
    """Start `command` detached in a new run directory; return how it was started. Refuses
    clearly when another run holds the host."""
    busy = [run for run in list_runs(host, entry) if not run.done]
    if busy:
        raise JobError(_busy_message(host.name, busy[0]))
    directory = run_dir(entry, run_id)
    params = {**params, "run_id": run_id, "host": host.name, "started": time.time()}
    script = wrapper_script(entry, run_id, command)
    quoted = shlex.quote(directory)
    # Run directories are the user's own (umask 077): their logs may quote prompts and paths.
    host.run(
        with_umask(
            "077",
            f"mkdir -p {quoted} && cd {quoted} && "
            f"printf '%s' {shlex.quote(json.dumps(params))} > params.json && "
            f"printf '%s' {shlex.quote(script)} > run.sh",
        )
    )
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


def launch_and_follow(
    host: Host,
    entry: EvalHost,
    run_id: str,
    command: str,
    params: dict,
    say: Callable[[str], None],
    on_events: Callable[[str], Callable[[dict], None]],
    detach: bool = False,
) -> Run:
    """Launch `command` as run `run_id` (see `launch`), say where it started, and pass each
    harness event to what `on_events(run_id)` returns until the run ends; return its final
    state. `detach`: return as soon as it started. A Ctrl-C once the run holds the host
    raises Detached: the run goes on there, and the caller says how to reattach."""
    try:
        launcher = launch(host, entry, run_id, command, params)
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
            raise JobError(
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


def runs_probe(host_name: str, entry: EvalHost) -> Probe[list[Run]]:
    """Every run on the host. No runs directory yet: no runs; one the login may not enter
    (a non-root login without `become`) exits DENIED_EXIT, so it does not read as none."""
    runs = shlex.quote(runs_dir(entry))
    command = (
        f"why=$(cd {runs} 2>&1) || {{ case $why in *'ermission denied'*) "
        f'echo "$why" >&2; exit {DENIED_EXIT};; esac; exit 0; }}; cd {runs} || exit 0; '
        'for d in */; do d=${d%/}; [ -f "$d/params.json" ] || continue; '
        'code=$(cat "$d/exit_code" 2>/dev/null || echo -); '
        'pid=$(cat "$d/pid" 2>/dev/null || echo -); '
        'alive=no; for p in "$pid" "$(cat "$d/wrapper.pid" 2>/dev/null)"; do '
        '[ -n "$p" ] && [ "$p" != - ] && kill -0 "$p" 2>/dev/null && alive=yes; done; '
        'results=no; [ -f "$d/results.json" ] && results=yes; '
        '[ -f "$d/cancelled" ] && results=cancelled; '
        'finished=$(stat -c %Y "$d/exit_code" 2>/dev/null || echo -); '
        # One record per run, NUL-ended, tabs and newlines in the name made byte 1 (a control
        # character: such a run is listed broken). params.json is cut at PARAMS_BYTES (a
        # longer one fails to parse, and is named broken).
        "name=$(printf %s \"$d\" | tr '\\t\\n\\r' '\\001\\001\\001'); "
        'printf \'%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\0\' "$name" "$code" "$pid" "$alive" '
        f'"$results" "$finished" "$(head -c {PARAMS_BYTES} "$d/params.json" | tr -d \'\\n\\0\')"; '
        "done"
    )
    return Probe(command, lambda output: parse_runs(host_name, output))


def parse_runs(host_name: str, output: str, now: float | None = None) -> list[Run]:
    now = time.time() if now is None else now
    runs = []
    for line in output.split("\0"):
        if not line.strip():
            continue
        run_id, code, pid, alive, results, finished, params = line.split("\t", 6)
        params_data, problem = _params(params)
        if not run_id.isprintable():
            run_id = run_id.encode("unicode_escape").decode("ascii")
            params_data, problem = {}, "its directory name holds control characters"
        exit_code = int(code) if code.lstrip("-").isdigit() else None
        if results == "cancelled":  # `fab eval-cancel` marks the run before killing it
            state = "cancelled" if exit_code is not None or alive != "yes" else "running"
        elif exit_code is not None:
            # An eval run's product is results.json; a features run's is its feature set.
            produced = results == "yes" or params_data.get("kind") == "features"
            state = "succeeded" if exit_code == 0 and produced else "failed"
        elif alive == "yes":
            state = "running"
        elif pid == "-" and now - params_data.get("started", 0) < 30:
            state = "starting"
        else:
            state = "lost"  # the wrapper died without recording an exit code
        if problem and state in ("starting", "lost"):
            state = "broken"
        runs.append(
            Run(
                run_id,
                host_name,
                state,
                exit_code,
                params_data,
                float(finished) if finished != "-" else None,
                problem,
            )
        )
    return sorted(runs, key=lambda run: run.started or 0)


def _params(text: str) -> tuple[dict, str | None]:
    """A run's params.json, or ({}, why not): one damaged run directory (a truncated write,
    a full disk, a text where a number goes) must not make every listing of the host fail."""
    if not text:
        return {}, None
    try:
        params = parse_record(text, "params.json", RunParams)
    except RecordError as exc:
        return {}, str(exc)
    return params.model_dump(exclude_unset=True), None


def list_runs(host: Host, entry: EvalHost) -> list[Run]:
    probe = runs_probe(host.name, entry)
    listed = host.run(probe.command, check=False)
    if listed.exit_code == DENIED_EXIT:
        raise JobError(
            f"{host.name}: cannot list the runs in {runs_dir(entry)}: "
            f"{stderr_reason(listed.stderr)}.{host.root_hint()}"
        )
    if not listed.ok:
        raise RemoteCommandError(host.name, "list the runs", listed.exit_code, listed.stderr)
    return probe.parse(listed.stdout)


def find_run(hosts: dict[str, tuple[Host, EvalHost]], run_id: str) -> tuple[Host, EvalHost, Run]:
    """The run with this id (or unique id prefix) on any of the hosts."""
    matches = [
        (host, entry, run)
        for host, entry in hosts.values()
        for run in list_runs(host, entry)
        if run.run_id.startswith(run_id)
    ]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise JobError(f"no run {run_id!r} on {', '.join(hosts)}; `fab eval-status` lists runs")
    names = ", ".join(run.run_id for _, _, run in matches)
    raise JobError(f"{run_id!r} matches several runs ({names}); give more of the id")


# --- following -----------------------------------------------------------------------------


def follow(
    host: Host, entry: EvalHost, run_id: str, file: str, on_line: Callable[[str], None]
) -> Run:
    """Stream `file` of the run (from its start) until the run ends; return its final state.

    Reading stops when the harness process exits; the caller's Ctrl-C stops only this
    reader, never the remote run."""
    directory = shlex.quote(run_dir(entry, run_id))
    command = (
        f"cd {directory} && while [ ! -f pid ] && [ ! -f exit_code ]; do sleep 0.2; "
        f"done; touch {shlex.quote(file)}; "
        f'exec tail -n +1 -F --pid="$(cat pid 2>/dev/null || echo 1)" '
        f"{shlex.quote(file)} 2>/dev/null"
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
    for run in list_runs(host, entry):
        if run.run_id == run_id:
            return run
    raise JobError(f"{host.name}: run {run_id} not found under {runs_dir(entry)}")


def parse_events(lines: Iterator[str] | list[str]) -> Iterator[dict]:
    """The JSON events among `lines` (anything else is skipped)."""
    for line in lines:
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and "event" in event:
                yield event


def log_tail(host: Host, entry: EvalHost, run_id: str, lines: int = 30) -> str:
    path = shlex.quote(f"{run_dir(entry, run_id)}/log")
    return host.run(f"tail -n {int(lines)} {path} 2>/dev/null || true").stdout


# --- cancelling and fetching ---------------------------------------------------------------


def cancel(host: Host, entry: EvalHost, run: Run) -> None:
    if run.done:
        raise JobError(f"run {run.run_id} on {host.name} already {run.state}; nothing to cancel")
    directory = shlex.quote(run_dir(entry, run.run_id))
    host.run(f'cd {directory} && touch cancelled && kill -TERM "$(cat pid)"')


def fetch(host: Host, entry: EvalHost, run: Run, results_root: Path) -> Path | None:
    """Copy a finished run's files into `results_root/<run-id>/` (atomically); None when it
    was already there, so fetching twice changes nothing."""
    destination = results_root / run.run_id
    if (destination / "run.json").exists():
        return None
    partial = make_dirs(results_root) / f".{run.run_id}.partial"
    make_dirs(partial, PRIVATE_DIR_MODE)  # as the run directory on the host: its logs
    remote = run_dir(entry, run.run_id)
    for name in RUN_FILES:
        try:
            data = host.download(f"{remote}/{name}")
        except OSError as exc:
            raise RemoteCommandError(host.name, f"get {remote}/{name}", 1, str(exc)) from None
        if data is not None:  # a failed run has no results.json: none is written here either
            write_atomic(partial / name, data)
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
    write_atomic(partial / "run.json", json.dumps(summary, indent=2) + "\n")
    partial.replace(destination)
    return destination


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


def locate(inventory: Inventory, run_id: str) -> tuple[Host, EvalHost, Run]:
    """The run with this id (or unique prefix) on any eval or features host, with its host
    left open for what the caller does next."""
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
