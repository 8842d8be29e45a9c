"""Where a staged copy lives on one side, how its state is read, and how it is promoted.

Staged layout on an eval host (and in the workstation's `local.staging` in two-hop mode);
a named training run's steps are in `{staging}/RUN/step_{N}/`, laid out the same:

    {staging}/step_{N}/checkpoint.pt                 a single-file checkpoint, verified
    {staging}/step_{N}/checkpoint.pt.manifest.json   source host/path, size, mtime, sha256
    {staging}/step_{N}/checkpoint.pt.partial         an unfinished transfer (resumable)
    {staging}/step_{N}/.checkpoint.pt.lock           flock of the stage in progress
    {staging}/step_{N}/.checkpoint.pt.promoting      the tool's claim while it promotes
    {staging}/step_{N}/checkpoint/                   a directory checkpoint (all its files)
    {staging}/step_{N}/extracted/                    the drafter weights alone (--weights-only)

A set (directory or extracted) is built in `NAME.partial/`: each file is written as
`FILE.partial`, renamed to `FILE` once its sha256 verified, and recorded in
`NAME.partial.jsonl`, so an interrupted stage resumes file by file (and inside the file it
was writing). When every file verified, the directory is renamed to `NAME` and
`NAME.manifest.json` written: nothing half-copied ever looks complete.

A copy is replaced only when it is the tool's: it has a manifest, or the claim that promote
writes first and removes last (so a crash between the rename and the manifest leaves a copy
the next stage may replace). Anything else at the staged path is the user's and stays.

Reading a destination's state is one round trip; once locked, every further control step
(state again, a file done, promote) runs through the lock's session.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from dflash_ops.core.errors import InventoryError, NotOursError
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.records import RecordError, parse_json
from dflash_ops.remote import probes
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import STAGED_NAME, EvalLayout
from dflash_ops.staging.lock import DestinationLock, glob_literal
from dflash_ops.staging.manifest import Identity, Kind, Member, matches
from dflash_ops.staging.relay_commands import sink
from dflash_ops.staging.sides import LocalSide, RemoteSide, Side

STAGED_NAMES: dict[Kind, str] = {
    "file": STAGED_NAME,
    "directory": "checkpoint",
    "extracted": "extracted",
}

MANIFEST_SUFFIX = ".manifest.json"  # beside each staged copy: what makes it complete


def staged_path(inventory: Inventory, host: str, step: int, kind: Kind = "file") -> str:
    """Where `kind` of step `step` (of the inventory's training run) is staged on `host` (an
    eval host, or the workstation)."""
    run = inventory.training_run
    if host == LocalSide.name:
        if inventory.local.staging is None:
            raise InventoryError(f"{inventory.path}: two-hop mode needs local.staging set")
        step_dir = "/".join([str(inventory.local.staging), *([run] if run else []), f"step_{step}"])
    else:
        _, entry = inventory.eval_host(host)
        step_dir = EvalLayout(entry).staged_checkpoint(step, run).rpartition("/")[0]
    return f"{step_dir}/{STAGED_NAMES[kind]}"


@dataclass
class DestinationState:
    manifest: dict | None
    free: int  # bytes free where the copy goes
    final_size: int | None = None  # the staged file or directory (its inode), or None
    partial_size: int | None = None  # file kind: the unfinished transfer
    records: list[dict] = field(default_factory=list)  # set kinds: files verified so far
    sizes: dict[str, int] = field(default_factory=dict)  # set kinds: files in NAME.partial/
    claimed: bool = False  # promote's claim is there: a copy at the path is the tool's

    @property
    def ours(self) -> bool:
        """Nothing is at the staged path, or what is there is the tool's to replace."""
        return self.final_size is None or self.manifest is not None or self.claimed


def _json_dict(text: str) -> dict | None:
    """A manifest's content; a damaged or empty one counts as none (the copy is redone)."""
    try:
        value = parse_json(text, "manifest") if text.strip() else None
    except RecordError:
        return None
    return value if isinstance(value, dict) else None


def _json_lines(text: str) -> list[dict]:
    """Records, one JSON object a line; a torn last line (a crash while appending) is skipped."""
    return [record for line in text.splitlines() if (record := _json_dict(line)) is not None]


def _sizes(text: str) -> dict[str, int]:
    """`find . -type f -exec stat -c '%s %n'` output → {relative name: size}."""
    found = {}
    for line in text.splitlines():
        size, _, name = line.partition(" ")
        if size.isdigit() and name.startswith("./"):
            found[name[2:]] = int(size)
    return found


