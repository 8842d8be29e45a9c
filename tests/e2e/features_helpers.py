"""What the extract-features tests (test_extract_features.py) do on their lab: run the task,
find a set on a host's disk, edit the lab's inventory, shrink a disk."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from dflash_lab import lab as labs
from dflash_lab.models import BLOCK_SIZE
from dflash_ops.core.inventory import load
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from tests.conftest import run_fab

MAX_NEW_TOKENS = "24"
DTYPE = ["--target-dtype", "float32"]  # both sides of the τ comparison in the same dtype


def lab_layers(lab: labs.Lab) -> str:
    """The lab drafter's target layers (dflash_lab.models: the default rule for 2 layers)."""
    from dflash_eval.drafter.config import default_target_layer_ids

    config = json.loads((lab.data_dir("features") / "models/tiny-target/config.json").read_text())
    return ",".join(map(str, default_target_layer_ids(config["num_hidden_layers"], 2)))


def extract(lab: labs.Lab, *more: str, inventory_path: Path | None = None):
    return run_fab(
        inventory_path or lab.inventory_path,
        "extract-features",
        "--prompts",
        str(lab.root / labs.LAB_PROMPTS),
        "--max-new-tokens",
        MAX_NEW_TOKENS,
        "--layers",
        lab_layers(lab),
        "--block-size",
        str(BLOCK_SIZE),
        *DTYPE,
        "--device",
        "cpu",
        *more,
        timeout=900,
    )


def set_dir(lab: labs.Lab, host: str, identifier: str) -> Path:
    """Where a host keeps the set (the lab's disks are directories on this machine)."""
    entry = load(lab.inventory_path).hosts[host]
    return Path(EvalLayout(entry).feature_set(identifier))


def digests(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def said(output: str) -> str:
    """The output with rich's line wrapping undone (phrases are searched in it)."""
    return " ".join(output.split())


def small_extraction(inventory_path: Path) -> subprocess.CompletedProcess:
    return run_fab(
        inventory_path, "extract-features", "--layers", "1", "--block-size", "8",
        "--max-new-tokens", "4", timeout=600,
    )  # fmt: skip


@contextmanager
def tiny_disk(lab: labs.Lab, host_name: str, directory: str, size: str) -> Iterator[Host]:
    """A small tmpfs over `directory` on a lab host, hiding what is there until it is unmounted.
    Mounted through the host's own SSH login (root in the lab's netns mode): the host's sshd
    runs in a mount namespace of its own, which a mount made here would not reach."""
    if lab.state.mode != "netns":
        pytest.skip("a size-limited disk needs the lab's netns mode (root)")
    host = Host(load(lab.inventory_path), host_name)
    quoted = shlex.quote(directory)
    host.run(f"mkdir -p {quoted} && mount -t tmpfs -o size={size} dflash-test-tiny {quoted}")
    try:
        yield host
    finally:
        host.run(f"umount {quoted}")
        host.close()


def without_margin(lab: labs.Lab, tmp_path: Path) -> Path:
    """The lab's inventory with no free-space margin: a refusal is the set's size alone."""
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["transfer"] = {"margin": "0", "margin_fraction": 0}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def new_results(inventory_path: Path, before: set[Path]) -> dict:
    results_root = load(inventory_path).local.results
    (new,) = set(results_root.glob("*/results.json")) - before
    return json.loads(new.read_text())
