"""The harness's command line for one run on an eval host: the inventory's inputs for it
(reference drafter, threads, the profile's target dtype), and the files it uploads beside the
run directories (prompts, drafter config and profile; the SGLang URL privately, never in argv).
"""

from __future__ import annotations

import json
import shlex

from dflash_ops.core.errors import HostError, InventoryError
from dflash_ops.core.inventory import EvalHost, Inventory
from dflash_ops.evaluation.request import EvalRequest, sglang_url
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout

SGLANG_URL_FILE = "sglang-url"  # the private upload; its run's wrapper removes it


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


def pickle_args(request: EvalRequest, profile: dict | None) -> list[str]:
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
