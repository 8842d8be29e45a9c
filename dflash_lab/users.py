"""The lab's non-root login with passwordless sudo (`LabConfig.sudo_hosts`), for `become: sudo`.

The lab's hosts share this machine's users, so the login is a real user of the machine:
`dflashlab<slot>` (the lab's network slot makes it unique among labs), with a home of its
own holding the lab's public key (sshd reads authorized_keys as the user, and the lab's
directory is not the user's to read), and a rule in /etc/sudoers.d/ that lets it run anything
as root without a password. The rule keeps the session's PATH (the lab host's tools, the pct
stand-in among them, come first on it) and HOME, so commands under sudo see the lab host as
the root login does. Both are recorded in the lab's state as they are made; teardown removes
them. Root only: without root there is no user to make.
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_lab import network
from dflash_lab.system import run
from dflash_ops.core.errors import LabError

if TYPE_CHECKING:
    from dflash_lab.lab import Lab

SUDOERS_DIR = Path("/etc/sudoers.d")
TOOLS = ("sudo", "useradd", "userdel", "visudo")


def user_name(lab: Lab) -> str:
    return _slot_user(lab.state.slot)


def _slot_user(slot: int | None) -> str:
    return f"dflashlab{slot}"


def slot_in_use(slot: int) -> bool:
    """Whether a lab's login or sudoers file of `slot` exists: a lab tearing down removes its
    namespaces before its user, so the slot looks free while they are still there."""
    return _exists(_slot_user(slot)) or _sudoers_path(slot).exists()


def require_tools() -> None:
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    if missing:
        raise LabError(
            f"a lab with a sudo login needs {', '.join(missing)}: `apt-get install sudo passwd`"
        )


def make_sudo_user(lab: Lab) -> str:
    """Create the lab's sudo login (its home, the lab's key, the sudoers rule); its name."""
    if os.geteuid() != 0 or lab.state.slot is None:
        raise LabError("a lab host with a non-root sudo login needs root (network mode)")
    require_tools()
    name = user_name(lab)
    if _exists(name):
        raise LabError(
            f"the user {name} already exists (left by an earlier lab?); remove it with "
            f"`userdel -r {name}` and retry"
        )
    # '*': no password, but not a locked account (sshd without PAM refuses locked ones).
    run(
        [
            "useradd",
            "--create-home",
            "--shell",
            "/bin/bash",
            "--password",
            "*",
            "--comment",
            network.mark(lab.state),
            name,
        ]
    )
    lab.state.users.append(name)
    lab.state.save()
    home = Path(pwd.getpwnam(name).pw_dir)
    keys = home / ".ssh" / "authorized_keys"
    keys.parent.mkdir(mode=0o700)
    keys.write_text(Path(f"{lab.key}.pub").read_text())
    entry = pwd.getpwnam(name)
    for path in (keys.parent, keys):
        os.chown(path, entry.pw_uid, entry.pw_gid)
    lab.state.files.append(str(sudoers_file(lab)))
    lab.state.save()
    set_sudo_rights(lab, granted=True)
    return name


def sudoers_file(lab: Lab) -> Path:
    return _sudoers_path(lab.state.slot)


def _sudoers_path(slot: int | None) -> Path:
    return SUDOERS_DIR / f"dflash-lab-{slot}"  # no dot: sudo skips such names


def _sudoers_header(lab: Lab) -> str:
    return f"# dflash lab {lab.root}: its non-root login; removed by `dflash-lab down`"


def set_sudo_rights(lab: Lab, granted: bool) -> None:
    """Give the lab's login passwordless sudo, or take it away (the file stays, ruleless)."""
    name = user_name(lab)
    lines = [
        _sudoers_header(lab),
        f'Defaults:{name} !secure_path, env_keep += "HOME DFLASH_LAB_HOST"',
    ]
    if granted:
        lines.append(f"{name} ALL=(root) NOPASSWD: ALL")
    path = sudoers_file(lab)
    draft = path.with_name(f".{path.name}-draft")  # a dot: sudo ignores it meanwhile
    draft.write_text("\n".join(lines) + "\n")
    draft.chmod(0o440)
    try:
        run(["visudo", "-c", "-q", "-f", str(draft)])
    except LabError:
        draft.unlink()
        raise
    draft.replace(path)


def remove(lab: Lab, problems: list[str]) -> None:
    """The lab's sudoers files and users (after its processes are gone)."""
    for file in lab.state.files:
        if not _own_file(lab, file):
            continue
        try:
            Path(file).unlink(missing_ok=True)
        except OSError as exc:
            problems.append(f"remove {file}: {exc}")
    for name in lab.state.users:
        if _own_user(lab, name):
            try:
                run(["userdel", "--remove", name])
            except LabError as exc:
                problems.append(f"remove user {name}: {exc}")


def leftovers(lab: Lab) -> list[str]:
    found = [f"user {name}" for name in lab.state.users if _own_user(lab, name)]
    return found + [f"file {file}" for file in lab.state.files if _own_file(lab, file)]


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# A later lab in the same slot makes a user and a sudoers file of the same names: a stale
# record removes only those that carry this lab's mark (its token; its root in the file).
def _own_user(lab: Lab, name: str) -> bool:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return False
    return not lab.state.token or entry.pw_gecos == network.mark(lab.state)


def _own_file(lab: Lab, file: str) -> bool:
    try:
        first = Path(file).read_text().partition("\n")[0]
    except FileNotFoundError:
        return False
    except OSError:
        return True  # unreadable: reported by the attempt to remove it
    return first == _sudoers_header(lab)
