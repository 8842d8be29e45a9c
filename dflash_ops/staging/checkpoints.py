"""Checkpoints: which steps the trainer has, and staging one onto eval hosts, verified.

Staged layout on an eval host (and in the workstation's `local.staging` in two-hop mode):

    {staging_dir}/step_{N}/checkpoint.pt                 the verified file
    {staging_dir}/step_{N}/checkpoint.pt.manifest.json   source host/path, size, mtime, sha256
    {staging_dir}/step_{N}/checkpoint.pt.partial         an unfinished transfer (resumable)
    {staging_dir}/step_{N}/.checkpoint.pt.lock           flock of the stage in progress

A staged file is "already staged" when its manifest names the same source path, size and
mtime as the trainer's file now, and the file has that size: no bytes move.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Literal

from dflash_ops.core.errors import CheckpointError, InventoryError, TransferError
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.units import format_bytes
from dflash_ops.remote import probes
from dflash_ops.remote.connection import Host
from dflash_ops.remote.containers import environment_of
from dflash_ops.remote.layout import STAGED_NAME, EvalLayout
from dflash_ops.staging.disk import Margin, SpaceCheck, margin_of, space_check
from dflash_ops.staging.relay import (
    HASHER_PROBE,
    DestinationLock,
    LocalSide,
    ProgressCallback,
    RemoteSide,
    Side,
    holder_description,
    move,
    stderr_reason,
)

STABLE_AFTER_S = 2  # a file untouched this long is not being written
STABLE_WINDOW_S = 1.0  # otherwise: its size must not change over this window

Via = Literal["stream", "pull", "rootfs"]


# --- the trainer's checkpoints ------------------------------------------------------------


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


# --- manifests and staged files -----------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """What a staged copy is a copy of: the trainer's file as it was when read."""

    source_host: str
    source_path: str
    size: int
    mtime: int
    step: int


@dataclass(frozen=True)
class StagedCheckpoint:
    host: str  # inventory host name, or 'workstation' for the two-hop copy
    path: str
    sha256: str
    size: int
    step: int
    moved: int  # bytes sent in this run (0: already staged)
    already: bool


def staged_path(inventory: Inventory, host: str, step: int) -> str:
    if host == LocalSide.name:
        if inventory.local.staging is None:
            raise InventoryError(f"{inventory.path}: two-hop mode needs local.staging set")
        return f"{inventory.local.staging}/step_{step}/{STAGED_NAME}"
    _, entry = inventory.eval_host(host)
    return EvalLayout(entry).staged_checkpoint(step)


@dataclass
class DestinationState:
    manifest: dict | None
    final_size: int | None
    partial_size: int | None
    free: int  # bytes free where the file goes

    def matches(self, identity: Identity) -> bool:
        m = self.manifest or {}
        return (
            self.final_size == identity.size
            and m.get("size") == identity.size
            and m.get("mtime") == identity.mtime
            and m.get("source_path") == identity.source_path
            and m.get("source_host") == identity.source_host
            and isinstance(m.get("sha256"), str)
        )


class Destination:
    def __init__(self, side: Side, path: str) -> None:
        self.side, self.path = side, path
        self.partial = f"{path}.partial"
        self.manifest = f"{path}.manifest.json"
        directory, _, name = path.rpartition("/")
        self.directory = directory or "/"
        self.lock = f"{self.directory}/.{name}.lock"

    def __str__(self) -> str:
        return f"{self.side.name}:{self.path}"

    def state(self) -> DestinationState:
        q = shlex.quote
        stat = probes.file_stat_command
        # One round trip: manifest, both files, free space, and the side's hash tool.
        command = (
            f"cat -- {q(self.manifest)} 2>/dev/null; echo; echo @@; "
            f"{stat(q(self.path))}; {stat(q(self.partial))}; echo @@; "
            f"{probes.free_bytes(self.directory).command}; echo @@; {HASHER_PROBE}"
        )
        head, _, tail = self.side.run(command).stdout.partition("\n@@\n")
        tail, df_output, hasher = tail.split("@@\n")
        self.side.set_hasher(hasher)
        try:
            manifest = json.loads(head) if head.strip() else None
        except json.JSONDecodeError:
            manifest = None
        final, partial = (probes.parse_file_stat(line) for line in tail.strip().splitlines())
        return DestinationState(
            manifest if isinstance(manifest, dict) else None,
            final.size if final else None,
            partial.size if partial else None,
            probes.parse_df_avail(df_output),
        )

    def promote(self, manifest: dict) -> None:
        """Rename the verified partial into place, then write the manifest beside it."""
        q = shlex.quote
        text = json.dumps(manifest, sort_keys=True)
        tmp = f"{self.manifest}.tmp"
        self.side.run(
            f"mv -f -- {q(self.partial)} {q(self.path)} && "
            f"printf '%s\\n' {q(text)} > {q(tmp)} && sync -- {q(tmp)} && "
            f"mv -f -- {q(tmp)} {q(self.manifest)} && sync -- {q(self.directory)}"
        )

    def remove_partial(self) -> None:
        self.side.run(f"rm -f -- {shlex.quote(self.partial)}")