class Destination:
    """A staged copy of `kind` at `path` on `side`."""

    def __init__(self, side: Side, path: str, kind: Kind = "file") -> None:
        self.side, self.path, self.kind = side, path, kind
        self.partial = f"{path}.partial"
        self.manifest = f"{path}{MANIFEST_SUFFIX}"
        directory, _, name = path.rpartition("/")
        self.directory = directory or "/"
        self.lock_path = f"{self.directory}/.{name}.lock"
        self.claim = f"{self.directory}/.{name}.promoting"

    def __str__(self) -> str:
        return f"{self.side.name}:{self.path}"

    @property
    def is_set(self) -> bool:
        return self.kind != "file"

    # --- reading ------------------------------------------------------------------------

    def state_probes(self) -> dict[str, probes.Probe]:
        """The probes that make up the state (to combine with others in one command)."""
        q = shlex.quote
        named = {
            "manifest": probes.Probe(f"cat -- {q(self.manifest)} 2>/dev/null", _json_dict),
            "free": probes.free_bytes(self.directory),
        }
        named["final"] = probes.file_stat(self.path)
        named["claim"] = probes.file_stat(self.claim)
        if self.is_set:
            named["records"] = probes.Probe(
                f"cat -- {q(self.partial)}.jsonl 2>/dev/null", _json_lines
            )
            named["sizes"] = probes.Probe(
                f"cd -- {q(self.partial)} 2>/dev/null && "
                "find . -type f -exec stat -c '%s %n' {} + 2>/dev/null",
                _sizes,
            )
        else:
            named["partial"] = probes.file_stat(self.partial)
        return named

    @staticmethod
    def state_from(found: dict) -> DestinationState:
        """The state from the parsed answers of `state_probes`."""
        final, partial = found.get("final"), found.get("partial")
        return DestinationState(
            found["manifest"],
            found["free"],
            final.size if final else None,
            partial.size if partial else None,
            found.get("records", []),
            found.get("sizes", {}),
            found.get("claim") is not None,
        )

    def state_probe(self) -> probes.Probe[DestinationState]:
        together = probes.together(**self.state_probes())
        return probes.Probe(together.command, lambda out: self.state_from(together.parse(out)))

    def state(self) -> DestinationState:
        """Manifest, partial(s) and free space: one round trip."""
        probe = self.state_probe()
        return probe.parse(self.side.run(probe.command, check=False).stdout)

    def require_ours(self, state: DestinationState) -> None:
        """Refuse to stage over what the tool did not put at the staged path."""
        if not state.ours:
            raise NotOursError(
                self.side.name,
                self.path,
                "is there with no staging manifest",
                "Move it away (or point the staging directory elsewhere), then stage again.",
            )

    def matches(self, state: DestinationState, identity: Identity, members: tuple) -> bool:
        if not matches(state.manifest, identity, self.kind, members):
            return False
        if self.kind == "file":
            return state.final_size == identity.size
        return state.final_size is not None  # the directory is there

    def resume_offset(self, state: DestinationState, member: Member) -> int | None:
        """None: this member is already verified here; else the bytes to resume from."""
        if not self.is_set:
            partial = state.partial_size
            return partial if partial is not None and partial <= member.size else 0
        record = next((r for r in state.records if r.get("name") == member.name), None)
        if record and member.same_file(record) and state.sizes.get(member.name) == member.size:
            return None
        partial = state.sizes.get(f"{member.name}.partial")
        return partial if partial is not None and partial <= member.size else 0

    # --- writing (under the lock) ---------------------------------------------------------

    def locked(self, note: Callable[[str], None]) -> DestinationLock:
        """The lock for this copy (a gone holder's writers are found by the partials); it
        reads the state again as soon as it is taken (`locked_state`)."""
        held = glob_literal(self.partial) + ("/*" if self.is_set else "")
        first = self.state_probe().command
        return DestinationLock(self.side, self.lock_path, (held,), note, first)

    def locked_state(self, lock: DestinationLock) -> DestinationState:
        """The state read when `lock` was taken."""
        return self.state_probe().parse(lock.first_result.stdout)

    def writes_to(self, member: Member) -> str:
        """The partial file a member's bytes go to."""
        return f"{self.partial}/{member.name}.partial" if self.is_set else self.partial

    def sink(self, partial: str, *, append: bool = False) -> str:
        """The writer of `partial` on this side: it hashes a fresh file, appends to a resumed
        one, and gives up after the side's stall timeout without bytes."""
        return sink(
            partial, append=append, hashed=not append, stall_timeout=self.side.stall_timeout
        )

    def prepare_command(self, members: tuple[Member, ...], *, fresh: bool) -> str:
        """Make the directories the members' partials go to (`fresh`: after removing what an
        earlier stage left)."""
        q = shlex.quote
        directories = sorted({self.writes_to(m).rpartition("/")[0] for m in members})
        start_over = f"rm -rf -- {q(self.partial)} {q(self.partial)}.jsonl && " if fresh else ""
        return f"{start_over}mkdir -p -- {' '.join(q(d) for d in directories)}"

    def member_done_command(self, member: Member, record: dict) -> str | None:
        """Once a member of a set verified: its final name, and its resume record."""
        if not self.is_set:
            return None
        q = shlex.quote
        final = f"{self.partial}/{member.name}"
        return (
            f"mv -f -- {q(self.writes_to(member))} {q(final)} && "
            f"printf '%s\\n' {q(json.dumps(record, sort_keys=True))} >> {q(self.partial)}.jsonl"
        )

    def discard_command(self, member: Member) -> str:
        return f"rm -f -- {shlex.quote(self.writes_to(member))}"

    def promote_command(self, manifest: dict) -> str:
        """Put the verified copy in place, then its manifest, under the tool's claim. A set
        replaces an older copy with two renames, the old manifest removed first: a crash in
        between leaves no copy that looks staged, and the claim says the copy is the tool's.
        The command checks again that what it replaces is the tool's (as `require_ours`)."""
        q = shlex.quote
        path, claim = q(self.path), q(self.claim)
        text = json.dumps(manifest, sort_keys=True)
        tmp = f"{self.manifest}.tmp"
        mine = (
            f"{{ {{ [ ! -e {path} ] && [ ! -L {path} ]; }} || [ -e {q(self.manifest)} ] || "
            f"[ -e {claim} ] || {{ echo {q(f'{self.path} is not a copy dflash-ops staged')} >&2;"
            f" false; }}; }} && : > {claim} && "
        )
        write_manifest = (
            f"printf '%s\\n' {q(text)} > {q(tmp)} && sync -- {q(tmp)} && "
            f"mv -f -- {q(tmp)} {q(self.manifest)} && sync -- {q(self.directory)}"
        )
        release = f"rm -f -- {claim}"
        if not self.is_set:
            return f"{mine}mv -f -- {q(self.partial)} {path} && {write_manifest} && {release}"
        old = f"{self.path}.old"
        return (
            f"{mine}rm -rf -- {q(old)} && rm -f -- {q(self.manifest)} && "
            f"{{ [ ! -e {path} ] || mv -- {path} {q(old)}; }} && "
            f"mv -- {q(self.partial)} {path} && sync -- {path} && "
            f"{write_manifest} && rm -rf -- {q(old)} {q(self.partial)}.jsonl && {release}"
        )


