"""Gentle to training: a bandwidth limit paces the relay (`transfer.bwlimit`, `--bwlimit`), and
the trainer's readers run at nice 19 in the idle I/O class.

The pacing is asserted on what the code measured and computed (bytes, seconds, waits), never
on a stopwatch in the test; the priorities on the reading processes themselves, read from
/proc while a paced copy is under way.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from dflash_lab.system import wait_for
from dflash_ops.core.errors import InventoryError
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.core.inventory import parse, with_bwlimit
from dflash_ops.core.units import MIN_BWLIMIT, parse_bwlimit
from dflash_ops.remote.connection import Host
from dflash_ops.remote.containers import environment_of
from dflash_ops.remote.priority import MARK, NICENESS, announced, low_priority
from dflash_ops.staging.delivery import StageOptions
from dflash_ops.staging.pace import Pace
from dflash_ops.staging.relay import Pipe, RelayState
from dflash_ops.staging.relay_commands import sink
from dflash_ops.staging.sides import RemoteSide
from dflash_ops.staging.sources import TrainerFiles
from dflash_ops.staging.stage import stage
from tests.inventory_documents import minimal_document

MiB = 1 << 20


# --- units and the inventory ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("200m", 200 * MiB),
        ("200M/s", 200 * MiB),
        ("1.5g", 3 * 512 * MiB),
        ("64k", MIN_BWLIMIT),
        (10 * MiB, 10 * MiB),
        (None, None),
        ("none", None),
        ("0", None),
        (0, None),
    ],
)
def test_a_bwlimit_is_bytes_per_second_in_binary_units(text, rate):
    assert parse_bwlimit(text) == rate


@pytest.mark.parametrize("text", ["fast", "63k", "-5m", "1k/s"])
def test_a_bwlimit_that_is_no_rate_or_too_small_is_refused(text):
    with pytest.raises(ValueError, match="bandwidth"):
        parse_bwlimit(text)


def inventory_with(transfer: dict | None = None, **trainer) -> dict:
    raw = minimal_document(**trainer)
    if transfer is not None:
        raw["transfer"] = transfer
    return raw


def test_the_inventory_reads_transfer_bwlimit_as_bytes_per_second():
    inventory = parse(inventory_with({"bwlimit": "200m"}), Path("inv.yaml"))
    assert inventory.transfer.bwlimit == 200 * MiB
    assert parse(inventory_with(), Path("inv.yaml")).transfer.bwlimit is None


@pytest.mark.parametrize("value", ["2k", "quick", True])
def test_a_bad_transfer_bwlimit_names_the_key_and_the_expected_units(value):
    with pytest.raises(InventoryError) as caught:
        parse(inventory_with({"bwlimit": value}), Path("inv.yaml"))
    message = str(caught.value)
    assert "transfer.bwlimit: expected a bandwidth in bytes per second" in message
    assert "64.0 KiB/s" in message and "200m" in message


def test_the_bwlimit_flag_overrides_the_inventory_and_none_lifts_it():
    inventory = parse(inventory_with({"bwlimit": "200m"}), Path("inv.yaml"))
    assert with_bwlimit(inventory, None).transfer.bwlimit == 200 * MiB
    assert with_bwlimit(inventory, "50m").transfer.bwlimit == 50 * MiB
    assert with_bwlimit(inventory, "none").transfer.bwlimit is None
    with pytest.raises(InventoryError, match="--bwlimit: bandwidth '10k'"):
        with_bwlimit(inventory, "10k")


# --- the token bucket ------------------------------------------------------------------------


class VirtualClock:
    """Time that passes only when the pace sleeps: the waits it computes, exactly."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_the_pace_starts_empty_and_waits_for_each_piece_at_the_limit():
    clock = VirtualClock()
    limit = 4 * MiB
    pace = Pace(limit, clock=clock, sleep=clock.sleep)
    for _ in range(10):
        allowed = pace.allowance()
        assert allowed == pace.piece
        pace.spent(allowed)
    paced = pace.report()
    assert paced.sent == 10 * pace.piece
    assert clock.sleeps == pytest.approx([pace.piece / limit] * 10)
    assert paced.waited == pytest.approx(paced.sent / limit)
    assert paced.rate == pytest.approx(limit)


def test_a_slow_source_is_never_held_back_further():
    """Time spent waiting for the source's bytes counts: the pace only sleeps for the rest."""
    clock = VirtualClock()
    limit = 4 * MiB
    pace = Pace(limit, clock=clock, sleep=clock.sleep)
    pace.spent(pace.allowance())
    clock.now += 10  # the source took ten seconds for the next bytes
    assert pace.allowance() == pace.piece
    assert len(clock.sleeps) == 1  # no second wait: the bucket had refilled meanwhile


