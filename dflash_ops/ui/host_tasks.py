"""The tasks that look at and prepare the hosts: `fab check-hosts`, `fab setup-eval-host` and
`fab deploy-harness`. fabfile.py imports them, so that fab lists them with the other tasks.
"""

from __future__ import annotations

from invoke.exceptions import Exit

from dflash_ops.core.errors import OpsError
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.evaluation.served import sglang_rows
from dflash_ops.provision.harness import deploy_harness_to
from dflash_ops.provision.setup import setup_eval_hosts
from dflash_ops.provision.setup import summary as setup_summary
from dflash_ops.remote import checks
from dflash_ops.ui.console import check_summary, check_table, console
from dflash_ops.ui.host_lines import HostLines
from dflash_ops.ui.task import ops_task


@ops_task(help={"verbose": "every check with its detail, and the hosts' facts (a table)"})
def check_hosts(c, inventory=None, verbose=False):
    """Check every inventory host: SSH, host key, container, directories, disk, tools, SGLang."""
    inv = load_inventory(inventory)
    rows = checks.check_inventory(inv, more=[sglang_rows])
    view = check_table if verbose else check_summary
    console.print(view(rows, f"check-hosts ({inv.path})"))
    bad = checks.failed(rows)
    if bad:
        raise Exit(
            f"{len(bad)} required check(s) failed: "
            + "; ".join(f"{r.host} {r.check}" for r in bad),
            code=1,
        )
    console.print("[green]all required checks passed[/]" + ("" if verbose else " (details: -v)"))


@ops_task(
    help={
        "host": "eval or features host to set up (default: every eval and features host)",
        "force": "delete and recreate the venv even if it is as recorded (one the tool made)",
        "adopt": "a venv at venv.path that dflash-ops did not make: install the missing "
        "packages into it and record it (it is never deleted)",
        "replace": "a venv at venv.path that dflash-ops did not make: delete it and build anew",
    }
)
def setup_eval_host(c, host=None, force=False, adopt=False, replace=False, inventory=None):
    """Provision eval (and features) hosts: uv, the venv (torch, transformers…), the harness."""
    if adopt and replace:
        raise OpsError("--adopt keeps the venv at venv.path, --replace deletes it: pick one")
    existing = "adopt" if adopt else "replace" if replace else None
    inv = load_inventory(inventory)
    with HostLines(console).shown() as lines:  # hosts in parallel, a progress line each
        setup_eval_hosts(
            inv,
            host,
            force,
            existing=existing,
            says=lines.says,
            on_outcome=lambda outcome: console.print(setup_summary(outcome)),
        )


@ops_task(help={"host": "eval host to deploy to (default: every eval host)"})
def deploy_harness(c, host=None, inventory=None):
    """Upload remote/dflash_eval under its content hash (if new) and make it `current`."""
    inv = load_inventory(inventory)
    for deployed in deploy_harness_to(inv, host, say=console.print):
        console.print(f"{deployed.path} (sha256 {deployed.digest})")
