"""A working copy of the deployment topology on this machine, for the demo and the tests.

As root, every remote host (the trainer, one or more eval servers) is a network namespace
joined to the workstation (this machine's root namespace) by its own veth pair, running its own
OpenSSH sshd, with its data on a size-limited tmpfs so that disk checks and disk-full are real.
Namespaces have no routes to each other: like the real servers, the trainer cannot reach an
eval host; only the workstation reaches both. Without root the lab falls back to sshd on
loopback ports and plain directories (no size limits, no isolation).

The trainer's "Proxmox container 200" is a directory playing its rootfs, and `pct` on the
trainer's PATH is a TEST STAND-IN for Proxmox's tool (which cannot be installed here): it
implements `pct status`, `pct exec ID -- CMD` (chroot into the rootfs, in a private mount
namespace) and `pct pull ID SRC DST`.

Everything the lab makes is recorded in `<root>/lab.json` as it is made, so `down()` removes
every process, mount, namespace, link and file even after a failed `up()`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from dflash_ops.core.errors import LabError
from dflash_ops.core.units import parse_size
from dflash_ops.remote.routes import network_namespaces, verify_routes

STATE_FILE = "lab.json"
LAB_PROMPTS = "prompts.jsonl"  # written by the "models" content, for run-eval --prompts
DEFAULT_ROOT = Path(os.environ.get("DFLASH_LAB_DIR", "/tmp/dflash-lab"))
CONTAINER_ID = 200
CONTAINER_CHECKPOINTS = "/workspace/checkpoints"
CHECKPOINT_LAYOUT = "step_{step}/checkpoint.pt"
SUBNET_PREFIX = "10.231"  # 10.231.<slot>.<4i+1 workstation, 4i+2 host> /30 per host
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
MODEL_CACHE = Path(os.environ.get("DFLASH_LAB_CACHE", Path.home() / ".cache" / "dflash-lab"))

# Hosts' data dirs as the inventory sees them: <root>/hosts/<name>/disk (the tmpfs).
TRAINER = "trainer"


@dataclass
class LabConfig:
    root: Path = DEFAULT_ROOT
    eval_hosts: int = 1
    trainer_disk: str = "256m"
    eval_disk: str = "3g"  # a CPU torch venv + uv cache (~0.9 GiB); tmpfs uses RAM as written
    workstation_disk: str = "256m"
    steps: tuple[int, ...] = (2000, 4000, 6000)
    checkpoint_size: str = "4m"  # for the random-bytes content
    content: str = "random"  # "random" (bytes) or "models" (tiny target + trained drafters)

    @property
    def eval_names(self) -> list[str]:
        return ["eval" if i == 0 else f"eval{i + 1}" for i in range(self.eval_hosts)]


@dataclass
class HostRecord:
    name: str
    address: str
    port: int
    data_dir: str
    netns: str | None = None
    veth: str | None = None
    pid: int | None = None


@dataclass
class LabState:
    root: str
    mode: str  # "netns" or "loopback"
    slot: int | None = None
    hosts: dict[str, HostRecord] = field(default_factory=dict)
    mounts: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    created_run_sshd: bool = False

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
            raise LabError(f"no lab at {root} ({STATE_FILE} missing); run `fab lab-up`") from None
        data["hosts"] = {name: HostRecord(**host) for name, host in data["hosts"].items()}
        return cls(**data)


# A content generator fills the lab with checkpoints (and models) and returns, per eval host,
# the inventory settings that point at what it made there (target_model, …).
ContentGenerator = Callable[["Lab", LabConfig], dict[str, dict]]


class Lab:
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
        return self.root / "hosts" / TRAINER / "container-state"

    def set_container_running(self, running: bool) -> None:
        self.container_state_file.write_text("running\n" if running else "stopped\n")

    # --- processes ------------------------------------------------------------------------

    def sshd_running(self, host: str) -> bool:
        pid = self.state.hosts[host].pid
        return pid is not None and _alive(pid)

    def stop_sshd(self, host: str) -> None:
        record = self.state.hosts[host]
        if record.pid and _alive(record.pid):
            os.kill(record.pid, 15)
            _wait_dead(record.pid)

    def start_sshd(self, host: str) -> None:
        record = self.state.hosts[host]
        config = self.root / "hosts" / host / "sshd_config"
        pidfile = self.root / "hosts" / host / "sshd.pid"
        pidfile.unlink(missing_ok=True)
        log = config.with_name("sshd.log")
        _run(self.in_namespace(host, [SSHD, "-f", str(config), "-E", str(log)]))
        record.pid = int(
            _wait_for(
                lambda: pidfile.exists() and pidfile.read_text().strip(),
                f"sshd of {host} to write {pidfile}",
            )
        )
        self.state.save()
        _wait_for(
            lambda: _port_open(record.address, record.port),
            f"sshd of {host} to listen on {record.address}:{record.port}",
        )

    def in_namespace(self, host: str, argv: list[str]) -> list[str]:
        """argv to run a local command inside the host's network namespace (as that host
        would); unchanged in loopback mode."""
        netns = self.state.hosts[host].netns
        return ["ip", "netns", "exec", netns, *argv] if netns else list(argv)

    def exec_in(self, host: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        argv = self.in_namespace(host, argv)
        return subprocess.run(argv, capture_output=True, text=True, **kwargs)

    # --- teardown -------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Remove everything the lab made. Returns what could not be removed (empty: clean)."""
        problems: list[str] = []
        state = self.state
        for name, record in state.hosts.items():
            if record.pid and _alive(record.pid):
                _try(problems, f"stop sshd of {name}", lambda r=record: _kill(r.pid))
        for netns in state.namespaces:
            pids = _netns_pids(netns)
            for pid in pids:  # sessions and anything they started inside the namespace
                _try(problems, f"stop pid {pid} in {netns}", lambda p=pid: _kill(p))
        for mount in reversed(state.mounts):
            _try(problems, f"unmount {mount}", lambda m=mount: _unmount(m))
        for link in state.links:
            if _run_ok(["ip", "link", "show", link]):
                _try(problems, f"delete link {link}", lambda n=link: _run(["ip", "link", "del", n]))
        for netns in state.namespaces:
            if netns in network_namespaces():
                _try(
                    problems,
                    f"delete netns {netns}",
                    lambda n=netns: _run(["ip", "netns", "del", n]),
                )
        # sshd's privilege-separation directory: ours to remove only when no lab is left.
        if state.created_run_sshd and not any(n.startswith("dflab") for n in network_namespaces()):
            shutil.rmtree("/run/sshd", ignore_errors=True)
        if not problems:
            shutil.rmtree(self.root, ignore_errors=True)
            if self.root.exists():
                problems.append(f"could not remove {self.root}")
        return problems

    def leftovers(self) -> list[str]:
        """What of this lab still exists on the machine (for tests and `lab-status`)."""
        found = [f"netns {n}" for n in self.state.namespaces if n in network_namespaces()]
        found += [
            f"link {link}" for link in self.state.links if _run_ok(["ip", "link", "show", link])
        ]
        mounted = _mount_points()
        found += [f"mount {m}" for m in self.state.mounts if m in mounted]
        found += [
            f"sshd pid {r.pid} ({n})"
            for n, r in self.state.hosts.items()
            if r.pid and _alive(r.pid)
        ]
        if self.root.exists():
            found.append(f"directory {self.root}")
        return found


