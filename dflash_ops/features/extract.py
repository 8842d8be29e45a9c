"""Compute a feature set on the features host: the harness's `features` subcommand, run
detached with the same machinery as an eval run (run directory, flock, events streamed).

The set goes to `{features workdir}/features/<set-id>`; the harness builds it in
`<set-id>.partial` and renames it when complete, so a set with its `feature-set.json` is a
finished one, and asking for it again does nothing. Before a run is launched, the harness
bounds the set's size on the host and the set must fit there with the margin (space.py).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shlex
from dataclasses import dataclass
from datetime import datetime, timezone

from dflash_ops.core.errors import EvalFailed, HostError, OpsError
from dflash_ops.core.inventory import FeaturesHost, Inventory
from dflash_ops.core.records import RecordError, parse_json
from dflash_ops.evaluation import jobs
from dflash_ops.evaluation.run import RunReporter, ensure_ready
from dflash_ops.evaluation.set_anchors import record_made
from dflash_ops.features.space import check_features_host
from dflash_ops.features.spec import SET_RECORD, FeatureRequest, set_id
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.staging.disk import Margin, margin_of

# Prints the target's name and fingerprint as the harness computes them (config and
# tokenizer hashed, weights by name, size, mtime and safetensors header).
TARGET_IDENTITY = (
    "import json, sys\n"
    "from dflash_eval.target.files import target_identity\n"
    "found = target_identity(sys.argv[1])\n"
    "print(json.dumps({'name': found['name'], 'fingerprint': found['fingerprint']}))\n"
)


@dataclass(frozen=True)
class FeatureSet:
    host: str  # the features host that computed it
    set_id: str
    path: str  # on that host
    record: dict  # its feature-set.json
    computed: bool  # False: it was there already


def extract_features(
    inventory: Inventory, host_name: str | None, request: FeatureRequest, reporter: RunReporter
) -> FeatureSet:
    """The set for `request` on the features host: computed now, or found there complete."""
    name, entry = inventory.features_host(host_name)
    host = Host(inventory, name)
    try:
        harness = ensure_ready(host, entry, reporter.say)
        target = _target_identity(host, entry, harness)
        identifier = set_id(request, target["name"], target["fingerprint"])
        path = EvalLayout(entry).feature_set(identifier)
        found = read_set_record(host, path)
        computed = found is None
        if not computed:
            reporter.say(f"{name}: feature set {identifier} already computed ({path})")
        else:
            reporter.say(f"{name}: computing feature set {identifier} → {path}")
            run = _run(host, entry, harness, request, path, reporter, margin_of(inventory))
            found = read_set_record(host, path)
            if found is None:
                raise HostError(
                    name,
                    f"the harness finished but {path}/{SET_RECORD} is missing: the set is not "
                    f"complete. See the run's log (fab eval-logs --id {run.run_id}) and rerun.",
                )
        record, sha256 = found
        record_made(inventory.local.results, identifier, name, path, sha256, computed=computed)
        return FeatureSet(name, identifier, path, record, computed)
    finally:
        host.close()


def read_set_record(host: Host, path: str) -> tuple[dict, str] | None:
    """A complete set's feature-set.json and the sha256 of its bytes (None: no complete set
    at `path`)."""
    try:
        data = host.download(f"{path}/{SET_RECORD}")
    except OSError as exc:
        raise HostError(host.name, f"cannot read {path}/{SET_RECORD}: {exc}") from None
    try:
        record = parse_json(data, SET_RECORD) if data is not None else None
    except RecordError:
        return None
    return (record, hashlib.sha256(data).hexdigest()) if isinstance(record, dict) else None


def _target_identity(host: Host, entry: FeaturesHost, harness: str) -> dict:
    python = shlex.quote(EvalLayout(entry).python)
    answer = host.run(
        f"cd {shlex.quote(harness)} && {python} -c {shlex.quote(TARGET_IDENTITY)} "
        f"{shlex.quote(entry.target_model)}",
        check=False,
    )
    try:
        return json.loads(answer.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise HostError(
            host.name,
            f"cannot read the target model at {entry.target_model} "
            f"({answer.stderr.strip().splitlines()[-1] if answer.stderr.strip() else 'no output'})"
            "; fix `target_model` in the inventory",
        ) from None


def features_command(
    entry: FeaturesHost,
    host_name: str,
    harness: str,
    request: FeatureRequest,
    out: str,
    uploads: dict[str, str],
) -> str:
    """The harness invocation (`uploads`: flag → the uploaded file's path on the host)."""
    argv = [
        EvalLayout(entry).python,
        "-m",
        "dflash_eval",
        "features",
        "--target",
        entry.target_model,
        "--out",
        out,
        "--layers",
        ",".join(map(str, request.layers)),
        "--block-size",
        str(request.block_size),
        "--max-new-tokens",
        str(request.max_new_tokens),
        "--thinking",
        "on" if request.thinking else "off",
        "--host-name",
        host_name,
    ]
    threads = request.threads or entry.threads
    if threads:
        argv += ["--threads", str(threads)]
    if request.target_dtype:
        argv += ["--target-dtype", request.target_dtype]
    if request.device:
        argv += ["--device", request.device]
    environment = [f"PYTHONPATH={harness}"]
    if entry.gpus:
        # nvidia-smi's numbering (PCI bus order), not CUDA's default fastest-first.
        visible = ",".join(map(str, entry.gpus))
        environment += ["CUDA_DEVICE_ORDER=PCI_BUS_ID", f"CUDA_VISIBLE_DEVICES={visible}"]
        argv += ["--shard-gpus"]
        if entry.gpu_memory:
            argv += ["--gpu-memory", str(entry.gpu_memory)]
    for flag, remote in uploads.items():
        argv += [flag, f"@{remote}" if flag == "--sglang" else remote]
    return shlex.join(["env", *environment, *argv])


def _uploads(
    host: Host, entry: FeaturesHost, request: FeatureRequest, run_id: str
) -> dict[str, str]:
    """The prompts file and the SGLang URL (private: it may carry credentials, which must not
    reach argv or the run's log) on the host, by harness flag."""
    files: dict[str, tuple[bytes, bool]] = {}
    if request.prompts is not None:
        files["--prompts"] = (request.prompts.read_bytes(), False)
    if request.sglang:  # chosen by --completions, the host's sglang_url known to be set
        files["--sglang"] = (entry.sglang_url.encode(), True)
    runs = EvalLayout(entry).runs
    if files:
        host.run(f"mkdir -p {shlex.quote(runs)}")
    uploaded = {}
    for flag, (data, private) in files.items():
        remote = f"{runs}/.{flag.lstrip('-')}-{run_id}"
        host.upload(data, remote, private=private)
        uploaded[flag] = remote
    return uploaded


def _remove(host: Host, uploads: dict[str, str]) -> None:
    if uploads:
        host.run("rm -f -- " + " ".join(map(shlex.quote, uploads.values())), check=False)


def new_run_id(host: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-features-{host}-{secrets.token_hex(2)}"


def _run(
    host: Host,
    entry: FeaturesHost,
    harness: str,
    request: FeatureRequest,
    out: str,
    reporter: RunReporter,
    margin: Margin,
) -> jobs.Run:
    """Check that the set fits, then launch the harness detached and stream its events until
    it ends; raise when it failed."""
    run_id = new_run_id(host.name)
    uploads = _uploads(host, entry, request, run_id)
    command = features_command(entry, host.name, harness, request, out, uploads)
    try:
        check_features_host(host, command, out.rpartition("/")[2], margin, reporter.say)
    except OpsError:
        _remove(host, uploads)
        raise
    params = {"kind": "features", "out": out, "harness": harness, "command": command}
    # The run's wrapper removes the URL file (it may hold credentials) however the run ends.
    private = [uploads["--sglang"]] if "--sglang" in uploads else []
    run = jobs.launch_and_follow(
        host, entry, run_id, command, params, reporter.say, reporter.follow, private_files=private
    )
    reporter.finished(run, [], None)
    if run.state != "succeeded":
        raise EvalFailed(run, jobs.log_tail(host, entry, run_id))
    return run
