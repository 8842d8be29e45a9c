"""`fab diagnose`: the harness's `diagnose` on an eval host, as a run like run-eval's.

The candidate (the checkpoint of --step) is staged if needed; the other drafter is the
host's reference_drafter (`--against reference`) or another step's checkpoint, staged
likewise. The run is launched detached and followed like an eval (jobs.py); its files are
pulled into `results/diagnose/<run-id>/` (diagnose.json holds the findings and the data
behind them: dflash_eval/contract/diagnose_summary.py reads it for the terminal and the report).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflash_eval.contract import reading

from dflash_ops.core.errors import EvalFailed, HostError, OpsError, ResultsError
from dflash_ops.core.files import write_atomic
from dflash_ops.core.inventory import EvalHost, Inventory
from dflash_ops.core.records import RecordError, read_json_file
from dflash_ops.evaluation import jobs, results
from dflash_ops.evaluation.harness_command import drafter_profile, harness_command
from dflash_ops.evaluation.plan import HostPlan, plan_host
from dflash_ops.evaluation.request import EvalRequest
from dflash_ops.evaluation.run import RunReporter, ensure_ready, stage_checkpoint
from dflash_ops.evaluation.served_records import served_findings
from dflash_ops.remote.connection import Host
from dflash_ops.staging.delivery import StagedCheckpoint, StageOptions
from dflash_ops.staging.stage import stage

DIAGNOSE_DIR = "diagnose"  # under the local results directory


def parse_against(text: str) -> str | int:
    """'reference', or a step number."""
    if text == "reference":
        return text
    if text.isdigit():
        return int(text)
    raise OpsError(f"--against: expected 'reference' or a step number, got {text!r}")


def run_diagnose(
    inventory: Inventory,
    step: int,
    against: str | int,
    reporter: RunReporter,
    host_name: str | None = None,
    harness_args: list[str] | None = None,
) -> dict[str, Any]:
    """Stage, run the harness's diagnose on the eval host, pull and return the diagnosis."""
    name, entry = inventory.eval_host(host_name)
    if against == step:
        raise OpsError(f"--against {against}: that is the candidate's own step")
    host = Host(inventory, name)
    try:
        harness = ensure_ready(host, entry, reporter.say)
        candidate = stage_checkpoint(inventory, step, name, reporter)
        other = _other_drafter(
            entry, name, against, lambda s: stage_checkpoint(inventory, s, name, reporter).path
        )
        args = [*(harness_args or []), "--reference-drafter", other, "--against", _named(against)]
        # local completions, as before SGLang became run-eval's default: the diagnosis
        # launch does not remove a private URL file after the run
        request = EvalRequest(step=step, host=name, harness_args=args, completions="local")
        run_id = jobs.new_run_id(step, name, DIAGNOSE_DIR, inventory.training_run)
        command = harness_command(
            host,
            entry,
            harness,
            candidate.path,
            run_id,
            request,
            drafter_profile(inventory),
            inventory.training_run,
            subcommand="diagnose",
        )
        params = {
            "step": step,
            "tag": DIAGNOSE_DIR,
            "checkpoint": candidate.path,
            "command": command,
        }
        reporter.starting(run_id)
        run = jobs.launch_and_follow(
            host, entry, run_id, command, params, reporter.say, reporter.follow
        )
        local = jobs.fetch(host, entry, run, inventory.local.results / DIAGNOSE_DIR)
        reporter.finished(run, [], local)
        if run.state != "succeeded":
            raise EvalFailed(run, jobs.log_tail(host, entry, run.run_id))
        pulled = inventory.local.results / DIAGNOSE_DIR / run_id / "diagnose.json"
        return finish_pulled(pulled, inventory.local.results, inventory.training_run, step)
    finally:
        host.close()


def plan_diagnose(
    inventory: Inventory,
    step: int,
    against: str | int,
    host_name: str | None = None,
    harness_args: list[str] | None = None,
) -> HostPlan:
    """What `run_diagnose` would stage, run (the repairs × prompts) and take, with nothing
    staged, run or written (the harness's `plan --diagnose`, from memory on the host)."""
    name, entry = inventory.eval_host(host_name)
    if against == step:
        raise OpsError(f"--against {against}: that is the candidate's own step")

    def planned(at: int) -> StagedCheckpoint:
        options = StageOptions(dry_run=True, report=lambda message: None)
        return stage(inventory, at, [name], options=options)[-1]

    other = _other_drafter(entry, name, against, lambda s: planned(s).path)
    args = [*(harness_args or []), "--reference-drafter", other, "--diagnose"]
    request = EvalRequest(step=step, host=name, harness_args=args, completions="local")
    return plan_host(inventory, request, planned(step))


def _other_drafter(
    entry: EvalHost, host: str, against: str | int, staged_path: Callable[[int], str]
) -> str:
    """Where the other drafter is on the host: the inventory's reference drafter, or the
    path of another step's checkpoint (`staged_path` stages it, or plans its staging)."""
    if against != "reference":
        return staged_path(int(against))
    if not entry.reference_drafter:
        raise HostError(host, "--against reference needs `reference_drafter` in the inventory")
    return entry.reference_drafter


def _named(against: str | int) -> str:
    return "reference" if against == "reference" else f"step {against}"


def finish_pulled(
    pulled: Path, results_root: Path, training_run: str | None, step: int
) -> dict[str, Any]:
    """The pulled diagnosis with what only the workstation knows (τ by step of the training
    run, served records of the step), written back into diagnose.json once: the report and
    any later reader see every finding, not only this terminal."""
    diagnosis = read_diagnosis(pulled)
    trend = step_trend(results_root, training_run, step, diagnosis.get("prompts"))
    diagnosis = with_served_findings(with_trend(diagnosis, trend, step), results_root, step)
    write_atomic(pulled, json.dumps(diagnosis, indent=2) + "\n")
    return diagnosis


