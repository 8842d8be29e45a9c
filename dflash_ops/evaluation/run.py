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
    InventoryError,
    NotOursError,
    ResultsError,
)
from dflash_ops.core.files import write_atomic
from dflash_ops.core.inventory import EvalHost, Inventory
from dflash_ops.core.records import RecordError, parse_json
from dflash_ops.core.units import format_bytes
from dflash_ops.evaluation import jobs, set_anchors
from dflash_ops.evaluation.request import EvalRequest, sglang_url
from dflash_ops.evaluation.results import read_results
from dflash_ops.evaluation.tracking import after_pull
from dflash_ops.evaluation.verdict import closing_line
from dflash_ops.provision.harness import deploy_harness
from dflash_ops.provision.state import read_state, venv_problem
from dflash_ops.remote import probes
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.remote.relayed_sets import relayed_set
from dflash_ops.staging.delivery import StagedCheckpoint, StageOptions
from dflash_ops.staging.disk import margin_of, space_check
from dflash_ops.staging.relay import ProgressCallback
from dflash_ops.staging.stage import stage
from dflash_ops.staging.strip import nothing_to_strip

# Makes a progress callback for one transfer from its label and its total bytes.
TransferProgress = Callable[[str, int], ProgressCallback]

EXTRACT_RECORD = "dflash_extract.json"  # what the harness's extract records beside the copy
NOT_OURS = "@@not-ours"
SGLANG_URL_FILE = "sglang-url"  # the private upload; its run's wrapper removes it

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
                _pickle_args(request, profile),
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


def run_flag(inventory: Inventory) -> str:
    """` --run NAME` for the hints of a named training run's commands ('' for the default)."""
    return f" --run {inventory.training_run}" if inventory.training_run else ""


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


def extract(
    inventory: Inventory,
    host: Host,
    entry: EvalHost,
    harness: str,
    staged: StagedCheckpoint,
    pickle_args: list[str],
    say: Callable[[str], None],
) -> str:
    """Strip optimizer state on the eval host with the harness's `extract`; return the
    extracted directory to evaluate. A copy is reused only when it was extracted from the
    bytes staging verified (its record names their sha256): a re-staged step is extracted
    again, and a staged file that no longer hashes as staged is refused."""
    checkpoint, out = staged.path, EvalLayout.extracted(staged.path)
    quoted = shlex.quote(out)
    made_from = _extracted_from(host, out)
    if made_from == staged.sha256:
        say(f"{host.name}: reusing {out} (extracted from sha256 {staged.sha256[:16]}…)")
        return out
    if made_from is not None:
        say(
            f"{host.name}: {out} was extracted from sha256 {made_from[:16]}…, the staged "
            f"checkpoint is now {staged.sha256[:16]}…: extracting again"
        )
    directory = out.rpartition("/")[0] or "/"
    free = host.probe(probes.free_bytes(directory))
    space_check(host.name, directory, free, staged.size, margin_of(inventory), "extract").require()
    python = shlex.quote(EvalLayout(entry).python)
    result = host.run(
        f"cd {shlex.quote(harness)} && {python} -m dflash_eval extract --checkpoint "
        f"{shlex.quote(checkpoint)} --out {quoted}.tmp {shlex.join(pickle_args)} && "
        f"rm -rf {quoted} && "
        f"mv {quoted}.tmp {quoted}",
        check=False,
    )
    if not result.ok:
        # The harness explains an expected failure in a paragraph on stderr: pass it on whole.
        raise HostError(
            host.name,
            f"extracting {checkpoint} failed: {result.stderr.strip() or 'no error output'}",
        )
    if _extracted_from(host, out) != staged.sha256:
        host.run(f"rm -rf -- {quoted}", check=False)
        raise CheckpointError(
            f"{host.name}: {checkpoint} does not hash to the sha256 staging verified "
            f"({staged.sha256[:16]}…): it changed or is corrupt on disk. Re-stage it: fab "
            f"stage-checkpoint --step {staged.step}{run_flag(inventory)} --to {host.name} --verify"
        )
    say(f"{host.name}: optimizer state stripped → {out}")
    return out


def _extracted_from(host: Host, extracted: str) -> str | None:
    """The source sha256 an extracted copy records (None: no complete copy there). What stands
    there without extract's record was not made by the tool: refused, never replaced."""
    q = shlex.quote(extracted)
    answer = host.run(
        f"if [ -f {q}/{EXTRACT_RECORD} ]; then cd {q} && test -f model.safetensors && "
        f"cat -- {EXTRACT_RECORD}; elif {probes.occupied(extracted)}; then echo {NOT_OURS}; fi",
        check=False,
    )
    if answer.stdout.strip() == NOT_OURS:
        raise NotOursError(
            host.name,
            extracted,
            f"is where the extracted checkpoint goes, but holds no {EXTRACT_RECORD}",
            "Move it away (or remove it) yourself, then run again.",
        )
    try:
        record = parse_json(answer.stdout, EXTRACT_RECORD) if answer.ok else None
    except RecordError:
        return None
    source = record.get("source_sha256") if isinstance(record, dict) else None
    return source if isinstance(source, str) else None