# --- sources ------------------------------------------------------------------------------


@dataclass
class Source:
    side: Side
    description: str  # for messages: where the bytes come from
    read: Callable[[int], str]  # offset → command writing the file's bytes from there on
    stat_command: str
    label: str = ""
    file: str | None = None  # the path, when it is a plain file this side's shell can open
    now: int = 0  # the side's clock at the last stat

    def stat(self) -> probes.FileStat | None:
        """Size/mtime (and, in the same round trip, the side's clock and hash tool)."""
        output = self.side.run(f"{HASHER_PROBE}; echo @@; date +%s; {self.stat_command}")
        hasher, _, rest = output.stdout.partition("@@\n")
        self.side.set_hasher(hasher)
        now, _, stat = rest.partition("\n")
        self.now = int(now)
        return probes.parse_file_stat(stat)


def _plain_source(side: Side, path: str, label: str) -> Source:
    q = shlex.quote(path)
    return Source(
        side,
        f"{side.name}:{path}",
        lambda offset: f"tail -c +{offset + 1} -- {q}" if offset else f"cat -- {q}",
        probes.file_stat_command(q),
        label,
        path,
    )


def trainer_source(inventory: Inventory, step: int, via: Via) -> Source:
    trainer = inventory.trainer
    side = RemoteSide(Host(inventory, inventory.trainer_name))
    path = checkpoint_path(inventory, step)
    env = environment_of(trainer.container)
    if via == "rootfs":
        rootfs = env.host_rootfs()
        if rootfs is None:
            raise InventoryError(
                f"{inventory.path}: --via rootfs needs the trainer's container to name its "
                f"host-side rootfs (container.rootfs for pct, or kind: rootfs); found "
                f"{env.description}"
            )
        return _plain_source(side, f"{rootfs.rstrip('/')}/{path.lstrip('/')}", "rootfs")
    return Source(
        side,
        f"{side.name}:{path} ({env.description})",
        lambda offset: env.stream_command(path, offset),
        env.run_command(probes.file_stat_command("{}"), path),
        "stream",
    )


# --- staging ------------------------------------------------------------------------------


@dataclass
class HopPlan:
    source: str
    destination: Destination
    size: int
    already: bool
    offset: int
    space: SpaceCheck | None

    def describe(self) -> str:
        if self.already:
            return f"{self.source} → {self.destination}: already staged"
        resume = f", resume from {format_bytes(self.offset)}" if self.offset else ""
        space = f"\n    disk: {self.space.describe()}" if self.space else ""
        return (
            f"{self.source} → {self.destination}: "
            f"{format_bytes(self.size - self.offset)} to move{resume}{space}"
        )


@dataclass
class StageOptions:
    via: Via = "stream"
    two_hop: bool = False
    resume: bool = True
    verify: bool = False
    dry_run: bool = False
    margin: str | None = None
    on_progress: ProgressCallback | None = None
    report: Callable[[str], None] = print
    progress_factory: Callable[[str, int], ProgressCallback] | None = None
    plan: list[HopPlan] = field(default_factory=list)


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