# --- bringing a lab up ---------------------------------------------------------------------


def up(config: LabConfig, content: ContentGenerator | None = None) -> Lab:
    """Build the lab described by `config`; on any failure, remove what was made and raise."""
    root = config.root.resolve()
    if (root / STATE_FILE).exists():
        raise LabError(f"a lab is already up at {root}; run `fab lab-down` first")
    if root.exists() and any(root.iterdir()):
        raise LabError(f"{root} exists and is not empty; choose another --dir or remove it")
    _require_tools(as_root=os.geteuid() == 0)
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
    return Lab(LabState.load(root.resolve()))


def _build(lab: Lab, config: LabConfig, content: ContentGenerator) -> None:
    state, root = lab.state, lab.root
    (root / "keys").mkdir()
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dflash-lab", "-f", str(lab.key)])
    (root / "ssh_config").write_text("# the lab's hosts need no client settings beyond argv\n")
    if state.mode == "netns":
        state.slot = _free_slot()
        if not Path("/run/sshd").exists():  # sshd's privilege-separation directory
            Path("/run/sshd").mkdir(mode=0o755)
            state.created_run_sshd = True
    disks = {TRAINER: config.trainer_disk, **dict.fromkeys(config.eval_names, config.eval_disk)}
    for index, (name, disk) in enumerate(disks.items()):
        _add_host(lab, name, index, disk)
    workstation = lab.workstation_dir
    workstation.mkdir()
    _mount_disk(state, workstation, config.workstation_disk)
    for sub in ("staging", "results"):
        (workstation / sub).mkdir()
    _make_container(lab)
    eval_settings = content(lab, config)
    _write_known_hosts(lab)
    for name in state.hosts:
        lab.start_sshd(name)
    _write_inventory(lab, config, eval_settings)
    verify_routes(root / STATE_FILE)


