"""`fab check-hosts`' SGLang row: does a harness host's `sglang_url` serve its target?

The server is asked from the host itself (the workstation usually cannot reach it), by the
check a run makes before it uses the server (dflash_eval.reference.sglang_server.check_serves), run
from memory (in_memory.py) so that checking writes nothing there. The URL goes on stdin: it may
carry credentials, which must reach neither argv nor a file.
"""

from __future__ import annotations

from collections.abc import Iterator

from dflash_eval.contract.urls import redact_url

from dflash_ops.core.errors import HostError
from dflash_ops.core.inventory import HarnessHost, HostEntry
from dflash_ops.evaluation.in_memory import harness_event, run_harness
from dflash_ops.provision.state import read_state, venv_problem
from dflash_ops.remote.checks import Row, Status
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.remote.messages import host_error_row

CHECK = "sglang server"


def sglang_rows(host: Host, entry: HostEntry) -> Iterator[Row]:
    """One row for a host with an `sglang_url`: the model it serves and whether it is the
    target (ok), or why not (fail); none for a host without one."""
    if not isinstance(entry, HarnessHost) or not entry.sglang_url:
        return
    shown = redact_url(entry.sglang_url)
    problem = venv_problem(read_state(host, entry), entry)
    if problem:
        yield Row(
            host.name,
            CHECK,
            Status.SKIPPED,
            f"{shown} not asked: the venv at {entry.venv.path} is not ready ({problem}); run "
            f"`fab setup-eval-host --host {host.name}`, then check again",
        )
        return
    argv = ["served", "--target", entry.target_model]
    answer = run_harness(host, EvalLayout(entry).python, argv, entry.sglang_url)
    try:
        served = harness_event(host.name, answer, "served", f"asked from {host.name}")
    except HostError as refusal:
        yield Row(host.name, CHECK, Status.FAIL, host_error_row(refusal))
        return
    yield Row(
        host.name,
        CHECK,
        Status.OK,
        f"{shown} serves {served['model_path']} (version {served['version'] or 'not given'}): "
        f"the inventory's target {entry.target_model}",
    )
