"""The trainer's checkpoints: which steps exist, their size and time, and which are complete.

A step's checkpoint is a file (`step_{step}/checkpoint.pt`) or a directory (`checkpoint-{step}`:
a Hugging Face directory, sharded safetensors, …). One command over the layout's glob in the
training environment (host or container) lists them, a directory with every file in it (its
size is their total, its mtime the newest); a checkpoint is complete when the inventory's
marker exists, else when its size stops changing.
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
from dflash_ops.staging.manifest import Member
from dflash_ops.staging.relay_commands import stderr_reason


@dataclass(frozen=True)
class Stability:
    """How a checkpoint without a marker is judged complete: one untouched for `after_s` is
    not being written; a newer one must keep its size while the listing waits `window_s`
    and looks again."""

    after_s: float = 2.0
    window_s: float = 1.0

    def recent(self, now: float, mtime: float) -> bool:
        return now - mtime < self.after_s


# The judgement every listing makes. A module setting, so that a caller (the tests) can put
# in a shorter window without threading it through every task that lists checkpoints.
STABILITY = Stability()


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: str  # in the training environment
    size: int
    mtime: int
    complete: bool
    directory: bool = False  # a directory checkpoint (else a single file)
    members: tuple[Member, ...] = ()  # a directory's files


# What one scan finds per step: total size, newest mtime, a directory's files (None: a file).
Found = tuple[int, int, tuple[Member, ...] | None]


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


def list_directory_command(quoted_dir: str) -> str:
    """Every file under a directory, one 'f SIZE MTIME ./NAME' line each."""
    return f"(cd -- {quoted_dir} && find . -type f -exec stat -c 'f %s %Y %n' {{}} +)"


def parse_listing(lines: list[str], where: str) -> tuple[Member, ...]:
    """'f SIZE MTIME ./NAME' lines → the directory's files, by name. A name that would leave
    the directory is refused (it would name a path outside the staged copy)."""
    members = []
    for line in lines:
        _, size, mtime, name = line.split(" ", 3)
        name = name.removeprefix("./")
        if name.startswith("/") or ".." in name.split("/"):
            raise CheckpointError(
                f"{where}: refusing the file name {name!r} (leaves its directory)"
            )
        members.append(Member(name, int(size), int(mtime)))
    return tuple(sorted(members, key=lambda m: m.name))


def _scan(inventory: Inventory, host: Host | None = None) -> tuple[int, dict[int, Found], set[int]]:
    """One look at the checkpoint dir: remote time, {step: found}, steps with marker."""
    trainer = inventory.trainer
    env = environment_of(trainer.container)
    glob, regex = _glob_and_regex(trainer.layout)
    each = (  # a directory: its header line, then its files; a file: its stat
        'if [ -d "$p" ]; then printf \'D 0 0 %s\\n\' "$p"; '
        + list_directory_command('"$p"')
        + "; else stat -c 'F %s %Y %n' -- \"$p\"; fi"
    )
    command = (
        f"cd -- {shlex.quote(env.host_path(trainer.checkpoints))} || exit 3; date +%s; "
        f'for p in {glob}; do [ -e "$p" ] || continue; {each}; done 2>/dev/null'
    )
    marker_regex = None
    if trainer.complete_marker:
        marker_glob, marker_regex = _glob_and_regex(trainer.complete_marker)
        command += f"; stat -c 'M 0 0 %n' -- {marker_glob} 2>/dev/null"
    host = host or Host(inventory, inventory.trainer_name)
    result = host.run(env.wrap(command + "; true"), check=False)
    if result.exit_code == 3 and "Permission denied" in result.stderr:
        raise CheckpointError(
            f"{host.name}: permission denied entering the checkpoint directory "
            f"{trainer.checkpoints} in {env.description}.{host.root_hint()}"
        )
    if result.exit_code == 3:
        raise CheckpointError(
            f"{host.name}: checkpoint directory {trainer.checkpoints} not found in "
            f"{env.description}. Check `checkpoints` in the inventory."
        )
    if not result.ok:
        raise CheckpointError(
            f"{host.name}: listing {trainer.checkpoints} in {env.description} failed: "
            f"{stderr_reason(result.stderr)}.{host.root_hint()}"
        )
    lines = result.stdout.splitlines()
    now = int(lines[0])
    found: dict[int, Found] = {}
    markers: set[int] = set()
    directory: tuple[int, list[str]] | None = None  # (step, its file lines) being read

    def close_directory() -> None:
        if directory is not None:
            step, listing = directory
            members = parse_listing(listing, f"{host.name}:{checkpoint_path(inventory, step)}")
            size = sum(m.size for m in members)
            found[step] = (size, max((m.mtime for m in members), default=0), members)

    for line in lines[1:]:
        kind, size, mtime, name = line.split(" ", 3)
        if kind == "f":
            if directory is not None:
                directory[1].append(line)
            continue
        close_directory()
        directory = None
        if kind in "FD" and (match := regex.match(name)):
            if kind == "D":
                directory = (int(match.group(1)), [])
            else:
                found[int(match.group(1))] = (int(size), int(mtime), None)
        elif kind == "M" and marker_regex and (match := marker_regex.match(name)):
            markers.add(int(match.group(1)))
    close_directory()
    return now, found, markers


def list_checkpoints(inventory: Inventory, host: Host | None = None) -> list[CheckpointInfo]:
    """The trainer's checkpoints, by step, with completeness: the marker when the inventory
    names one, else a size that does not change (recent files are looked at again after
    STABILITY's window). `host`: the trainer's already-open connection."""
    inventory = inventory.for_run(inventory.training_run)  # a trainer with runs only: its run
    now, files, markers = _scan(inventory, host)
    uses_marker = inventory.trainer.complete_marker is not None
    recent = [s for s, (_, mtime, _) in files.items() if STABILITY.recent(now, mtime)]
    unstable: set[int] = set()
    if recent and not uses_marker:
        time.sleep(STABILITY.window_s)
        _, again, _ = _scan(inventory, host)
        unstable = {s for s in recent if again.get(s) != files[s]}
        files = {**files, **{s: again[s] for s in recent if s in again}}
    return [
        CheckpointInfo(
            step,
            checkpoint_path(inventory, step),
            size,
            mtime,
            (step in markers) if uses_marker else step not in unstable,
            members is not None,
            members or (),
        )
        for step, (size, mtime, members) in sorted(files.items())
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
