"""`fab run-eval --dry-run` on a lab with a tiny target and provisioned eval hosts: the plan
before staging, after staging and after a real run (cache hits 0/n, then n/n), over several
hosts (and `--hosts all`, planned and run on each), with clear errors, and nothing written
anywhere by the plan itself."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from dflash_ops.core.inventory import load
from dflash_ops.remote.connection import Host
from tests.conftest import run_fab
from tests.e2e.conftest import hidden_steps

pytestmark = pytest.mark.long(410)  # seconds in a cold `make test` (5 workers)

QUICK = ["--num-prompts", "2", "--max-new-tokens", "24", "--ddtree", "4"]


@pytest.fixture
def plan_lab(e2e_lab):
    """The shared lab with the steps 2000 and 4000 on its trainer."""
    with hidden_steps(e2e_lab, 6000):
        yield e2e_lab


def host_listing(inventory_path: Path, name: str) -> str:
    """Every path on the host's own disk (workdir, venv, staging, target, cache) and the
    trainer's, with type, size and mtime: any file created, removed or written shows."""
    inventory = load(inventory_path)
    host = Host(inventory, name)
    try:
        if name in inventory.eval_hosts:
            root = str(Path(inventory.eval_hosts[name].workdir).parent)
        else:
            root = str(Path(inventory.trainer.tmp_dir).parent)
        command = f"find {shlex.quote(root)} -printf '%y %p %s %T@\\n' | sort"
        return host.run(command).stdout
    finally:
        host.close()


def local_listing(inventory_path: Path) -> dict[str, str]:
    """The workstation's results and staging directories, content-hashed."""
    local = load(inventory_path).local
    found = {}
    for root in (Path(local.results), Path(local.staging or local.results)):
        for path in sorted([root, *root.rglob("*")]) if root.exists() else []:
            found[str(path)] = (
                hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
            )
    return found


def everything(inventory_path: Path) -> tuple:
    hosts = ("eval", "eval2", "trainer")
    return tuple(host_listing(inventory_path, name) for name in hosts), local_listing(
        inventory_path
    )


