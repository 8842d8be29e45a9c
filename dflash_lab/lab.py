"""A working copy of the deployment topology on this machine, for the demo and the tests.

As root, every remote host (the trainer, one or more eval servers) is a network namespace
joined to the workstation (this machine's root namespace) by its own veth pair, running its own
OpenSSH sshd, with its data on a size-limited tmpfs so that disk checks and disk-full are real.
Namespaces have no routes to each other: like the real servers, the trainer cannot reach an
eval host; only the workstation reaches both. Without root the lab falls back to sshd on
loopback ports and plain directories (no size limits, no isolation).

The trainer's "Proxmox container 200" is a directory playing its rootfs, and `pct` on the
trainer's PATH is a TEST STAND-IN for Proxmox's tool (see dflash_lab/container.py).

This module is the lab's front door: `up()`, `load()` and the `Lab` handle. The parts live
beside it: state (config and records), network, disks, sshd, container, content, inventory,
teardown. Everything the lab makes is recorded in `<root>/lab.json` as it is made, so
`Lab.down()` removes it all even after a failed `up()`.

Layout under the lab's root:

    lab.json  inventory.yaml  known_hosts  ssh_config  keys/id_ed25519(.pub)
    hosts/<name>/  sshd_config  sshd.pid  sshd.log  ssh_host_ed25519_key(.pub)  bin/
                   disk/   the host's data (tmpfs): home/, models/, the trainer's containers/
    workstation/   staging/  results/  (tmpfs)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from dflash_lab import disks, network, sshd, teardown, users
from dflash_lab.container import make_container
from dflash_lab.content import (
    ContentGenerator,
    content_generator,
    qwen36_models,
    random_checkpoints,
    trained_models,
)
from dflash_lab.inventory import write_inventory
from dflash_lab.state import (
    CHECKPOINT_LAYOUT,
    CONTAINER_CHECKPOINTS,
    CONTAINER_ID,
    DEFAULT_ROOT,
    LAB_PROMPTS,
    STATE_FILE,
    TRAINER,
    HostRecord,
    LabConfig,
    LabState,
)
from dflash_ops.core.errors import LabError
from dflash_ops.remote.routes import verify_routes

__all__ = [
    "CHECKPOINT_LAYOUT",
    "CONTAINER_CHECKPOINTS",
    "CONTAINER_ID",
    "DEFAULT_ROOT",
    "LAB_PROMPTS",
    "STATE_FILE",
    "TRAINER",
    "ContentGenerator",
    "HostRecord",
    "Lab",
    "LabConfig",
    "LabState",
    "content_generator",
    "load",
    "qwen36_models",
    "random_checkpoints",
    "trained_models",
    "up",
]


class Lab:
    """A built lab: where its files are, its hosts' sshd, and its removal."""

    def __init__(self, state: LabState) -> None:
        self.state = state

    @property
    def root(self) -> Path:
        return Path(self.state.root)

    @property
    def inventory_path(self) -> Path:
        return self.root / "inventory.yaml"

    @property
    def key(self) -> Path:
        return self.root / "keys" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    def host_dir(self, host: str) -> Path:
        """The host's lab files (sshd config, keys, bin/); its data is in `data_dir`."""
        return self.root / "hosts" / host

    def data_dir(self, host: str) -> Path:
        return Path(self.state.hosts[host].data_dir)

    @property
    def workstation_dir(self) -> Path:
        return self.root / "workstation"

    @property
    def container_rootfs(self) -> Path:
        return self.data_dir(TRAINER) / "containers" / f"subvol-{CONTAINER_ID}-disk-0"

    def container_path(self, in_container: str) -> Path:
        """Where an in-container path lies on the trainer host."""
        return self.container_rootfs / in_container.lstrip("/")

    def checkpoint_path(self, step: int) -> Path:
        return self.container_path(f"{CONTAINER_CHECKPOINTS}/{CHECKPOINT_LAYOUT.format(step=step)}")

    @property
    def container_state_file(self) -> Path:
        return self.host_dir(TRAINER) / "container-state"

    def set_container_running(self, running: bool) -> None:
        self.container_state_file.write_text("running\n" if running else "stopped\n")

    def sshd_running(self, host: str) -> bool:
        return sshd.running(self, host)

    def stop_sshd(self, host: str) -> None:
        """Stop the host's sshd listener (as a server going down; open sessions go on)."""
        sshd.stop(self, host)

    def start_sshd(self, host: str) -> None:
        sshd.start(self, host)

    @property
    def sudo_user(self) -> str | None:
        """The non-root login of the `sudo_hosts` (None: the lab has none)."""
        return self.state.users[0] if self.state.users else None

    def set_sudo_rights(self, granted: bool) -> None:
        """Give the sudo login its passwordless sudo, or take it away (tests put it back)."""
        users.set_sudo_rights(self, granted)

    def in_namespace(self, host: str, argv: list[str]) -> list[str]:
        """argv to run a local command inside the host's network namespace (as that host
        would); unchanged in loopback mode."""
        return network.in_namespace(self.state.hosts[host], argv)

    def exec_in(self, host: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return network.exec_in(self.state.hosts[host], argv, **kwargs)

    def down(self) -> list[str]:
        """Remove everything the lab made, processes first; returns what could not be
        removed (empty: nothing of the lab is left)."""
        return teardown.down(self)

    def leftovers(self) -> list[str]:
        """What of this lab still exists on the machine (for tests and `dflash-lab status`)."""
        return teardown.leftovers(self)


def up(config: LabConfig, content: ContentGenerator | None = None) -> Lab:
    """Build the lab described by `config`; on any failure, remove what was made and raise."""
    root = config.root.resolve()
    if (root / STATE_FILE).exists():
        raise LabError(f"a lab is already up at {root}; run `dflash-lab down` first")
    if root.exists() and any(root.iterdir()):
        raise LabError(f"{root} exists and is not empty; choose another --dir or remove it")
    _require_tools(as_root=os.geteuid() == 0)
    unknown = sorted(set(config.sudo_hosts) - set(config.disks))
    if unknown:
        raise LabError(f"sudo_hosts: no lab host named {', '.join(unknown)}")
    if config.sudo_hosts:
        if os.geteuid() != 0:
            raise LabError("sudo_hosts need root: the lab makes a user of this machine")
        users.require_tools()
    root.mkdir(parents=True, exist_ok=True)
    state = LabState(root=str(root), mode="netns" if os.geteuid() == 0 else "loopback")
    lab = Lab(state)
    state.save()
    try:
        _build(lab, config, content or random_checkpoints)
    except BaseException:
        lab.down()
        raise
    return lab


def load(root: Path = DEFAULT_ROOT) -> Lab:
    """The lab whose state is at `root` (as `up()` left it)."""
    return Lab(LabState.load(root.resolve()))


def _build(lab: Lab, config: LabConfig, content: ContentGenerator) -> None:
    state, root = lab.state, lab.root
    (root / "keys").mkdir()
    sshd.make_key(lab.key, "dflash-lab")
    (root / "ssh_config").write_text("# the lab's hosts need no client settings beyond argv\n")
    for name in config.disks:
        lab.host_dir(name).mkdir(parents=True)
        sshd.make_key(lab.host_dir(name) / sshd.HOST_KEY, f"lab-{name}")
    _add_hosts(lab, list(config.disks))
    if config.sudo_hosts:
        users.make_sudo_user(lab)
    for name, size in config.disks.items():
        _prepare_host(lab, name, size)
    workstation = lab.workstation_dir
    workstation.mkdir()
    disks.mount_tmpfs(state, workstation, config.workstation_disk)
    for sub in ("staging", "results"):
        (workstation / sub).mkdir()
    make_container(lab)
    eval_settings = content(lab, config)
    sshd.write_known_hosts(lab)
    for name in state.hosts:
        lab.start_sshd(name)
    write_inventory(lab, config, eval_settings)
    verify_routes(root / STATE_FILE)


def _add_hosts(lab: Lab, names: list[str]) -> None:
    """Give each host its address: a namespace in a slot no other lab uses, chosen and
    claimed under the machine-wide slot lock (as root), or a loopback port."""
    state = lab.state
    if state.mode != "netns":
        for name in names:
            state.hosts[name] = network.loopback_host(name, lab.host_dir(name) / "disk")
        state.save()
        return
    with network.slot_lock():
        # sshd's privilege-separation directory, under the lock: a lab tearing down removes
        # the one it made when no lab's namespace is left, and ours are made here.
        if not Path("/run/sshd").exists():
            Path("/run/sshd").mkdir(mode=0o755)
            state.created_run_sshd = True
        state.slot = network.free_slot(users.slot_in_use)
        for index, name in enumerate(names):
            data_dir = lab.host_dir(name) / "disk"
            state.hosts[name] = network.add_namespace_host(state, name, index, data_dir)
            state.save()


def _prepare_host(lab: Lab, name: str, disk_size: str) -> None:
    """The host's disk, home, bin/ (first on its PATH) and sshd config."""
    data_dir = lab.data_dir(name)
    data_dir.mkdir()
    disks.mount_tmpfs(lab.state, data_dir, disk_size)
    (data_dir / "home").mkdir()
    bin_dir = lab.host_dir(name) / "bin"
    bin_dir.mkdir()
    sshd.write_config(lab, name, bin_dir)


def _require_tools(as_root: bool) -> None:
    needed = ["ssh", "ssh-keygen", sshd.SSHD]
    if as_root:
        needed += ["ip", "mount", "unshare", "chroot"]
    missing = [tool for tool in needed if not shutil.which(tool)]
    if missing:
        raise LabError(
            f"the lab needs {', '.join(missing)}: run `make setup` (as root it "
            "installs openssh-server and iproute2) or install them"
        )
