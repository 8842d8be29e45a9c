"""`fab run-eval` and the job tasks end to end on a lab with a tiny target, trained drafter
checkpoints and provisioned eval hosts: the real harness, over real SSH.

The lab is the e2e tier's shared one; after each test its runs, pulled results and staged
checkpoints are put back as the lab was built (and checked). A test that needs a run to be
still going when it acts pauses the harness process (SIGSTOP) instead of hoping it is slow.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from dflash_lab.models import BLOCK_SIZE
from dflash_ops.core.inventory import load
from dflash_ops.evaluation import jobs
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from tests.conftest import FAB, run_fab, start_fab
from tests.sglang_stand_in import started_in

pytestmark = pytest.mark.long(310)  # seconds in a cold `make test` (5 workers)

QUICK = ["--num-prompts", "2", "--max-new-tokens", "24", "--ddtree", "4,8"]
SHORTER = ["--num-prompts", "2", "--max-new-tokens", "16", "--ddtree", "4,8"]  # not comparable


@pytest.fixture
def inventory_path(e2e_lab) -> Path:
    """The shared lab's inventory (put back as built after the test: tests/e2e/conftest.py)."""
    return e2e_lab.inventory_path


@contextmanager
def paused(inventory_path: Path, run: jobs.Run, host_name: str = "eval") -> Iterator[str]:
    """Hold a run's harness process still (SIGSTOP) so that it is certainly running while
    the test acts; it continues on exit. Yields the run directory."""
    inventory = load(inventory_path)
    host = Host(inventory, host_name)
    directory = jobs.run_dir(inventory.eval_hosts[host_name], run.run_id)
    pid = f"$(cat {shlex.quote(directory)}/pid)"
    try:
        host.run(f"kill -STOP {pid}")
        yield directory
    finally:
        host.run(f"kill -CONT {pid} 2>/dev/null || true")
        host.close()


def fab_eval(inventory_path: Path, *args: str, timeout: float = 300):
    return run_fab(inventory_path, *args, timeout=timeout)


def wait_for_run(
    inventory_path: Path,
    host_name: str = "eval",
    state: str = "running",
    timeout: float = 120,
    launcher: subprocess.Popen | None = None,
) -> jobs.Run:
    """The newest run in `state` on the host, polled; with `launcher` (the `fab` that starts
    it), a launcher that ended first fails the wait at once with its output."""
    inventory = load(inventory_path)
    host, entry = Host(inventory, host_name), inventory.eval_hosts[host_name]
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            runs = [run for run in jobs.list_runs(host, entry) if run.state == state]
            if runs:
                return runs[-1]
            if launcher is not None and launcher.poll() is not None:
                out, err = launcher.communicate()
                raise AssertionError(f"fab ended (exit {launcher.returncode}) first:\n{out}{err}")
            time.sleep(0.5)
    finally:
        host.close()
    raise AssertionError(f"no {state} run on {host_name} within {timeout} s")


def wait_on_host(inventory_path: Path, condition: str, host_name: str = "eval") -> None:
    """Return once the shell `condition` holds on the host (checked there; `timeout` only
    bounds a broken test)."""
    inventory = load(inventory_path)
    host = Host(inventory, host_name)
    try:
        host.run(f"timeout 120 sh -c {shlex.quote(f'until {condition}; do sleep 0.1; done')}")
    finally:
        host.close()


def pulled(inventory_path: Path) -> list[Path]:
    return sorted(load(inventory_path).local.results.glob("*/run.json"))