def staged_status(inventory: Inventory, host: str, infos: list) -> dict[int, str]:
    """Per step (`infos`: the catalog's CheckpointInfo list): 'staged' (a manifest matches
    the trainer's checkpoint), 'weights' (only its extracted weights are), 'stale' (an older
    copy), 'partial N%' or '' — one round trip for every step."""
    side = RemoteSide(Host(inventory, host))
    checks = {}
    for info in infos:
        kind: Kind = "directory" if info.directory else "file"
        full = Destination(side, staged_path(inventory, host, info.step, kind), kind)
        extracted = staged_path(inventory, host, info.step, "extracted")
        weights = Destination(side, extracted, "extracted")
        checks[info.step] = (info, full, weights)
    if not checks:
        return {}
    named = {}  # one flat probe: every destination's parts, prefixed
    for step, (_, full, weights) in checks.items():
        for which, dest in (("full", full), ("weights", weights)):
            named.update({f"{which}{step}-{k}": p for k, p in dest.state_probes().items()})
    probe = probes.together(**named)
    found = probe.parse(side.run(probe.command, check=False).stdout)

    def state(prefix: str) -> DestinationState:
        start = f"{prefix}-"
        return Destination.state_from(
            {k.removeprefix(start): v for k, v in found.items() if k.startswith(start)}
        )

    return {
        step: _status(
            Identity(inventory.trainer_name, info.path, info.size, info.mtime, step),
            info.members,
            (full, state(f"full{step}")),
            (weights, state(f"weights{step}")),
        )
        for step, (info, full, weights) in checks.items()
    }


def _status(
    identity: Identity,
    members: tuple,
    full: tuple[Destination, DestinationState],
    weights: tuple[Destination, DestinationState],
) -> str:
    (full, state), (weights, weights_state) = full, weights
    if full.matches(state, identity, members):
        return "staged"
    if weights.matches(weights_state, identity, ()):
        return "weights"
    if state.manifest or state.final_size is not None:
        return "stale"
    partial = state.partial_size or 0
    partial += sum(state.sizes.values())
    if partial and identity.size:
        return f"partial {min(partial * 100 // identity.size, 99)}%"
    return ""
