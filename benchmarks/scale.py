"""Benchmark: stage an 8 GiB checkpoint through lab hosts whose disks are on the real disk.

The lab's hosts keep their small tmpfs disks for everything else; the trainer container's
checkpoint directory and the eval host's staging directory are plain directories on the real
disk (under --dir), bind-mounted into the lab while it is built — before the hosts' sshd
start, so that their sessions (each host has its own mount namespace) see them — and listed
with the lab's mounts, so that `down` removes them. Before every transfer the page cache of
the files involved is dropped (`posix_fadvise`, these files only): the trainer's file is read
from the disk and written to the disk, as on real hosts.

Reports, runs interleaved (the machine is shared):
- stage-checkpoint's throughput against the raw `ssh trainer cat | ssh eval 'cat >'` pipe,
  and against that pipe followed by an fsync (which stage's durability matches);
- the workstation's memory while the bytes move: this process's RSS and the two ssh
  clients' RSS at each quarter of the transfer (flat: it must not grow with the bytes);
- a kill of the source at ~50 % and the resume: the bytes it moved against the remainder.

Needs root (namespaces, bind mounts) and 3 × --size free on the disk under --dir. Everything
it made is removed at the end, even on failure.
Run: `.venv/bin/python benchmarks/scale.py [--size 8g] [--runs 2] [--dir /var/tmp] [--smoke]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._smoke import parse_args
from dflash_lab import lab
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.core.units import format_bytes, parse_size
from dflash_ops.remote.connection import Host
from dflash_ops.staging.delivery import StageOptions
from dflash_ops.staging.destination import staged_path
from dflash_ops.staging.relay import RelayState
from dflash_ops.staging.stage import stage

STEP = 4000
BLOCK = 16 << 20
SAMPLES = (0.25, 0.5, 0.75, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="8g")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dir", default="/var/tmp", help="a directory on the real disk")
    args = parse_args(parser, {"size": "32m", "runs": 1})
    size = parse_size(args.size)
    base = Path(tempfile.mkdtemp(prefix="dflash-scale-", dir=args.dir))
    kind = filesystem_of(base)
    if kind in ("tmpfs", "ramfs"):
        shutil.rmtree(base)
        raise SystemExit(f"{args.dir} is on {kind}: pass --dir on a real disk")
    free = shutil.disk_usage(base).free
    if free < 3 * size + (2 << 30):
        shutil.rmtree(base)
        raise SystemExit(f"{base}: {format_bytes(free)} free, need 3 × {format_bytes(size)}")
    print(f"real-disk directories under {base} ({kind}, {format_bytes(free)} free)", flush=True)
    built = None
    try:
        config = lab.LabConfig(root=base / "lab", steps=(STEP,), workstation_disk="16m")
        started = time.monotonic()
        built = lab.up(config, real_disk_content(base, size))
        print(f"lab up with a {format_bytes(size)} checkpoint ({time.monotonic() - started:.0f} s)")
        run(built, size, args.runs)
    finally:
        problems = built.down() if built else []
        shutil.rmtree(base, ignore_errors=True)
        print("lab and directories removed" if not problems else f"left behind: {problems}")


def filesystem_of(path: Path) -> str:
    mounts = [line.split()[1:3] for line in Path("/proc/self/mounts").read_text().splitlines()]
    best = max((m for m in mounts if str(path).startswith(m[0])), key=lambda m: len(m[0]))
    return best[1]


def real_disk_content(base: Path, size: int):
    """Lab content: bind the trainer's checkpoint dir and the eval host's staging dir to
    directories on the real disk, and write the checkpoint there."""

    def content(built: lab.Lab, config: lab.LabConfig) -> dict[str, dict]:
        for name, target in (
            ("trainer-checkpoints", built.container_path(lab.CONTAINER_CHECKPOINTS)),
            ("eval-checkpoints", built.data_dir("eval") / "eval" / "checkpoints"),
        ):
            real = base / name
            real.mkdir()
            target.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "--bind", str(real), str(target)], check=True)
            built.state.mounts.append(str(target))
            built.state.save()
        write_checkpoint(built.checkpoint_path(STEP), size)
        settings = {}
        for name in config.eval_names:
            target_model = built.data_dir(name) / "models" / "tiny-target"
            target_model.mkdir(parents=True)
            settings[name] = {"target_model": str(target_model)}
        return settings

    return content


def write_checkpoint(path: Path, size: int) -> None:
    """`size` bytes that do not repeat (a random block, numbered), fsynced."""
    path.parent.mkdir(parents=True)
    block = bytearray(os.urandom(BLOCK))
    with path.open("wb") as out:
        for index in range(0, size, BLOCK):
            block[:8] = index.to_bytes(8, "little")
            out.write(block[: min(BLOCK, size - index)])
        out.flush()
        os.fsync(out.fileno())


def forget(*paths: Path) -> None:
    """Drop these files' pages from the page cache (flushed first): the next read is from
    the disk."""
    for path in paths:
        if path.exists():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class MemoryProbe:
    """A progress callback sampling the workstation's RSS (this process, the ssh clients)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, int]] = []  # (fraction, own RSS, ssh RSS)
        self.next = 0

    def __call__(self, state: RelayState) -> None:
        fraction = state.done / max(state.total, 1)
        if self.next < len(SAMPLES) and fraction >= SAMPLES[self.next] - 0.01:
            ssh = rss(state.source.pid) + rss(state.destination.pid)
            self.samples.append((fraction, rss(os.getpid()), ssh))
            self.next += 1


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run(built: lab.Lab, size: int, runs: int) -> None:
    inventory = load_inventory(built.inventory_path)
    trainer, evalhost = Host(inventory, "trainer"), Host(inventory, "eval")
    source = built.checkpoint_path(STEP)
    staged = Path(staged_path(inventory, "eval", STEP))
    raw_target = staged.parent.parent / "raw.bin"  # on the same real-disk directory
    quiet = {"report": lambda message: None, "via": "rootfs", "resume": False}
    probes: list[MemoryProbe] = []

    def clear() -> None:
        for path in (raw_target, staged, staged.with_name(staged.name + ".manifest.json")):
            path.unlink(missing_ok=True)
        forget(source)

    def raw(fsync: bool) -> float:
        write = f"cat > {raw_target}" + (f" && sync {raw_target}" if fsync else "")
        started = time.monotonic()
        reader = subprocess.Popen(trainer.ssh_argv(f"cat {source}"), stdout=subprocess.PIPE)
        writer = subprocess.Popen(evalhost.ssh_argv(write), stdin=reader.stdout)
        reader.stdout.close()
        if writer.wait() or reader.wait() or raw_target.stat().st_size != size:
            raise SystemExit("the raw pipe failed")
        return time.monotonic() - started

    def staged_once() -> float:
        probes.append(MemoryProbe())
        started = time.monotonic()
        (result,) = stage(inventory, STEP, options=StageOptions(**quiet, on_progress=probes[-1]))
        assert result.moved == size and not result.already
        return time.monotonic() - started

    times: dict[str, list[float]] = {"raw": [], "raw+fsync": [], "stage": []}
    kinds = list(times)
    for index in range(runs):
        order = kinds[index % 3 :] + kinds[: index % 3]
        for which in order:
            clear()
            seconds = raw(fsync=which == "raw+fsync") if which != "stage" else staged_once()
            times[which].append(seconds)
            print(f"run {index + 1} {which:9}: {rate(size, seconds)}", flush=True)
    clear()
    medians = {which: statistics.median(t) for which, t in times.items()}
    print()
    for which, seconds in medians.items():
        print(f"{which:16}: {rate(size, seconds)}  (runs: {spread(times[which])})")
    print(
        f"stage / raw pipe: {medians['raw'] / medians['stage']:.3f}; "
        f"stage / raw pipe + fsync: {medians['raw+fsync'] / medians['stage']:.3f}"
    )
    report_memory(probes)
    kill_and_resume(inventory, size, staged, quiet, clear)


