"""Room for a feature set, checked before anything is computed or relayed.

On the features host, the harness itself bounds the set's size (`features --check-space`,
dflash_eval/reference/feature_size.py: prompts counted with the target's tokenizer, the dtype the
run will choose, the layers and hidden size) and reads the free space of the set directory's
filesystem; here the inventory's margin is added, as staging adds it for every hop. The
figure is an upper bound: a set whose completions stop early takes less.

On the eval hosts, the set's real size is known: staging's own dry run plans each relay
(what is already there, what resumes) with its free-space check, and every short host is
named before the first byte moves.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from dflash_ops.core.errors import DiskSpaceError
from dflash_ops.core.units import format_bytes
from dflash_ops.evaluation.in_memory import harness_event
from dflash_ops.remote.connection import Host
from dflash_ops.staging.delivery import StagedCheckpoint
from dflash_ops.staging.disk import Margin, SpaceCheck, space_check

CHECK_FLAG = "--check-space"


def features_host_advice(host: str) -> str:
    return (
        f"old feature sets: `fab prune --features --host {host}`; or extract fewer prompts "
        "(a shorter --prompts file, --num-prompts with --dataset) or fewer --max-new-tokens"
    )


def eval_host_advice(host: str) -> str:
    return (
        f"old feature sets: `fab prune --features --host {host}`; staged checkpoints: "
        f"`fab prune --host {host}`; or relay to other hosts with --to"
    )


def check_features_host(
    host: Host, command: str, set_id: str, margin: Margin, report: Callable[[str], None]
) -> SpaceCheck:
    """Run the features command with --check-space (computes nothing) and refuse, with the
    numbers and what to do, when the set's upper bound and the margin exceed the free space."""
    answer = host.run(f"{command} {CHECK_FLAG}", check=False)
    space = harness_event(host.name, answer, "space", "the harness refused the feature set")
    bound = (
        f"at most {format_bytes(space['to_write_bytes'])}, an upper bound: "
        f"{space['prompts']} prompts of ≤ {space['longest_bound']} tokens × {space['layers']} "
        f"layers × hidden {space['hidden_size']} in {space['dtype']}, plus completions"
    )
    check = space_check(
        host.name,
        space["path"],
        space["free_bytes"],
        space["to_write_bytes"],
        margin,
        f"feature set {set_id} ({bound})",
        features_host_advice(host.name),
    )
    check.require()
    report(
        f"{host.name}: feature set {set_id} needs {bound}; {format_bytes(check.free)} free at "
        f"{shlex.quote(check.path)}"
    )
    return check


def require_room(planned: list[StagedCheckpoint]) -> None:
    """Refuse before any relay when a host's planned copy does not fit (all named)."""
    short = [
        hop.space
        for staged in planned
        for hop in staged.plan
        if hop.space is not None and not hop.space.ok
    ]
    if not short:
        return
    first, others = short[0], short[1:]
    also = "".join(
        f"; also short: {check.host}:{check.path} needs {format_bytes(check.needed)}, free "
        f"{format_bytes(check.free)}"
        for check in others
    )
    raise DiskSpaceError(
        first.host,
        first.path,
        first.needed,
        first.free,
        f"{first.what} ({format_bytes(first.to_write)} to relay)",
        first.advice + also,
    )
