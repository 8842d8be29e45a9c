"""`fab diagnose`'s output: the ranked findings as text, or as JSON on stdout (progress then
goes to stderr, so that stdout is the JSON object alone)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dflash_eval.contract.diagnose_summary import report_section, summary_lines

from dflash_ops.core.errors import OpsError
from dflash_ops.core.inventory import Inventory
from dflash_ops.evaluation import jobs
from dflash_ops.evaluation.diagnose import (
    parse_against,
    plan_diagnose,
    run_diagnose,
    trend_line,
)
from dflash_ops.evaluation.run import TransferProgress
from dflash_ops.ui.console import console, errors, shown
from dflash_ops.ui.eval_view import LiveView
from dflash_ops.ui.plan_view import duration, plan_lines

FORMATS = ("text", "json")


class StderrView:
    """Progress for a run whose stdout is reserved for JSON: plain lines on stderr."""

    def say(self, message: str) -> None:
        errors.print(message)

    @contextmanager
    def transfers(self) -> Iterator[TransferProgress]:
        yield lambda label, total: lambda state: None

    def starting(self, run_id: str) -> None:
        """The start line comes from the run itself."""

    def follow(self, run_id: str) -> Callable[[dict], None]:
        def on_event(event: dict) -> None:
            if event["event"] in ("warning", "error"):
                errors.print(f"harness {event['event']}: {shown(event['message'], lines=True)}")

        return on_event

    def finished(self, run: jobs.Run, summary: list[str], local_dir: Path | None) -> None:
        errors.print(f"run {shown(run.run_id)}: {run.state}; files in {shown(local_dir)}")


def diagnose_plan_lines(part: dict) -> list[str]:
    """What the diagnosis adds to the eval's plan: its repairs and their time."""
    if part["repairs"] is None:
        return [f"  repairs: {part['note']} ({part['prompts']} prompts)"]
    labels = "; ".join(shown(label) for label in part["labels"])
    skipped = [
        f"  not tried: {shown(s['label'])} ({shown(s['why'])})" for s in part.get("not_tried", [])
    ]
    return [
        f"  repairs: {part['repairs']} × {part['prompts']} prompts = {part['walks']} walks "
        f"of the candidate: {labels}",
        *skipped,
        f"  diagnose time: ~{duration(part['seconds'])} on {part['threads']} threads, up to "
        f"~{duration(part['seconds_up_to'])} if a repair is found (the others are then tried "
        "again on it)",
    ]


def diagnose_command(
    inventory: Inventory,
    *,
    step: int | None,
    against: str,
    host: str | None,
    harness_args: list[str],
    output: str,
    dry_run: bool = False,
) -> None:
    if step is None:
        raise OpsError("--step is required: the step of the checkpoint to diagnose")
    if output not in FORMATS:
        raise OpsError(f"--format: expected one of {', '.join(FORMATS)}, got {output!r}")
    if dry_run:
        plan = plan_diagnose(inventory, step, parse_against(against), host, harness_args)
        if output == "json":
            print(json.dumps({"host": plan.host, "step": plan.step, **plan.harness}, indent=2))
            return
        for line in [*plan_lines(plan), *diagnose_plan_lines(plan.harness["diagnose"])]:
            console.print(line, soft_wrap=True)
        return
    reporter = LiveView() if output == "text" else StderrView()
    try:
        diagnosis = run_diagnose(
            inventory, step, parse_against(against), reporter, host, harness_args
        )
    except jobs.Detached as detached:
        errors.print(
            f"\n[yellow]detached[/]: diagnosis run {detached.run_id} goes on on "
            f"{detached.host}. Follow it: fab eval-logs --id {detached.run_id} --follow; "
            "its diagnose.json stays in that run's directory there"
        )
        raise SystemExit(130) from None
    trend = diagnosis.get("step_trend")
    if output == "json":
        print(json.dumps({**report_section(diagnosis), "step_trend": trend}, indent=2))
        return
    for line in summary_lines(diagnosis):
        console.print(line, markup=False, soft_wrap=True)
    if trend is not None:
        console.print(trend_line(trend, step), markup=False, soft_wrap=True)