def report_memory(probes: list[MemoryProbe]) -> None:
    print("\nworkstation memory while the bytes move (RSS at 25/50/75/100 % of the transfer):")
    for number, probe in enumerate(probes, 1):
        own = "  ".join(format_bytes(s[1]) for s in probe.samples)
        ssh = "  ".join(format_bytes(s[2]) for s in probe.samples)
        growth = probe.samples[-1][1] - probe.samples[0][1] if probe.samples else 0
        print(f"  stage {number}: this process {own} (growth {format_bytes(growth)}); ssh {ssh}")
    print(f"  peak RSS of this process over its life: {format_bytes(peak_rss())}")


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def kill_and_resume(inventory, size: int, staged: Path, quiet: dict, clear) -> None:
    clear()
    killed_at: list[int] = []

    def kill_half(state: RelayState) -> None:
        if not killed_at and state.done >= state.total // 2:
            killed_at.append(state.done)
            os.killpg(state.source.pid, signal.SIGKILL)

    options = {**quiet, "resume": True}
    try:
        stage(inventory, STEP, options=StageOptions(**options, on_progress=kill_half))
    except Exception as exc:  # the expected TransferError
        print(f"\nkilled the source at {format_bytes(killed_at[0])}: {type(exc).__name__}")
    kept = staged.with_name(staged.name + ".partial").stat().st_size
    started = time.monotonic()
    (result,) = stage(inventory, STEP, options=StageOptions(**options))
    seconds = time.monotonic() - started
    print(
        f"resume moved {format_bytes(result.moved)} ({result.moved} B) in {seconds:.1f} s "
        f"(incl. re-hashing both whole files); partial kept {kept} B; remainder "
        f"{size - kept} B: {'only the remainder' if result.moved == size - kept else 'MORE'}"
    )


def spread(values: list[float]) -> str:
    return ", ".join(f"{v:.1f} s" for v in values)


def rate(size: int, seconds: float) -> str:
    return f"{size / seconds / 1e6:7.1f} MB/s ({seconds:6.1f} s)"


if __name__ == "__main__":
    main()
