"""Retention of feature sets (`fab prune --features`): which sets a policy keeps on each
features and eval host, and removing the rest.

Sets live in `{workdir}/features/` (remote/layout.py): on a features host a computed set is
`<set-id>/` with its `feature-set.json`; on an eval host a relayed set is `<set-id>/` with
`<set-id>.manifest.json` beside it. Only complete sets are listed: a `<set-id>.partial` is an
interrupted build or relay that the next `extract-features` resumes, so it is left alone.

The policy is staged checkpoints' (staging/prune.py), with sets in place of steps: on each
host keep the newest `keep_last` sets of each target (newest: completed last on a features
host, relayed last on an eval host, the order `run-eval --features latest` uses), the sets
named in `keep_sets`, and never a set that a run on that host has not finished with: an eval
reading it (`--features`) or a features run building or checking it (`--out`).
"""

from __future__ import annotations

import itertools
import shlex
from dataclasses import dataclass

from dflash_ops.core.errors import InventoryError
from dflash_ops.core.inventory import HarnessHost, Inventory
from dflash_ops.evaluation import jobs
from dflash_ops.features.spec import SET_RECORD
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout

MANIFEST_SUFFIX = ".manifest.json"  # a relayed set's manifest, beside it (remote/relayed_sets.py)
RUN_FLAGS = ("--features", "--out")  # how eval and features runs name the set they use


@dataclass(frozen=True)
class HeldSet:
    host: str
    path: str  # the set directory
    set_id: str
    when: int  # epoch s: completed (features host) or relayed (eval host)
    size: int  # the directory and its manifest
    keep: str | None = None  # why it stays (None: it goes)

    @property
    def target(self) -> str:
        """The target's name: a set id is `<target name>-<12 hex>` (spec.set_id)."""
        return self.set_id.rpartition("-")[0] or self.set_id


@dataclass(frozen=True)
class SetPolicy:
    keep_last: int = 2
    keep_sets: frozenset[str] = frozenset()

    def verdicts(self, sets: list[HeldSet], in_use: dict[str, str]) -> list[HeldSet]:
        """Each set with the reason it is kept; `in_use`: set path → the run using it."""
        by_target: dict[str, list[HeldSet]] = {}
        for item in sets:
            by_target.setdefault(item.target, []).append(item)
        newest = set()
        for group in by_target.values():
            ordered = sorted(group, key=lambda held: (held.when, held.set_id))
            newest |= {held.path for held in ordered[max(0, len(ordered) - self.keep_last) :]}
        judged = []
        for item in sets:
            keep = None
            if item.path in in_use:
                keep = f"run {in_use[item.path]} uses it"
            elif item.set_id in self.keep_sets:
                keep = "--keep-sets"
            elif self.keep_last and item.path in newest:
                keep = f"among the newest {self.keep_last}"
            judged.append(HeldSet(item.host, item.path, item.set_id, item.when, item.size, keep))
        return judged


def listing_command(directory: str) -> str:
    """One line per complete set under `directory`: record mtime, bytes, set id."""
    quoted = shlex.quote(directory)
    return (
        f"cd {quoted} 2>/dev/null || exit 0; "
        'for d in */; do d=${d%/}; case "$d" in *.partial) continue;; esac; '
        f'm="$d{MANIFEST_SUFFIX}"; '
        f'if [ -f "$m" ]; then r="$m"; elif [ -f "$d/{SET_RECORD}" ]; then r="$d/{SET_RECORD}"; '
        'm=""; else continue; fi; '
        'printf \'%s\\t%s\\t%s\\n\' "$(stat -c %Y -- "$r")" '
        '"$(du -sbc -- "$d" ${m:+"$m"} | tail -n 1 | cut -f 1)" "$d"; '
        "done; true"
    )


def parse_listing(host: str, directory: str, output: str) -> list[HeldSet]:
    found = []
    for line in output.splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and fields[0].isdigit() and fields[1].isdigit() and fields[2]:
            path = f"{directory.rstrip('/')}/{fields[2]}"
            found.append(HeldSet(host, path, fields[2], int(fields[0]), int(fields[1])))
    return sorted(found, key=lambda item: (item.target, item.when, item.set_id))


def sets_in_use(runs: list[jobs.Run]) -> dict[str, str]:
    """{set path: run id} for every unfinished run that names a set."""
    used = {}
    for run in (run for run in runs if not run.done):
        out = run.params.get("out")
        if out:
            used[str(out)] = run.run_id
        words = shlex.split(str(run.params.get("command", "")))
        for before, word in itertools.pairwise(words):
            if before in RUN_FLAGS:
                used[word] = run.run_id
    return used


def _hosts(inventory: Inventory, host: str | None) -> dict[str, HarnessHost]:
    hosts = inventory.harness_hosts
    if host is None:
        return hosts
    if host not in hosts:
        raise InventoryError(
            f"{inventory.path}: no eval or features host named {host!r} (hosts that hold "
            f"feature sets: {', '.join(hosts) or 'none'})"
        )
    return {host: hosts[host]}


def plan(inventory: Inventory, policy: SetPolicy, host: str | None = None) -> list[HeldSet]:
    """Every complete feature set on the features and eval hosts (or one), with its verdict."""
    judged: list[HeldSet] = []
    for name, entry in _hosts(inventory, host).items():
        connection = Host(inventory, name)
        try:
            directory = EvalLayout(entry).features
            output = connection.run(listing_command(directory)).stdout
            in_use = sets_in_use(jobs.list_runs(connection, entry))
        finally:
            connection.close()
        judged += policy.verdicts(parse_listing(name, directory, output), in_use)
    return judged


def removal_command(paths: list[str]) -> str:
    """The records first (a manifest, feature-set.json), so that a removal cut short never
    leaves a set that looks complete; then the directories."""
    records = [f"{path}{MANIFEST_SUFFIX}" for path in paths]
    records += [f"{path}/{SET_RECORD}" for path in paths]
    return (
        f"rm -f -- {' '.join(map(shlex.quote, records))} && "
        f"rm -rf -- {' '.join(map(shlex.quote, paths))}"
    )


def apply(inventory: Inventory, dropped: list[HeldSet]) -> int:
    """Remove the dropped sets; returns the bytes freed."""
    by_host: dict[str, list[HeldSet]] = {}
    for item in dropped:
        by_host.setdefault(item.host, []).append(item)
    for name, items in by_host.items():
        connection = Host(inventory, name)
        try:
            connection.run(removal_command([item.path for item in items]))
        finally:
            connection.close()
    return sum(item.size for item in dropped)
