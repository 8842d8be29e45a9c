"""Strip at the source (`stage-checkpoint --weights-only`): extract the drafter weights on the
trainer, inside its training environment, so that only they cross the network.

`strip_script.py` is shipped as text and run with the training environment's own python
(the trainer's `python` in the inventory, default `python3`) into a private `mktemp -d`
directory of that environment; the directory is removed when the stage is done. When the
environment has no usable torch/safetensors, `extract_on_trainer` says why and the stage
copies the whole checkpoint instead (the eval side can still strip it: `run-eval
--strip-optimizer`).

For a directory checkpoint no code runs: its weight files (config.json, *.safetensors and
their index) are the weights, and optimizer/scheduler files stay behind.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from dflash_eval.contract.weights import (
    EXTRACT_MARKER,
    METADATA_KEYS,
    PREFIXES,
    STATE_DICT_KEYS,
)

from dflash_ops.core.errors import CheckpointError
from dflash_ops.remote.priority import low_priority
from dflash_ops.staging import strip_script
from dflash_ops.staging.manifest import Kind, Member
from dflash_ops.staging.relay_commands import stderr_reason
from dflash_ops.staging.sources import TrainerFiles

# A directory checkpoint's files that hold the drafter: what the harness reads.
WEIGHT_FILES = ("config.json", "*.safetensors", "*.safetensors.index.json")
NO_PYTHON = 127  # the shell's "command not found"


@dataclass(frozen=True)
class Extraction:
    """What the trainer wrote: the files (in `directory`, a path of the training
    environment) and the source checkpoint's sha256 they were extracted from."""

    directory: str
    members: tuple[Member, ...]
    source_sha256: str
    source_size: int
    weights_bytes: int
    dropped_entries: tuple[str, ...]

    @property
    def size(self) -> int:
        return sum(m.size for m in self.members)

    def manifest_fields(self) -> dict:
        return {
            "extracted_on": "trainer",
            "source_sha256": self.source_sha256,
            "source_size": self.source_size,
            "dropped_entries": list(self.dropped_entries),
        }


@dataclass(frozen=True)
class Unavailable:
    """Why the training environment cannot extract (the stage copies everything instead)."""

    reason: str


def nothing_to_strip(kind: Kind) -> str | None:
    """Why a staged checkpoint of this kind has no optimizer state for the eval side to strip
    (`run-eval --strip-optimizer`); None when it may have some (a training checkpoint file)."""
    if kind == "directory":
        return (
            "is a directory checkpoint: the harness reads only its config.json and safetensors "
            "weights, never the optimizer state beside them"
        )
    if kind == "extracted":
        return "holds the drafter weights alone (staged --weights-only)"
    return None


def weight_members(members: tuple[Member, ...]) -> tuple[Member, ...]:
    """A directory checkpoint's weight files."""
    return tuple(m for m in members if any(fnmatch.fnmatch(m.name, p) for p in WEIGHT_FILES))


def harness_keys() -> dict:
    """The harness's own definitions of where the weights are (dflash_eval.contract.weights)."""
    return {
        "state_dict_keys": STATE_DICT_KEYS,
        "metadata_keys": METADATA_KEYS,
        "prefixes": PREFIXES,
        "marker": EXTRACT_MARKER,
    }


class TrainerExtraction:
    """`with TrainerExtraction(files, checkpoint) as extraction:` — an `Extraction`, or
    `Unavailable`; the private directory goes at the end."""

    def __init__(self, files: TrainerFiles, checkpoint: str, python: str) -> None:
        self.files, self.checkpoint, self.python = files, checkpoint, python
        self.directory: str | None = None

    def __enter__(self) -> Extraction | Unavailable:
        env = self.files.env
        if not env.runs_commands:
            return Unavailable(
                f"{env.description} is only read through its files: nothing runs inside it"
            )
        script = Path(strip_script.__file__).read_text()
        keys = json.dumps(harness_keys())
        q = shlex.quote
        command = (
            'd=$(mktemp -d "${TMPDIR:-/tmp}/dflash-strip.XXXXXXXX") || exit 90; '
            f'printf "%s\\n" "$d"; {q(self.python)} -c {q(script)} {q(keys)} '
            f'{q(env.host_path(self.checkpoint))} "$d"'
        )
        # It reads the whole checkpoint: gently (dflash_ops.remote.priority).
        if self.files.gentle:
            command = low_priority(command)
        result = self.files.side.run(env.wrap(command), check=False)
        lines = result.stdout.splitlines()
        self.directory = lines[0] if lines and lines[0].startswith("/") else None
        where = f"{self.files.side.name}: {env.description}"
        if result.exit_code in (NO_PYTHON, strip_script.UNUSABLE):
            self.__exit__()
            return Unavailable(f"{where} cannot extract: {_reason(result.stderr)}")
        if not result.ok or self.directory is None:
            self.__exit__()
            raise CheckpointError(
                f"{where}: extracting the weights of {self.checkpoint} failed: "
                f"{_reason(result.stderr)}"
            )
        summary = json.loads(lines[-1])
        members = tuple(
            Member(f["name"], f["size"], summary["mtime"], f["sha256"]) for f in summary["files"]
        )
        return Extraction(
            self.directory,
            members,
            summary["source_sha256"],
            summary["source_size"],
            summary["weights_bytes"],
            tuple(summary["dropped_entries"]),
        )

    def __exit__(self, *exc) -> None:
        if self.directory:
            removal = f"rm -rf -- {shlex.quote(self.directory)}"
            self.files.side.run(self.files.env.wrap(removal), check=False)
            self.directory = None


def _reason(stderr: str) -> str:
    return stderr_reason(stderr).removeprefix("dflash-strip: ")
