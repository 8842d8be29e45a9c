"""The tasks around served acceptance: `fab export-drafter` (a staged checkpoint as a Hugging
Face drafter directory) and `fab served-eval` (the acceptance length SGLang itself gets with
it). fabfile.py imports them, so that fab lists them with the other tasks.
"""

from __future__ import annotations

from pathlib import Path

from dflash_ops.core.arguments import MAX_COUNT, parse_choice, parse_count, parse_step
from dflash_ops.core.errors import OpsError
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.ui.task import ops_task

STEP_HELP = "training step of the checkpoint (staged first when it is not yet)"
HOST_HELP = "eval host (default: the only one)"
RUN_HELP = "named training run of the trainer (default: the trainer's own checkpoints)"


def require_step(step: str | None) -> int:
    parsed = parse_step(step)
    if parsed is None:
        raise OpsError("--step N is needed: the training step of the checkpoint")
    return parsed


@ops_task(
    help={
        "step": STEP_HELP,
        "host": HOST_HELP,
        "out": "directory on the eval host to write (default: `drafter` beside the staged "
        "checkpoint); one the tool did not export is refused, never replaced",
        "local": "also copy it to this directory on the workstation (weights over OpenSSH, "
        "sha256-checked); one the tool did not write is refused",
        "run": RUN_HELP,
    }
)
def export_drafter(c, step=None, host=None, out=None, local=None, inventory=None, run=None):
    """Write a staged checkpoint as a Hugging Face drafter dir (config.json, model.safetensors)."""
    from dflash_ops.evaluation.export import export_drafter as export
    from dflash_ops.ui.eval_view import LiveView

    inv, where = load_inventory(inventory).for_run(run), Path(local) if local else None
    export(inv, require_step(step), host, out, LiveView(), where)


@ops_task(
    help={
        "step": STEP_HELP,
        "host": HOST_HELP,
        "prompts": "JSONL prompts file, as run-eval's --prompts (default: the built-in set)",
        "num_prompts": "the first N prompts, as run-eval's --num-prompts",
        "max_new_tokens": "completion budget per request, as run-eval's --max-new-tokens",
        "thinking": "on/off: enable_thinking in the chat template, as run-eval's --thinking",
        "run": RUN_HELP,
    }
)
def served_eval(
    c,
    step=None,
    host=None,
    prompts=None,
    num_prompts=None,
    max_new_tokens=None,
    thinking=None,
    inventory=None,
    run=None,
):
    """Start SGLang with the exported drafter (DFLASH), send run-eval's prompts: served τ."""
    from dflash_ops.evaluation.served_eval import ServedRequest
    from dflash_ops.evaluation.served_eval import served_eval as serve
    from dflash_ops.ui.eval_view import LiveView

    request = ServedRequest(
        step=require_step(step),
        host=host,
        prompts=Path(prompts) if prompts else None,
        num_prompts=parse_count("--num-prompts", num_prompts, minimum=1, maximum=MAX_COUNT),
        max_new_tokens=parse_count("--max-new-tokens", max_new_tokens, minimum=1, maximum=1 << 20),
        thinking=None
        if thinking is None
        else parse_choice("--thinking", thinking, ("on", "off")) == "on",
    )
    serve(load_inventory(inventory).for_run(run), request, LiveView())