def test_a_short_splice_spends_only_what_it_moved():
    clock = VirtualClock()
    pace = Pace(MIN_BWLIMIT, clock=clock, sleep=clock.sleep)
    pace.spent(pace.allowance() // 4)
    waits = len(clock.sleeps)
    assert pace.allowance() == pace.piece
    assert clock.sleeps[waits] == pytest.approx(pace.piece / 4 / MIN_BWLIMIT)


# --- low priority ----------------------------------------------------------------------------


def test_low_priority_runs_the_command_at_nice_19_and_idle_io_and_says_so():
    command = low_priority(
        "cut -d ' ' -f 19 /proc/self/stat; ionice -p $$", announce="here's 'mine'"
    )
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(NICENESS), "idle"]
    assert announced(done.stderr) == ["here's 'mine': nice 19, ionice idle"]


@pytest.mark.parametrize("container", [None, {"kind": "pct", "id": 200}])
def test_transfer_low_priority_false_reads_at_normal_priority(tmp_path, container):
    """The trainer's reader is gentle by default; `transfer.low_priority: false` (a trainer
    with CPU to spare) leaves it, on the host and inside a container, at normal priority."""
    trainer = {} if container is None else {"container": container}
    for setting, wrapped in ((None, True), (True, True), (False, False)):
        raw = inventory_with(None if setting is None else {"low_priority": setting}, **trainer)
        files = TrainerFiles(parse(raw, tmp_path / "inv.yaml"), "stream")
        command = files.source("/ckpt/step_1/checkpoint.pt").command(0, hashed=True)
        assert (f"nice -n {NICENESS}" in command) == wrapped, (setting, command)


def test_without_ionice_the_reader_falls_back_to_nice_alone(tmp_path):
    """A host (or container) whose PATH lacks ionice: nice only, said so, and no error."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("nice", "sh", "cut"):
        (bin_dir / tool).symlink_to(subprocess.check_output(["which", tool], text=True).strip())
    command = low_priority("cut -d ' ' -f 19 /proc/self/stat", announce="bare")
    done = subprocess.run(
        ["/bin/bash", "-c", command],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(NICENESS)
    assert done.stderr == f"{MARK} bare: nice 19\n"


# --- on the lab ------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def paced_copy(inventory, lab, step: int, bwlimit: int | None, name: str):
    """The trainer's checkpoint of `step` to the eval host's disk through one real relay pipe."""
    reader = TrainerFiles(inventory, "stream")
    source = reader.source(f"/workspace/checkpoints/step_{step}/checkpoint.pt")
    target = lab.data_dir("eval") / name
    dest = RemoteSide(Host(inventory, "eval"))
    pipe = Pipe(
        source.side.argv(source.command(0, hashed=True)),
        dest.argv(sink(str(target), append=False, hashed=True, stall_timeout=None)),
        gated=False,
        bwlimit=bwlimit,
    )
    return pipe.run(lab.checkpoint_path(step).stat().st_size), target


def test_a_bwlimit_holds_the_relay_to_the_limit_it_measures(lab, inventory):
    limit = 2 * MiB
    size = lab.checkpoint_path(2000).stat().st_size
    moved, target = paced_copy(inventory, lab, 2000, limit, "paced.bin")
    try:
        assert moved.count == size and moved.source_digest == moved.dest_digest
        assert sha256(target) == sha256(lab.checkpoint_path(2000))
        paced = moved.paced
        assert paced.limit == limit and paced.sent == size
        assert paced.waited > 0  # the pace held the stream back
        # The bucket starts empty: the measured average can never exceed the limit, so the
        # copy took at least size/limit seconds by the code's own clock.
        assert paced.rate <= limit * 1.001
        assert paced.seconds >= size / limit * 0.999
        unpaced, _ = paced_copy(inventory, lab, 2000, None, "paced.bin")
        assert unpaced.paced is None and unpaced.count == size
    finally:
        target.unlink(missing_ok=True)


def test_the_stage_summary_shows_the_limit_and_the_readers_priority(lab, fab):
    done = fab(lab.inventory_path, "stage-checkpoint", "--step", "6000", "--bwlimit", "3m")
    try:
        assert done.returncode == 0, done.stderr
        output = " ".join(done.stdout.split())
        assert "bwlimit 3.0 MiB/s (average " in output
        assert "reader at trainer: nice 19, ionice idle" in output
        if lab.state.mode == "netns":  # the pct stand-in: the reader inside sets its own
            assert "pct container 200: nice 19, ionice idle" in output
    finally:
        staged = lab.data_dir("eval") / "eval" / "checkpoints" / "step_6000"
        subprocess.run(["rm", "-rf", "--", str(staged)], check=True)


def test_a_dry_run_plan_names_the_limit(lab, fab):
    done = fab(lab.inventory_path, "stage-checkpoint", "--step", "4000", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "each transfer: no bwlimit" in " ".join(done.stdout.split())
    done = fab(
        lab.inventory_path, "stage-checkpoint", "--step", "4000", "--dry-run", "--bwlimit", "5m"
    )
    assert "each transfer: at most 5.0 MiB/s" in " ".join(done.stdout.split())


@pytest.mark.parametrize("task", ["stage-checkpoint", "run-eval"])
def test_a_bad_bwlimit_flag_is_one_clear_line(lab, fab, task):
    done = fab(lab.inventory_path, task, "--step", "4000", "--bwlimit", "12")
    assert done.returncode == 1
    assert "--bwlimit: bandwidth '12' is 12 B/s" in done.stderr
    assert "Traceback" not in done.stderr


def processes_reading(path: str) -> dict[int, str]:
    """{pid: command line} of the live processes whose command line names `path`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if path.encode() in argv:
            found[int(entry.name)] = " ".join(a.decode(errors="replace") for a in argv)
    return found