def _add_host(lab: Lab, name: str, index: int, disk: str) -> None:
    state = lab.state
    host_dir = lab.root / "hosts" / name
    data_dir = host_dir / "disk"
    data_dir.mkdir(parents=True)
    _run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            f"lab-{name}",
            "-f",
            str(host_dir / "ssh_host_ed25519_key"),
        ]
    )
    if state.mode == "netns":
        netns, veth = f"dflab{state.slot}-{name}", f"dfl{state.slot}h{index}"
        workstation_ip = f"{SUBNET_PREFIX}.{state.slot}.{4 * index + 1}"
        address = f"{SUBNET_PREFIX}.{state.slot}.{4 * index + 2}"
        _run(["ip", "netns", "add", netns])
        state.namespaces.append(netns)
        state.save()
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p"])
        state.links.append(veth)
        state.save()
        _run(["ip", "link", "set", f"{veth}p", "netns", netns])
        _run(["ip", "addr", "add", f"{workstation_ip}/30", "dev", veth])
        _run(["ip", "link", "set", veth, "up"])
        _run(["ip", "-n", netns, "addr", "add", f"{address}/30", "dev", f"{veth}p"])
        _run(["ip", "-n", netns, "link", "set", f"{veth}p", "up"])
        _run(["ip", "-n", netns, "link", "set", "lo", "up"])
        record = HostRecord(name, address, 22, str(data_dir), netns, veth)
    else:
        record = HostRecord(name, "127.0.0.1", _free_port(), str(data_dir))
    state.hosts[name] = record
    state.save()
    _mount_disk(state, data_dir, disk)
    bin_dir = host_dir / "bin"
    bin_dir.mkdir()
    (data_dir / "home").mkdir()
    (host_dir / "sshd_config").write_text(_sshd_config(lab, name, record, bin_dir))


def _sshd_config(lab: Lab, name: str, record: HostRecord, bin_dir: Path) -> str:
    host_dir = lab.root / "hosts" / name
    path = f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return "\n".join(
        [
            f"# sshd of the lab host {name!r}",
            f"ListenAddress {record.address}",
            f"Port {record.port}",
            f"HostKey {host_dir / 'ssh_host_ed25519_key'}",
            f"PidFile {host_dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {lab.key}.pub",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PrintMotd no",
            "MaxStartups 64:30:128",
            "MaxSessions 64",
            "Subsystem sftp internal-sftp",
            # Each host has its own HOME on its own disk, as separate machines do (and this
            # machine's ~/.bashrc, which bash reads for every ssh command, stays out of it);
            # its own tools (the pct stand-in on the trainer) come first on PATH.
            f"SetEnv HOME={record.data_dir}/home PATH={path} DFLASH_LAB_HOST={name}",
            "",
        ]
    )