def stage(
    inventory: Inventory,
    step: int | None = None,
    to: list[str] | None = None,
    *,
    latest: bool = False,
    options: StageOptions | None = None,
) -> list[StagedCheckpoint]:
    """Stage the trainer's checkpoint at `step` on the eval hosts `to` (default: all).

    Returns one StagedCheckpoint per host (and one for the workstation in two-hop mode), with
    the staged path, its sha256 and size. Raises CheckpointError / TransferError /
    DiskSpaceError with what to do; an interrupted transfer leaves a resumable partial."""
    options = options or StageOptions()
    names = to or list(inventory.eval_hosts)
    for name in names:
        inventory.eval_host(name)  # unknown names fail before any connection
    margin = margin_of(inventory, options.margin)
    env = environment_of(inventory.trainer.container)
    if options.via == "pull" and env.pull_command("/", "/") is None:
        raise InventoryError(
            f"{inventory.path}: --pull needs a trainer container that can copy files out "
            f"(kind pct or docker); found {env.description}"
        )
    if latest or step is None:
        step = resolve_step(inventory, step, latest=True).step
    source = trainer_source(inventory, step, options.via)
    found = source.stat()
    if found is None:
        resolve_step(inventory, step, latest=False)  # raises with the available steps
        raise CheckpointError(f"{source.description}: not found")
    identity = Identity(
        inventory.trainer_name, checkpoint_path(inventory, step), found.size, found.mtime, step
    )
    results: list[StagedCheckpoint] = []
    if options.two_hop:
        local = Destination(LocalSide(), staged_path(inventory, LocalSide.name, step))
        copy = _deliver(inventory, source, identity, local, margin, options, None)
        results.append(copy)
        source = _plain_source(LocalSide(), local.path, "staging")
        expected = copy.sha256
    else:
        expected = None
    destinations = [
        Destination(RemoteSide(Host(inventory, name)), staged_path(inventory, name, step))
        for name in names
    ]
    for destination in destinations:
        results.append(
            _deliver(inventory, source, identity, destination, margin, options, expected)
        )
    return results


def _deliver(
    inventory: Inventory,
    source: Source,
    identity: Identity,
    dest: Destination,
    margin: Margin,
    options: StageOptions,
    expected_sha: str | None,
) -> StagedCheckpoint:
    state = dest.state()
    if state.matches(identity):
        sha = state.manifest["sha256"]
        if options.verify:
            _verify_staged(source, dest, dest.path, sha)
        options.plan.append(HopPlan(source.description, dest, identity.size, True, 0, None))
        options.report(
            f"{dest}: already staged (sha256 {sha[:16]}…"
            f"{', verified again' if options.verify else ''})"
        )
        return StagedCheckpoint(
            dest.side.name, dest.path, sha, identity.size, identity.step, 0, True
        )
    offset = _resume_offset(state, identity, options)
    space = space_check(
        dest.side.name,
        dest.directory,
        state.free,
        identity.size - offset,
        margin,
        f"step {identity.step}",
    )
    plan = HopPlan(source.description, dest, identity.size, False, offset, space)
    pull_space = None
    if options.via == "pull" and source.label == "stream":
        tmp_dir = inventory.trainer.tmp_dir
        pull_space = space_check(
            source.side.name,
            tmp_dir,
            source.side.free_bytes(tmp_dir),
            identity.size,
            margin,
            f"copy out of {environment_of(inventory.trainer.container).description}",
        )
        options.plan.append(
            HopPlan(
                source.description,
                Destination(source.side, tmp_dir),
                identity.size,
                False,
                0,
                pull_space,
            )
        )
    options.plan.append(plan)
    if options.dry_run:
        return StagedCheckpoint(
            dest.side.name, dest.path, "", identity.size, identity.step, 0, False
        )
    if pull_space:
        pull_space.require()
    space.require()
    if inventory.trainer.complete_marker or source.now - identity.mtime < STABLE_AFTER_S:
        _require_complete(inventory, identity)
    with DestinationLock(dest.side, dest.lock, holder_description()):
        state = dest.state()  # another run may have finished or grown the partial meanwhile
        if state.matches(identity):
            sha = state.manifest["sha256"]
            options.report(f"{dest}: already staged (by another run)")
            return StagedCheckpoint(
                dest.side.name, dest.path, sha, identity.size, identity.step, 0, True
            )
        offset = _resume_offset(state, identity, options)
        if options.via == "pull" and source.label == "stream":
            with _pulled(inventory, identity) as pulled:
                sha, moved = _transfer(pulled, source, identity, dest, offset, options)
        else:
            origin = source if expected_sha is None else None
            sha, moved = _transfer(source, origin, identity, dest, offset, options)
        if expected_sha and sha != expected_sha:
            dest.remove_partial()
            raise TransferError(
                f"{dest}: sha256 {sha} differs from the staging copy's {expected_sha}; the "
                f"partial was removed. Rerun to transfer again."
            )
        dest.promote(
            {
                **asdict(identity),
                "sha256": sha,
                "staged_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "staged_via": source.description,
            }
        )
    options.report(f"{dest}: staged and verified (sha256 {sha[:16]}…, {format_bytes(moved)} moved)")
    return StagedCheckpoint(
        dest.side.name, dest.path, sha, identity.size, identity.step, moved, False
    )