def with_trend(diagnosis: dict[str, Any], trend: dict[str, Any] | None, step: int) -> dict:
    """The diagnosis with τ by step of the candidate's training run (`step_trend`'s), ranked
    first as "less trained" when it rises measurably after the step."""
    diagnosis["step_trend"] = trend
    less_trained = trend_finding(trend, step, diagnosis["findings"]) if trend else None
    if less_trained is not None:
        diagnosis["findings"] = ranked_with(diagnosis["findings"], less_trained)
    return diagnosis


def with_served_findings(diagnosis: dict[str, Any], results_root: Path, step: int) -> dict:
    """The diagnosis with a finding for each served record of `step` that disagrees with the
    CPU τ (served_records)."""
    diagnosis["findings"] += served_findings(results_root, step, diagnosis["findings"])
    return diagnosis


def read_diagnosis(path: Path) -> dict[str, Any]:
    """A pulled diagnosis; one clear error when it is missing or not a diagnosis."""
    try:
        diagnosis = read_json_file(path)  # bounded, as every file read back
    except RecordError as error:
        raise OpsError(f"cannot read the diagnosis: {error}; run fab diagnose again") from None
    if not isinstance(diagnosis, dict) or not isinstance(diagnosis.get("findings"), list):
        raise OpsError(f"{path}: not a diagnosis (no findings list); run fab diagnose again")
    return diagnosis


def step_trend(
    results_root: Path, training_run: str | None, step: int, prompts: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """τ by step over the runs already pulled for the candidate's training run (its largest
    comparable group, the latest run of each step), with each step's 95 % interval where its
    run has one: when no repair closes a gap, whether τ still rises after the candidate's step
    says "an earlier step of a run still improving". With the diagnosis's `prompts` record,
    only greedy runs of the same prompts, length and thinking flag count (a trend at other
    settings is not the diagnosis's τ). None: fewer than two steps pulled, or none after the
    candidate's."""
    runs = [run for run in results.load_runs(results_root) if _measured_as(run, prompts)]
    try:
        comparison = results.compare(runs, training_run=training_run)
    except ResultsError:
        return None
    rows = {row.step: row for row in comparison.within().rows if row.step}
    by_step = {s: row.metrics["tau_macro"] for s, row in rows.items()}
    later = {s: tau for s, tau in by_step.items() if s > step}
    if len(by_step) < 2 or not later or step not in by_step:
        return None
    best = max(later, key=later.get)
    intervals = {s: reading.overall_interval(row.done) for s, row in sorted(rows.items())}
    return {
        "taus": dict(sorted(by_step.items())),
        "intervals": {s: [i["low"], i["high"]] if i else None for s, i in intervals.items()},
        "rises": later[best] > by_step[step],
        "best_later_step": best,
    }


def _measured_as(run: results.RunResult, prompts: dict[str, Any] | None) -> bool:
    if prompts is None:
        return True
    if run.results is None or "sampling" in run.done["metrics"]:
        return False
    theirs = run.done["prompts"]
    keys = ("sha256", "max_new_tokens", "thinking")
    return all(theirs.get(key) == prompts.get(key) for key in keys)


def trend_finding(
    trend: dict[str, Any], step: int, findings: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The finding "less trained", when a later step's τ interval of the same training run
    lies wholly above the candidate's and no setting change repairs the candidate alone (a
    repair the other drafter gains as much from does not count); None otherwise: a rise
    within the intervals is not evidence, and a candidate that does not load or holds NaN is
    not merely behind."""
    repaired = any(f["area"] == "repair" and f.get("setting") for f in findings)
    # "training": the harness already said it, the other drafter being a step of this run
    if repaired or any(f["area"] in ("loading", "weights", "training") for f in findings):
        return None
    later = trend["best_later_step"]
    mine, theirs = trend["intervals"].get(step), trend["intervals"].get(later)
    if not trend["rises"] or mine is None or theirs is None or None in (*mine, *theirs):
        return None
    if theirs[0] <= mine[1]:
        return None
    taus = trend["taus"]
    return {
        "area": "training",
        "title": (
            f"less trained: step {step} is an earlier step of a run that is still improving "
            f"(τ {taus[step]:.2f} → {taus[later]:.2f} at step {later})"
        ),
        "evidence": (
            f"the pulled runs of this training run (one comparable group): step {step} τ "
            f"{taus[step]:.2f} [{mine[0]:.2f}, {mine[1]:.2f}], step {later} τ "
            f"{taus[later]:.2f} [{theirs[0]:.2f}, {theirs[1]:.2f}] (95 %): the intervals do "
            "not overlap, and no setting change repairs the candidate alone"
        ),
        "check_next": "train on, or evaluate a later step; fab compare shows τ by step",
    }


def ranked_with(findings: list[dict[str, Any]], first: dict[str, Any]) -> list[dict[str, Any]]:
    """`first` ranked first, the findings after it renumbered."""
    return [{**f, "rank": rank} for rank, f in enumerate([first, *findings], start=1)]


def trend_line(trend: dict[str, Any], step: int) -> str:
    """The trend as one line for people."""
    steps = ", ".join(f"{s}: {tau:.2f}" for s, tau in trend["taus"].items())
    if trend["rises"]:
        verdict = (
            f"τ still rises after step {step} (to {trend['taus'][trend['best_later_step']]:.2f} "
            f"at {trend['best_later_step']}): an earlier step of a run that is still improving"
        )
    else:
        verdict = f"τ does not rise after step {step}: more training alone is not the answer"
    return f"τ by step of this training run (pulled runs, one comparable group): {steps}; {verdict}"