def _mount_disk(state: LabState, directory: Path, size: str) -> None:
    if state.mode != "netns":
        return
    _run(
        [
            "mount",
            "-t",
            "tmpfs",
            "-o",
            f"size={parse_size(size)},mode=0755",
            f"dflash-lab-{directory.name}",
            str(directory),
        ]
    )
    state.mounts.append(str(directory))
    state.save()


def _make_container(lab: Lab) -> None:
    rootfs = lab.container_rootfs
    for sub in ("usr", "etc", "dev", "proc", "tmp", "workspace/checkpoints"):
        (rootfs / sub).mkdir(parents=True)
    for link in ("bin", "sbin", "lib", "lib64"):  # merged-/usr layout, as in Debian 12
        if Path(f"/{link}").is_symlink():
            (rootfs / link).symlink_to(f"usr/{link}")
    lab.set_container_running(True)
    pct = Path(lab.state.hosts[TRAINER].data_dir).parent / "bin" / "pct"
    pct.write_text(
        PCT_STAND_IN.format(ct_id=CONTAINER_ID, rootfs=rootfs, state=lab.container_state_file)
    )
    pct.chmod(0o755)


# The TEST STAND-IN for Proxmox's `pct`, installed on the lab trainer's PATH.
PCT_STAND_IN = """#!/bin/bash
# TEST STAND-IN for Proxmox VE's `pct`, written by dflash_lab.lab. Proxmox cannot be installed
# here; this implements only what dflash-ops uses, for one container whose rootfs is a
# directory: `pct status ID`, `pct exec ID -- CMD...` (CMD chrooted into the rootfs, with the
# host's /usr and /etc bind-mounted read-only in a private mount namespace) and
# `pct pull ID SRC DST`.
set -euo pipefail
CT_ID={ct_id}
ROOTFS='{rootfs}'
STATE='{state}'
die() {{ echo "pct: $*" >&2; exit 2; }}
if [ "${{1:-}}" = __enter ]; then  # inside the private mount namespace
  shift
  for dir in usr etc; do
    mount --bind "/$dir" "$ROOTFS/$dir"; mount -o remount,bind,ro "$ROOTFS/$dir"
  done
  mount --rbind /dev "$ROOTFS/dev"
  mount -t proc proc "$ROOTFS/proc"
  exec chroot "$ROOTFS" "$@"
fi
[ $# -ge 2 ] || die "usage: pct status|exec|pull ID ..."
command=$1 id=$2; shift 2
[ "$id" = "$CT_ID" ] || die "Configuration file 'nodes/lab/lxc/$id.conf' does not exist"
state=$(cat "$STATE")
case $command in
  status) echo "status: $state" ;;
  exec)
    [ "$state" = running ] || die "CT $id not running"
    [ "${{1:-}}" = -- ] && shift
    [ $# -ge 1 ] || die "missing command"
    exec unshare --mount --propagation private -- "$0" __enter "$@" ;;
  pull)
    [ "$state" = running ] || die "CT $id not running"
    [ $# -eq 2 ] || die "usage: pct pull ID SRC DST"
    case $1 in /*) ;; *) die "source path must be absolute: $1" ;; esac
    cp -- "$ROOTFS$1" "$2" ;;
  *) die "unknown command '$command' (this stand-in knows status, exec, pull)" ;;
esac
"""


