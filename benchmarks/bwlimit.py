"""Timing demo: how closely `transfer.bwlimit` holds a stage to its limit, by the wall clock.

Builds its own lab with one checkpoint of `--size` (default 64 MiB) and stages it with no limit
and then with each of `--limits` (default 8m,16m,32m), from scratch each time. Prints, per run,
the wall-clock time of the whole stage and of its byte-moving phase, the rate of that phase
against the limit, and what the code's pace measured (its average rate, how long it held the
stream back). The tests assert only what the code computes; this is the stopwatch view.
The lab is removed at the end, even on failure.
Run: `.venv/bin/python benchmarks/bwlimit.py [--size 64m] [--limits 8m,16m,32m] [--smoke]`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._lab import one_checkpoint_lab
from benchmarks._smoke import parse_args
from dflash_lab import lab
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.core.inventory import with_bwlimit
from dflash_ops.core.units import format_bytes, parse_bwlimit, parse_size
from dflash_ops.staging import relay
from dflash_ops.staging.delivery import StageOptions
from dflash_ops.staging.destination import staged_path
from dflash_ops.staging.stage import stage

STEP = 4000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="64m")
    parser.add_argument("--limits", default="8m,16m,32m")
    args = parse_args(parser, {"size": "4m", "limits": "16m"})
    size = parse_size(args.size)
    with one_checkpoint_lab(
        "dflash-bwlimit-",
        STEP,
        args.size,
        trainer_disk=size + (64 << 20),
        eval_disk=size + (400 << 20),
    ) as built:
        for limit in [None, *args.limits.split(",")]:
            print(one_run(built, size, limit), flush=True)


def one_run(built: lab.Lab, size: int, limit: str | None) -> str:
    inventory = with_bwlimit(load_inventory(built.inventory_path), limit or "none")
    staged = Path(staged_path(inventory, "eval", STEP))
    for path in (staged, staged.with_name(staged.name + ".manifest.json")):
        path.unlink(missing_ok=True)
    moved: list[tuple[relay.Moved, float]] = []  # each transfer, and its wall-clock seconds
    run = relay.Pipe.run

    def keep(pipe, *args, **kwargs):
        started = time.monotonic()
        result = run(pipe, *args, **kwargs)
        moved.append((result, time.monotonic() - started))
        return result

    relay.Pipe.run = keep
    try:
        started = time.monotonic()
        stage(inventory, STEP, options=StageOptions(report=lambda _: None, resume=False))
        whole = time.monotonic() - started
    finally:
        relay.Pipe.run = run
    phase, seconds = moved[-1]
    wall_rate = size / seconds
    line = (
        f"bwlimit {limit or 'none':>5}: stage {whole:5.2f} s, bytes moving {seconds:5.2f} s "
        f"= {format_bytes(wall_rate)}/s"
    )
    if phase.paced is None:
        return line
    target = parse_bwlimit(limit)
    return (
        f"{line} ({wall_rate / target:.2f} of the limit); the pace measured "
        f"{format_bytes(phase.paced.rate)}/s and held the stream back {phase.paced.waited:.2f} s"
    )


if __name__ == "__main__":
    main()
