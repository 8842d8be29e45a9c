"""One evaluation run (`fab run-eval --step N`): stage the checkpoint, make sure the host can
evaluate it, run the harness detached, follow it, and bring the results home.

Orchestration only: bytes move in dflash_ops.staging, hosts are provisioned by
dflash_ops.provision, runs are managed by dflash_ops.evaluation.jobs. What the user sees goes
through a `RunReporter` that the caller passes in (dflash_ops.ui.eval_view implements it with
rich); nothing here imports a view.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path, PurePosixPath
from typing import Protocol

from dflash_eval.contract.schema import Results
from dflash_eval.contract.summary import summary_lines

from dflash_ops.core.errors import (
    CheckpointError,
    EvalFailed,
    HostError,
    ResultsError,
)
from dflash_ops.core.files import write_atomic
from dflash_ops.core.inventory import EvalHost, Inventory
from dflash_ops.core.units import format_bytes
from dflash_ops.evaluation import jobs, set_anchors
from dflash_ops.evaluation.harness_command import (
    SGLANG_URL_FILE,
    drafter_profile,
    harness_command,
    pickle_args,
    upload_path,
)
from dflash_ops.evaluation.host_extract import extract
from dflash_ops.evaluation.request import EvalRequest, run_flag, sglang_url
from dflash_ops.evaluation.results import read_results
from dflash_ops.evaluation.tracking import after_pull
from dflash_ops.evaluation.verdict import closing_line
from dflash_ops.provision.harness import deploy_harness
from dflash_ops.provision.state import read_state, venv_problem
from dflash_ops.remote import probes
from dflash_ops.remote.connection import Host
from dflash_ops.remote.relayed_sets import relayed_set
from dflash_ops.staging.delivery import StagedCheckpoint, StageOptions
from dflash_ops.staging.relay import ProgressCallback
from dflash_ops.staging.stage import stage
from dflash_ops.staging.strip import nothing_to_strip

# Makes a progress callback for one transfer from its label and its total bytes.
TransferProgress = Callable[[str, int], ProgressCallback]


# Bytes of memory per byte of target weights on disk, when loaded for CPU inference.
MEMORY_PER_WEIGHT_BYTE = 1.2


class RunReporter(Protocol):
    """How a run shows itself: a view implements this, the orchestration calls it."""

    def say(self, message: str) -> None:
        """One line for the user (rich markup allowed)."""

    def transfers(self) -> AbstractContextManager[TransferProgress]:
        """Held while the checkpoint is staged; gives each transfer its progress callback."""

    def starting(self, run_id: str) -> None:
        """The run is being launched: from here on it may be running on the host, even if
        this process is stopped before the launch is confirmed."""

    def follow(self, run_id: str) -> Callable[[dict], None]:
        """The run has started: returns what to call with each harness event."""

    def finished(self, run: jobs.Run, summary: list[str], local_dir: Path | None) -> None:
        """The run ended: its state, the results' summary lines, where they were pulled."""


def run_eval(inventory: Inventory, request: EvalRequest, reporter: RunReporter) -> jobs.Run:
    """One evaluation on one eval host, start to finish (or until detached)."""
    name, entry = inventory.eval_host(request.host)
    from_sglang = sglang_url(request, name, entry) is not None  # refused before anything
    host = Host(inventory, name)
    try:
        harness = ensure_ready(host, entry, reporter.say)
        features = relayed_set(host, entry, request.features) if request.features else None
        if features:
            reporter.say(f"{name}: features from {features}")
        warn_if_short_of_memory(host, entry, reporter.say)
        staged = stage_checkpoint(inventory, request.step, name, reporter, request.via)
        checkpoint = staged.path
        profile = drafter_profile(inventory)
        unstrippable = nothing_to_strip(staged.kind) if request.strip_optimizer else None
        if unstrippable:
            reporter.say(f"{name}: --strip-optimizer skipped: {checkpoint} {unstrippable}")
        elif request.strip_optimizer:
            checkpoint = extract(
                inventory,
                host,
                entry,
                harness,
                staged,
                pickle_args(request, profile),
                reporter.say,
            )
        run_id = jobs.new_run_id(request.step, name, request.tag, inventory.training_run)
        command = harness_command(
            host,
            entry,
            harness,
            checkpoint,
            run_id,
            request,
            profile,
            inventory.training_run,
            features,
        )
        params = {
            "step": request.step,
            "tag": request.tag,
            "checkpoint": checkpoint,
            "harness": harness,
            "command": command,
            **({"training_run": inventory.training_run} if inventory.training_run else {}),
        }
        reporter.starting(run_id)
        run = jobs.launch_and_follow(
            host,
            entry,
            run_id,
            command,
            params,
            reporter.say,
            reporter.follow,
            request.detach,
            [upload_path(entry, SGLANG_URL_FILE, run_id)] if from_sglang else [],
        )
        if request.detach:
            reporter.say(
                f"detached. Follow: fab eval-logs --id {run_id} --follow; results: "
                "fab fetch-results"
            )
            return run
        expected = staged if checkpoint == staged.path else None  # not an extracted copy
        return conclude(inventory, host, entry, run, reporter, expected, request.wandb)
    finally:
        host.close()


