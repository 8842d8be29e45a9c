"""The exceptions that are part of dflash-ops' interface.

Every expected failure is an `OpsError` whose message names the host, the path, what was
expected, what was found and what to do next. Fabric tasks print it and exit non-zero without a
traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from typing import Any


class OpsError(Exception):
    """An expected failure, explained for the user."""


class InventoryError(OpsError):
    """The inventory file is missing, unreadable or does not match the schema."""


class HostError(OpsError):
    """A host could not be reached, authenticated or used."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host


class UnreachableError(HostError):
    """No TCP connection to the host's SSH port."""


class HostKeyError(HostError):
    """The host's key is unknown or does not match known_hosts: we refuse to talk to it."""


class AuthenticationError(HostError):
    """The host refused our key."""


class RemoteCommandError(HostError):
    """A command on the host exited non-zero where success was required."""

    def __init__(
        self, host: str, command: str, exit_code: int, stderr: str, advice: str = ""
    ) -> None:
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else "(no error output)"
        super().__init__(host, f"`{command}` exited {exit_code}: {detail}{advice}")
        self.command = command
        self.exit_code = exit_code
        self.stderr = stderr


class NotOursError(HostError):
    """A path holds something dflash-ops has no record of making: it is left as it is."""

    def __init__(self, host: str, path: str, found: str, choices: str) -> None:
        super().__init__(
            host, f"{path} {found}; dflash-ops did not make it and changed nothing. {choices}"
        )
        self.path = path


class DiskSpaceError(HostError):
    """Not enough free space where we are about to write."""

    def __init__(
        self, host: str, path: str, needed: int, free: int, what: str = "", advice: str = ""
    ) -> None:
        from dflash_ops.core.units import format_bytes

        purpose = f" for {what}" if what else ""
        advice = advice or (
            f"old staged checkpoints: `fab prune --host {host}`; or point the inventory at a "
            "larger filesystem"
        )
        super().__init__(
            host,
            f"not enough free space at {path}{purpose}: need {format_bytes(needed)}, "
            f"free {format_bytes(free)}. Free {format_bytes(needed - free)} there ({advice}) "
            "and retry.",
        )
        self.path = path
        self.needed = needed
        self.free = free


class TransferError(OpsError):
    """A byte transfer failed or its result did not verify."""


class CheckpointError(OpsError):
    """A checkpoint is missing, incomplete or not what was asked for."""


class LabError(OpsError):
    """The local lab could not be built, checked or removed."""


class DatasetError(OpsError):
    """A named prompt set is unknown, cannot be loaded, or does not have the expected fields."""


class JobError(OpsError):
    """A run could not be launched, found or followed."""


class HostBusy(JobError):
    """Another run holds the eval host: a reason to wait, not a failure of the step."""


class EvalFailed(OpsError):
    """The remote run ended without results (its exit code and log tail are in the message)."""

    def __init__(self, run: Any, log_tail: str) -> None:  # run: a dflash_ops.evaluation.jobs.Run
        super().__init__(
            f"run {run.run_id} on {run.host} {run.state} (exit code {run.exit_code}); last "
            f"lines of its log:\n{log_tail.rstrip() or '(empty log)'}"
        )
        self.run = run


class ResultsError(OpsError):
    """Results are missing, unreadable or not comparable."""


class WatchError(OpsError):
    """The watch cannot go on: bad arguments or an unreadable state file."""


class MetricsLogError(OpsError):
    """A training run's metrics log cannot be read or does not parse (τ is unaffected)."""


class TrackerError(OpsError):
    """Logging to an experiment tracker (W&B) cannot start or failed."""
