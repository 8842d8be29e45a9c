"""`fab run-eval --dry-run`: per eval host, what the run would stage, find cached, compute,
need in memory and roughly take, with nothing written anywhere.

Staging is asked for its dry-run plan (the destination's manifest, partials and free space
are read; nothing is copied or locked). The harness's `plan` runs on the host from memory
(in_memory.py) with the argv a real run would pass, its uploaded inputs (prompts, drafter
config and profile, SGLang URL) sent on stdin instead of as files. The harness answers with
the cache counts under the very keys `eval` would look up, the target's memory in the dtype
it would choose against what the host has, and an estimate of the time.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from dflash_ops.core.errors import HostError
from dflash_ops.core.inventory import EvalHost, Inventory
from dflash_ops.evaluation.harness_command import (
    drafter_profile,
    host_defaults_argv,
    host_inputs_argv,
)
from dflash_ops.evaluation.in_memory import harness_event, run_harness
from dflash_ops.evaluation.request import EvalRequest, sglang_url
from dflash_ops.provision.state import read_state, venv_problem
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.staging.delivery import HopPlan, StagedCheckpoint, StageOptions
from dflash_ops.staging.stage import stage


@dataclass
class HostPlan:
    host: str
    step: int
    checkpoint: str  # where the checkpoint is, or will be, staged on the host
    staged: bool
    hops: tuple[HopPlan, ...]  # what staging would move (empty when staged)
    harness: dict  # the harness's plan (dflash_eval.plan.dry_run.make_plan)
    notes: list[str] = field(default_factory=list)


def plan_runs(
    inventory: Inventory,
    request: EvalRequest,
    steps: list[int],
    on_plan: Callable[[HostPlan], None],
    hosts: list[str] | None = None,
) -> list[HostPlan]:
    """Plan `request` for each step on each eval host (only `request.host` when given, only
    `hosts` when given), calling `on_plan` as each is known. Raises the first host's error
    after planning the others (HostError: unreachable, venv not ready, target missing, the
    harness refused)."""
    names = hosts or (
        [inventory.eval_host(request.host)[0]] if request.host else list(inventory.eval_hosts)
    )
    plans: list[HostPlan] = []
    failures: list[HostError] = []
    for step in steps:
        options = StageOptions(dry_run=True, via=request.via, report=lambda message: None)
        for staged in stage(inventory, step, names, options=options):
            try:
                plans.append(plan_host(inventory, request, staged))
            except HostError as error:
                failures.append(error)
                continue
            on_plan(plans[-1])
    if failures:
        if len(failures) == 1:
            raise failures[0]
        raise HostError(
            ", ".join(sorted({f.host for f in failures})),
            "no plan: " + "; ".join(str(f) for f in failures),
        )
    return plans


def plan_host(inventory: Inventory, request: EvalRequest, staged: StagedCheckpoint) -> HostPlan:
    """One host's plan for one step (the harness run from memory on it)."""
    host = Host(inventory, staged.host)
    entry = inventory.eval_hosts[staged.host]
    try:
        _require_ready(host, entry)
        profile = drafter_profile(inventory)
        argv = plan_argv(host, entry, staged.path, request, profile)
        result = run_harness(
            host,
            EvalLayout(entry).python,
            argv,
            json.dumps(
                stdin_inputs(entry, request, profile, sglang_url(request, host.name, entry))
            ),
        )
    finally:
        host.close()
    plan = harness_event(host.name, result, "plan", "the harness could not plan the run")["plan"]
    notes = []
    if request.strip_optimizer:
        notes.append("--strip-optimizer: the run evaluates an optimizer-free copy of it")
    hops = () if staged.already else staged.plan
    return HostPlan(staged.host, staged.step, staged.path, staged.already, hops, plan, notes)


def _require_ready(host: Host, entry: EvalHost) -> None:
    """As run-eval checks: a provisioned venv, and the target where the inventory says."""
    problem = venv_problem(read_state(host, entry), entry)
    if problem:
        raise HostError(
            host.name,
            f"the eval venv at {entry.venv.path} is not ready ({problem}); run "
            f"`fab setup-eval-host --host {host.name}`"
            f"{host.access_hint(entry.venv.path)}",
        )
    found = host.run(f"test -d {shlex.quote(entry.target_model)}", check=False)
    if not found.ok:
        raise HostError(
            host.name,
            f"target model {entry.target_model} not found; fix `target_model` in the inventory",
        )


def plan_argv(
    host: Host, entry: EvalHost, checkpoint: str, request: EvalRequest, profile: dict | None
) -> list[str]:
    """The harness argv of the real run (run.harness_command), as `plan`, with no --out and
    its would-be uploads announced on stdin."""
    layout = EvalLayout(entry)
    argv = ["plan", "--checkpoint", checkpoint, "--target", entry.target_model]
    argv += ["--step", str(request.step), "--cache-dir", layout.cache, "--inputs-on-stdin"]
    argv += host_inputs_argv(host, entry, request)
    argv += host_defaults_argv(entry, request, profile)
    return argv + request.harness_args


def stdin_inputs(
    entry: EvalHost, request: EvalRequest, profile: dict | None, url: str | None
) -> dict:
    """What a real run uploads into its run directory, as the harness's `--inputs-on-stdin`."""
    inputs: dict[str, str] = {}
    if request.prompts is not None:
        inputs["prompts"] = request.prompts.read_text(encoding="utf-8")
    if request.drafter_config is not None:
        inputs["drafter_config"] = request.drafter_config.read_text(encoding="utf-8")
    if profile is not None:
        harness_profile = {k: v for k, v in profile.items() if k != "target_dtype"}
        inputs["drafter_profile"] = json.dumps(harness_profile)
    if url is not None:
        inputs["sglang_url"] = url
    return inputs
