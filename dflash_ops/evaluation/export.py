"""`fab export-drafter --step N`: the staged checkpoint written as a Hugging Face drafter
directory on the eval host by the harness's `export` (config.json with dflash_config,
model.safetensors, as z-lab publishes drafters and SGLang loads them), its settings resolved
from the checkpoint, the inventory's drafter profile and the flags, as `run-eval` resolves
them. A directory there that the harness's record does not name as its own export is refused
by the harness and left as it is. A copy exported from the bytes staging verified is reused.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

from dflash_eval.contract.weights import EXPORT_MARKER

from dflash_ops.core.errors import HostError
from dflash_ops.core.inventory import EvalHost, Inventory
from dflash_ops.core.records import RecordError, parse_json
from dflash_ops.evaluation.export_pull import pull_export
from dflash_ops.evaluation.harness_command import drafter_profile
from dflash_ops.evaluation.run import RunReporter, ensure_ready, stage_checkpoint
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.staging.delivery import StagedCheckpoint

PROFILE_UPLOAD = "export-drafter-profile.json"


def exported_from(host: Host, out: str) -> str | None:
    """The source sha256 the export at `out` records (None: no complete export of ours)."""
    q = shlex.quote(out)
    answer = host.run(
        f"cd {q} 2>/dev/null && test -f model.safetensors && test -f config.json && "
        f"cat -- {EXPORT_MARKER}",
        check=False,
    )
    if not answer.ok:
        return None
    try:
        return parse_json(answer.stdout, EXPORT_MARKER).get("source_sha256")
    except RecordError:
        return None


def export_on_host(
    host: Host,
    entry: EvalHost,
    harness: str,
    staged: StagedCheckpoint,
    profile: dict | None,
    say: Callable[[str], None],
    out: str | None = None,
) -> str:
    """The drafter directory of `staged` on the host (written unless one exported from the
    same bytes is there); returns its path."""
    out = out or EvalLayout.exported(staged.path)
    if exported_from(host, out) == staged.sha256:
        say(f"{host.name}: reusing {out} (exported from sha256 {staged.sha256[:16]}…)")
        return out
    layout = EvalLayout(entry)
    argv = [layout.python, "-m", "dflash_eval", "export", "--checkpoint", staged.path]
    argv += ["--target", entry.target_model, "--out", out, "--quiet"]
    uploaded = None
    if profile is not None:
        harness_profile = {k: v for k, v in profile.items() if k != "target_dtype"}
        host.run(f"mkdir -p {shlex.quote(layout.runs)}")
        uploaded = f"{layout.runs}/.{PROFILE_UPLOAD}"
        host.upload(json.dumps(harness_profile, indent=2).encode(), uploaded)
        argv += ["--drafter-profile", uploaded]
    try:
        result = host.run(
            f"cd {shlex.quote(harness)} && env PYTHONPATH={shlex.quote(harness)} "
            f"{shlex.join(argv)}",
            check=False,
        )
    finally:
        if uploaded:
            host.run(f"rm -f -- {shlex.quote(uploaded)}", check=False)
    if not result.ok:
        # The harness explains an expected failure in a paragraph on stderr: pass it on whole.
        raise HostError(
            host.name,
            f"exporting {staged.path} failed: {result.stderr.strip() or 'no error output'}",
        )
    say(f"{host.name}: drafter directory {out} (config.json + model.safetensors)")
    return out


def export_drafter(
    inventory: Inventory,
    step: int,
    host_name: str | None,
    out: str | None,
    reporter: RunReporter,
    local: Path | None = None,
) -> str:
    """Stage step `step` on the eval host if needed, then export it there (and copy it to
    the workstation's `local` directory when given)."""
    name, entry = inventory.eval_host(host_name)
    host = Host(inventory, name)
    try:
        harness = ensure_ready(host, entry, reporter.say)
        staged = stage_checkpoint(inventory, step, name, reporter)
        profile = drafter_profile(inventory)
        exported = export_on_host(host, entry, harness, staged, profile, reporter.say, out)
        if local is not None:
            pull_export(host, exported, local, reporter.say)
        return exported
    finally:
        host.close()
