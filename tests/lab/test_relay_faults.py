"""Faults while staging (issue 14): a link that dies mid-transfer fails in bounded time with
the reason, and a lock whose holder is gone is taken over at once."""

from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from dflash_lab import sshd
from dflash_ops.core.errors import TransferError
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.staging.delivery import StageOptions
from dflash_ops.staging.stage import stage

pytestmark = pytest.mark.long(50)  # seconds in a cold `make test` (5 workers)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def staged_dir(lab, step: int) -> Path:
    return lab.data_dir("eval") / "eval" / "checkpoints" / f"step_{step}"


def live_pids_holding(path: Path) -> list[int]:
    """Processes (not zombies) that have `path` open."""
    found = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(Path(fd).resolve() == path for fd in fd_dir.iterdir()):
                state = (fd_dir.parent / "stat").read_text().rpartition(")")[2].split()[0]
                if state != "Z":
                    found.append(int(fd_dir.parent.name))
        except OSError:
            continue
    return found


class LinkCut:
    """A lab whose trainer holds a 96 MiB checkpoint, its inventory with quick `transfer`
    settings (`fast`), and a progress callback that takes the eval host's link down once
    8 MiB have moved (`at`: when); `restore()` brings it back."""

    def __init__(self, make_lab, **transfer) -> None:
        self.lab = make_lab(steps=(4000,), checkpoint_size="96m", trainer_disk="160m")
        if self.lab.state.mode != "netns":
            pytest.skip("needs the lab's network namespaces (root)")
        self.inventory = load_inventory(self.lab.inventory_path)
        settings = self.inventory.transfer.model_copy(update=transfer)
        self.fast = self.inventory.model_copy(update={"transfer": settings})
        self.veth = self.lab.state.hosts["eval"].veth
        self.at: float | None = None

    def on_progress(self, state) -> None:
        if self.at is None and state.done >= 8 << 20:
            subprocess.run(["ip", "link", "set", self.veth, "down"], check=True)
            self.at = time.monotonic()

    def restore(self) -> None:
        subprocess.run(["ip", "link", "set", self.veth, "up"], check=True)


def test_a_link_that_dies_mid_transfer_fails_in_bounded_time(make_lab):
    cut = LinkCut(make_lab, keepalive=1)
    lab, inventory = cut.lab, cut.inventory
    try:
        with pytest.raises(TransferError) as raised:
            stage(
                cut.fast,
                4000,
                options=StageOptions(report=lambda _: None, on_progress=cut.on_progress),
            )
        failed_after = time.monotonic() - cut.at
    finally:
        cut.restore()
    message = str(raised.value)
    assert "exit 255" in message and "not responding" in message, message
    assert "rerun to resume" in message
    # keepalive 1 s × 4 to notice, the same again at most to let go of the lock: well under
    # the minutes an unbounded wait would take
    assert failed_after < 60, failed_after
    partial = staged_dir(lab, 4000) / "checkpoint.pt.partial"
    assert partial.exists()
    (result,) = stage(inventory, 4000, options=StageOptions(report=lambda _: None))
    assert result.sha256 == sha256(lab.checkpoint_path(4000))
    assert 0 < result.moved < 96 << 20  # resumed from what arrived before the link died


def live_writers_of(path: Path) -> list[int]:
    """The relay's writer processes for `path` (the host's `bash -c` and its python3 or tee),
    not zombies (PID 1 here reaps none): their command line holds the sink's script (or is
    tee's) and `path`.
    (The destination's lock holder names the path too, but holds only the lock file: a
    leftover holder is taken over by the next stage, see the test below.)"""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            command = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        writer = b"import hashlib" in command or command.startswith(b"tee\0")
        if str(path).encode() in command and writer and state != "Z":
            found.append(int(proc.name))
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
    except OSError:
        return "(gone)"


def without_python3(lab, host: str) -> None:
    """Restart `host`'s sshd with a PATH that has every tool of this machine but python3
    (a host with coreutils and no python): the relay's writer there is its tee fallback."""
    tools = lab.host_dir(host) / "no-python"
    tools.mkdir()
    for directory in (
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ):
        for tool in sorted(Path(directory).iterdir()) if Path(directory).is_dir() else ():
            if not tool.name.startswith("python") and not (tools / tool.name).exists():
                (tools / tool.name).symlink_to(tool)
    config = lab.host_dir(host) / "sshd_config"
    text = config.read_text()
    system = ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
    assert system in text
    config.write_text(text.replace(system, f":{tools} "))
    sshd.stop(lab, host)
    sshd.start(lab, host)


