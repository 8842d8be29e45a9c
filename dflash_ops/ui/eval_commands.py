"""The eval tasks' front doors (`fab run-eval`, `eval-status`, `eval-logs`, `eval-cancel`,
`fetch-results`): each hands its arguments to the orchestration in dflash_ops.evaluation with
the views that show it, and prints the outcome. Comparing the pulled runs: compare_commands.
Exit statuses: OpsError → 1 (ops_task / the click CLI); Ctrl-C while following → 130.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from typing import Any

from rich.markup import escape

from dflash_ops.core.arguments import one_of, parse_steps
from dflash_ops.core.errors import OpsError
from dflash_ops.core.inventory import Inventory
from dflash_ops.core.text import check_tag
from dflash_ops.evaluation import (
    jobs,
    like,
    results,
    sweep,
    training_fetch,
)
from dflash_ops.evaluation.dataset_cache import load_set
from dflash_ops.evaluation.datasets import parse_sets
from dflash_ops.evaluation.foresee import comparability_warning
from dflash_ops.evaluation.harness_options import checked, harness_args
from dflash_ops.evaluation.host_choice import choose_eval_host, named_eval_hosts
from dflash_ops.evaluation.jobs import Detached
from dflash_ops.evaluation.plan import HostPlan, plan_runs
from dflash_ops.evaluation.request import EvalRequest, build_request, sglang_url
from dflash_ops.evaluation.run import run_eval
from dflash_ops.evaluation.tracking import said_if_flagged
from dflash_ops.evaluation.verdict import verdicts
from dflash_ops.staging.catalog import resolve_step
from dflash_ops.ui.console import console, errors, shown
from dflash_ops.ui.eval_view import LiveView, PrefixedView, show_finished, show_runs, step_line
from dflash_ops.ui.output import parse_format
from dflash_ops.ui.plan_view import plan_lines

PROMPT_SETS_DIR = "prompt-sets"  # under the results directory: the prompts files uploaded


def request_from(inventory: Inventory, options: Mapping[str, object], **fixed: Any) -> EvalRequest:
    """The run request of a task's options (run.request_options) and of what the task sets
    itself (`fixed`: step, host, …), its prompt sets built under the inventory's results."""
    return build_request(
        **options,
        **fixed,
        prompt_sets_dir=inventory.local.results / PROMPT_SETS_DIR,
        say=console.print,
    )


def run_eval_command(
    inventory: Inventory,
    *,
    step: int | None,
    steps: str | None,
    all_new: bool,
    host: str | None,
    options: Mapping[str, object],
    latest: bool = False,
    detach: bool = False,
    dry_run: bool = False,
    features: str | None = None,
    verbose: bool = False,
    hosts: str | None = None,
) -> None:
    """`fab run-eval`: one step in the foreground, or a sweep over several steps/hosts, or
    one step on each of `hosts` (`all` or a comma list); with `dry_run`, only their plan
    (nothing staged, run or written). `options`: the request's options from the task's
    flags (run.request_options); `verbose`: the whole summary of a single run."""
    one_of(("--step", step), ("--steps", steps), ("--latest", latest), ("--all-new", all_new))
    names = named_eval_hosts(inventory, host, hosts, sweep=bool(steps or all_new))
    if names is not None and len(names) == 1:  # one host named: a plain run there
        host, names = names[0], None
    harness = options.get("harness_options")
    if isinstance(harness, Mapping):  # a bad value is one line before a step or host is asked
        checked(harness)
    check_tag(options.get("tag"))
    if latest:
        step = resolve_step(inventory, None, latest=True).step
    if dry_run and options.get("dataset"):
        raise OpsError(
            "--dry-run with --dataset is not supported: the prompts file would be written. "
            "Build it with a real run first, or pass --prompts FILE"
        )
    steps_of_sweep = sweep.choose_steps(inventory, step, parse_steps(steps), all_new)
    if steps_of_sweep is None and not latest:
        resolve_step(inventory, step, latest=False)  # a missing step, before anything deploys
    if steps_of_sweep is None and host is None and not names and len(inventory.eval_hosts) > 1:
        choice = choose_eval_host(inventory, step)  # the dry run plans where the run would go
        console.print(f"{choice.name}: {escape(choice.reason)}")
        host = choice.name
    request = request_from(
        inventory,
        options,
        step=step or 0,  # a sweep's template: each of its runs sets its own
        host=host,
        detach=detach,
        features=features,
    )
    if not dry_run:
        warn_if_incomparable(inventory, request)
    if dry_run:
        _show_plans(inventory, request, steps_of_sweep or [request.step], names)
    elif names:
        _evaluate_on_hosts(inventory, names, request)
    elif steps_of_sweep is None:
        _evaluate_one(inventory, request, verbose)
    else:
        _evaluate_sweep(inventory, steps_of_sweep, request)


