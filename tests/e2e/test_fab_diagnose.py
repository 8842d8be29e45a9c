"""`fab diagnose` end to end on a lab: the candidate and the other step staged, the harness's
diagnose run on the eval host over real SSH, the diagnosis pulled and printed as JSON."""

from __future__ import annotations

import json
import re

import pytest

from dflash_ops.core.inventory import load
from dflash_ops.evaluation import jobs
from dflash_ops.remote.connection import Host
from tests.conftest import run_fab
from tests.e2e.conftest import hidden_steps, one_eval_host

pytestmark = pytest.mark.long(45)  # seconds in a cold `make test` (5 workers)


QUICK = ["--num-prompts", "2", "--max-new-tokens", "24"]


@pytest.fixture
def models_lab(e2e_lab, tmp_path):
    """The shared lab as a trainer with the steps 2000 and 6000 and one eval host."""
    with hidden_steps(e2e_lab, 4000):
        yield one_eval_host(e2e_lab, tmp_path)


def test_diagnose_one_step_against_another_prints_ranked_findings_and_keeps_the_data(models_lab):
    done = run_fab(
        models_lab.inventory_path,
        "diagnose",
        "--step",
        "2000",
        "--against",
        "6000",
        "--format",
        "json",
        *QUICK,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)  # stdout is the JSON object alone
    assert shown["against"] == "step 6000"
    assert shown["candidate"].endswith("checkpoint.pt")
    assert [f["rank"] for f in shown["findings"]] == list(range(1, len(shown["findings"]) + 1))
    assert all(f["evidence"] and f["check_next"] for f in shown["findings"])
    assert {r["repair"] for r in shown["repairs"]} >= {"all target layer ids +1"}
    assert all(r["verdict"] in ("finding", "no measurable effect") for r in shown["repairs"])
    results = load(models_lab.inventory_path).local.results
    [pulled] = list((results / "diagnose").glob("*/diagnose.json"))
    kept = json.loads(pulled.read_text())
    assert kept["findings"][0]["title"] == shown["findings"][0]["title"]
    assert kept["candidate"]["step"] == 2000 and kept["other"]["step"] == 6000


def test_diagnose_refuses_an_against_that_is_neither_reference_nor_a_step(models_lab):
    done = run_fab(models_lab.inventory_path, "diagnose", "--step", "2000", "--against", "best")
    assert done.returncode != 0
    assert "--against: expected 'reference' or a step number, got 'best'" in done.stderr
    assert "Traceback" not in done.stderr


def test_ctrl_c_during_diagnose_detaches_with_the_line_to_follow_it(models_lab, monkeypatch):
    confirm = jobs._wait_started

    def interrupted_once_started(host, entry, run_id, timeout=20):
        confirm(host, entry, run_id, timeout)
        raise KeyboardInterrupt  # as if Ctrl-C landed just as the start was confirmed

    monkeypatch.setattr(jobs, "_wait_started", interrupted_once_started)
    done = run_fab(models_lab.inventory_path, "diagnose", "--step", "2000", *QUICK)
    assert done.returncode == 130 and "Traceback" not in done.stderr
    said = " ".join(done.stderr.split())
    run_id = re.search(r"detached: diagnosis run (\S+) goes on on eval", said).group(1)
    assert f"fab eval-logs --id {run_id} --follow" in said
    inventory = load(models_lab.inventory_path)
    host = Host(inventory, "eval")
    entry = inventory.eval_hosts["eval"]
    try:  # the run went on after the Ctrl-C: it is still there to cancel
        run = next(r for r in jobs.list_runs(host, entry) if r.run_id == run_id)
        jobs.cancel(host, entry, run)
        assert jobs.wait_finished(host, entry, run_id, 60).state in ("cancelled", "succeeded")
    finally:
        host.close()


def test_a_dry_run_lists_the_repairs_and_their_time_and_runs_nothing(models_lab):
    staged = run_fab(models_lab.inventory_path, "stage-checkpoint", "--step", "2000")
    assert staged.returncode == 0, staged.stderr
    inventory = load(models_lab.inventory_path)
    host = Host(inventory, "eval")
    try:
        before = {r.run_id for r in jobs.list_runs(host, inventory.eval_hosts["eval"])}
        planned = run_fab(
            models_lab.inventory_path,
            "diagnose",
            "--step",
            "2000",
            "--dry-run",
            "--format",
            "json",
            *QUICK,
        )
        assert planned.returncode == 0, planned.stderr
        part = json.loads(planned.stdout)["diagnose"]
        assert part["repairs"] > 5 and len(part["labels"]) == part["repairs"]
        assert part["prompts"] == 2 and part["walks"] == 2 * part["repairs"]
        assert 0 < part["seconds"] < part["seconds_up_to"]
        shown = run_fab(
            models_lab.inventory_path, "diagnose", "--step", "2000", "--dry-run", *QUICK
        )
        said = " ".join(shown.stdout.split())
        assert f"repairs: {part['repairs']} × 2 prompts" in said, shown.stdout
        assert "all target layer ids +1" in said and "diagnose time: ~" in said
        after = {r.run_id for r in jobs.list_runs(host, inventory.eval_hosts["eval"])}
        assert after == before  # nothing was launched
        assert not (inventory.local.results / "diagnose").exists()
    finally:
        host.close()
