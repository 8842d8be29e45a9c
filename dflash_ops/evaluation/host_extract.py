"""Optimizer state stripped on the eval host (`run-eval --strip-optimizer`): the harness's
`extract` writes the drafter weights beside the staged checkpoint, with a record of the bytes
it read; a copy is reused only when that record names the sha256 staging verified, and what
stands there without the record is the user's, never replaced.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from dflash_ops.core.errors import CheckpointError, HostError, NotOursError
from dflash_ops.core.inventory import EvalHost, Inventory
from dflash_ops.core.records import RecordError, parse_json
from dflash_ops.evaluation.request import run_flag
from dflash_ops.remote import probes
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.staging.delivery import StagedCheckpoint
from dflash_ops.staging.disk import margin_of, space_check

EXTRACT_RECORD = "dflash_extract.json"  # what the harness's extract records beside the copy
NOT_OURS = "@@not-ours"


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