def test_run_eval_end_to_end(inventory_path):
    result = fab_eval(
        inventory_path, "run-eval", "--step", "2000", "--host", "eval", "--reference", "-v", *QUICK
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "succeeded (exit code 0)" in result.stdout
    assert "step 2000  τ macro" in result.stdout
    assert "reference drafter τ macro" in result.stdout  # the inventory's reference_drafter
    last = result.stdout.strip().splitlines()[-1]  # the verdict: τ [CI], change, ratio, key
    assert re.fullmatch(
        r"step 2000: τ [\d.]+ \[.+\], first comparable step, [\d.]+× reference, key k\w{8}", last
    ), last
    [run_file] = pulled(inventory_path)
    results = json.loads((run_file.parent / "results.json").read_text())
    assert results["checkpoint"]["step"] == 2000
    reference = load(inventory_path).eval_hosts["eval"].reference_drafter
    assert results["reference"]["checkpoint"]["path"] == reference
    assert results["comparison"]["tau_macro"] > 0
    assert results["prompts"]["count"] == 2
    # The inventory's per-host thread budget reaches the harness (the lab splits the cores).
    assert results["host"]["torch_threads"] == load(inventory_path).eval_hosts["eval"].threads
    staged = EvalLayout(load(inventory_path).eval_hosts["eval"]).staged_checkpoint(2000)
    assert results["checkpoint"]["path"] == staged
    deployed = json.loads((run_file.parent / "params.json").read_text())["harness"]
    assert Path(deployed).name == results["harness"]["content_sha256"][:16]
    assert (run_file.parent / "log").exists() and (run_file.parent / "events.jsonl").exists()
    again = fab_eval(inventory_path, "fetch-results")
    assert "nothing new to pull" in again.stdout  # pulling twice changes nothing


def test_harness_killed_mid_run_fails_loudly(inventory_path):
    running = start_fab(
        inventory_path, "run-eval", "--step", "4000", "--host", "eval", "--max-new-tokens", "400"
    )
    run = wait_for_run(inventory_path, launcher=running)
    inventory = load(inventory_path)
    host = Host(inventory, "eval")
    pid_file = f"{jobs.run_dir(inventory.eval_hosts['eval'], run.run_id)}/pid"
    host.run(f"kill -KILL $(cat {shlex.quote(pid_file)})")
    host.close()
    _, stderr = running.communicate(timeout=120)
    assert running.returncode == 1
    assert f"run {run.run_id} on eval failed (exit code 137)" in stderr
    assert "last lines of its log" in stderr
    status = fab_eval(inventory_path, "eval-status")
    assert run.run_id in status.stdout and "failed" in status.stdout


def test_workstation_killed_mid_run_then_fetch(inventory_path):
    running = start_fab(inventory_path, "run-eval", "--step", "6000", "--host", "eval", *QUICK)
    run = wait_for_run(inventory_path, launcher=running)
    with paused(inventory_path, run):  # the workstation goes while the run certainly runs
        running.send_signal(signal.SIGKILL)
        running.wait(timeout=30)
    finished = wait_for_run(inventory_path, state="succeeded")
    assert finished.run_id == run.run_id
    fetched = fab_eval(inventory_path, "fetch-results")
    assert f"pulled {run.run_id} (succeeded)" in fetched.stdout
    assert [path.parent.name for path in pulled(inventory_path)] == [run.run_id]


def test_detach_reattach_cancel_and_busy(inventory_path):
    long = fab_eval(
        inventory_path,
        "run-eval",
        "--step",
        "4000",
        "--host",
        "eval",
        "--detach",
        "--max-new-tokens",
        "400",
    )
    assert long.returncode == 0, long.stderr
    victim = wait_for_run(inventory_path, state="running")
    with paused(inventory_path, victim) as directory:  # it holds the host for the busy check
        busy = fab_eval(inventory_path, "run-eval", "--step", "2000", "--host", "eval", *QUICK)
        assert busy.returncode == 1 and f"eval is busy with run {victim.run_id}" in busy.stderr
        canceller = start_fab(inventory_path, "eval-cancel", "--id", victim.run_id)
        # The cancel marks the run, then sends SIGTERM; the paused harness takes it on resume.
        wait_on_host(inventory_path, f"test -f {shlex.quote(directory)}/cancelled")
    cancelled, _ = canceller.communicate(timeout=120)
    assert f"run {victim.run_id} on eval: cancelled" in cancelled
    nothing = fab_eval(inventory_path, "eval-cancel", "--id", victim.run_id)
    assert nothing.returncode == 1 and "already cancelled" in nothing.stderr

    detached = fab_eval(
        inventory_path, "run-eval", "--step", "2000", "--host", "eval", "--detach", *QUICK
    )
    assert detached.returncode == 0, detached.stderr
    [run_id] = re.findall(r"run (\S+) started", detached.stdout)
    follow = fab_eval(inventory_path, "eval-logs", "--id", run_id[:20], "--follow")
    assert follow.returncode == 0, follow.stderr
    assert f"run {run_id} succeeded" in follow.stdout
    assert "Checkpoint" in follow.stdout  # the harness's human summary, from its log


def test_sweep_over_two_hosts_and_compare(inventory_path):
    # Step 6000 is staged on eval2 only: the sweep must run it there instead of copying it.
    stage_only_on_eval2(inventory_path, 6000)
    sweep = fab_eval(inventory_path, "run-eval", "--steps", "2000,4000,6000", *QUICK, timeout=600)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    for host in ("eval", "eval2"):
        assert f"{host:>8} │ " in sweep.stdout  # lines prefixed by their host
    hosts = {
        json.loads(p.read_text())["step"]: json.loads(p.read_text())["host"]
        for p in pulled(inventory_path)
    }
    assert sorted(hosts) == [2000, 4000, 6000]
    assert hosts[6000] == "eval2"
    assert "step_6000/checkpoint.pt: already staged" in sweep.stdout
    nothing_new = fab_eval(inventory_path, "run-eval", "--all-new", *QUICK)
    assert "nothing to evaluate: every complete checkpoint has a result" in nothing_new.stdout
    check_compare_plots_and_list(inventory_path, runs=3)

    # A run with other completion lengths is not comparable: a group of its own, named.
    other = fab_eval(inventory_path, "run-eval", "--step", "2000", "--host", "eval", *SHORTER)
    assert other.returncode == 0, other.stderr
    assert "will not be comparable with the 3 pulled run(s)" in " ".join(other.stdout.split())
    grouped = fab_eval(inventory_path, "compare")
    assert grouped.returncode == 0, grouped.stderr
    assert "differ in max new tokens; compare them with --group 2" in grouped.stdout
    mixed = fab_eval(inventory_path, "compare", "--allow-mixed")
    assert mixed.returncode == 0 and "≠ max new tokens" in mixed.stdout


def stage_only_on_eval2(inventory_path: Path, step: int) -> None:
    """The step's checkpoint staged on eval2, and not on eval."""
    inventory = load(inventory_path)
    eval_host = Host(inventory, "eval")
    staging = EvalLayout(inventory.eval_hosts["eval"]).staging
    eval_host.run(f"rm -rf {shlex.quote(staging)}/step_{step}")
    eval_host.close()
    staged = fab_eval(inventory_path, "stage-checkpoint", "--step", str(step), "--to", "eval2")
    assert staged.returncode == 0, staged.stderr


def dflash_ops(*args: str) -> subprocess.CompletedProcess:
    """The click CLI, run as a user runs it."""
    return subprocess.run([str(FAB.parent / "dflash-ops"), *args], capture_output=True, text=True)


def check_compare_plots_and_list(inventory_path: Path, runs: int) -> None:
    """`fab compare --plots`, `dflash-ops results compare --plots` and `results list` on the
    pulled runs: the table and its plots, and every run listed as succeeded."""
    compared = fab_eval(inventory_path, "compare", "--plots")
    assert compared.returncode == 0, compared.stderr
    assert "tau_vs_step.png" in compared.stdout
    results = load(inventory_path).local.results
    cli_plots = results / "cli-plots"
    cli = dflash_ops("results", "compare", "--results", str(results), "--plots", str(cli_plots))
    assert cli.returncode == 0, cli.stderr
    assert "best tree" in cli.stdout and (cli_plots / "tau_vs_step.png").exists()
    listing = dflash_ops("results", "list", "--results", str(results))
    assert listing.stdout.count("succeeded") == runs
    plots = results / "plots"
    assert (plots / "tau_vs_step.png").stat().st_size > 1000
    assert (plots / "acceptance_per_position.png").stat().st_size > 1000


def test_ctrl_c_detaches_and_the_run_goes_on(inventory_path):
    running = start_fab(inventory_path, "run-eval", "--step", "2000", "--host", "eval", *QUICK)
    run = wait_for_run(inventory_path, launcher=running)
    with paused(inventory_path, run):  # Ctrl-C lands while the run certainly runs
        running.send_signal(signal.SIGINT)
        stdout, _ = running.communicate(timeout=60)
    assert running.returncode == 130
    assert f"detached: run {run.run_id} goes on on eval" in " ".join(stdout.split())
    assert f"fab eval-logs --id {run.run_id} --follow" in stdout.replace("\n", "")
    assert wait_for_run(inventory_path, state="succeeded").run_id == run.run_id


def test_ctrl_c_while_the_launch_confirms_still_detaches(inventory_path, monkeypatch):
    from dflash_ops.evaluation.jobs import Detached
    from dflash_ops.evaluation.request import EvalRequest
    from dflash_ops.evaluation.run import run_eval
    from dflash_ops.ui.eval_view import LiveView

    confirm = jobs._wait_started

    def interrupted_once_started(host, entry, run_id, timeout=20):
        confirm(host, entry, run_id, timeout)
        raise KeyboardInterrupt  # as if Ctrl-C landed just as the start was confirmed

    monkeypatch.setattr(jobs, "_wait_started", interrupted_once_started)
    request = EvalRequest(step=2000, host="eval", harness_args=QUICK)
    with pytest.raises(Detached) as detached:
        run_eval(load(inventory_path), request, LiveView())
    assert wait_for_run(inventory_path, state="succeeded").run_id == detached.value.run_id


def test_memory_warning_and_missing_target(e2e_lab, monkeypatch):
    from dflash_ops.evaluation import run as evaluation

    inventory = load(e2e_lab.inventory_path)
    host, entry = Host(inventory, "eval"), inventory.eval_hosts["eval"]
    said: list[str] = []
    try:
        evaluation.warn_if_short_of_memory(host, entry, said.append)
        assert said == []  # a tiny target fits
        monkeypatch.setattr(evaluation, "MEMORY_PER_WEIGHT_BYTE", 1e9)
        evaluation.warn_if_short_of_memory(host, entry, said.append)
        assert "of memory available; the target at" in said[0] and "OOM" in said[0]
        missing = entry.model_copy(update={"target_model": entry.target_model + "-gone"})
        with pytest.raises(evaluation.HostError, match=r"target model .*-gone not found"):
            evaluation.warn_if_short_of_memory(host, missing, said.append)
    finally:
        host.close()


def test_unprovisioned_host_gets_a_clear_hint(make_lab, fab):
    built = make_lab()
    result = fab(built.inventory_path, "run-eval", "--step", "2000")
    assert result.returncode == 1
    assert "eval: the eval venv at" in result.stderr
    assert "is not ready (no venv yet); run `fab setup-eval-host --host eval`" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture
def sglang_stand_in(e2e_lab, tmp_path):
    """The SGLang stand-in (tests/sglang_stand_in.py) inside eval's network namespace,
    serving the target's greedy continuations on that namespace's loopback. Yields the
    process, its URL and its request log."""
    target = load(e2e_lab.inventory_path).eval_hosts["eval"].target_model
    log = tmp_path / "requests.jsonl"
    with started_in(e2e_lab, "eval", target, log) as (server, url):
        yield server, url, log


def test_run_eval_with_sglang_completions(inventory_path, sglang_stand_in, tmp_path):
    server, url, log = sglang_stand_in
    # Credentials in the URL (the stand-in ignores them) must reach no recorded file: a
    # password, a token in the path (a proxy's prefix) and one in the query string.
    secret_url = url.replace("http://", "http://dflash:s3cret-pw@") + "/s3cret-path/?k=s3cret-q"
    runs = Path(EvalLayout(load(inventory_path).eval_hosts["eval"]).runs)
    document = yaml.safe_load(inventory_path.read_text())
    document["hosts"]["eval"]["sglang_url"] = secret_url
    with_sglang = tmp_path / "inventory.yaml"
    with_sglang.write_text(yaml.safe_dump(document, sort_keys=False))
    step = ["--step", "6000", "--host", "eval"]
    served = fab_eval(with_sglang, "run-eval", *step, *QUICK)  # sglang_url: SGLang by default
    assert served.returncode == 0, served.stdout + served.stderr
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    assert [request["path"] for request in requests] == ["/s3cret-path/generate?k=s3cret-q"] * 2
    # The reference runs one block past --max-new-tokens (the live loop's last round).
    asked = {request["sampling_params"]["max_new_tokens"] for request in requests}
    assert asked == {24 + BLOCK_SIZE}
    [run_file] = pulled(inventory_path)
    results = json.loads((run_file.parent / "results.json").read_text())
    redacted = f"{url}/***"  # scheme, host and port only
    assert results["completions"] == {
        "source": "sglang",
        "sglang_url": redacted,
        "extra_tokens": BLOCK_SIZE,
        "sglang_model": load(inventory_path).eval_hosts["eval"].target_model,  # asked first
        "sglang_version": "0.0.0-stand-in",
    }
    for pulled_file in run_file.parent.iterdir():
        assert "s3cret" not in pulled_file.read_text(errors="replace"), pulled_file.name
    assert "s3cret" not in served.stdout + served.stderr
    assert list(runs.glob(".sglang-url-*")) == []  # the run is over: its secret file too
    # The stand-in serves the target's own greedy continuations: same metrics as local.
    local = fab_eval(with_sglang, "run-eval", *step, "--completions", "local", *QUICK)
    assert local.returncode == 0, local.stdout + local.stderr
    [local_file] = [path for path in pulled(inventory_path) if path != run_file]
    local_results = json.loads((local_file.parent / "results.json").read_text())
    assert local_results["completions"]["source"] == "local-greedy"
    assert len(log.read_text().splitlines()) == len(requests)  # the server was not asked
    assert local_results["metrics"] == results["metrics"]
    assert results["metrics"]["tau_macro"] > 1  # the trained step-6000 drafter
    # The server gone (other lengths, so no cached completion hides it): a clear failure.
    server.terminate()
    server.wait(timeout=30)
    down = fab_eval(
        with_sglang,
        "run-eval",
        *step,
        "--num-prompts",
        "2",
        "--max-new-tokens",
        "20",
        "--ddtree",
        "4",
    )
    assert down.returncode == 1
    output = " ".join((down.stdout + down.stderr).split())
    assert f"Cannot reach the SGLang server at {redacted}" in output
    assert "Start it on the eval host" in output and "s3cret" not in output
    assert list(runs.glob(".sglang-url-*")) == []  # a failed run's too


def test_strip_optimizer_evaluates_the_extracted_copy(inventory_path):
    result = fab_eval(
        inventory_path, "run-eval", "--step", "4000", "--host", "eval", "--strip-optimizer", *QUICK
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "optimizer state stripped" in result.stdout
    [run_file] = pulled(inventory_path)
    checkpoint = json.loads((run_file.parent / "results.json").read_text())["checkpoint"]
    assert checkpoint["path"].endswith("/step_4000/extracted")
    assert checkpoint["step"] == 4000
    again = fab_eval(
        inventory_path, "run-eval", "--step", "4000", "--host", "eval", "--strip-optimizer", *QUICK
    )
    assert again.returncode == 0 and "optimizer state stripped" not in again.stdout  # reused
