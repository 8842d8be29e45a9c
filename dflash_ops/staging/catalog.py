"""The trainer's checkpoints: which steps exist, their size and time, and which are complete.

One `stat` over the layout's glob in the training environment (host or container) lists
them; a file is complete when the inventory's marker exists, else when its size stops
changing.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass

from dflash_ops.core.errors import CheckpointError, InventoryError
from dflash_ops.core.inventory import Inventory
from dflash_ops.remote.connection import Host
from dflash_ops.remote.containers import environment_of
from dflash_ops.staging.relay import stderr_reason

STABLE_AFTER_S = 2  # a file untouched this long is not being written
STABLE_WINDOW_S = 1.0  # otherwise: its size must not change over this window


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: str  # in the training environment
    size: int
    mtime: int
    complete: bool


def checkpoint_path(inventory: Inventory, step: int) -> str:
    trainer = inventory.trainer
    return f"{trainer.checkpoints.rstrip('/')}/{trainer.layout.format(step=step)}"


def _glob_and_regex(pattern: str) -> tuple[str, re.Pattern]:
    """'step_{step}/checkpoint.pt' → shell glob 'step_'*'/checkpoint.pt' and a step regex."""
    if pattern.count("{step}") != 1:
        raise InventoryError(f"layout/complete_marker {pattern!r} must contain {{step}} once")
    before, after = pattern.split("{step}")
    glob = "".join(
        part
        for part in (
            shlex.quote(before) if before else "",
            "*",
            shlex.quote(after) if after else "",
        )
    )
    return glob, re.compile(re.escape(before) + r"(\d+)" + re.escape(after) + "$")


def _scan(inventory: Inventory) -> tuple[int, dict[int, tuple[int, int]], set[int]]:
    """One look at the checkpoint dir: remote time, {step: (size, mtime)}, steps with marker."""
    trainer = inventory.trainer
    env = environment_of(trainer.container)
    glob, regex = _glob_and_regex(trainer.layout)
    command = (
        f"cd -- {shlex.quote(env.host_path(trainer.checkpoints))} || exit 3; date +%s; "
        f"stat -c 'F %s %Y %n' -- {glob} 2>/dev/null"
    )
    marker_regex = None
    if trainer.complete_marker:
        marker_glob, marker_regex = _glob_and_regex(trainer.complete_marker)
        command += f"; stat -c 'M 0 0 %n' -- {marker_glob} 2>/dev/null"
    host = Host(inventory, inventory.trainer_name)
    result = host.run(env.wrap(command + "; true"), check=False)
    if result.exit_code == 3:
        raise CheckpointError(
            f"{host.name}: checkpoint directory {trainer.checkpoints} not found in "
            f"{env.description}. Check `checkpoints` in the inventory."
        )
    if not result.ok:
        raise CheckpointError(
            f"{host.name}: listing {trainer.checkpoints} in {env.description} failed: "
            f"{stderr_reason(result.stderr)}"
        )
    lines = result.stdout.splitlines()
    now = int(lines[0])
    files: dict[int, tuple[int, int]] = {}
    markers: set[int] = set()
    for line in lines[1:]:
        kind, size, mtime, name = line.split(" ", 3)
        if kind == "F" and (match := regex.match(name)):
            files[int(match.group(1))] = (int(size), int(mtime))
        elif kind == "M" and marker_regex and (match := marker_regex.match(name)):
            markers.add(int(match.group(1)))
    return now, files, markers


def list_checkpoints(inventory: Inventory) -> list[CheckpointInfo]:
    """The trainer's checkpoints, by step, with completeness: the marker when the inventory
    names one, else a size that does not change (files modified within STABLE_AFTER_S are
    looked at again after STABLE_WINDOW_S)."""
    now, files, markers = _scan(inventory)
    uses_marker = inventory.trainer.complete_marker is not None
    recent = [s for s, (_, mtime) in files.items() if now - mtime < STABLE_AFTER_S]
    unstable: set[int] = set()
    if recent and not uses_marker:
        time.sleep(STABLE_WINDOW_S)
        _, again, _ = _scan(inventory)
        unstable = {s for s in recent if again.get(s) != files[s]}
        files = {**files, **{s: again[s] for s in recent if s in again}}
    return [
        CheckpointInfo(
            step,
            checkpoint_path(inventory, step),
            size,
            mtime,
            (step in markers) if uses_marker else step not in unstable,
        )
        for step, (size, mtime) in sorted(files.items())
    ]


def resolve_step(inventory: Inventory, step: int | None, latest: bool) -> CheckpointInfo:
    """The requested step (or the latest complete one), with the list as the error."""
    found = list_checkpoints(inventory)
    available = ", ".join(str(c.step) for c in found) or "none"
    if latest:
        complete = [c for c in found if c.complete]
        if not complete:
            raise CheckpointError(
                f"{inventory.trainer_name}: no complete checkpoint in "
                f"{inventory.trainer.checkpoints} (steps present: {available})"
            )
        return complete[-1]
    match = [c for c in found if c.step == step]
    if not match:
        raise CheckpointError(
            f"{inventory.trainer_name}: no checkpoint for step {step} at "
            f"{checkpoint_path(inventory, step or 0)}; available steps: {available}"
        )
    return match[0]
