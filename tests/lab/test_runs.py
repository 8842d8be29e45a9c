"""Several training runs on one trainer (`hosts.trainer.runs`, `--run NAME`): the inventory's
runs model, staging side by side under `{staging}/RUN/step_N`, results that carry the run and
a comparison that keeps runs apart, and prune's per-run policy; on real lab hosts where hosts
are involved. The trainer's own checkpoints (no `--run`) keep today's paths."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from dflash_lab import lab as labs
from dflash_ops.core import inventory as inventories
from dflash_ops.core.errors import InventoryError
from dflash_ops.evaluation import compare_rows, figures, results
from dflash_ops.evaluation.watch import WatchState
from dflash_ops.staging.destination import staged_path
from tests.inventory_documents import minimal_document
from tests.schema_samples import results_dict

V5_DIR = "/workspace/checkpoints-v5"  # the second run's checkpoints, in the trainer's container
QUICK = ["--num-prompts", "2", "--max-new-tokens", "24", "--ddtree", "4,8"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the inventory's runs model ------------------------------------------------------------


def document(**trainer) -> dict:
    return {**minimal_document(**trainer), "local": {"staging": "/local"}}


def without_own_checkpoints(**trainer) -> dict:
    found = document(**trainer)
    del found["hosts"]["trainer"]["checkpoints"]
    return found


def load(tmp_path: Path, content: dict) -> inventories.Inventory:
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(content))
    return inventories.load(path)


def error_for(tmp_path: Path, content: dict) -> str:
    with pytest.raises(InventoryError) as raised:
        load(tmp_path, content)
    return str(raised.value)


def test_a_run_inherits_what_it_leaves_out_from_the_trainer(tmp_path):
    inventory = load(
        tmp_path,
        document(
            layout="ckpt-{step}.pt",
            complete_marker="ckpt-{step}.done",
            drafter={"block_size": 8},
            runs={"v4": {}, "v5": {"checkpoints": "/v5", "drafter": {"block_size": 16}}},
        ),
    )
    v4, v5 = inventory.for_run("v4"), inventory.for_run("v5")
    assert (v4.trainer.checkpoints, v4.trainer.layout) == ("/ckpt", "ckpt-{step}.pt")
    assert v4.trainer.complete_marker == "ckpt-{step}.done"
    assert v4.trainer.drafter.block_size == 8
    assert (v5.trainer.checkpoints, v5.trainer.layout) == ("/v5", "ckpt-{step}.pt")
    assert v5.trainer.drafter.block_size == 16  # the run's profile replaces the trainer's
    assert (v4.training_run, v5.training_run) == ("v4", "v5")
    assert v5.for_run("v5") == v5  # choosing again (as staging does) changes nothing
    # check-hosts looks at each directory once: v4's is the trainer's own.
    assert inventory.trainer.checkpoint_dirs() == {None: "/ckpt", "v5": "/v5"}


def test_without_run_the_trainer_s_own_checkpoints_keep_today_s_paths(tmp_path):
    inventory = load(tmp_path, document(runs={"v5": {"checkpoints": "/v5"}}))
    default = inventory.for_run(None)
    assert default is inventory and default.training_run is None
    assert default.trainer.checkpoints == "/ckpt"
    assert staged_path(default, "eval", 4000) == "/w/checkpoints/step_4000/checkpoint.pt"
    assert staged_path(default, "workstation", 4000) == "/local/step_4000/checkpoint.pt"
    v5 = inventory.for_run("v5")
    assert staged_path(v5, "eval", 4000) == "/w/checkpoints/v5/step_4000/checkpoint.pt"
    assert staged_path(v5, "eval", 4000, "extracted") == "/w/checkpoints/v5/step_4000/extracted"
    assert staged_path(v5, "workstation", 4000) == "/local/v5/step_4000/checkpoint.pt"


@pytest.mark.parametrize(
    "name", ["bad name", "../up", ".hidden", "a/b", "-dash", "step_4000", "x" * 65, "v5;rm"]
)
def test_a_run_name_must_be_one_safe_path_component(tmp_path, name):
    message = error_for(tmp_path, document(runs={name: {"checkpoints": "/x"}}))
    assert f"hosts.trainer.runs.{name}: expected a training run name" in message
    assert len(message.splitlines()) == 1


def test_a_run_s_keys_are_checked_like_the_trainer_s(tmp_path):
    message = error_for(tmp_path, document(runs={"v5": {"layuot": "x"}}))
    assert "hosts.trainer.runs.v5.layuot: unknown key (did you mean 'layout'?)" in message
    message = error_for(tmp_path, document(runs={"v5": {"layout": "no-step.pt"}}))
    assert "hosts.trainer.runs.v5.layout: expected a path with {step} exactly once" in message


def test_checkpoints_are_needed_of_the_trainer_or_of_every_run(tmp_path):
    message = error_for(tmp_path, without_own_checkpoints())
    assert "hosts.trainer.checkpoints: required key is missing" in message
    message = error_for(
        tmp_path, without_own_checkpoints(runs={"v4": {}, "v5": {"checkpoints": "/5"}})
    )
    assert "hosts.trainer.runs.v4.checkpoints: required key is missing" in message


def test_several_runs_and_no_own_checkpoints_need_run(tmp_path):
    runs = {"v4": {"checkpoints": "/4"}, "v5": {"checkpoints": "/5"}}
    inventory = load(tmp_path, without_own_checkpoints(runs=runs))
    with pytest.raises(InventoryError, match=r"several training runs \(v4, v5\).*--run NAME"):
        inventory.for_run(None)
    assert inventory.for_run("v5").trainer.checkpoints == "/5"
    only = load(tmp_path, without_own_checkpoints(runs={"v5": {"checkpoints": "/5"}}))
    chosen = only.for_run(None)
    assert (chosen.training_run, chosen.trainer.checkpoints) == ("v5", "/5")


def test_an_unknown_run_is_refused_with_the_runs_listed(tmp_path):
    inventory = load(tmp_path, document(runs={"v4": {}, "v5": {}}))
    with pytest.raises(
        InventoryError, match=r"no training run named 'v6' on trainer; its runs: v4, v5"
    ):
        inventory.for_run("v6")
    with pytest.raises(InventoryError, match=r"it lists none \(hosts.trainer.runs\)"):
        load(tmp_path, document()).for_run("v4")


def test_the_chosen_run_is_not_a_key_of_the_file(tmp_path):
    content = {**document(), "training_run": "v4"}
    assert "training_run: unknown key at the top level" in error_for(tmp_path, content)


def test_each_run_s_watch_has_its_own_state_file(tmp_path):
    names = {
        WatchState.file_for(tmp_path, tag, run).name
        for tag in (None, "a", "a-b")
        for run in (None, "b", "b-c")
    }
    assert len(names) == 9
    assert WatchState.file_for(tmp_path, None).name == "watch-state.json"
    assert WatchState.file_for(tmp_path, "a", "b-c").name == "watch-state-a@b-c.json"


# --- results of two runs ------------------------------------------------------------------


def pull(root: Path, run_id: str, step: int, training_run: str | None, tau: float) -> None:
    """A pulled run directory, as `fab fetch-results` leaves it."""
    outcome = results_dict()
    outcome["checkpoint"]["step"] = step
    if training_run:
        outcome["checkpoint"]["training_run"] = training_run
    outcome["metrics"]["tau_macro"] = tau
    directory = root / run_id
    directory.mkdir(parents=True)
    run = {"run_id": run_id, "host": "eval", "state": "succeeded", "step": step, "started": 1}
    (directory / "run.json").write_text(json.dumps(run))
    (directory / "results.json").write_text(json.dumps(outcome))


def test_compare_keeps_two_runs_of_one_step_apart_and_labelled(tmp_path):
    pull(tmp_path, "a", 4000, "v5", 1.9)
    pull(tmp_path, "b", 4000, "v4", 1.6)
    pull(tmp_path, "c", 2000, "v4", 1.2)
    comparison = results.compare(results.load_runs(tmp_path))
    header, cells = compare_rows.table_rows(comparison)
    assert header[:4] == ["run", "training run", "step", "host"]
    assert [[*row[:3], row[4]] for row in cells] == [
        ["c", "v4", "2000", "1.200"],
        ["b", "v4", "4000", "1.600"],
        ["a", "v5", "4000", "1.900"],
    ]
    only = results.compare(results.load_runs(tmp_path), training_run="v5")
    assert [row.run_id for row in only.rows] == ["a"]
    legend = figures.build(comparison)["tau_vs_step"].axes[0].get_legend_handles_labels()[1]
    assert "v4: τ vanilla (macro)" in legend and "v5: τ vanilla (macro)" in legend


def test_the_default_run_s_table_is_unchanged(tmp_path):
    pull(tmp_path, "a", 2000, None, 1.2)
    header, cells = compare_rows.table_rows(results.compare(results.load_runs(tmp_path)))
    assert header[:3] == ["run", "step", "host"] and cells[0][:2] == ["a", "2000"]


# --- on the lab ------------------------------------------------------------------------------


def add_v5_checkpoints(lab: labs.Lab, steps: dict[int, Path | None]) -> dict[int, Path]:
    """The second run's checkpoints in the trainer's container: a copy of `steps[step]`, or
    random bytes of the lab's checkpoint size where None."""
    written = {}
    for step, source in steps.items():
        path = lab.container_path(f"{V5_DIR}/step_{step}/checkpoint.pt")
        path.parent.mkdir(parents=True)
        if source is None:
            path.write_bytes(os.urandom(lab.checkpoint_path(2000).stat().st_size))
        else:
            shutil.copyfile(source, path)
        written[step] = path
    return written


