"""The lab the transfer benchmarks build: one checkpoint on the trainer, in a temporary
directory of its own (as root: network-namespace hosts with tmpfs disks)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dflash_lab import lab
from dflash_ops.core.units import format_bytes, parse_size


@contextmanager
def one_checkpoint_lab(
    prefix: str, step: int, size: str, trainer_disk: int, eval_disk: int, **config: Any
) -> Iterator[lab.Lab]:
    """A lab whose trainer holds one checkpoint of `size` at `step`, with disks of the given
    bytes (other `LabConfig` fields in `config`). Removed on exit, even on failure, and its
    temporary directory with it when it came down cleanly."""
    root = Path(tempfile.mkdtemp(prefix=prefix)) / "lab"
    lab_config = lab.LabConfig(
        root=root,
        steps=(step,),
        checkpoint_size=size,
        trainer_disk=str(trainer_disk),
        eval_disk=str(eval_disk),
        **config,
    )
    print(
        f"building the lab at {root} with a {format_bytes(parse_size(size))} checkpoint …",
        flush=True,
    )
    built = lab.up(lab_config)
    try:
        yield built
    finally:
        problems = built.down()
        if not problems:
            root.parent.rmdir()  # the mkdtemp directory the lab was in
        print("lab removed" if not problems else f"lab-down problems: {problems}")