def like_command(
    inventory: Inventory,
    typed: str,
    *,
    run: str | None,
    step: int | None,
    host: str | None,
    options: Mapping[str, object],
    features: str | None,
    refused: Mapping[str, object],
    **rest: Any,
) -> None:
    """`fab run-eval --like RUN_ID`: the pulled run's step, prompts and options again (see
    dflash_ops.evaluation.like), the flags given beside it overriding; `refused`: flags
    that choose other steps, by name and value."""
    for flag, value in refused.items():
        if value:
            raise OpsError(f"--like repeats one run's step: {flag} cannot go with it")
    pulled = like.find(inventory.local.results, typed)
    found = like.liked(pulled)
    chosen = like.merged(found.options, options)
    own_prompts = bool(options.get("prompts") or options.get("dataset"))
    wanted = [
        name
        for name in found.remote_files
        if not options.get(name) and not (name == "prompts" and own_prompts)
    ]
    if wanted and rest.get("dry_run"):
        raise OpsError(
            f"--dry-run with --like {found.run_id} is not supported: its "
            f"{' and '.join(like.FETCHED[name] for name in wanted)} would be fetched and "
            "written here; pass them yourself (--prompts, --drafter-config) to see the plan"
        )
    chosen |= like.fetch_files(inventory, found, wanted, inventory.local.results / PROMPT_SETS_DIR)
    if not own_prompts and not (features or found.features):
        like.require_same_prompts(found, pulled, chosen.get("prompts"))
    if host is None and not rest.get("hosts") and found.host in inventory.eval_hosts:
        host = found.host
    repeated = harness_args(chosen["harness_options"])
    console.print(
        f"like {shown(found.run_id)}: step {step or found.step}"
        + (f", options {escape(shlex.join(repeated))}" if repeated else "")
        + (f", its prompts from {shown(found.host)}" if "prompts" in wanted else "")
    )
    run_eval_command(
        inventory.for_run(run or found.training_run),
        step=step or found.step,
        steps=None,
        all_new=False,
        host=host,
        options=chosen,
        features=features or found.features,
        **rest,
    )


def warn_if_incomparable(inventory: Inventory, request: EvalRequest) -> None:
    """Say, before it starts, when a run will not be comparable with the pulled results."""
    hosts = [inventory.eval_host(request.host)] if request.host else inventory.eval_hosts.items()
    from_sglang = all(sglang_url(request, name, entry) for name, entry in hosts)
    warning = comparability_warning(inventory.local.results, request, from_sglang)
    if warning:
        console.print(f"[yellow]warning:[/] {escape(warning)}")


def _evaluate_one(inventory: Inventory, request: EvalRequest, verbose: bool) -> None:
    try:
        run_eval(inventory, request, LiveView(verbose))
    except Detached as detached:
        console.print(
            f"\n[yellow]detached[/]: run {shown(detached.run_id)} goes on on "
            f"{shown(detached.host)}. Reattach: fab eval-logs --id {shown(detached.run_id)} "
            "--follow; pull results later: fab fetch-results"
        )
        raise SystemExit(130) from None


def _evaluate_sweep(inventory: Inventory, steps: list[int], template: EvalRequest) -> None:
    if not steps:
        console.print("nothing to evaluate: every complete checkpoint has a result")
        return
    console.print(
        f"sweep: steps {', '.join(map(str, steps))} over {', '.join(inventory.eval_hosts)}"
    )
    outcomes, found = _in_parallel(
        inventory, "sweep", lambda: sweep.run_sweep(inventory, steps, template, PrefixedView)
    )
    for step, outcome in sorted(outcomes.items()):
        console.print(step_line(step, outcome, found))
    sweep.require_success(outcomes)


