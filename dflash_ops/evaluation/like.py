"""`fab run-eval --like RUN_ID`: a pulled run's parameters, to evaluate again with the
current harness (after an upgrade: do its numbers still come out the same?).

What is repeated, read from the run's pulled results.json (its `options` record every
harness option as the run had it) and run.json:
- the step, the training run (`checkpoint.step`, `checkpoint.training_run`) and the host;
- every harness option `fab run-eval` passes on (`options`; `--no-cache` is the null
  `cache_dir` it leaves), values equal to the option table's default left to the harness;
- the prompts the run read (`options.prompts`, its uploaded copy) and the drafter config it
  was given (`options.drafter_config`), fetched back from the host it ran on; built-in
  prompts need nothing;
- `--reference` (a `reference` block), `--completions` (`completions.source`),
  `--strip-optimizer` (an `extracted` checkpoint), the feature set (`features.set`), the tag.

Not repeated: how staging read the checkpoint (`--via`), and the inventory's drafter profile
(the current one is sent, as to every run). A flag given beside `--like` overrides what the
run had; a switch the run had cannot be turned off that way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_eval.contract import options as table

from dflash_ops.core.errors import HostError, OpsError
from dflash_ops.core.files import write_atomic
from dflash_ops.core.inventory import Inventory
from dflash_ops.evaluation import run_ids
from dflash_ops.evaluation.foresee import prompts_sha256
from dflash_ops.evaluation.results import RunResult, load_runs
from dflash_ops.remote.connection import Host

# The run files a liked run read on its host, by their request option (uploaded as such).
FETCHED = {"prompts": "prompts.jsonl", "drafter_config": "drafter-config.json"}


@dataclass
class Liked:
    """What a new run takes from the liked one: as run_eval_command's arguments."""

    run_id: str
    step: int
    training_run: str | None
    host: str | None
    options: dict[str, Any]  # request options (request.request_options' shape)
    features: str | None
    remote_files: dict[str, str]  # request option → the file's path on `host`


def find(results_root: Path, typed: str) -> RunResult:
    """The pulled, successful run that `typed` names (its id, short id or a unique part)."""
    runs = {run.run_id: run for run in load_runs(results_root) if run.results is not None}
    if not runs:
        raise OpsError(
            f"--like: no successful runs pulled into {results_root}; pull them first with "
            "`fab fetch-results`"
        )
    return runs[run_ids.match(runs, typed, f"among the successful runs in {results_root}")]


def liked(run: RunResult) -> Liked:
    """The parameters of `run`, as a new run asks for them."""
    results = run.done
    recorded = results["options"]
    harness = {
        option.name: recorded[option.name]
        for option in table.for_task(table.RUN_EVAL)
        if recorded.get(option.name) not in (None, False, table.default(option.name))
    }
    if "cache_dir" in recorded and recorded["cache_dir"] is None:
        harness["no_cache"] = True  # the harness records --no-cache as no cache directory
    step = results["checkpoint"]["step"]
    if step is None:
        raise OpsError(f"--like {run.run_id}: its results record no step; pass --step")
    features = results.get("features") or {}
    if not features.get("set"):  # a feature set brings its own completions
        from_sglang = results["completions"]["source"] == "sglang"
        harness["completions"] = "sglang" if from_sglang else "local"
    return Liked(
        run_id=run.run_id,
        step=step,
        training_run=results["checkpoint"].get("training_run"),
        host=run.run.get("host"),
        options={
            "harness_options": harness,
            "reference": results["reference"] is not None,
            "strip_optimizer": results["checkpoint"]["format"] == "extracted",
            "tag": run.tag,
        },
        features=features.get("set"),
        remote_files={name: recorded[name] for name in FETCHED if recorded.get(name)},
    )


def merged(liked_options: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The liked run's request options, each overridden by one given on the command line
    (unset: None or False); harness options one by one."""
    chosen = {**liked_options}
    for name, value in given.items():
        if name == "harness_options":
            ours = {k: v for k, v in dict(value).items() if v not in (None, False)}
            chosen[name] = {**liked_options.get(name, {}), **ours}
        elif value not in (None, False) or name not in chosen:
            chosen[name] = value
    return chosen


def fetch_files(
    inventory: Inventory, found: Liked, wanted: list[str], directory: Path
) -> dict[str, str]:
    """The liked run's files among `wanted` (request options of FETCHED), copied from its
    host into `directory`: {option: local path}. Its prompts must still hash as it recorded."""
    if not wanted:
        return {}
    if found.host not in inventory.eval_hosts:
        raise OpsError(
            f"--like {found.run_id}: it ran on {found.host!r}, which the inventory lists no "
            f"longer, and its {', '.join(wanted)} file(s) are there; pass them yourself "
            "(--prompts, --drafter-config)"
        )
    host = Host(inventory, found.host)
    copies = {}
    try:
        for name in wanted:
            remote = found.remote_files[name]
            data = host.download(remote)
            if data is None:
                raise HostError(
                    host.name,
                    f"--like {found.run_id}: {remote}, the {FETCHED[name]} it read, is gone "
                    f"(pruned?); pass --{name.replace('_', '-')} yourself",
                )
            local = directory / f"like-{found.run_id}-{FETCHED[name]}"
            write_atomic(local, data)
            copies[name] = str(local)
    finally:
        host.close()
    return copies


def require_same_prompts(found: Liked, run: RunResult, path: str | None) -> None:
    """The fetched prompts must be the ones the run read."""
    count = found.options["harness_options"].get("num_prompts")
    digest = prompts_sha256(Path(path) if path else None, count)
    recorded = run.done["prompts"]["sha256"]
    if digest != recorded:
        raise OpsError(
            f"--like {found.run_id}: its prompts file {path} now hashes to {digest[:16]}…, "
            f"not the {recorded[:16]}… it recorded: it was changed; pass --prompts yourself"
        )
