"""What a host's runs directory says: each run's state, read in one round trip.

`runs_probe` lists `{workdir}/runs/*/` with each run's exit code, the host's verdict on its
harness's and wrapper's pid files (remote/process_claims.py: a pid counts only if its process
started when the run recorded), results, latest event, a finished run's last log line (a
failed run's reason) and params, one NUL-ended record per run; `parse_runs` turns that into
`Run`s.
params.json is read through the one reader (core/records.py): one damaged run directory (a
truncated params.json, a text where a number goes, a name with control characters) is
listed as broken, never fatal to the listing.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass

from dflash_ops.core.inventory import EvalHost
from dflash_ops.core.records import RecordError, parse_json, parse_record
from dflash_ops.evaluation.records import RunParams
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.remote.probes import Probe
from dflash_ops.remote.process_claims import SAID, SHELL, Claim, doubt, parse_claim

DENIED_EXIT = 77  # the runs listing's exit code when the login may not enter the runs dir
PARAMS_BYTES = 1 << 20  # params.json read back at most (the tool writes a few hundred bytes)
EVENT_BYTES = 1 << 16  # of the latest event (a progress line is a few hundred bytes)
REASON_BYTES = 300  # of a finished run's last log line (a failed run's reason)


@dataclass(frozen=True)
class Run:
    run_id: str
    host: str
    # starting | running | succeeded | failed | cancelled | lost | broken | unverified (its
    # pid file records no start time and names a live process: see process_claims)
    state: str
    exit_code: int | None
    params: dict
    finished: float | None  # epoch seconds when exit_code was written
    problem: str | None = None  # why it failed, or its files cannot be read or trusted
    last_event: dict | None = None  # the harness's latest progress (or done) event

    @property
    def step(self) -> int | None:
        return self.params.get("step")

    @property
    def started(self) -> float | None:
        return self.params.get("started")

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled", "lost", "broken")


def runs_probe(
    host_name: str, entry: EvalHost, run_id: str | None = None, unfinished: bool = False
) -> Probe[list[Run]]:
    """Every run on the host; `run_id`: that run alone; `unfinished`: only the runs without
    an exit code (the others are all done). Each run read costs a few processes on the host,
    so a host with hundreds of runs takes seconds to list them all. No runs directory yet: no
    runs; one the login may not enter (a non-root login without `become`) exits DENIED_EXIT,
    so it does not read as none."""
    runs = shlex.quote(EvalLayout(entry).runs)
    which = "*/" if run_id is None else f"{shlex.quote(run_id)}/"
    finished = '[ -f "$d/exit_code" ] && continue; ' if unfinished else ""
    command = (
        f"{SHELL}why=$(cd {runs} 2>&1) || {{ case $why in *'ermission denied'*) "
        f'echo "$why" >&2; exit {DENIED_EXIT};; esac; exit 0; }}; cd {runs} || exit 0; '
        f'for d in {which}; do d=${{d%/}}; [ -f "$d/params.json" ] || continue; {finished}'
        'code=$(cat "$d/exit_code" 2>/dev/null || echo -); '
        # Liveness is the host's verdict on each recorded pid (process_claims), never kill -0.
        f'dflash_claim "$d/pid"; harness={SAID}; '
        f'dflash_claim "$d/wrapper.pid"; wrapper={SAID}; '
        # An eval's product is results.json, a diagnosis's diagnose.json.
        "results=no; for r in results.json diagnose.json; do "
        '[ -f "$d/$r" ] && results=yes; done; '
        '[ -f "$d/cancelled" ] && results=cancelled; '
        'finished=$(stat -c %Y "$d/exit_code" 2>/dev/null || echo -); '
        'last=$(tail -n 50 "$d/events.jsonl" 2>/dev/null | grep -aE '
        '\'^[{]"event": "(progress|done)"\' | tail -n 1 | '
        f"head -c {EVENT_BYTES} | tr -d '\\t\\0'); "
        # One record per run, NUL-ended, tabs and newlines in the name made byte 1 (a control
        # character: such a run is listed broken). params.json is cut at PARAMS_BYTES (a
        # longer one fails to parse, and is named broken).
        "name=$(printf %s \"$d\" | tr '\\t\\n\\r' '\\001\\001\\001'); "
        # A finished run's last log line: a failed run's reason (where the harness, Python
        # and the shell say why).
        'reason=-; [ "$code" = - ] || reason=$(tail -n 50 "$d/log" 2>/dev/null | '
        f"grep -a '[^[:space:]]' | tail -n 1 | head -c {REASON_BYTES} | tr -d '\\t\\r\\0'); "
        'printf \'%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\0\' "$name" "$code" "$harness" '
        '"$wrapper" "$results" "$finished" "${last:--}" "${reason:--}" '
        f'"$(head -c {PARAMS_BYTES} "$d/params.json" | tr -d \'\\n\\0\')"; '
        "done"
    )
    return Probe(command, lambda output: parse_runs(host_name, output))


def parse_runs(host_name: str, output: str, now: float | None = None) -> list[Run]:
    now = time.time() if now is None else now
    runs = []
    for line in output.split("\0"):
        if not line.strip():
            continue
        run_id, code, harness, wrapper, results, finished, last, reason, params = line.split(
            "\t", 8
        )
        params_data, problem = _params(params)
        if not run_id.isprintable():
            run_id = run_id.encode("unicode_escape").decode("ascii")
            params_data, problem = {}, "its directory name holds control characters"
        exit_code = int(code) if code.lstrip("-").isdigit() else None
        claims = (parse_claim(harness), parse_claim(wrapper))
        alive = any(claim.live for claim in claims)
        if results == "cancelled":  # `fab eval-cancel` marks the run before killing it
            state = "cancelled" if exit_code is not None or not alive else "running"
        elif exit_code is not None:
            # An eval's (or a diagnosis's) product is its JSON; a features run's, its set.
            produced = results == "yes" or params_data.get("kind") == "features"
            state = "succeeded" if exit_code == 0 and produced else "failed"
            if state == "failed" and not problem:
                problem = failure_reason(exit_code, reason)
        elif alive:
            state = "running"
        elif claims[0].verdict == "none" and now - params_data.get("started", 0) < 30:
            state = "starting"
        elif problem:
            state = "broken"
        else:  # the wrapper died without recording an exit code, or its pid files say why not
            state, problem = _unconfirmed(claims, host_name)
        runs.append(
            Run(
                run_id,
                host_name,
                state,
                exit_code,
                params_data,
                float(finished) if finished != "-" else None,
                problem,
                next(parse_events([last]), None),
            )
        )
    return sorted(runs, key=lambda run: run.started or 0)


def _unconfirmed(claims: tuple[Claim, Claim], host: str) -> tuple[str, str | None]:
    """The state of a run with no exit code and no live process of its own, with the reason
    its pid files give (the harness's first, then the wrapper's): a malformed one makes the
    run broken, one that cannot be checked unverified, a stale one lost (not running)."""
    named = list(zip(claims, ("pid", "wrapper.pid"), strict=True))
    for verdict, state in (("malformed", "broken"), ("unverifiable", "unverified")):
        for claim, name in named:
            if claim.verdict == verdict:
                return state, doubt(claim, name, host)
    stale = [doubt(claim, name, host) for claim, name in named if claim.verdict == "stale"]
    return "lost", (stale[0] if stale else None)


def failure_reason(exit_code: int, last_line: str) -> str:
    """Why a finished run failed, for listings: its log's last line (the harness's error, a
    traceback's exception), with the signal that ended it; control characters escaped."""
    line = "" if last_line == "-" else last_line.strip()
    if not line.isprintable():
        line = line.encode("unicode_escape").decode("ascii")
    if exit_code > 128:
        ended = f"ended by signal {exit_code - 128}"
        return f"{ended}; its log ends: {line}" if line else ended
    if exit_code == 0:
        return "exited 0 without writing its results"
    return line or f"exit code {exit_code}, nothing in its log"


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


def parse_events(lines: Iterator[str] | list[str]) -> Iterator[dict]:
    """The JSON events among `lines` (anything else, a damaged or too deep line too, is
    skipped), each read through the bounded reader."""
    for line in lines:
        if line.startswith("{"):
            try:
                event = parse_json(line, "event")
            except RecordError:
                continue
            if isinstance(event, dict) and "event" in event:
                yield event
