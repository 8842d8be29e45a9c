"""What a lab is asked to be (`LabConfig`) and what it has made so far (`LabState`).

The state is written to `<root>/lab.json` after every step of `up()`, so that `down()` can
remove every process, mount, namespace, link and file even after a failed or interrupted
`up()`. `dflash_ops.remote.routes` reads the same file (address, netns, veth of each host)
to check the lab's routes before connecting.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dflash_ops.core.errors import LabError

STATE_FILE = "lab.json"
LAB_PROMPTS = "prompts.jsonl"  # written by the "models" content, for run-eval --prompts
DEFAULT_ROOT = Path(os.environ.get("DFLASH_LAB_DIR", "/tmp/dflash-lab"))

TRAINER = "trainer"  # the one trainer host's name; eval hosts are eval, eval2, …
FEATURES = "features"  # the features host's name (`dflash-lab up --features-host`)
CONTAINER_ID = 200  # the trainer's "Proxmox container"
CONTAINER_CHECKPOINTS = "/workspace/checkpoints"  # inside the container
CHECKPOINT_LAYOUT = "step_{step}/checkpoint.pt"


@dataclass
class LabConfig:
    root: Path = DEFAULT_ROOT
    eval_hosts: int = 1
    trainer_disk: str = "256m"
    eval_disk: str = "3g"  # a CPU torch venv + uv cache (~0.9 GiB); tmpfs uses RAM as written
    workstation_disk: str = "256m"
    steps: tuple[int, ...] = (2000, 4000, 6000)
    checkpoint_size: str = "4m"  # for the random-bytes content
    # "random" (bytes), "models" (tiny target + trained drafters) or "qwen3.6" (the same on
    # a miniature shaped as the Qwen3.6-27B release)
    content: str = "random"
    # Hosts whose inventory entry logs in as the lab's non-root user with `become: sudo`
    # (root only; see dflash_lab/users.py).
    sudo_hosts: tuple[str, ...] = ()
    features_host: bool = False  # also a features host (CPU here), with its own namespace

    @property
    def eval_names(self) -> list[str]:
        return ["eval" if i == 0 else f"eval{i + 1}" for i in range(self.eval_hosts)]

    @property
    def target_hosts(self) -> list[str]:
        """The hosts that hold a target model: the eval hosts, and the features host."""
        return self.eval_names + ([FEATURES] if self.features_host else [])

    @property
    def disks(self) -> dict[str, str]:
        """Each host's name and disk size, the trainer first (a features host's as an eval
        host's: it holds a venv and the target too)."""
        return {TRAINER: self.trainer_disk, **dict.fromkeys(self.target_hosts, self.eval_disk)}


@dataclass
class HostRecord:
    name: str
    address: str
    port: int
    data_dir: str
    netns: str | None = None
    veth: str | None = None
    pid: int | None = None  # the sshd listener's


@dataclass
class LabState:
    root: str
    mode: str  # "netns" or "loopback"
    # Marks what this lab made on the machine (namespaces, links, users): a later lab in the
    # same slot makes things of the same names, and a stale record must never remove those.
    # Empty in a record written before marks existed: its things are known by name only.
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    slot: int | None = None
    hosts: dict[str, HostRecord] = field(default_factory=dict)
    mounts: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    created_run_sshd: bool = False
    users: list[str] = field(default_factory=list)  # machine users made for the lab
    files: list[str] = field(default_factory=list)  # files outside the lab's root (sudoers)

    def save(self) -> None:
        path = Path(self.root) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, root: Path) -> LabState:
        try:
            data = json.loads((root / STATE_FILE).read_text())
        except FileNotFoundError:
            raise LabError(
                f"no lab at {root} ({STATE_FILE} missing); run `dflash-lab up`"
            ) from None
        data.setdefault("token", "")
        data["hosts"] = {name: HostRecord(**host) for name, host in data["hosts"].items()}
        return cls(**data)
