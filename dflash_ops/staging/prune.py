"""Retention of staged checkpoints: which step directories a policy keeps, and removing the rest.

Staged steps live in `{staging}/step_N/` on each eval host (`{staging}/RUN/step_N/` for a named
training run) and in the workstation's `local.staging`; each holds the checkpoint, its
manifest and any extracted copy; a step directory without a manifest was not staged by the
tool and is never listed or removed. `plan` lists them with their sizes and decides, per place:
keep the newest `keep_last` steps of each training run and the steps named in `keep_steps`,
and never a directory that a running eval on that host reads; with a run named, only that
run's steps are looked at. `apply` removes what the plan drops.
"""

from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dflash_ops.core.inventory import EvalHost, Inventory
from dflash_ops.remote.connection import Host, each_eval_host
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.staging.destination import MANIFEST_SUFFIX

WORKSTATION = "workstation"
_STEP_DIR = re.compile(r"(?:(?P<run>[^/]+)/)?step_(?P<step>\d+)$")


@dataclass(frozen=True)
class StagedStep:
    host: str  # eval host name, or WORKSTATION
    path: str  # the step directory
    run: str | None  # the training run (None: the default one)
    step: int
    size: int
    keep: str | None  # why it stays (None: it goes)


@dataclass(frozen=True)
class Policy:
    keep_last: int = 2
    keep_steps: frozenset[int] = frozenset()

    def verdicts(self, steps: list[StagedStep], in_use: set[str]) -> list[StagedStep]:
        """Each staged step with the reason it is kept (newest `keep_last` per run)."""
        newest: dict[str | None, list[int]] = {}
        for item in steps:
            newest.setdefault(item.run, []).append(item.step)
        latest = {run: sorted(found)[-self.keep_last :] for run, found in newest.items()}
        judged = []
        for item in steps:
            keep = None
            if item.path in in_use:
                keep = "a running eval uses it"
            elif item.step in self.keep_steps:
                keep = "--keep-steps"
            elif self.keep_last and item.step in latest[item.run]:
                keep = f"among the newest {self.keep_last}"
            judged.append(StagedStep(item.host, item.path, item.run, item.step, item.size, keep))
        return judged


def parse_staged(host: str, base: str, output: str) -> list[StagedStep]:
    """`du -sb` lines of step directories under `base` → staged steps."""
    found = []
    for line in output.splitlines():
        size, _, path = line.partition("\t")
        relative = path.removeprefix(base.rstrip("/") + "/")
        match = _STEP_DIR.fullmatch(relative)
        if match and size.isdigit():
            found.append(StagedStep(host, path, match["run"], int(match["step"]), int(size), None))
    return sorted(found, key=lambda item: (item.run or "", item.step))


def _listing_command(base: str) -> str:
    quoted = shlex.quote(base.rstrip("/"))
    return (
        f"cd {quoted} 2>/dev/null || exit 0; "
        f'for d in {quoted}/step_* {quoted}/*/step_*; do [ -d "$d" ] && '
        f'ls -- "$d"/*{MANIFEST_SUFFIX} >/dev/null 2>&1 && du -sb -- "$d"; done; true'
    )


# The step directories that unfinished runs on an eval host read (dflash_ops.evaluation knows
# the runs; the caller passes this in, as staging sits below evaluation).
StepsInUse = Callable[[Host, EvalHost], set[str]]


def plan(
    inventory: Inventory,
    policy: Policy,
    in_use: StepsInUse,
    host: str | None = None,
    run: str | None = None,
) -> list[StagedStep]:
    """Every staged step on the eval hosts (or one) and the workstation, with its verdict;
    only training run `run`'s steps when it is named."""
    inventory.require_run(run)

    def of_run(steps: list[StagedStep]) -> list[StagedStep]:
        return steps if run is None else [item for item in steps if item.run == run]

    judged: list[StagedStep] = []
    for eval_host, entry in each_eval_host(inventory, host):
        base = EvalLayout(entry).staging
        output = eval_host.run(_listing_command(base)).stdout
        listed = of_run(parse_staged(eval_host.name, base, output))
        judged += policy.verdicts(listed, in_use(eval_host, entry))
    local = inventory.local.staging
    if host is None and local is not None and Path(local).is_dir():
        output = "\n".join(
            f"{_local_size(d)}\t{d}"
            for d in sorted([*Path(local).glob("step_*"), *Path(local).glob("*/step_*")])
            if any(d.glob(f"*{MANIFEST_SUFFIX}"))
        )
        judged += policy.verdicts(of_run(parse_staged(WORKSTATION, str(local), output)), set())
    return judged


def _local_size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def apply(inventory: Inventory, dropped: list[StagedStep]) -> int:
    """Remove the dropped step directories; returns the bytes freed."""
    freed = 0
    by_host: dict[str, list[StagedStep]] = {}
    for item in dropped:
        by_host.setdefault(item.host, []).append(item)
    for item in by_host.pop(WORKSTATION, []):
        shutil.rmtree(item.path)
        freed += item.size
    for eval_host, _ in each_eval_host(inventory):
        items = by_host.get(eval_host.name, [])
        if items:
            eval_host.run("rm -rf -- " + " ".join(shlex.quote(item.path) for item in items))
            freed += sum(item.size for item in items)
    return freed
