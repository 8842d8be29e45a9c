"""The lab itself: isolation between hosts, real disk limits, the pct stand-in, teardown."""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from importlib.resources import files
from pathlib import Path

import pytest

from dflash_lab import lab as labs
from dflash_lab import network, users
from dflash_ops.core.errors import LabError
from dflash_ops.remote.routes import network_namespaces
from tests.conftest import run_lab

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="namespaces and tmpfs need root")

REPO = Path(__file__).resolve().parents[2]


def tcp_from(lab: labs.Lab, host: str, address: str) -> subprocess.CompletedProcess:
    return lab.exec_in(host, ["timeout", "3", "bash", "-c", f"exec 3<>/dev/tcp/{address}/22"])


def ssh_argv(lab: labs.Lab, host: str, command: str) -> list[str]:
    """The plain OpenSSH client, as a user would reach a lab host."""
    return [
        "ssh",
        "-i",
        str(lab.key),
        "-o",
        "BatchMode=yes",
        "-o",
        f"UserKnownHostsFile={lab.known_hosts}",
        lab.state.hosts[host].address,
        command,
    ]


def processes_in(netns_fd: int) -> dict[int, str]:
    """{pid: command} of the live (not zombie) processes in the network namespace open as
    `netns_fd`, found from /proc independently of the lab's own code."""
    namespace = os.fstat(netns_fd)
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            member = os.stat(f"/proc/{pid}/ns/net")
            status = Path(f"/proc/{pid}/status").read_text()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        same = (member.st_dev, member.st_ino) == (namespace.st_dev, namespace.st_ino)
        if same and "\nState:\tZ" not in status:
            found[int(pid)] = command.strip()
    return found


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
    installed = lab.root / "hosts/trainer/bin/pct"
    assert installed.read_bytes() == files("dflash_lab").joinpath("stand_ins/pct").read_bytes()
    assert "TEST STAND-IN" in installed.read_text()
    pct = str(installed)
    assert lab.exec_in("trainer", [pct, "status", "200"]).stdout == "status: running\n"
    missing = lab.exec_in("trainer", [pct, "status", "201"])
    assert missing.returncode == 2 and "201.conf' does not exist" in missing.stderr
    pulled = tmp_path / "pulled.pt"
    source = "/workspace/checkpoints/step_2000/checkpoint.pt"
    assert lab.exec_in("trainer", [pct, "pull", "200", source, str(pulled)]).returncode == 0
    assert pulled.read_bytes() == lab.checkpoint_path(2000).read_bytes()
    listed = lab.exec_in("trainer", [pct, "exec", "200", "--", "ls", "/workspace/checkpoints"])
    assert listed.stdout.split() == ["step_2000", "step_4000", "step_6000"], listed.stderr


def test_second_lab_up_in_the_same_place_is_refused(lab):
    with pytest.raises(LabError, match="already up"):
        labs.up(labs.LabConfig(root=lab.root))


def test_down_leaves_nothing_behind(tmp_path):
    root = tmp_path / "lab"
    up = run_lab("up", "--dir", str(root), "--eval-hosts", "2")
    assert up.returncode == 0, up.stderr
    built = labs.load(root)
    assert set(built.state.hosts) == {"trainer", "eval", "eval2"}
    everything = built.leftovers()
    assert sum(item.startswith("netns") for item in everything) == 3
    assert sum(item.startswith("mount") for item in everything) == 4
    # A live SSH session must not keep anything alive either.
    session = subprocess.Popen(ssh_argv(built, "eval", "sleep 60"))
    status = run_lab("status", "--dir", str(root))
    assert "eval2" in status.stdout and "sshd running" in status.stdout
    down = run_lab("down", "--dir", str(root))
    session.wait(timeout=10)
    assert down.returncode == 0, down.stderr
    assert built.leftovers() == []
    # By name alone this would race: once down releases the slot, a lab coming up on another
    # worker may claim it and make namespaces of the same names. Ours carry our mark.
    slot = [n for n in network_namespaces() if n.startswith(f"dflab{built.state.slot}-")]
    assert not [n for n in slot if network.own_namespace(built.state, n)]


def test_a_stale_record_of_the_slot_removes_nothing_of_the_lab_there_now(make_lab, tmp_path):
    """A lab whose teardown stopped half-way keeps its record; by then a later lab may hold
    the same slot, and so namespaces, links, user and sudoers file of the same names. Taking
    the stale record down must leave that lab untouched (it once took a running lab's
    trainer namespace from under its sshd)."""
    now = make_lab(sudo_hosts=("eval",))
    stale_root = tmp_path / "stale"
    stale_root.mkdir()
    stale = labs.Lab(dataclasses.replace(now.state, root=str(stale_root), token=STALE_TOKEN))
    stale.state.save()
    assert stale.down() == []
    assert not stale_root.exists()
    assert set(now.state.namespaces) <= set(network_namespaces())
    assert all(now.sshd_running(name) for name in now.state.hosts)
    assert all(Path(file).exists() for file in now.state.files)
    assert subprocess.run(["id", now.state.users[0]], capture_output=True).returncode == 0
    assert tcp_from(now, "eval", now.state.hosts["eval"].address).returncode == 0


STALE_TOKEN = "0" * 16  # another lab's mark