def _evaluate_on_hosts(inventory: Inventory, names: list[str], request: EvalRequest) -> None:
    step = request.step
    console.print(f"step {step} on {len(names)} hosts: {', '.join(names)}")
    outcomes, found = _in_parallel(
        inventory, "runs", lambda: sweep.run_on_hosts(inventory, step, names, request, PrefixedView)
    )
    for name in names:  # a run's line names its host; a failure's does not
        line = step_line(step, outcomes[name], found)
        console.print(line if isinstance(outcomes[name], jobs.Run) else f"{name}: {line}")
    failed = [name for name in names if isinstance(outcomes[name], Exception)]
    if failed:
        raise OpsError(f"step {step} failed on {', '.join(failed)} (see above)")


def _in_parallel(
    inventory: Inventory, what: str, start: Callable[[], Mapping[Any, jobs.Run | Exception]]
) -> tuple[Mapping[Any, jobs.Run | Exception], Mapping[str, str]]:
    """The outcomes of runs on several hosts at once (`start`), and the verdicts of those
    that ran; Ctrl-C leaves the runs going on their hosts."""
    try:
        outcomes = start()
    except KeyboardInterrupt:
        console.print(
            f"\n[yellow]{what} interrupted[/]: runs already started go on on their "
            "hosts; `fab eval-status` shows them, `fab fetch-results` pulls them"
        )
        raise SystemExit(130) from None
    ran = [outcome.run_id for outcome in outcomes.values() if isinstance(outcome, jobs.Run)]
    return outcomes, verdicts(inventory.local.results, ran)


def _show_plans(
    inventory: Inventory, request: EvalRequest, steps: list[int], hosts: list[str] | None
) -> None:
    if not steps:
        console.print("nothing to plan: every complete checkpoint has a result")
        return

    def show(plan: HostPlan) -> None:
        for line in plan_lines(plan):
            console.print(line)

    plans = plan_runs(inventory, request, steps, show, hosts)
    console.print(f"dry run: {len(plans)} plan(s); nothing was staged, run or written")


def fetch_datasets(sets: str, refresh: bool) -> None:
    """`fab fetch-datasets`: read named prompt sets into the workstation's cache."""
    for request in parse_sets(sets):
        loaded = load_set(request, refresh=refresh, say=console.print)
        origin = ", ".join(f"{key} {value}" for key, value in loaded.origin.items() if value)
        console.print(f"{loaded.spec.name}: {len(loaded.rows)} rows ({origin})")


def show_status(inventory: Inventory, fmt: str = "table", wide: bool = False) -> None:
    """`fab eval-status`."""
    show_runs(jobs.all_runs(inventory), parse_format(fmt), wide)


def show_logs(inventory: Inventory, run_id: str | None, follow: bool) -> None:
    """`fab eval-logs`: the run's log, or (--follow) its lines as they come until it ends."""
    host, entry, run = jobs.locate(inventory, run_id)
    if run_id is None:  # say which run was chosen, beside the log (stdout stays the log)
        errors.print(f"log of run {shown(run.run_id)} on {host.name} ({run.state})")
    if not follow:
        log = jobs.log_tail(host, entry, run.run_id, lines=100_000)
        console.print(log, end="", markup=False, soft_wrap=True)
        return
    try:
        final = jobs.follow(
            host,
            entry,
            run.run_id,
            "log",
            lambda line: console.print(line, markup=False, soft_wrap=True),
        )
    except KeyboardInterrupt:
        console.print(f"\n[yellow]stopped following[/]; run {shown(run.run_id)} goes on")
        raise SystemExit(130) from None
    show_finished(console.print, final, [], None)


def cancel_run(inventory: Inventory, run_id: str | None) -> None:
    """`fab eval-cancel`."""
    host, entry, run = jobs.locate(inventory, run_id)
    jobs.cancel(host, entry, run)
    final = jobs.wait_finished(host, entry, run.run_id)
    console.print(f"run {shown(run.run_id)} on {host.name}: {final.state}")


def fetch_all(inventory: Inventory) -> None:
    """`fab fetch-results`."""

    def said(host: str, run: jobs.Run) -> None:
        console.print(f"{host}: pulled {shown(run.run_id)} ({run.state})")
        said_if_flagged(results.load_run(inventory.local.results / run.run_id), console.print)

    pulled = jobs.fetch_finished(inventory, said)
    console.print(
        f"{pulled} run(s) pulled into {shown(inventory.local.results)}"
        if pulled
        else "nothing new to pull"
    )
    # every pulled run still without its training metrics: a log that had not reached a
    # step at the run's end, or could not be read then, is read again
    training_fetch.attach(
        inventory, inventory.local.results, lambda line: console.print(escape(line))
    )