def _resume_offset(state: DestinationState, identity: Identity, options: StageOptions) -> int:
    partial = state.partial_size
    if options.resume and partial is not None and partial <= identity.size:
        return partial
    return 0


def _require_complete(inventory: Inventory, identity: Identity) -> None:
    info = next((c for c in list_checkpoints(inventory) if c.step == identity.step), None)
    if info is not None and not info.complete:
        how = (
            f"its marker {inventory.trainer.complete_marker} is missing"
            if inventory.trainer.complete_marker
            else "its size is still changing"
        )
        raise CheckpointError(
            f"{inventory.trainer_name}: step {identity.step} at {identity.source_path} looks "
            f"incomplete ({how}): is it still being written? Wait for it and retry."
        )


class _pulled:
    """Copy the checkpoint out of the container (`pct pull`, `docker cp`) into a fresh private
    directory under the trainer's tmp_dir, and remove that directory afterwards.

    A fresh `mktemp -d` directory (mode 0700) per pull: a fixed file name in a shared tmp_dir
    could be a symlink planted by another user, which the copy (as root) would follow."""

    def __init__(self, inventory: Inventory, identity: Identity) -> None:
        self.identity = identity
        self.side = RemoteSide(Host(inventory, inventory.trainer_name))
        self.env = environment_of(inventory.trainer.container)
        self.tmp_dir = inventory.trainer.tmp_dir
        self.directory: str | None = None

    def __enter__(self) -> Source:
        made = self.side.run(
            f"mkdir -p -- {shlex.quote(self.tmp_dir)} && umask 077 && "
            f"mktemp -d -p {shlex.quote(self.tmp_dir)} dflash-pull.XXXXXXXX",
            check=False,
        )
        if not made.ok:
            raise TransferError(
                f"{self.side.name}: cannot make a private directory in {self.tmp_dir} for the "
                f"copy out of {self.env.description}: {stderr_reason(made.stderr)}. Check "
                f"`tmp_dir` in the inventory."
            )
        self.directory = made.stdout.strip()
        path = f"{self.directory}/{STAGED_NAME}"
        command = self.env.pull_command(self.identity.source_path, path)
        result = self.side.run(command, check=False)
        if not result.ok:
            self.__exit__()
            raise TransferError(
                f"{self.side.name}: copying {self.identity.source_path} out of "
                f"{self.env.description} to {path} failed: {stderr_reason(result.stderr)}; "
                f"nothing was staged."
            )
        return _plain_source(self.side, path, "pulled")

    def __exit__(self, *exc) -> None:
        if self.directory:
            self.side.run(f"rm -rf -- {shlex.quote(self.directory)}", check=False)
            self.directory = None


