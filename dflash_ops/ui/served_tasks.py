"""The tasks around served acceptance: `fab export-drafter` (a staged checkpoint as a Hugging
Face drafter directory) and `fab served-eval` (the acceptance length SGLang itself gets with
it). fabfile.py imports them, so that fab lists them with the other tasks.
"""

from __future__ import annotations

from dflash_ops.core.arguments import parse_step
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.ui.task import ops_task

STEP_HELP = "training step of the checkpoint (staged first when it is not yet)"
HOST_HELP = "eval host (default: the only one)"
RUN_HELP = "named training run of the trainer (default: the trainer's own checkpoints)"


@ops_task(
    help={
        "step": STEP_HELP,
        "host": HOST_HELP,
        "out": "directory on the eval host to write (default: `drafter` beside the staged "
        "checkpoint); one the tool did not export is refused, never replaced",
        "run": RUN_HELP,
    }
)
def export_drafter(c, step=None, host=None, out=None, inventory=None, run=None):
    """Write a staged checkpoint as a Hugging Face drafter dir (config.json, model.safetensors)."""
    from dflash_ops.evaluation.export import export_drafter as export
    from dflash_ops.ui.eval_view import LiveView

    export(load_inventory(inventory).for_run(run), parse_step(step), host, out, LiveView())
