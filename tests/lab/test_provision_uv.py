"""uv's online routes refuse what is not pinned, and what provisioning creates on a host is
readable by every user whatever the login's umask: on a real lab eval host.

The lab has no internet, so the routes get a stand-in uv wheel through a file:// URL (the
installer route) or a local --find-links (the pip route): the same commands, sha256 checks
and unpacking as for the pinned wheels on PyPI.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dflash_ops.core.inventory import EvalHost
from dflash_ops.provision.harness import HARNESS_SOURCE, deploy_harness
from dflash_ops.provision.uv import (
    PYPI_FILES,
    UV_PIP_HASHES,
    UV_VERSION,
    UV_WHEELS,
    PinnedWheel,
    download_uv,
    pip_install_uv,
)
from dflash_ops.provision.venv import write_record
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout

# --- without a host ------------------------------------------------------------------------


def test_pinned_uv_wheels_are_one_version_static_builds_and_pip_accepts_them():
    for machine, wheel in UV_WHEELS.items():
        assert wheel.url.startswith(f"{PYPI_FILES}/")
        assert wheel.filename.startswith(f"uv-{UV_VERSION}-py3-none-")
        assert f"musllinux_1_1_{machine}" in wheel.filename  # static: any Linux of that arch
        assert wheel.member == f"uv-{UV_VERSION}.data/scripts/uv"
        assert re.fullmatch("[0-9a-f]{64}", wheel.sha256)
        assert wheel.sha256 in UV_PIP_HASHES
    assert all(re.fullmatch("[0-9a-f]{64}", digest) for digest in UV_PIP_HASHES)


def stand_in_wheel(directory: Path) -> Path:
    """A wheel laid out like uv's (the binary in uv-VERSION.data/scripts/uv) whose `uv`
    is a script printing a version: pip installs it, our unpacking finds it."""
    version = UV_VERSION
    files = {
        f"uv-{version}.data/scripts/uv": f"#!/bin/sh\necho 'uv {version} (stand-in)'\n".encode(),
        f"uv-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: uv\nVersion: {version}\n".encode()
        ),
        f"uv-{version}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"uv-{version}.dist-info/RECORD,,")
    files[f"uv-{version}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / f"uv-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            member = zipfile.ZipInfo(name)
            executable = name.endswith("/scripts/uv")  # as in uv's real wheels
            member.external_attr = (0o100755 if executable else 0o100644) << 16
            wheel.writestr(member, data)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- on a lab eval host whose logins have umask 077 ------------------------------------------


@dataclass
class PrivateHost:
    host: Host
    entry: EvalHost
    scratch: Path  # the same path on the host and here (the lab shares the filesystem)
    wheel: Path

    def run(self, command: str) -> str:
        return self.host.run(command).stdout.strip()

    def modes(self, path: Path) -> dict[str, str]:
        """relative path -> octal mode, for everything under `path` (links left out)."""
        listed = self.run(f"cd {path} && find . -mindepth 1 ! -type l -printf '%P %m\\n'")
        return dict(line.split() for line in listed.splitlines())


@pytest.fixture
def private_host(lab, inventory) -> Iterator[PrivateHost]:
    """The session lab's eval host, with `umask 077` in the lab host's ~/.bashrc (bash reads
    it for every ssh command) for the test only, and a scratch directory on its disk."""
    bashrc = lab.data_dir("eval") / "home" / ".bashrc"
    assert not bashrc.exists()
    scratch = lab.data_dir("eval") / "provision-uv-test"
    scratch.mkdir()
    scratch.chmod(0o755)
    bashrc.write_text("umask 077\n")
    host = Host(inventory, "eval")
    try:
        private = PrivateHost(host, inventory.eval_hosts["eval"], scratch, stand_in_wheel(scratch))
        # The premise: under the login's own umask (no tool's prefix), what a command
        # creates is private.
        plain = f"touch {scratch}/plain && stat -c %a {scratch}/plain"
        assert host.run(plain, as_login_user=True).stdout.strip() == "600"
        (scratch / "bin").mkdir()
        yield private
    finally:
        host.close()
        bashrc.unlink()
        shutil.rmtree(scratch)


def test_installer_refuses_a_wheel_whose_sha256_is_not_pinned(private_host):
    target = f"{private_host.scratch}/bin/uv"
    wheel = private_host.wheel
    failure = download_uv(
        private_host.host, target, PinnedWheel(wheel.as_uri(), UV_WHEELS["x86_64"].sha256)
    )
    assert failure == (
        f"REFUSED {wheel.name}: its sha256 is {sha256(wheel)}, not the pinned "
        f"{UV_WHEELS['x86_64'].sha256} (deleted, not run)"
    )
    assert list((private_host.scratch / "bin").iterdir()) == []  # no uv, no temporary file


def test_installer_unpacks_the_pinned_wheel_for_every_user(private_host):
    target = f"{private_host.scratch}/bin/uv"
    wheel = private_host.wheel
    pinned = PinnedWheel(wheel.as_uri(), sha256(wheel))
    assert download_uv(private_host.host, target, pinned) is None
    assert private_host.run(f"{target} --version") == f"uv {UV_VERSION} (stand-in)"
    assert private_host.modes(private_host.scratch / "bin") == {"uv": "755"}


def test_pip_refuses_a_uv_wheel_whose_sha256_is_not_pinned(private_host):
    """A mirror serving other bytes under uv's name and version gets nothing installed."""
    target = f"{private_host.scratch}/bin/uv"
    local_only = ("--no-index", "--find-links", str(private_host.scratch))
    failure = pip_install_uv(private_host.host, target, pip_args=local_only)
    assert failure.startswith(f"REFUSED the uv {UV_VERSION} wheel pip found"), failure
    assert sha256(private_host.wheel) in failure  # pip's "Got <sha256>"
    assert list((private_host.scratch / "bin").iterdir()) == []


