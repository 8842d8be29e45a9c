"""`fab prune` on the lab: the policy keeps the newest steps, named steps and anything a
running eval reads; a dry run removes nothing; --yes frees what it said. The same for feature
sets (`--features`) on the features and eval hosts."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

from dflash_ops.core.inventory import load
from dflash_ops.evaluation import jobs
from dflash_ops.features import prune as features_prune
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from dflash_ops.staging import prune
from dflash_ops.staging.delivery import StageOptions
from dflash_ops.staging.stage import stage


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
    # A step directory the user copied in by hand (no manifest): never the tool's to remove.
    users = f"{layout.staging}/step_1000"
    host.run(f"mkdir {shlex.quote(users)} && echo mine > {shlex.quote(users)}/checkpoint.pt")
    try:
        dry = fab(lab.inventory_path, "prune", "--keep-last", "1")
        assert dry.returncode == 0, dry.stderr
        assert "dry run: would free 2.0 MiB (1 step(s))" in dry.stdout
        assert "a running eval uses it" in dry.stdout
        listing = host.run(f"ls {shlex.quote(layout.staging)}").stdout.split()
        assert listing == ["step_1000", "step_2000", "step_4000", "step_6000"]
        assert "step_1000" not in dry.stdout
        done = fab(lab.inventory_path, "prune", "--keep-last", "1", "--yes")
        assert done.returncode == 0, done.stderr
        assert "removed 1 step(s), freed 2.0 MiB" in done.stdout
        remaining = host.run(f"ls {shlex.quote(layout.staging)}").stdout.split()
        assert remaining == ["step_1000", "step_2000", "step_6000"]
        assert host.run(f"cat {shlex.quote(users)}/checkpoint.pt").stdout == "mine\n"
        assert host.run(f"test -d {shlex.quote(step_dir[2000])}", check=False).ok
    finally:
        run = next(r for r in jobs.list_runs(host, entry) if r.run_id == run_id)
        jobs.cancel(host, entry, run)
        jobs.wait_finished(host, entry, run_id)
        host.close()


# --- feature sets (fab prune --features) ------------------------------------------------------

TARGET_SETS = [f"tiny-target-{letter * 12}" for letter in "abc"]  # oldest first
OTHER_SET = "other-target-dddddddddddd"


def test_set_policy_keeps_newest_of_each_target_named_and_in_use():
    held = [
        features_prune.HeldSet("eval", f"/f/{name}", name, when, 10)
        for when, name in enumerate([*TARGET_SETS, OTHER_SET])
    ]
    policy = features_prune.SetPolicy(keep_last=1, keep_sets=frozenset({TARGET_SETS[1]}))
    judged = policy.verdicts(held, {f"/f/{TARGET_SETS[0]}": "run-1"})
    assert [item.keep for item in judged] == [
        "run run-1 uses it", "--keep-sets", "among the newest 1", "among the newest 1",
    ]  # fmt: skip
    everything = features_prune.SetPolicy(keep_last=5).verdicts(held, {})
    assert all(item.keep for item in everything)


def test_sets_in_use_are_those_unfinished_runs_name():
    def run(state: str, **params) -> jobs.Run:
        return jobs.Run(f"r-{state}-{len(params)}", "h", state, None, params, None)

    runs = [
        run("running", command="python -m dflash_eval eval --features /w/features/s1 --out /x"),
        run("running", kind="features", out="/w/features/s2"),
        run("succeeded", command="python -m dflash_eval eval --features /w/features/s3"),
    ]
    used = features_prune.sets_in_use(runs)
    assert {"/w/features/s1", "/w/features/s2"} <= set(used)
    assert "/w/features/s3" not in used


def _make_set(entry, set_id: str, size: int, when: float, relayed: bool) -> Path:
    """A set as the host holds it (contents do not matter to prune, its layout does)."""
    path = Path(EvalLayout(entry).feature_set(set_id))
    (path / "hidden").mkdir(parents=True)
    (path / "hidden" / "states.safetensors").write_bytes(b"\0" * size)
    record = path.with_name(f"{set_id}.manifest.json") if relayed else path / "feature-set.json"
    record.write_text("{}\n")
    os.utime(record, (when, when))
    return path


def _launch_sleeper(host: Host, entry, params: dict) -> str:
    run_id = jobs.new_run_id(0, host.name, "prune-test")
    jobs.launch(host, entry, run_id, "exec sleep 600", params)
    return run_id


def _stop(host: Host, entry, run_id: str) -> None:
    run = next(r for r in jobs.list_runs(host, entry) if r.run_id == run_id)
    jobs.cancel(host, entry, run)
    jobs.wait_finished(host, entry, run_id)


def test_prune_features_on_the_lab(make_lab, fab):
    lab = make_lab(features_host=True)
    inventory = load(lab.inventory_path)
    now = time.time()
    sets: dict[str, dict[str, Path]] = {}
    for name, relayed in (("features", False), ("eval", True)):
        entry = inventory.hosts[name]
        sets[name] = {
            set_id: _make_set(entry, set_id, 1 << 20, now - 3600 * (3 - age), relayed)
            for age, set_id in enumerate(TARGET_SETS)
        }
        sets[name][OTHER_SET] = _make_set(entry, OTHER_SET, 4096, now - 7200, relayed)
    features_dir = Path(EvalLayout(inventory.hosts["eval"]).features)
    (features_dir / f"{TARGET_SETS[0]}.partial").mkdir()  # an interrupted relay: left alone
    oldest = {name: str(found[TARGET_SETS[0]]) for name, found in sets.items()}
    hosts = {name: Host(inventory, name) for name in ("features", "eval")}
    entries = {name: inventory.hosts[name] for name in hosts}
    runs = {
        "features": _launch_sleeper(
            hosts["features"], entries["features"], {"kind": "features", "out": oldest["features"]}
        ),
        "eval": _launch_sleeper(
            hosts["eval"],
            entries["eval"],
            {"step": 0, "command": f"python -m dflash_eval eval --features {oldest['eval']}"},
        ),
    }
    directories = {name: Path(EvalLayout(entry).features) for name, entry in entries.items()}

    def listings() -> dict[str, list[str]]:
        return {name: sorted(p.name for p in d.iterdir()) for name, d in directories.items()}

    try:
        before = listings()
        dry = fab(lab.inventory_path, "prune", "--features", "--keep-last", "1")
        assert dry.returncode == 0, dry.stderr
        output = " ".join(dry.stdout.split())
        assert "dry run: would free 2.0 MiB (2 set(s))" in output, dry.stdout
        for run_id in runs.values():
            assert f"run {run_id} uses it" in output, dry.stdout
        assert listings() == before  # a dry run removes nothing

        done = fab(lab.inventory_path, "prune", "--features", "--keep-last", "1", "--yes")
        assert done.returncode == 0, done.stderr
        assert "removed 2 set(s), freed 2.0 MiB" in " ".join(done.stdout.split()), done.stdout
        for name, found in sets.items():
            kept = sorted(set_id for set_id, path in found.items() if path.is_dir())
            assert kept == sorted([TARGET_SETS[0], TARGET_SETS[2], OTHER_SET]), name
        assert not (features_dir / f"{TARGET_SETS[1]}.manifest.json").exists()
        assert (features_dir / f"{TARGET_SETS[2]}.manifest.json").is_file()
        assert (features_dir / f"{TARGET_SETS[0]}.partial").is_dir()

        again = fab(lab.inventory_path, "prune", "--features", "--keep-last", "1", "--yes")
        assert "nothing to remove" in again.stdout, again.stdout
        mixed = fab(lab.inventory_path, "prune", "--features", "--keep-steps", "2000")
        assert mixed.returncode == 1 and "--keep-sets" in mixed.stderr, mixed.stderr
    finally:
        for name, run_id in runs.items():
            _stop(hosts[name], entries[name], run_id)
            hosts[name].close()