def stage_checkpoint(
    inventory: Inventory, step: int, host: str, reporter: RunReporter, via: str = "stream"
) -> StagedCheckpoint:
    """The checkpoint of `step` staged on `host` (copied first unless it already is there)."""
    with reporter.transfers() as progress_factory:
        options = StageOptions(report=reporter.say, progress_factory=progress_factory, via=via)
        return stage(inventory, step, [host], options=options)[-1]


def conclude(
    inventory: Inventory,
    host: Host,
    entry: EvalHost,
    run: jobs.Run,
    reporter: RunReporter,
    staged: StagedCheckpoint | None = None,
    wandb_project: str | None = None,
) -> jobs.Run:
    """Fetch a finished run, show its summary; raise EvalFailed when it has no results,
    CheckpointError when the harness read other bytes than staging verified (`staged`), and
    ResultsError when its feature set is not the one the workstation recorded (set_anchors).
    A freshly pulled success gets its training metrics, goes to W&B (`wandb_project`), and
    ends with its verdict (verdict.py)."""
    local = jobs.fetch(host, entry, run, inventory.local.results)
    directory = inventory.local.results / run.run_id
    summary = []
    if run.state == "succeeded":
        try:
            results = read_results(directory / "results.json")
        except ResultsError as exc:
            raise ResultsError(
                f"{host.name}: run {run.run_id} succeeded but its results do not read: {exc}; "
                f"compare its log in {directory} with the harness version"
            ) from None
        summary = summary_lines(results)
        if staged is not None:
            _require_staged_bytes(results, staged, directory, run_flag(inventory))
        flag = set_anchors.flag_of(inventory.local.results, results, host.name)
        if flag is not None:  # kept, and flagged by compare; no training metrics, no W&B
            raise ResultsError(f"run {run.run_id}: {flag}")
    reporter.finished(run, summary, local)
    if run.state != "succeeded":
        raise EvalFailed(run, jobs.log_tail(host, entry, run.run_id))
    if local is not None:
        after_pull(inventory, [run.run_id], reporter.say, wandb_project)
        last = closing_line(inventory.local.results, run.run_id)
        if last is not None:  # what to act on
            reporter.say(last)
    return run


def _require_staged_bytes(
    results: Results, staged: StagedCheckpoint, directory: Path, run: str = ""
) -> None:
    """The sha256 the harness computed of each checkpoint file must be the one staging
    verified: otherwise the file changed (or rotted) on the eval host after it was staged,
    and the numbers belong to unknown weights. The pulled run is marked so `compare` skips it."""
    if staged.files:  # a directory (or extracted set): its files by name
        expected = {record["name"]: record["sha256"] for record in staged.files}
        base = staged.path
    else:
        expected = {PurePosixPath(staged.path).name: staged.sha256}
        base = str(PurePosixPath(staged.path).parent)
    read = {
        posixpath.relpath(record["path"], base): record["sha256"]
        for record in results["checkpoint"]["files"]
    }
    changed = sorted(
        name for name, sha in read.items() if name in expected and expected[name] != sha
    )
    if not changed:
        return
    problem = (
        f"the harness read other bytes than staging verified in {staged.host}:{staged.path} "
        f"({', '.join(changed)}: sha256 {read[changed[0]][:16]}…, staged "
        f"{expected[changed[0]][:16]}…): the staged checkpoint changed or is corrupt"
    )
    run_file = directory / "run.json"
    write_atomic(run_file, json.dumps({**json.loads(run_file.read_text()), "problem": problem}))
    raise CheckpointError(
        f"{problem}. These results are not used by compare. Re-stage it: fab stage-checkpoint "
        f"--step {staged.step}{run} --to {staged.host} --verify (or delete {staged.path} and "
        "rerun)."
    )


def ensure_ready(host: Host, entry: EvalHost, say: Callable[[str], None]) -> str:
    """The deployed harness directory (to put on PYTHONPATH), after checking the venv is
    provisioned; a host that is not gets a clear pointer to setup-eval-host."""
    problem = venv_problem(read_state(host, entry), entry)
    if problem:
        raise HostError(
            host.name,
            f"the eval venv at {entry.venv.path} is not ready "
            f"({problem}); run `fab setup-eval-host --host {host.name}`"
            f"{host.access_hint(entry.venv.path)}",
        )
    deployed = deploy_harness(host, entry, say=say)
    return str(Path(deployed.path).parent)


def warn_if_short_of_memory(host: Host, entry: EvalHost, say: Callable[[str], None]) -> None:
    weights = host.run(
        f"du -sb -- {shlex.quote(entry.target_model)} 2>/dev/null | cut -f1", check=False
    ).stdout.strip()
    if not weights.isdigit():
        raise HostError(
            host.name,
            f"target model {entry.target_model} not found; fix `target_model` in the inventory",
        )
    machine = host.probe(probes.machine())
    needed = int(int(weights) * MEMORY_PER_WEIGHT_BYTE)
    if machine.memory_available < needed:
        say(
            f"[yellow]warning:[/] {host.name} has {format_bytes(machine.memory_available)} "
            f"of memory available; the target at {entry.target_model} "
            f"({format_bytes(int(weights))} on disk) needs about {format_bytes(needed)}. "
            "The run may be killed by the OOM killer."
        )