def dry_run(inventory_path: Path, *args: str):
    """A dry run, asserted to succeed and to leave every host and the workstation as they were."""
    before = everything(inventory_path)
    result = run_fab(inventory_path, "run-eval", "--dry-run", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert everything(inventory_path) == before, "the dry run wrote something"
    return result.stdout


def block_of(output: str, host: str) -> str:
    """The lines of one host's plan."""
    blocks = output.split("\n" + host + ": step")
    assert len(blocks) == 2 or output.startswith(host + ": step"), output
    return blocks[-1].split("\neval")[0]


def test_plan_before_staging_after_staging_and_after_a_run(plan_lab):
    inventory_path = plan_lab.inventory_path
    cold = dry_run(inventory_path, "--step", "2000", "--host", "eval", *QUICK)
    assert "checkpoint: not staged; would be copied to" in cold
    assert "staging: 994.1 KiB to move" in cold or "to move" in cold
    assert "disk: eval:" in cold and "free" in cold and "(ok)" in cold
    assert "block size and target layers unknown until staged" in cold
    assert "2 prompts; hits unknown" in cold
    assert "estimate ~" in cold and "target " in cold and "available (fits)" in cold
    assert "run: greedy, on cpu" in cold  # the run's decisions, as the harness makes them

    staged = run_fab(inventory_path, "stage-checkpoint", "--step", "2000", "--to", "eval")
    assert staged.returncode == 0, staged.stderr
    before_run = dry_run(inventory_path, "--step", "2000", "--host", "eval", *QUICK)
    assert "checkpoint: already staged at" in before_run
    assert "completions 0/2 hit, hidden states 0/2 hit" in before_run
    assert "2 completion(s), 2 hidden state(s); loads the target's body" in before_run
    assert "block size 8" in before_run

    # No --host with two eval hosts: the run takes the idle one the dry run names.
    ran = run_fab(inventory_path, "run-eval", "--step", "2000", *QUICK)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "eval: step 2000 runs here: idle (first in the inventory)" in ran.stdout
    after_run = dry_run(inventory_path, "--step", "2000", "--host", "eval", *QUICK)
    assert "completions 2/2 hit, hidden states 2/2 hit" in after_run
    assert "0 completion(s), 0 hidden state(s); reads only its embedding and head" in after_run
    # The cache belongs to the target and the prompts, not to the checkpoint: another step
    # with the same drafter settings finds the same entries once it is staged.
    other = dry_run(inventory_path, "--step", "4000", "--host", "eval", *QUICK)
    assert "not staged" in other
    # Sampled: every path of a prompt is an entry of its own, looked up under its own key.
    sampled = ("--temperature", "0.7", "--paths", "2")
    at_t = dry_run(inventory_path, "--step", "2000", "--host", "eval", *QUICK, *sampled)
    assert "run: sampled at temperature 0.7 (" in at_t and "2 path(s) per prompt, on cpu" in at_t
    assert "completions 0/4 hit, hidden states 0/4 hit" in at_t


def test_latest_plans_on_the_one_host_the_run_would_take_and_says_why(plan_lab):
    # Two idle eval hosts: the run takes the first (test_plan_before_staging_… runs it), so
    # its dry run plans there alone, not on both as it once did while the run refused.
    output = dry_run(plan_lab.inventory_path, "--latest", *QUICK)
    assert "eval: step 4000 runs here: idle (first in the inventory)" in output
    assert "eval: step 4000" in output and "eval2: step 4000" not in output
    assert "dry run: 1 plan(s); nothing was staged, run or written" in output
    several = dry_run(plan_lab.inventory_path, "--steps", "2000,4000", "--host", "eval2", *QUICK)
    assert "eval2: step 2000" in several and "eval2: step 4000" in several


def test_hosts_all_plans_and_runs_the_step_on_every_eval_host(plan_lab):
    inventory_path = plan_lab.inventory_path
    planned = dry_run(inventory_path, "--step", "4000", "--hosts", "all", *QUICK)
    assert "eval: step 4000" in planned and "eval2: step 4000" in planned
    assert "dry run: 2 plan(s)" in planned and "runs here: idle" not in planned
    ran = run_fab(inventory_path, "run-eval", "--step", "4000", "--hosts", "all", *QUICK)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "step 4000 on 2 hosts: eval, eval2" in ran.stdout
    for host in ("eval", "eval2"):  # a run on each, its lines prefixed, then its end line
        assert f"{host:>8} │ " in ran.stdout
        assert re.search(
            rf"^step 4000: τ .* on {host} \(run \S+-step4000-{host}-", ran.stdout, re.M
        )
    results = load(inventory_path).local.results
    pulled = [json.loads(path.read_text()) for path in results.glob("*/run.json")]
    assert sorted((run["step"], run["host"]) for run in pulled) == [(4000, "eval"), (4000, "eval2")]
    # --like repeats one of them; with --hosts all, on each host, not on the liked run's alone
    (liked,) = [run["run_id"] for run in pulled if run["host"] == "eval2"]
    again = dry_run(inventory_path, "--like", liked, "--hosts", "all")
    assert "eval: step 4000" in again and "dry run: 2 plan(s)" in again


def broken_inventory(inventory_path: Path, tmp_path: Path, **eval_settings) -> Path:
    """A copy of the lab's inventory with the eval host's settings changed."""
    document = yaml.safe_load(inventory_path.read_text())
    document["hosts"]["eval"].update(eval_settings)
    copy = tmp_path / "inventory.yaml"
    copy.write_text(yaml.safe_dump(document, sort_keys=False))
    return copy


def test_clear_errors_for_a_missing_target_and_an_unreachable_host(plan_lab, tmp_path):
    inventory_path = plan_lab.inventory_path
    missing = broken_inventory(inventory_path, tmp_path, target_model="/nonexistent/target")
    result = run_fab(missing, "run-eval", "--dry-run", "--step", "2000", "--host", "eval")
    assert result.returncode == 1
    assert "eval: target model /nonexistent/target not found" in result.stderr
    assert "Traceback" not in result.stderr

    port = load(inventory_path).eval_hosts["eval"].port
    unreachable = broken_inventory(inventory_path, tmp_path, port=port + 1)
    result = run_fab(unreachable, "run-eval", "--dry-run", "--step", "2000", "--host", "eval")
    assert result.returncode == 1
    assert "eval: cannot connect to" in result.stderr
    assert "Traceback" not in result.stderr

    datasets = run_fab(
        inventory_path, "run-eval", "--dry-run", "--step", "2000", "--dataset", "gsm8k"
    )
    assert datasets.returncode == 1 and "--dry-run with --dataset" in datasets.stderr


def test_a_target_the_venv_transformers_cannot_build_is_named_before_anything_is_staged(
    plan_lab, tmp_path
):
    import json
    import shutil

    from dflash_ops.remote import checks
    from dflash_ops.remote.checks import Status

    inventory_path = plan_lab.inventory_path
    rows = {(r.host, r.check): r for r in checks.check_inventory(load(inventory_path))}
    supported = rows[("eval", "transformers")]
    assert supported.status is Status.OK and "builds the target's qwen3 config" in supported.detail

    target = Path(load(inventory_path).eval_hosts["eval"].target_model)
    future = target.with_name(target.name + "-future")
    shutil.copytree(target, future)
    try:
        config = json.loads((future / "config.json").read_text())
        (future / "config.json").write_text(json.dumps({**config, "model_type": "qwen9_future"}))
        broken = broken_inventory(inventory_path, tmp_path, target_model=str(future))
        rows = {(r.host, r.check): r for r in checks.check_inventory(load(broken))}
        refused = rows[("eval", "transformers")]
        assert refused.status is Status.FAIL
        assert "cannot read" in refused.detail and "setup-eval-host" in refused.detail
        before = everything(broken)
        result = run_fab(broken, "run-eval", "--dry-run", "--step", "2000", "--host", "eval")
        assert "model_type 'qwen9_future'" in " ".join(
            result.stdout.split() + result.stderr.split()
        )
        assert everything(broken) == before
        assert "Traceback" not in result.stderr
    finally:
        shutil.rmtree(future)