def runs_inventory(lab: labs.Lab, name: str, own: bool = True, runs: tuple = ("v4", "v5")) -> Path:
    """The lab's inventory with training runs: v4 reads the lab's checkpoints, v5 V5_DIR;
    `own`: the trainer keeps its own checkpoints (the default run) too."""
    content = yaml.safe_load(lab.inventory_path.read_text())
    trainer = content["hosts"][labs.TRAINER]
    directories = {"v4": trainer["checkpoints"], "v5": V5_DIR}
    trainer["runs"] = {run: {"checkpoints": directories[run]} for run in runs}
    if not own:
        del trainer["checkpoints"]
    path = lab.root / name
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path


def staging_dir(lab: labs.Lab, host: str = "eval") -> Path:
    return lab.data_dir(host) / "eval" / "checkpoints"


def test_two_runs_with_the_same_step_are_staged_side_by_side(make_lab, fab):
    lab = make_lab(steps=(2000, 4000), checkpoint_size="1m")
    v5 = add_v5_checkpoints(lab, {2000: None, 4000: None})
    inventory = runs_inventory(lab, "runs.yaml")
    for run in ("v4", "v5"):
        staged = fab(inventory, "stage-checkpoint", "--run", run, "--step", "4000")
        assert staged.returncode == 0, staged.stdout + staged.stderr
        assert f"checkpoints/{run}/step_4000/checkpoint.pt: staged and verified" in staged.stdout
    staging = staging_dir(lab)
    v4_copy = staging / "v4" / "step_4000" / "checkpoint.pt"
    v5_copy = staging / "v5" / "step_4000" / "checkpoint.pt"
    assert sha256(v4_copy) == sha256(lab.checkpoint_path(4000))
    assert sha256(v5_copy) == sha256(v5[4000]) != sha256(v4_copy)
    manifest = json.loads(v5_copy.with_name("checkpoint.pt.manifest.json").read_text())
    assert manifest["source_path"] == f"{V5_DIR}/step_4000/checkpoint.pt"

    # The trainer's own checkpoints (no --run) go where they always went.
    default = fab(inventory, "stage-checkpoint", "--step", "2000")
    assert default.returncode == 0, default.stderr
    assert sha256(staging / "step_2000" / "checkpoint.pt") == sha256(lab.checkpoint_path(2000))
    assert sorted(p.name for p in staging.iterdir()) == ["step_2000", "v4", "v5"]

    # Two-hop: the workstation's copy carries the run as well.
    two_hop = fab(inventory, "stage-checkpoint", "--run", "v5", "--step", "2000", "--two-hop")
    assert two_hop.returncode == 0, two_hop.stderr
    local = load_local_staging(inventory) / "v5" / "step_2000" / "checkpoint.pt"
    assert sha256(local) == sha256(v5[2000]) == sha256(staging / "v5/step_2000/checkpoint.pt")

    listed = fab(inventory, "list-checkpoints", "--run", "v5")
    assert listed.returncode == 0, listed.stderr
    assert f"trainer:{V5_DIR} (training run v5)" in " ".join(listed.stdout.split())
    as_json = fab(inventory, "list-checkpoints", "--run", "v5", "--format", "json")
    rows = {row["step"]: row for row in json.loads(as_json.stdout)}
    assert rows[4000]["on_eval"] == rows[2000]["on_eval"] == "staged"

    unknown = fab(inventory, "stage-checkpoint", "--run", "v6", "--step", "4000")
    assert unknown.returncode == 1
    assert "no training run named 'v6' on trainer; its runs: v4, v5" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def load_local_staging(inventory: Path) -> Path:
    return inventories.load(inventory).local.staging