def random_checkpoints(lab: Lab, config: LabConfig) -> dict[str, dict]:
    """Default content: checkpoint files of random bytes at each step, and an empty
    directory where each eval host's target model would be."""
    size = parse_size(config.checkpoint_size)
    for step in config.steps:
        path = lab.checkpoint_path(step)
        path.parent.mkdir(parents=True)
        with path.open("wb") as out:
            remaining = size
            while remaining:
                chunk = os.urandom(min(remaining, 1 << 20))
                out.write(chunk)
                remaining -= len(chunk)
    settings = {}
    for name in config.eval_names:
        target = lab.data_dir(name) / "models" / "tiny-target"
        target.mkdir(parents=True)
        settings[name] = {"target_model": str(target)}
    return settings


def content_generator(kind: str) -> ContentGenerator:
    """The generator named on the command line: 'random' or 'models'."""
    if kind == "random":
        return random_checkpoints
    if kind == "models":
        return trained_models
    raise LabError(f"unknown lab content {kind!r}; expected 'random' or 'models'")


def trained_models(lab: Lab, config: LabConfig) -> dict[str, dict]:
    """A tiny target model on each eval host, and drafter checkpoints trained on it at each
    step in the trainer's container (built once, then reused from a cache)."""
    from dflash_lab.models import build_lab_models

    models = build_lab_models(MODEL_CACHE, steps=config.steps)
    for step in config.steps:
        path = lab.checkpoint_path(step)
        path.parent.mkdir(parents=True)
        shutil.copyfile(models.checkpoints[step], path)
    reference = _reference_drafter(models.checkpoints[max(config.steps)])
    settings = {}
    for name in config.eval_names:
        target = lab.data_dir(name) / "models" / "tiny-target"
        shutil.copytree(models.target_dir, target)
        shutil.copytree(reference, target.with_name("reference-drafter"))
        settings[name] = {
            "target_model": str(target),
            "reference_drafter": str(target.with_name("reference-drafter")),
        }
    if models.prompts is not None:  # prompts the tiny target answers sensibly
        shutil.copyfile(models.prompts, lab.root / LAB_PROMPTS)
    return settings


def _reference_drafter(checkpoint: Path) -> Path:
    """A 'published' drafter to compare against: the last checkpoint without its optimizer
    state (the harness's extracted form), made once next to the cached checkpoint."""
    from dflash_eval.extract import extract

    out = checkpoint.parent / "reference-drafter"
    if not (out / "model.safetensors").exists():
        extract(checkpoint, out.with_suffix(".tmp"))
        out.with_suffix(".tmp").rename(out)
    return out


def _write_known_hosts(lab: Lab) -> None:
    lines = []
    for name, record in lab.state.hosts.items():
        public = (lab.root / "hosts" / name / "ssh_host_ed25519_key.pub").read_text().split()
        host = record.address if record.port == 22 else f"[{record.address}]:{record.port}"
        lines.append(f"{host} {public[0]} {public[1]}")
    lab.known_hosts.write_text("\n".join(lines) + "\n")


def _container_access(lab: Lab) -> dict:
    """pct (the stand-in chroots, which needs root); without root the trainer reads the
    container through its rootfs instead."""
    rootfs = str(lab.container_rootfs)
    if lab.state.mode == "netns":
        return {"kind": "pct", "id": CONTAINER_ID, "rootfs": rootfs}
    return {"kind": "rootfs", "path": rootfs}


