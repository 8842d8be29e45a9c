"""Each lab host's OpenSSH server: its host key and config, starting and stopping its
listener, and the known_hosts file that pins every host key for the workstation.

Files per host under `<root>/hosts/<name>/`: ssh_host_ed25519_key(.pub), sshd_config,
sshd.pid, sshd.log. The listener is recognised by its config path on its command line (sshd
keeps `-f CONFIG` in its process title), never by its pid alone.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_lab import processes
from dflash_lab.network import port_open
from dflash_lab.state import HostRecord
from dflash_lab.system import poll, run, wait_for
from dflash_ops.core.errors import LabError

if TYPE_CHECKING:
    from dflash_lab.lab import Lab

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
HOST_KEY = "ssh_host_ed25519_key"


def make_key(path: Path, comment: str) -> None:
    """A new ed25519 key pair without passphrase at `path` and `path`.pub."""
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def write_config(lab: Lab, name: str, bin_dir: Path) -> None:
    """sshd_config of host `name`: key-only root login, its own HOME and PATH."""
    record = lab.state.hosts[name]
    host_dir = lab.host_dir(name)
    path = f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    lines = [
        f"# sshd of the lab host {name!r}",
        f"ListenAddress {record.address}",
        f"Port {record.port}",
        f"HostKey {host_dir / HOST_KEY}",
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
    ]
    for user in lab.state.users:  # its own copy of the key: sshd reads it as the user
        lines += [f"Match User {user}", "    AuthorizedKeysFile %h/.ssh/authorized_keys"]
    (host_dir / "sshd_config").write_text("\n".join(lines) + "\n")


# sshd starts in well under a second, but a full parallel test run (four workers and their
# labs' harness runs on two cores) once kept one from writing its pid file for over 10 s.
START_TIMEOUT = 60
START_ATTEMPTS = 2  # sshd binds after daemonizing: a listener that dies there is started again
EXITED = "exited"


def start(lab: Lab, name: str) -> None:
    """Start host `name`'s sshd (in its namespace) and wait until it accepts connections.

    The command returns once sshd has daemonized; the listener then binds and writes its pid
    file. One that exits before that (its log says why) is started once more, and a second
    failure quotes the end of its log."""
    record = lab.state.hosts[name]
    config = lab.host_dir(name) / "sshd_config"
    pidfile = config.with_name("sshd.pid")
    log = config.with_name("sshd.log")
    is_listener = _is_listener(lab, name)
    for _ in range(START_ATTEMPTS):
        pidfile.unlink(missing_ok=True)
        run(lab.in_namespace(name, [SSHD, "-f", str(config), "-E", str(log)]))
        found = poll(lambda: _written_pid(pidfile) or _exited(is_listener), START_TIMEOUT)
        if found not in (None, EXITED):
            break
    else:
        how = found or f"gave none within {START_TIMEOUT:g}s"
        tail = " | ".join(log.read_text().splitlines()[-5:]) if log.exists() else "no log"
        raise LabError(f"sshd of {name} wrote no {pidfile} ({how}); the end of {log}: {tail}")
    record.pid = int(found)
    lab.state.save()
    wait_for(
        lambda: port_open(record.address, record.port),
        f"sshd of {name} to listen on {record.address}:{record.port}",
        START_TIMEOUT,
    )


def _written_pid(pidfile: Path) -> str:
    return pidfile.read_text().strip() if pidfile.exists() else ""


def _exited(is_listener: Callable[[int], bool]) -> str:
    """EXITED when no process of the machine is this host's listener, else ""."""
    return "" if processes.matching(is_listener) else EXITED


def running(lab: Lab, name: str) -> bool:
    record = lab.state.hosts[name]
    return record.pid is not None and _is_listener(lab, name)(record.pid)


def stop(lab: Lab, name: str) -> None:
    """Stop host `name`'s listener (its open sessions go on, as on a real server)."""
    record = lab.state.hosts[name]
    if record.pid is not None:
        processes.stop(record.pid, _is_listener(lab, name))


def _is_listener(lab: Lab, name: str) -> Callable[[int], bool]:
    """A test of whether a pid is host `name`'s live sshd listener (by its config path)."""
    config = str(lab.host_dir(name) / "sshd_config")

    def is_listener(pid: int) -> bool:
        return processes.is_live(pid) and f"-f {config} " in processes.command_line(pid) + " "

    return is_listener


def write_known_hosts(lab: Lab) -> None:
    """Pin every host's key, under the name the inventory will connect to."""
    lines = []
    for name, record in lab.state.hosts.items():
        public = (lab.host_dir(name) / f"{HOST_KEY}.pub").read_text().split()
        lines.append(f"{_known_host_name(record)} {public[0]} {public[1]}")
    lab.known_hosts.write_text("\n".join(lines) + "\n")


def _known_host_name(record: HostRecord) -> str:
    if record.port == 22:
        return record.address
    return f"[{record.address}]:{record.port}"