def _transfer(
    source: Source,
    origin: Source | None,
    identity: Identity,
    dest: Destination,
    offset: int,
    options: StageOptions,
) -> tuple[str, int]:
    """Move the bytes, check the stream ended cleanly and the trainer's file (`origin`; None
    for the verified staging copy) did not change, and return the verified sha256 and the
    bytes moved. The partial is kept when the stream breaks."""
    fresh = offset == 0
    if fresh:
        source_command = source.side.stream_hashed(source.read(0), source.file)
    else:
        source_command = f"set -o pipefail; {source.read(offset)}"
    sink = dest.side.sink(dest.partial, append=not fresh, hashed=fresh)
    remaining = identity.size - offset
    callback = options.on_progress
    if options.progress_factory is not None:
        callback = _chain(options.progress_factory(str(dest), remaining), callback)
    moved = move(source.side.argv(source_command), dest.side.argv(sink), remaining, callback)
    kept = f"The partial {dest.partial} is kept: rerun to resume."
    if moved.dest_rc != 0:
        reason = stderr_reason(moved.dest_err)
        raise TransferError(
            f"{dest.side.name}: writing {dest.partial} failed after "
            f"{format_bytes(offset + moved.count)} of {format_bytes(identity.size)}: {reason}. "
            + ("Free space there, then rerun to resume." if "No space" in reason else kept)
        )
    if moved.source_rc != 0 or moved.count < remaining:
        raise TransferError(
            f"{source.side.name}: the stream of {source.description} ended after "
            f"{format_bytes(moved.count)} of {format_bytes(remaining)} "
            f"(exit {moved.source_rc}: {stderr_reason(moved.source_err)}). {kept}"
        )
    now = origin.stat() if origin else None
    if origin and (now is None or (now.size, now.mtime) != (identity.size, identity.mtime)):
        dest.remove_partial()
        raise TransferError(
            f"{origin.description} changed during the transfer (size/mtime "
            f"{identity.size}/{identity.mtime} → {now.size if now else 'gone'}/"
            f"{now.mtime if now else '-'}); not promoted, partial removed. Wait until the "
            f"trainer has finished writing it, then rerun."
        )
    if moved.count != remaining:
        dest.remove_partial()
        raise TransferError(
            f"{source.description} sent {moved.count} bytes, expected {remaining}; not "
            f"promoted, partial removed. Rerun to stage again."
        )
    if fresh:
        source_sha, dest_sha = moved.source_digest, moved.dest_digest
    else:
        source_sha, dest_sha = _hash_both(source, dest.side, dest.partial)
    if not source_sha or source_sha != dest_sha:
        dest.remove_partial()
        raise TransferError(
            f"{dest}: verification failed: sha256 at the source {source_sha}, of what "
            f"{dest.side.name} holds {dest_sha}. The partial was corrupt and has been "
            f"removed; rerun to transfer from scratch."
        )
    return source_sha, moved.count


def _chain(first: ProgressCallback, second: ProgressCallback | None) -> ProgressCallback:
    if second is None:
        return first

    def both(state) -> None:
        first(state)
        second(state)

    return both


def _hash_both(source: Source, side: Side, path: str) -> tuple[str | None, str | None]:
    """Whole-file sha256 at both ends, in parallel (after a resume, or for --verify)."""

    def at_source() -> str | None:
        out = source.side.run(
            f"set -o pipefail; {source.read(0)} | {source.side.hash_stdin()}", check=False
        )
        return _digest(out.stdout)

    def at_dest() -> str | None:
        out = side.run(f"{side.hash_stdin()} < {shlex.quote(path)}", check=False)
        return _digest(out.stdout)

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(at_source), pool.submit(at_dest)
        return a.result(), b.result()


def _digest(text: str) -> str | None:
    found = re.findall(r"\b[0-9a-f]{64}\b", text)
    return found[-1] if found else None


def _verify_staged(source: Source, dest: Destination, path: str, recorded: str) -> None:
    source_sha, dest_sha = _hash_both(source, dest.side, path)
    if not (source_sha == dest_sha == recorded):
        raise TransferError(
            f"{dest}: --verify failed: source sha256 {source_sha}, staged file {dest_sha}, "
            f"manifest {recorded}. Remove {dest.manifest} and rerun to stage again."
        )


# --- what is staged where -----------------------------------------------------------------


def staged_status(inventory: Inventory, host: str, infos: list[CheckpointInfo]) -> dict[int, str]:
    """Per step: 'staged' (manifest matches the trainer's file), 'stale' (an older copy),
    'partial N%' or '' (one small command per step)."""
    side = RemoteSide(Host(inventory, host))
    statuses: dict[int, str] = {}
    for info in infos:
        dest = Destination(side, staged_path(inventory, host, info.step))
        identity = Identity(inventory.trainer_name, info.path, info.size, info.mtime, info.step)
        state = dest.state()
        if state.matches(identity):
            statuses[info.step] = "staged"
        elif state.final_size is not None:
            statuses[info.step] = "stale"
        elif state.partial_size is not None and info.size:
            statuses[info.step] = f"partial {state.partial_size * 100 // info.size}%"
        else:
            statuses[info.step] = ""
    return statuses