@pytest.mark.parametrize("writer", ["python3", "tee"])
def test_the_eval_side_writer_dies_with_its_stream(make_lab, writer):
    """The link to the eval host goes down mid-transfer and stays down: the workstation gives
    up (keepalive), and the writer on the host gives up too after transfer.stall_timeout,
    closing the partial: removing it then frees its space, and no writer is left behind.
    Either writer: python3's, or tee with its watchdog on a host without python3."""
    cut = LinkCut(make_lab, keepalive=1, stall_timeout=3)
    lab, inventory = cut.lab, cut.inventory
    if writer == "tee":
        without_python3(lab, "eval")
    partial = staged_dir(lab, 4000) / "checkpoint.pt.partial"
    disk = lab.data_dir("eval")
    free_before = shutil.disk_usage(disk).free
    writing: list[str] = []  # the writers' command lines as the link went down

    def on_progress(state) -> None:
        cut.on_progress(state)
        if cut.at is not None and not writing:
            writing.extend(command_line(pid) for pid in live_writers_of(partial))

    try:
        with pytest.raises(TransferError):
            stage(
                cut.fast, 4000, options=StageOptions(report=lambda _: None, on_progress=on_progress)
            )
        assert any(line.startswith(f"{writer} ") for line in writing), writing
        # The link is still down: whatever ends the writer now is its own stall timeout.
        deadline = cut.at + 30
        while live_writers_of(partial) and time.monotonic() < deadline:
            time.sleep(0.5)
        alive = {pid: command_line(pid) for pid in live_writers_of(partial)}
        gone_after = time.monotonic() - cut.at
        assert not alive, f"alive {gone_after:.0f} s after the link went down: {alive}"
        assert live_pids_holding(partial) == []
        assert partial.stat().st_size > 0  # what arrived stays, for a resume
        assert not (staged_dir(lab, 4000) / "checkpoint.pt").exists()  # nothing promoted
        partial.unlink()  # as a discard or the user would: its space must come back
        assert shutil.disk_usage(disk).free >= free_before - (1 << 20)
    finally:
        cut.restore()
    (result,) = stage(inventory, 4000, options=StageOptions(report=lambda _: None))
    assert result.sha256 == sha256(lab.checkpoint_path(4000))


def lab_and_lock(make_lab):
    """A lab with step 4000 only, its inventory, and the lock staging takes on eval's copy."""
    lab = make_lab(steps=(4000,))
    directory = staged_dir(lab, 4000)
    directory.mkdir(parents=True)
    return lab, load_inventory(lab.inventory_path), directory / ".checkpoint.pt.lock"


def holding(lock: Path, pid: int, then: str) -> list[str]:
    """argv that takes `lock` as staging does, records `pid` as its holder, prints "held",
    then execs `then` (so the lock stays held while it runs)."""
    holder = f"pid {pid} on {socket.gethostname()} since 00:00:00 token 0123abcd"
    script = f"exec 9>>{lock}; flock 9; echo '{holder}' > {lock}; echo held; exec {then}"
    return ["bash", "-c", script]


def test_a_lock_whose_holder_is_gone_is_taken_over_at_once(make_lab):
    lab, inventory, lock = lab_and_lock(make_lab)
    gone = subprocess.Popen(["true"])
    gone.wait()
    # What a dropped connection leaves behind on the host: a process still holding the lock.
    leftover = subprocess.Popen(
        lab.in_namespace("eval", holding(lock, gone.pid, "sleep 600")),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert leftover.stdout.readline().strip() == "held"
        notes: list[str] = []
        (result,) = stage(inventory, 4000, options=StageOptions(report=notes.append))
        assert result.sha256 == sha256(lab.checkpoint_path(4000))
        assert any(f"took over the lock {lock} from pid {gone.pid}" in n for n in notes), notes
        assert leftover.wait(10) is not None  # the leftover holder was stopped
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()


def test_a_live_holder_is_never_taken_over(make_lab):
    _, inventory, lock = lab_and_lock(make_lab)
    sleeper = subprocess.Popen(["sleep", "600"])
    holder = subprocess.Popen(
        holding(lock, sleeper.pid, "cat"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TransferError, match=f"locked by another stage .*pid {sleeper.pid}"):
            stage(inventory, 4000, options=StageOptions(report=lambda _: None))
        assert holder.poll() is None and sleeper.poll() is None
    finally:
        holder.stdin.close()
        holder.wait()
        sleeper.kill()
        sleeper.wait()
