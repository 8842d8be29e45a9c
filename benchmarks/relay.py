"""Benchmark: stage-checkpoint (hashing and verification on) against a raw OpenSSH pipe.

Builds its own lab (as root: network-namespace hosts with tmpfs disks), with one checkpoint
of `--size` (default 1 GiB), and alternates runs of

    raw:    ssh trainer cat FILE | ssh eval 'cat > FILE'      (the same ssh argv)
    stage:  staging.stage.stage(step, via=rootfs, no resume)    (in-stream sha256 both ends)

in pairs, the order flipping each pair, so that the noise of a shared machine hits both
alike. Like the raw pipe, the stage's trainer-side reader runs at normal priority
(`transfer.low_priority: false`); `--low-priority` measures the default instead (nice 19,
ionice idle), which yields CPU to everything else, ssh included, on a saturated machine.
Prints each pair (and its ratio), a resume after killing the source at ~50 % with the bytes
the resume moved, then the spread of the pairs' ratios and, last, the whole-task ratio:
median raw time / median stage time. A stage's relay phase runs from the start of its ssh
processes (which start early, gated, while the control steps run) to its last byte. The lab
is removed at the end, even on failure.
Run: `.venv/bin/python benchmarks/relay.py [--runs 9] [--size 1g] [--low-priority] [--smoke]`.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._lab import one_checkpoint_lab
from benchmarks._smoke import parse_args
from dflash_lab import lab
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.core.units import format_bytes, parse_size
from dflash_ops.remote.connection import Host
from dflash_ops.staging import relay
from dflash_ops.staging.delivery import StageOptions
from dflash_ops.staging.destination import staged_path
from dflash_ops.staging.stage import stage

STEP = 4000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--size", default="1g")
    parser.add_argument("--via", default="rootfs", choices=["rootfs", "stream"])
    parser.add_argument(
        "--low-priority",
        action="store_true",
        help="the trainer's reader at nice 19 / ionice idle, as the inventory default",
    )
    args = parse_args(parser, {"runs": 1, "size": "8m"})
    size = parse_size(args.size)
    with one_checkpoint_lab(
        "dflash-bench-",
        STEP,
        args.size,
        trainer_disk=size + (200 << 20),
        eval_disk=2 * size + (400 << 20),
        workstation_disk="16m",
    ) as built:
        run(built, size, args.runs, args.via, args.low_priority)


class RelayClock:
    """Times every transfer of a stage from the start of its ssh processes (their handshakes,
    as in the raw pipe) to its last byte: what is left of a stage is the control steps that
    did not overlap it."""

    def __init__(self) -> None:
        self.spans: list[float] = []
        born, run = relay.Pipe.__init__, relay.Pipe.run
        clock = self

        def stamped(pipe, *args, **kwargs):
            pipe.born = time.monotonic()
            born(pipe, *args, **kwargs)

        def timed(pipe, *args, **kwargs):
            try:
                return run(pipe, *args, **kwargs)
            finally:
                clock.spans.append(time.monotonic() - pipe.born)

        relay.Pipe.__init__, relay.Pipe.run = stamped, timed


def raw_pipe(trainer: Host, evalhost: Host, source: Path, target: Path, size: int) -> float:
    started = time.monotonic()
    reader = subprocess.Popen(trainer.ssh_argv(f"cat {source}"), stdout=subprocess.PIPE)
    writer = subprocess.Popen(evalhost.ssh_argv(f"cat > {target}"), stdin=reader.stdout)
    reader.stdout.close()
    if writer.wait() or reader.wait() or target.stat().st_size != size:
        raise SystemExit("the raw pipe failed")
    return time.monotonic() - started


def run(built: lab.Lab, size: int, runs: int, via: str, low_priority: bool) -> None:
    inventory = load_inventory(built.inventory_path)
    transfer = inventory.transfer.model_copy(update={"low_priority": low_priority})
    inventory = inventory.model_copy(update={"transfer": transfer})
    print(f"trainer's reader: {'nice 19, ionice idle' if low_priority else 'normal priority'}")
    trainer, evalhost = Host(inventory, "trainer"), Host(inventory, "eval")
    source = built.checkpoint_path(STEP)
    raw_target = built.data_dir("eval") / "raw.bin"
    staged = Path(staged_path(inventory, "eval", STEP))
    clock = RelayClock()
    quiet = {"report": lambda message: None, "margin": "64m", "via": via, "resume": False}

    def clear() -> None:
        for path in (raw_target, staged, staged.with_name(staged.name + ".manifest.json")):
            path.unlink(missing_ok=True)

    def staged_once() -> float:
        started = time.monotonic()
        (result,) = stage(inventory, STEP, options=StageOptions(**quiet))
        assert result.moved == size and not result.already
        return time.monotonic() - started

    raw_times, stage_times, relay_times = [], [], []
    for index in range(runs):
        order = ("raw", "stage") if index % 2 == 0 else ("stage", "raw")
        for which in order:
            clear()
            if which == "raw":
                raw_times.append(raw_pipe(trainer, evalhost, source, raw_target, size))
            else:
                stage_times.append(staged_once())
                relay_times.append(clock.spans[-1])
        print(
            f"pair {index + 1} ({order[0]} first): raw {rate(size, raw_times[-1])}  "
            f"stage {rate(size, stage_times[-1])} (bytes moving "
            f"{rate(size, relay_times[-1])}, other {stage_times[-1] - relay_times[-1]:.2f} s)"
            f"  ratio {raw_times[-1] / stage_times[-1]:.3f}",
            flush=True,
        )
    resume_line(inventory, staged, size, quiet, clear)
    ratios = sorted(r / s for r, s in zip(raw_times, stage_times, strict=True))
    control = [s - m for s, m in zip(stage_times, relay_times, strict=True)]
    raw, whole, moving = (statistics.median(t) for t in (raw_times, stage_times, relay_times))
    print(f"\nraw ssh|ssh pipe     : {rate(size, raw)}")
    print(
        f"  its relay phase    : {rate(size, moving)}   ratio {raw / moving:.3f} "
        "(ssh start to last byte)"
    )
    print(
        f"pair ratios          : min {ratios[0]:.3f}  median {statistics.median(ratios):.3f}  "
        f"max {ratios[-1]:.3f}; control outside the relay phase "
        f"{min(control):.2f}–{max(control):.2f} s"
    )
    print(f"stage-checkpoint     : {rate(size, whole)}   whole-task ratio {raw / whole:.3f}")


def resume_line(inventory, staged: Path, size: int, quiet: dict, clear) -> None:
    clear()
    killed_at: list[int] = []

    def kill_half(state) -> None:
        if not killed_at and state.done >= state.total // 2:
            killed_at.append(state.done)
            os.killpg(state.source.pid, signal.SIGKILL)

    try:
        stage(
            inventory,
            STEP,
            options=StageOptions(**{**quiet, "resume": True}, on_progress=kill_half),
        )
    except Exception as exc:  # the expected TransferError
        print(f"\nkilled at {format_bytes(killed_at[0])}: {type(exc).__name__}")
    kept = staged.with_name(staged.name + ".partial").stat().st_size
    (result,) = stage(inventory, STEP, options=StageOptions(**{**quiet, "resume": True}))
    remaining = size - killed_at[0]
    print(
        f"resume moved {format_bytes(result.moved)} ({result.moved} B); remaining after the "
        f"kill {remaining} B; partial kept {kept} B; "
        f"{'OK' if result.moved <= remaining + size // 100 else 'OVER'} (target ≤ remaining + 1 %)"
    )


def rate(size: int, seconds: float) -> str:
    return f"{size / seconds / 1e6:7.1f} MB/s ({seconds:5.2f} s)"


if __name__ == "__main__":
    main()