def _write_inventory(lab: Lab, config: LabConfig, eval_settings: dict[str, dict]) -> None:
    user = _current_user()

    def ssh(name: str) -> dict:
        record = lab.state.hosts[name]
        return {
            "address": record.address,
            "port": record.port,
            "user": user,
            "identity_file": str(lab.key),
            "known_hosts": str(lab.known_hosts),
            "connect_timeout": 5,
        }

    hosts: dict = {
        TRAINER: {
            "role": "trainer",
            **ssh(TRAINER),
            "container": _container_access(lab),
            "checkpoints": CONTAINER_CHECKPOINTS,
            "layout": CHECKPOINT_LAYOUT,
            "tmp_dir": str(lab.data_dir(TRAINER) / "tmp"),
        }
    }
    (lab.data_dir(TRAINER) / "tmp").mkdir()
    for name in config.eval_names:
        disk = lab.data_dir(name)
        hosts[name] = {
            "role": "eval",
            **ssh(name),
            "workdir": str(disk / "eval"),
            "venv": _venv_settings(disk),
            # The lab's eval hosts share this machine's cores: oversubscribed torch threads
            # make concurrent runs many times slower.
            "threads": max(1, (os.cpu_count() or 1) // config.eval_hosts),
            **eval_settings[name],
        }
    document = {
        "lab": str(lab.root / STATE_FILE),
        "ssh_config": str(lab.root / "ssh_config"),
        "hosts": hosts,
        "local": {
            "staging": str(lab.workstation_dir / "staging"),
            "results": str(lab.workstation_dir / "results"),
        },
        # The lab's disks are small tmpfs: keep a small free-space margin.
        "transfer": {"margin": "1m", "margin_fraction": 0.01},
    }
    header = "# Generated by dflash_lab.lab for the local lab; removed by `fab lab-down`.\n"
    lab.inventory_path.write_text(header + yaml.safe_dump(document, sort_keys=False))


def _free_slot() -> int:
    taken = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    taken += subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    names = network_namespaces()
    for slot in range(1, 250):
        if f"{SUBNET_PREFIX}.{slot}." not in taken and not any(
            n.startswith(f"dflab{slot}-") for n in names
        ):
            return slot
    raise LabError(f"no free {SUBNET_PREFIX}.N.0/24 range for the lab; remove old labs")


# --- small system helpers ------------------------------------------------------------------


def _require_tools(as_root: bool) -> None:
    needed = ["ssh", "ssh-keygen", SSHD] + (["ip", "mount", "unshare", "chroot"] if as_root else [])
    missing = [tool for tool in needed if not shutil.which(tool)]
    if missing:
        raise LabError(
            f"the lab needs {', '.join(missing)}: run `make setup` (as root it "
            "installs openssh-server and iproute2) or install them"
        )


def _run(argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(
            f"`{' '.join(argv)}` failed ({result.returncode}): "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
    return result.stdout


def _run_ok(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True).returncode == 0


def _try(problems: list[str], what: str, action: Callable[[], object]) -> None:
    try:
        action()
    except (OSError, LabError) as exc:
        problems.append(f"{what}: {exc}")


def _netns_pids(netns: str) -> list[int]:
    output = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
    return [int(pid) for pid in output.split()]


def _mount_points() -> set[str]:
    with open("/proc/self/mounts") as mounts:
        return {line.split()[1] for line in mounts}


def _unmount(path: str) -> None:
    if path in _mount_points() and not _run_ok(["umount", path]):
        _run(["umount", "-l", path])  # something still holds it open: detach lazily


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        return
    if not _wait_dead(pid, timeout=3):
        os.kill(pid, 9)
        _wait_dead(pid)


def _wait_dead(pid: int, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


def _wait_for(condition: Callable[[], object], what: str, timeout: float = 10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise LabError(f"timed out waiting for {what}")


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _venv_settings(disk: Path) -> dict:
    """The eval venv as the lab's hosts can build it: they have no network, but see this
    machine's files, so torch is pinned to the workstation's own (CPU) build, which the
    workstation pip's find-links hold, and uv runs offline on pip's local indexes."""
    from contextlib import suppress
    from importlib.metadata import PackageNotFoundError, version

    settings: dict = {"path": str(disk / "venv"), "python": _python_version(), "offline": True}
    with suppress(PackageNotFoundError):
        settings["versions"] = {"torch": version("torch")}
    return settings


def _python_version() -> str:
    import sys

    return f"{sys.version_info.major}.{sys.version_info.minor}"
