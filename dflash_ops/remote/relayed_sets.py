"""The feature sets an eval host holds: relayed and verified ones only (a set directory with
its relay manifest beside it), for `run-eval --features SET-ID|latest`.
"""

from __future__ import annotations

import shlex

from dflash_ops.core.errors import HostError
from dflash_ops.core.inventory import EvalHost
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.remote.probes import Probe

MANIFEST_SUFFIX = ".manifest.json"
LATEST = "latest"


def relayed_sets_probe(entry: EvalHost) -> Probe[dict[str, int]]:
    """{set id: when its manifest was written (epoch s)} for each complete relayed set."""
    command = (
        f"cd {shlex.quote(EvalLayout(entry).features)} 2>/dev/null || exit 0; "
        f"for m in *{MANIFEST_SUFFIX}; do d=${{m%{MANIFEST_SUFFIX}}}; "
        '[ -f "$m" ] && [ -d "$d" ] && printf \'%s %s\\n\' "$(stat -c %Y "$m")" "$d"; done; true'
    )
    return Probe(command, parse_relayed_sets)


def parse_relayed_sets(output: str) -> dict[str, int]:
    found = {}
    for line in output.splitlines():
        stamp, _, name = line.partition(" ")
        if stamp.isdigit() and name:
            found[name] = int(stamp)
    return found


def pick_set(sets: dict[str, int], wanted: str) -> str | None:
    """`wanted` among the relayed `sets`, 'latest' being the one relayed last (None: absent)."""
    if wanted == LATEST:
        return max(sets, key=lambda name: (sets[name], name)) if sets else None
    return wanted if wanted in sets else None


def relayed_set(host: Host, entry: EvalHost, wanted: str) -> str:
    """The path of set `wanted` (an id, or 'latest': the last relayed) on the eval host."""
    sets = host.probe(relayed_sets_probe(entry))
    chosen = pick_set(sets, wanted)
    if chosen is None:
        held = ", ".join(sorted(sets)) or "none"
        raise HostError(
            host.name,
            f"no relayed feature set {wanted!r} in {EvalLayout(entry).features} (sets there: "
            f"{held}). Compute and relay one: fab extract-features --to {host.name} (with the "
            "prompts and --max-new-tokens of this run)",
        )
    return EvalLayout(entry).feature_set(chosen)