def test_pip_installs_a_pinned_uv_for_every_user(private_host):
    target = f"{private_host.scratch}/bin/uv"
    local_only = ("--no-index", "--find-links", str(private_host.scratch))
    hashes = (sha256(private_host.wheel),)
    assert pip_install_uv(private_host.host, target, hashes, pip_args=local_only) is None
    assert private_host.run(f"{target} --version") == f"uv {UV_VERSION} (stand-in)"
    assert private_host.modes(private_host.scratch / "bin") == {"uv": "755"}


def test_harness_and_record_are_readable_by_every_user(private_host, tmp_path):
    """Under a private login umask, with harness files that are private on the workstation,
    the deployed harness and the provision record are still world-readable (and owned by the
    ssh user, not by the workstation's uid)."""
    source = tmp_path / "dflash_eval"
    shutil.copytree(HARNESS_SOURCE, source, ignore=shutil.ignore_patterns("__pycache__"))
    for path in source.rglob("*"):
        path.chmod(0o700 if path.is_dir() else 0o600)
    workdir = private_host.scratch / "work"
    venv = private_host.scratch / "venv"
    entry = private_host.entry.model_copy(
        update={
            "workdir": str(workdir),
            "venv": private_host.entry.venv.model_copy(update={"path": str(venv)}),
        }
    )
    deployed = deploy_harness(private_host.host, entry, source, say=lambda message: None)
    assert deployed.uploaded and deployed.switched
    modes = private_host.modes(workdir)
    assert modes and {mode for name, mode in modes.items() if name.endswith(".py")} == {"644"}
    assert {mode for name, mode in modes.items() if not name.endswith(".py")} <= {"644", "755"}
    owners = private_host.run(f"find {workdir} -printf '%U\\n' | sort -u")
    assert owners == private_host.run("id -u")

    venv.mkdir()
    write_record(private_host.host, entry, {"format": 1})
    record = EvalLayout(entry).provision_record
    assert private_host.run(f"stat -c %a {record}") == "644"
    assert json.loads(private_host.run(f"cat {record}")) == {"format": 1}