def harness_command(
    host: Host,
    entry: EvalHost,
    harness: str,
    checkpoint: str,
    run_id: str,
    request: EvalRequest,
    profile: dict | None = None,
    training_run: str | None = None,
    features: str | None = None,
    subcommand: str = "eval",
) -> str:
    """The harness invocation for the run's wrapper (it runs in the run directory); the
    training run, when named, is recorded in the results' checkpoint block; `features`: a
    relayed feature set's directory on the host, used instead of the cache. `subcommand`:
    `eval` writes results.json; another (`diagnose`) writes SUBCOMMAND.json."""
    layout = EvalLayout(entry)
    directory = layout.run(run_id)
    out = "results.json" if subcommand == "eval" else f"{subcommand}.json"
    argv = [
        layout.python,
        "-m",
        "dflash_eval",
        subcommand,
        "--checkpoint",
        checkpoint,
        "--target",
        entry.target_model,
        "--out",
        f"{directory}/{out}",
        "--step",
        str(request.step),
        "--cache-dir",
        layout.cache,
        *(["--training-run", training_run] if training_run else []),
    ]
    argv += host_inputs_argv(host, entry, request)
    if features:
        argv += ["--features", features]
    uploads = _uploads(entry, request, profile, sglang_url(request, host.name, entry))
    if uploads:
        host.run(f"mkdir -p {shlex.quote(layout.runs)}")
    for flag, data, name, private in uploads:
        remote = upload_path(entry, name, run_id)
        host.upload(data, remote, private=private)
        argv += [flag, f"@{remote}" if flag == "--sglang-url" else remote]
    argv += host_defaults_argv(entry, request, profile) + request.harness_args
    return f"env PYTHONPATH={shlex.quote(harness)} {shlex.join(argv)}"


def host_inputs_argv(host: Host, entry: EvalHost, request: EvalRequest) -> list[str]:
    """The reference drafter the inventory names for this host, when asked for; refuses
    --reference that the host's inventory entry cannot serve."""
    if not request.reference:
        return []
    if not entry.reference_drafter:
        raise HostError(
            host.name, "--reference needs `reference_drafter` for this host in the inventory"
        )
    return ["--reference-drafter", entry.reference_drafter]


def host_defaults_argv(entry: EvalHost, request: EvalRequest, profile: dict | None) -> list[str]:
    """The host's thread count and the profile's target dtype, unless the command line
    gives its own."""
    argv = []
    if entry.threads and "--threads" not in request.harness_args:
        argv += ["--threads", str(entry.threads)]
    target_dtype = (profile or {}).get("target_dtype")
    if target_dtype and "--target-dtype" not in request.harness_args:
        argv += ["--target-dtype", target_dtype]
    return argv


def upload_path(entry: EvalHost, name: str, run_id: str) -> str:
    """Where the run's uploaded file `name` lives on the host (beside the run directories)."""
    return f"{EvalLayout(entry).runs}/.{name}-{run_id}"


def _uploads(
    entry: EvalHost, request: EvalRequest, profile: dict | None, url: str | None
) -> list[tuple[str, bytes, str, bool]]:
    """(harness flag, content, file name, private) of each file the run needs on the host.
    The SGLang URL goes through a private file: it may carry credentials, which must not
    reach argv, `ps`, the run's recorded command or its log. It comes last: an upload that
    fails before it leaves no credentials on the host (the run's wrapper removes them)."""
    uploads = []
    if request.prompts is not None:
        uploads.append(("--prompts", request.prompts.read_bytes(), "prompts.jsonl", False))
    if request.drafter_config is not None:
        config = request.drafter_config.read_bytes()
        uploads.append(("--drafter-config", config, "drafter-config.json", False))
    if profile is not None:
        harness_profile = {k: v for k, v in profile.items() if k != "target_dtype"}
        data = json.dumps(harness_profile, indent=2).encode()
        uploads.append(("--drafter-profile", data, "drafter-profile.json", False))
    if url is not None:
        uploads.append(("--sglang-url", url.encode(), SGLANG_URL_FILE, True))
    return uploads


def _pickle_args(request: EvalRequest, profile: dict | None) -> list[str]:
    """The pickle policy of the run's own evaluation, for `extract` to read the same file."""
    args = request.harness_args
    names = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--safe-globals"]
    names += (profile or {}).get("safe_globals", [])
    unsafe = ["--allow-unsafe-pickle"] if "--allow-unsafe-pickle" in args else []
    return (["--safe-globals", ",".join(names)] if names else []) + unsafe


def drafter_profile(inventory: Inventory) -> dict | None:
    """The inventory's drafter profile as the harness reads it (its config file inlined)."""
    spec = inventory.trainer.drafter
    if spec is None:
        return None
    profile = spec.model_dump(exclude_none=True, exclude={"config_file"})
    if spec.config_file is not None:
        path = inventory.path.parent / spec.config_file
        key = f"hosts.{inventory.trainer_name}"
        run = inventory.training_run
        if run and inventory.trainer.runs[run].drafter is not None:
            key += f".runs.{run}"  # the run's own profile (for_run put it in the trainer's)
        try:
            profile["config"] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InventoryError(
                f"{inventory.path}: {key}.drafter.config_file: cannot read {path} as JSON "
                f"({exc}); fix the path or the file"
            ) from None
    return profile
