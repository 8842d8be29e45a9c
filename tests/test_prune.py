"""`fab prune` on the lab: the policy keeps the newest steps, named steps and anything a
running eval reads; a dry run removes nothing; --yes frees what it said."""

from __future__ import annotations

import shlex

from dflash_ops.core.inventory import load
from dflash_ops.evaluation import jobs
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.staging import prune
from dflash_ops.staging.stage import StageOptions, stage


def test_parse_staged_reads_default_and_named_runs():
    output = "100\t/s/step_2000\n200\t/s/v5/step_4000\n7\t/s/other\n"
    found = prune.parse_staged("eval", "/s", output)
    assert [(f.run, f.step, f.size) for f in found] == [(None, 2000, 100), ("v5", 4000, 200)]


def test_policy_keeps_newest_named_and_in_use():
    steps = [prune.StagedStep("eval", f"/s/step_{n}", None, n, 10, None) for n in (1, 2, 3, 4)]
    judged = prune.Policy(keep_last=1, keep_steps=frozenset({2})).verdicts(steps, {"/s/step_1"})
    assert [item.keep for item in judged] == [
        "a running eval uses it", "--keep-steps", None, "among the newest 1",
    ]  # fmt: skip


def test_prune_on_the_lab(make_lab, fab):
    lab = make_lab(steps=(2000, 4000, 6000), checkpoint_size="2m")
    inventory = load(lab.inventory_path)
    for step in (2000, 4000, 6000):
        stage(inventory, step, options=StageOptions(report=lambda _: None))
    entry = inventory.eval_hosts["eval"]
    layout = EvalLayout(entry)
    step_dir = {n: layout.staged_checkpoint(n).rpartition("/")[0] for n in (2000, 4000, 6000)}
    host = Host(inventory, "eval")
    run_id = jobs.new_run_id(2000, "eval")
    jobs.launch(
        host, entry, run_id, "exec sleep 600", {"checkpoint": layout.staged_checkpoint(2000)}
    )
    try:
        dry = fab(lab.inventory_path, "prune", "--keep-last", "1")
        assert dry.returncode == 0, dry.stderr
        assert "dry run: would free 2.0 MiB (1 step(s))" in dry.stdout
        assert "a running eval uses it" in dry.stdout
        listing = host.run(f"ls {shlex.quote(layout.staging)}").stdout.split()
        assert listing == ["step_2000", "step_4000", "step_6000"]
        done = fab(lab.inventory_path, "prune", "--keep-last", "1", "--yes")
        assert done.returncode == 0, done.stderr
        assert "removed 1 step(s), freed 2.0 MiB" in done.stdout
        remaining = host.run(f"ls {shlex.quote(layout.staging)}").stdout.split()
        assert remaining == ["step_2000", "step_6000"]
        assert host.run(f"test -d {shlex.quote(step_dir[2000])}", check=False).ok
    finally:
        run = next(r for r in jobs.list_runs(host, entry) if r.run_id == run_id)
        jobs.cancel(host, entry, run)
        jobs.wait_finished(host, entry, run_id)
        host.close()
