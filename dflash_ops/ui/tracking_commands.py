"""`fab wandb-sync`'s front door: the pulled runs not yet sent go to W&B
(dflash_ops.evaluation.tracking.sync), one line each, then a count."""

from __future__ import annotations

from pathlib import Path

from dflash_ops.core.errors import TrackerError
from dflash_ops.evaluation import tracking
from dflash_ops.ui.console import console, shown


def wandb_sync(results_root: Path, project: str | None) -> None:
    """Send what was not sent; TrackerError (exit 1) when W&B refused a run."""
    if not project:
        raise TrackerError("wandb-sync: pass the W&B project: --project NAME")
    sent, failed = tracking.sync(project, results_root, console.print)
    if not sent and not failed:
        console.print(f"W&B: nothing new to send to {shown(project)} from {shown(results_root)}")
        return
    console.print(f"W&B: {sent} run(s) sent to {shown(project)}")
    if failed:
        raise TrackerError(
            f"wandb-sync: {failed} run(s) not sent to {project} (see above); the results are "
            "unaffected: run it again to send them"
        )
