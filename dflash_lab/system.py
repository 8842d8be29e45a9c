"""Running the system tools the lab is built with (ip, mount, ssh-keygen, sshd) and waiting
for what they start."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

from dflash_ops.core.errors import LabError

POLL_INTERVAL = 0.02  # seconds between checks of a condition being waited for
T = TypeVar("T")


def run(argv: list[str]) -> str:
    """Run a tool; its stdout, or LabError with its stderr when it fails."""
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(
            f"`{' '.join(argv)}` failed ({result.returncode}): "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
    return result.stdout


def run_ok(argv: list[str]) -> bool:
    """Whether a tool succeeds (used as a question: does this link exist?)."""
    return subprocess.run(argv, capture_output=True).returncode == 0


def poll(condition: Callable[[], T], timeout: float) -> T | None:
    """The first truthy value of `condition()` within `timeout` seconds, else None."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value or None
        time.sleep(POLL_INTERVAL)


def wait_for(condition: Callable[[], T], what: str, timeout: float = 10) -> T:
    """Like `poll`, but a LabError naming `what` when the time runs out."""
    value = poll(condition, timeout)
    if value is None:
        raise LabError(f"timed out after {timeout:g}s waiting for {what}")
    return value


def attempt(problems: list[str], what: str, action: Callable[[], object]) -> None:
    """Run one teardown step; record its failure in `problems` and carry on with the rest."""
    try:
        action()
    except (OSError, LabError) as exc:
        problems.append(f"{what}: {exc}")