def test_a_slot_whose_login_is_still_there_is_not_chosen():
    """A lab's user outlives its namespaces when its teardown was cut short: the slot looks
    free on the network, but a lab that took it could not make its login of the same name
    (CI once failed four tests that way)."""
    with network.slot_lock():  # no other lab claims or frees a slot meanwhile
        slot = network.free_slot(users.slot_in_use)
        name = f"dflashlab{slot}"
        subprocess.run(["useradd", "--no-create-home", name], check=True)
        try:
            assert network.free_slot(users.slot_in_use) != slot
            assert network.free_slot() == slot  # only the login tells
        finally:
            subprocess.run(["userdel", name], check=True)


def test_failed_up_removes_what_it_made(tmp_path):
    half_built = []

    def broken_content(lab, config):
        half_built.append(lab)
        raise LabError("content generator failed on purpose")

    root = tmp_path / "lab"
    with pytest.raises(LabError, match="on purpose"):
        labs.up(labs.LabConfig(root=root), broken_content)
    assert not root.exists()
    # Only what this lab made is looked for: other labs may come and go meanwhile.
    made = half_built[0].state
    assert len(made.namespaces) == 2 and len(made.links) == 2 and len(made.mounts) == 3
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    with open("/proc/self/mounts") as mounts:
        mounted = {line.split()[1] for line in mounts}
    assert not set(made.namespaces) & set(network_namespaces())
    assert not any(f" {link}:" in links or f" {link}@" in links for link in made.links)
    assert not set(made.mounts) & mounted


# Started over SSH, detached: ignores SIGTERM and SIGHUP (as do its children, which inherit
# that) and keeps starting long sleeps, so a single pass of kills always misses some.
STUBBORN_JOB = (
    "setsid -f bash -c "
    + shlex.quote(
        'trap "" TERM HUP; echo ready; exec >/dev/null; '
        "for i in $(seq 300); do sleep 300 & sleep 0.2; done"
    )
    + " </dev/null 2>/dev/null | head -n1"
)


def test_down_stops_every_process_left_in_a_namespace(make_lab):
    built = make_lab()
    netns = built.state.hosts["eval"].netns
    # Held open, the namespace keeps its identity after its name is deleted, so that any
    # process still inside can be found.
    held = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    session = None
    try:
        job = subprocess.run(
            ssh_argv(built, "eval", STUBBORN_JOB), capture_output=True, text=True, timeout=60
        )
        assert job.stdout == "ready\n", job.stderr
        session = subprocess.Popen(
            ssh_argv(built, "eval", "echo open; exec sleep 300"), stdout=subprocess.PIPE, text=True
        )
        assert session.stdout.readline() == "open\n"  # a session is open in the namespace
        inside = list(processes_in(held).values())
        assert "sleep 300" in inside and any(c.startswith("bash -c trap") for c in inside)

        problems = built.down()

        assert problems == []
        assert processes_in(held) == {}
        assert netns not in network_namespaces()
        assert session.wait(timeout=60) != 0  # its server side is gone
    finally:
        for pid in processes_in(held):  # only when the test failed
            os.kill(pid, signal.SIGKILL)
        os.close(held)
        if session is not None:
            if session.poll() is None:
                session.kill()
            session.stdout.close()


# A lab builder that waits on its stdin, so that several start building at the same moment.
BUILD_WHEN_TOLD = """
import sys
from pathlib import Path
from dflash_lab import lab as labs
from dflash_lab import network, users
print("ready", flush=True)
sys.stdin.read()
built = labs.up(labs.LabConfig(root=Path(sys.argv[1]), eval_disk="16m", checkpoint_size="64k"))
print(built.state.slot, flush=True)
"""


def test_labs_built_at_the_same_moment_get_different_slots(tmp_path):
    # Without the slot lock, two of four such builders pick the same slot most of the time.
    roots = [tmp_path / f"lab{i}" for i in range(4)]
    builders = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD_WHEN_TOLD, str(root)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for root in roots
    ]
    try:
        assert [builder.stdout.readline() for builder in builders] == ["ready\n"] * len(roots)
        for builder in builders:
            builder.stdin.close()  # go
        outputs = [builder.stdout.read() for builder in builders]  # the slot, or an error
        assert [builder.wait(timeout=120) for builder in builders] == [0] * len(roots), outputs
        assert len({output.strip() for output in outputs}) == len(roots), outputs
    finally:
        for builder in builders:
            if builder.poll() is None:
                builder.kill()
            builder.stdout.close()
        for root in roots:
            if (root / labs.STATE_FILE).exists():
                assert labs.load(root).down() == []


def test_an_sshd_that_cannot_bind_fails_fast_quoting_its_log_and_starts_once_free(make_lab):
    """sshd binds after daemonizing, so its start command succeeds either way: a listener
    that exits instead of writing its pid file is found at once, not after the timeout."""
    from dflash_lab import sshd

    lab = make_lab()
    lab.stop_sshd("eval")
    record = lab.state.hosts["eval"]
    squatter = subprocess.Popen(
        lab.in_namespace("eval", [sys.executable, "-c", SQUAT, record.address, str(record.port)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert squatter.stdout.readline().strip() == "listening"
        started = time.monotonic()
        with pytest.raises(LabError) as failed:
            sshd.start(lab, "eval")
        assert time.monotonic() - started < sshd.START_TIMEOUT / 2
        message = str(failed.value)
        assert "sshd of eval wrote no" in message and "(exited)" in message
        assert "Address already in use" in message  # the end of sshd's own log
    finally:
        squatter.kill()
        squatter.wait()
    sshd.start(lab, "eval")
    assert sshd.running(lab, "eval")


# Holds address:port (argv) until killed.
SQUAT = """
import socket, sys, time
listener = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
time.sleep(600)
"""
