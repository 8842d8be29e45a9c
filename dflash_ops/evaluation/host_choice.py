"""Which eval host runs `fab run-eval --step N` when the inventory has several and `--host`
names none: the first idle one in inventory order (a host runs one evaluation at a time), and
why. The run and its dry run both ask here, so the plan names the host the run would use.
`--hosts all` (or a comma list of names) runs the step on each of several hosts instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_ops.core.errors import HostBusy, OpsError
from dflash_ops.core.inventory import Inventory
from dflash_ops.evaluation import jobs
from dflash_ops.remote.connection import Host

ALL_HOSTS = "all"  # `--hosts all`: every eval host


@dataclass(frozen=True)
class HostChoice:
    name: str
    reason: str  # why this host, for the line the run and the dry run print


def choose_eval_host(inventory: Inventory, step: int) -> HostChoice:
    """The eval host for one run of `step`: the only one, else the first idle one (one SSH
    round trip per host to list its runs). HostBusy when none is idle."""
    names = list(inventory.eval_hosts)
    if len(names) == 1:
        return HostChoice(names[0], "the only eval host")
    return pick_idle(names, {name: _unavailable(inventory, name) for name in names}, step)


def named_eval_hosts(
    inventory: Inventory, host: str | None, hosts: str | None, sweep: bool
) -> list[str] | None:
    """The eval hosts `--hosts` names (`all`: every one, in inventory order; else a comma
    list), None when it is not given; refused beside `--host`, or beside a sweep's flags
    (a sweep already spreads its steps over every eval host)."""
    if hosts is None:
        return None
    if host is not None:
        raise OpsError("--host and --hosts exclude each other: pass one of them")
    if sweep:
        raise OpsError(
            "--hosts runs one step on each named host: pass --step N (or --latest); a sweep "
            "(--steps, --all-new) already spreads its steps over every eval host"
        )
    known = list(inventory.eval_hosts)
    if hosts.strip() == ALL_HOSTS:
        return known
    names = list(dict.fromkeys(name.strip() for name in hosts.split(",") if name.strip()))
    unknown = [name for name in names if name not in known]
    if not names or unknown:
        what = f"no eval host named {', '.join(map(repr, unknown))}" if unknown else "no name"
        raise OpsError(
            f"--hosts {hosts!r}: {what}; pass '{ALL_HOSTS}' or a comma list of the eval "
            f"hosts: {', '.join(known)}"
        )
    return names


def pick_idle(names: list[str], unavailable: dict[str, str | None], step: int) -> HostChoice:
    """The first of `names` (inventory order) that `unavailable` maps to None; its reason
    names what keeps the hosts before it busy."""
    for name in names:
        if unavailable[name] is None:
            passed = [f"{other}: {unavailable[other]}" for other in names[: names.index(name)]]
            why = f" ({'; '.join(passed)})" if passed else " (first in the inventory)"
            return HostChoice(name, f"step {step} runs here: idle{why}; --host NAME picks another")
    raise HostBusy(
        f"no eval host is free for step {step}: "
        + "; ".join(f"{name}: {unavailable[name]}" for name in names)
        + ". Wait for a run to end (`fab eval-status`), or pick a host with --host NAME."
    )


def _unavailable(inventory: Inventory, name: str) -> str | None:
    """Why `name` cannot take a run now (a run in progress, or the host cannot be asked), or
    None when it is idle."""
    host = Host(inventory, name)
    try:
        listed = jobs.list_runs(host, inventory.eval_hosts[name], unfinished=True)
        running = [run for run in listed if not run.done]
    except OpsError as error:
        return f"not asked ({error})"
    finally:
        host.close()
    return f"busy with run {running[0].run_id} (step {running[0].step})" if running else None