def priority_of(pid: int) -> tuple[int, str]:
    """(nice value, I/O scheduling class) of a running process."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    niceness = int(stat.rsplit(")", 1)[1].split()[16])  # field 19 of the whole line
    io_class = subprocess.check_output(["ionice", "-p", str(pid)], text=True).split(":")[0]
    return niceness, io_class.strip()


class Inspected(Exception):
    """Raised from the progress callback once the readers have been looked at."""


@pytest.mark.skipif(os.geteuid() != 0, reason="the pct stand-in (a chroot) needs root")
def test_the_trainers_reader_runs_at_nice_19_and_idle_io_while_a_paced_copy_runs(make_lab):
    # Large against every buffer between the two ends (pipes, ssh windows, sockets: a few
    # MiB), so the reader is certainly still reading when the first bytes arrive.
    lab = make_lab(steps=(2000,), checkpoint_size="64m", trainer_disk="128m")
    inventory = with_bwlimit(load_inventory(lab.inventory_path), "4m")
    in_container = "/workspace/checkpoints/step_2000/checkpoint.pt"
    seen: dict[str, tuple[int, str]] = {}

    def look(state: RelayState) -> None:
        for pid, command in processes_reading(in_container).items():  # in the pct stand-in
            seen[command] = priority_of(pid)
        raise Inspected

    with pytest.raises(Inspected):
        stage(inventory, 2000, options=StageOptions(report=lambda _: None, on_progress=look))
    assert list(seen) == [f"cat -- {in_container}"], "the reader was not running"
    assert seen[f"cat -- {in_container}"] == (NICENESS, "idle")

    # The interrupted paced copy resumes (without the limit) and verifies.
    (result,) = stage(load_inventory(lab.inventory_path), 2000, options=StageOptions(report=print))
    staged = lab.data_dir("eval") / "eval" / "checkpoints" / "step_2000" / "checkpoint.pt"
    assert 0 < result.moved < 64 * MiB
    assert result.sha256 == sha256(staged) == sha256(lab.checkpoint_path(2000))


def test_the_in_stream_hasher_on_the_trainer_runs_at_low_priority_too(make_lab):
    """On the host (outside the container): the hasher, which in loopback mode (a rootfs
    container) is also what reads the file."""
    lab = make_lab(steps=(2000,), checkpoint_size="64m", trainer_disk="128m")
    inventory = with_bwlimit(load_inventory(lab.inventory_path), "4m")
    seen: list[tuple[int, str]] = []
    # This lab's trainer session (sshd sets its HOME): other labs may be staging meanwhile.
    home = f"HOME={lab.data_dir('trainer')}/home".encode()

    def look(state: RelayState) -> None:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    argv = (entry / "cmdline").read_bytes()
                    environment = (entry / "environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                # PY_SOURCE, the trainer side's hasher, is the one script that marks its digest
                hasher = argv.startswith(b"python3\0") and b"dflash-sha256 %s" in argv
                if hasher and home in environment:
                    seen.append(priority_of(int(entry.name)))
        raise Inspected

    with pytest.raises(Inspected):
        stage(inventory, 2000, options=StageOptions(report=lambda _: None, on_progress=look))
    assert seen == [(NICENESS, "idle")]


@pytest.mark.skipif(os.geteuid() != 0, reason="the pct stand-in (a chroot) needs root")
def test_inside_the_container_the_reader_lowers_its_own_priority(lab, inventory):
    """Without the host-side wrapper around it (docker exec would not inherit it): the read
    command alone. A FIFO keeps the reader waiting, in plain sight, until the test writes."""
    env = environment_of(inventory.trainer.container)
    fifo = lab.container_path("/workspace/gentle.fifo")
    os.mkfifo(fifo)
    host = Host(inventory, "trainer")
    reader = subprocess.Popen(
        host.ssh_argv(env.stream_command("/workspace/gentle.fifo")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        pids = wait_for(lambda: processes_reading("/workspace/gentle.fifo"), "the reader")
        assert [priority_of(pid) for pid in pids] == [(NICENESS, "idle")]
        with open(fifo, "wb") as writer:
            writer.write(b"bytes")
        out, err = reader.communicate(timeout=30)
        assert out == b"bytes"
        assert announced(err.decode()) == ["pct container 200: nice 19, ionice idle"]
    finally:
        reader.kill()
        reader.wait()
        fifo.unlink()
