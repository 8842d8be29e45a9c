"""The lab itself: isolation between hosts, real disk limits, the pct stand-in, teardown."""

from __future__ import annotations

import os
import subprocess

import pytest

from dflash_lab import lab as labs
from dflash_ops.core.errors import LabError
from dflash_ops.remote.routes import network_namespaces

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="namespaces and tmpfs need root")


def tcp_from(lab: labs.Lab, host: str, address: str) -> subprocess.CompletedProcess:
    return lab.exec_in(host, ["timeout", "3", "bash", "-c", f"exec 3<>/dev/tcp/{address}/22"])


def test_trainer_and_eval_cannot_reach_each_other(lab):
    trainer, evaluator = (lab.state.hosts[name].address for name in ("trainer", "eval"))
    blocked = tcp_from(lab, "trainer", evaluator)
    assert blocked.returncode != 0 and "unreachable" in blocked.stderr.lower()
    assert tcp_from(lab, "eval", trainer).returncode != 0
    assert tcp_from(lab, "trainer", trainer).returncode == 0  # its own sshd answers


def test_disks_are_size_limited(make_lab):
    disk = make_lab(eval_disk="16m").data_dir("eval")
    filler = subprocess.run(
        ["dd", "if=/dev/zero", f"of={disk}/fill", "bs=1M", "count=17"],
        capture_output=True,
        text=True,
    )
    assert filler.returncode != 0 and "No space left on device" in filler.stderr
    assert (disk / "fill").stat().st_size == 16 << 20


def test_pct_stand_in(lab, tmp_path):
    pct = str(lab.root / "hosts/trainer/bin/pct")
    assert "TEST STAND-IN" in (lab.root / "hosts/trainer/bin/pct").read_text()
    assert lab.exec_in("trainer", [pct, "status", "200"]).stdout == "status: running\n"
    missing = lab.exec_in("trainer", [pct, "status", "201"])
    assert missing.returncode == 2 and "201.conf' does not exist" in missing.stderr
    pulled = tmp_path / "pulled.pt"
    source = "/workspace/checkpoints/step_2000/checkpoint.pt"
    assert lab.exec_in("trainer", [pct, "pull", "200", source, str(pulled)]).returncode == 0
    assert pulled.read_bytes() == lab.checkpoint_path(2000).read_bytes()


def test_second_lab_up_in_the_same_place_is_refused(lab):
    with pytest.raises(LabError, match="already up"):
        labs.up(labs.LabConfig(root=lab.root))


def test_down_leaves_nothing_behind(tmp_path, fab):
    root = tmp_path / "lab"
    up = fab(None, "lab-up", "--dir", str(root), "--eval-hosts", "2")
    assert up.returncode == 0, up.stderr
    built = labs.load(root)
    assert set(built.state.hosts) == {"trainer", "eval", "eval2"}
    everything = built.leftovers()
    assert sum(item.startswith("netns") for item in everything) == 3
    assert sum(item.startswith("mount") for item in everything) == 4
    # A live SSH session must not keep anything alive either.
    session = subprocess.Popen(
        [
            "ssh",
            "-i",
            str(built.key),
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={built.known_hosts}",
            built.state.hosts["eval"].address,
            "sleep 60",
        ]
    )
    status = fab(None, "lab-status", "--dir", str(root))
    assert "eval2" in status.stdout and "sshd running" in status.stdout
    down = fab(None, "lab-down", "--dir", str(root))
    session.wait(timeout=10)
    assert down.returncode == 0, down.stderr
    assert built.leftovers() == []
    assert not any(n.startswith(f"dflab{built.state.slot}-") for n in network_namespaces())


def test_failed_up_removes_what_it_made(tmp_path):
    def broken_content(lab, config):
        raise LabError("content generator failed on purpose")

    def snapshot() -> tuple:
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        return (
            sorted(network_namespaces()),
            sorted(labs._mount_points()),
            sorted(line.split(":")[1].strip() for line in links.splitlines()),
        )

    before = snapshot()
    root = tmp_path / "lab"
    with pytest.raises(LabError, match="on purpose"):
        labs.up(labs.LabConfig(root=root), broken_content)
    assert not root.exists()
    assert snapshot() == before
