"""How many torch threads a run uses when it is not told (`--threads`, the inventory's
`threads`): the host's physical cores that this process may run on, less a reserve of
`RESERVE` cores for what shares an eval host (SGLang's scheduler and tokenizer processes, sshd,
the system). A host of fewer than 8 physical cores keeps fewer back: a quarter of them,
rounded down (none on 2 or 3). Hyper-threads are not counted: two torch threads on the
siblings of one core are slower than one.

The run and the dry run's time estimate both take the count from here, so the estimate assumes
the threads the run will use (the dry run prints it beside the estimate).
"""

from __future__ import annotations

import os
from pathlib import Path

RESERVE = 2  # cores left to SGLang and the system when the run is not told its threads


def default_threads(cores: int) -> int:
    """The threads of a run on `cores` physical cores when none are asked for."""
    return max(1, cores - min(RESERVE, cores // 4))


def physical_cores(cpuinfo: str, allowed: set[int]) -> int | None:
    """The distinct physical cores (socket, core id) of the processors in `allowed`, from
    /proc/cpuinfo's text; None when it names no core ids (arm64 and most VMs of it)."""
    cores = set()
    for block in cpuinfo.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            name, _, value = line.partition(":")
            fields[name.strip()] = value.strip()
        processor = fields.get("processor", "")
        if processor.isdigit() and int(processor) in allowed and "core id" in fields:
            cores.add((fields.get("physical id", "0"), fields["core id"]))
    return len(cores) or None


def host_cores() -> int:
    """This host's physical cores that this process may run on (its logical CPUs where
    /proc/cpuinfo does not tell cores from hyper-threads)."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    logical = len(allowed) if allowed else os.cpu_count() or 1
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return logical
    return physical_cores(cpuinfo, allowed or set(range(logical))) or logical