def test_without_own_checkpoints_the_run_is_asked_for_unless_there_is_one(make_lab, fab):
    lab = make_lab(steps=(2000,), checkpoint_size="1m")
    add_v5_checkpoints(lab, {6000: None})
    several = runs_inventory(lab, "runs-only.yaml", own=False)
    refused = fab(several, "list-checkpoints")
    assert refused.returncode == 1
    assert "several training runs (v4, v5)" in refused.stderr and "--run NAME" in refused.stderr
    one = runs_inventory(lab, "one-run.yaml", own=False, runs=("v5",))
    listed = fab(one, "list-checkpoints")
    assert listed.returncode == 0, listed.stderr
    assert "(training run v5)" in " ".join(listed.stdout.split()) and "6000" in listed.stdout
    checked = fab(several, "check-hosts", "-v")
    assert "checkpoints dir (v4)" in checked.stdout and "checkpoints dir (v5)" in checked.stdout


def test_prune_keeps_the_newest_steps_of_each_run(make_lab, fab):
    lab = make_lab(steps=(2000, 4000), checkpoint_size="1m")
    add_v5_checkpoints(lab, {2000: None, 4000: None})
    inventory = runs_inventory(lab, "runs.yaml")
    for args in (["--run", "v5", "--step", "2000"], ["--run", "v5", "--step", "4000"]):
        assert fab(inventory, "stage-checkpoint", *args).returncode == 0
    assert fab(inventory, "stage-checkpoint", "--run", "v4", "--step", "2000").returncode == 0
    assert fab(inventory, "stage-checkpoint", "--step", "4000").returncode == 0
    only_v4 = fab(inventory, "prune", "--keep-last", "1", "--run", "v4")
    assert only_v4.returncode == 0, only_v4.stderr
    assert "nothing to remove" in only_v4.stdout and "v5" not in only_v4.stdout
    done = fab(inventory, "prune", "--keep-last", "1", "--yes")
    assert done.returncode == 0, done.stderr
    assert "removed 1 step(s)" in done.stdout
    staging = staging_dir(lab)
    kept = sorted(str(p.relative_to(staging)) for p in staging.glob("**/step_*"))
    assert kept == ["step_4000", "v4/step_2000", "v5/step_4000"]
    unknown = fab(inventory, "prune", "--run", "v6")
    assert unknown.returncode == 1 and "its runs: v4, v5" in unknown.stderr
