"""The e2e tier: tests that run the real harness on provisioned eval hosts.

One lab (tiny target, trained drafter checkpoints at STEPS, two provisioned eval hosts) is
built once per pytest run and shared by the modules here that take `e2e_lab`, or a view of
it (`one_eval_host`, `hidden_steps`); after every test it is put back as built: no run left
going, runs and pulled results removed, staged copies and the eval hosts' caches as built,
the trainer's checkpoints as built. `trainer` hides its checkpoints and makes them appear
while a watch runs. A lab with a features host (`features_lab`, and the set `extracted` on
it) is built once per run too, for the two modules that use it (sent to one worker:
`SAME_WORKER` in tests/conftest.py). Modules whose lab differs in kind otherwise (a sudo
login, a venv the test breaks) build their own.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from dflash_lab import lab as labs
from dflash_ops.core.inventory import load
from dflash_ops.evaluation import jobs
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from tests.conftest import provisioned_models_lab, run_fab
from tests.e2e.features_helpers import extract

STEPS = (2000, 4000, 6000)


@pytest.fixture(scope="session")
def shared_lab(tmp_path_factory) -> Iterator[labs.Lab]:
    yield from provisioned_models_lab(tmp_path_factory, eval_hosts=2, eval_disk="3g", steps=STEPS)


def staged_entries(inventory_path: Path) -> dict[str, list[str]]:
    """What each eval host's staging directory holds (names, sorted)."""
    inventory = load(inventory_path)
    found = {}
    for name, entry in inventory.eval_hosts.items():
        host = Host(inventory, name)
        try:
            staging = shlex.quote(EvalLayout(entry).staging)
            found[name] = host.run(f"ls -A {staging} 2>/dev/null || true").stdout.split()
        finally:
            host.close()
    return found


@pytest.fixture(scope="session")
def as_built(shared_lab, tmp_path_factory) -> dict:
    """The shared lab's staging listing, and a copy of each trainer checkpoint (mtime too)."""
    pristine = tmp_path_factory.mktemp("pristine-checkpoints")
    for step in STEPS:
        shutil.copy2(shared_lab.checkpoint_path(step), pristine / str(step))
    return {"staged": staged_entries(shared_lab.inventory_path), "checkpoints": pristine}


@pytest.fixture
def e2e_lab(shared_lab, as_built) -> Iterator[labs.Lab]:
    """The shared lab for one test, put back as built (and checked) afterwards."""
    yield shared_lab
    inventory = load(shared_lab.inventory_path)
    staged_now = staged_entries(shared_lab.inventory_path)
    for name, entry in inventory.eval_hosts.items():
        host = Host(inventory, name)
        for run in jobs.list_runs(host, entry):  # nothing may stay running into the next test
            if not run.done:
                jobs.cancel(host, entry, run)
                jobs.wait_finished(host, entry, run.run_id)
        layout = EvalLayout(entry)
        host.run(f"rm -rf {shlex.quote(jobs.runs_dir(entry))} {shlex.quote(layout.cache)}")
        for added in set(staged_now[name]) - set(as_built["staged"][name]):
            host.run(f"rm -rf -- {shlex.quote(f'{layout.staging}/{added}')}")
        host.close()
    local = inventory.local
    subprocess.run(["rm", "-rf", str(local.results)], check=True)
    if local.staging is not None:
        for path in Path(local.staging).iterdir():
            subprocess.run(["rm", "-rf", "--", str(path)], check=True)
    _restore_checkpoints(shared_lab, as_built["checkpoints"])
    assert staged_entries(shared_lab.inventory_path) == as_built["staged"]


def _restore_checkpoints(lab: labs.Lab, pristine: Path) -> None:
    """The trainer's checkpoints as built: STEPS' files with their bytes and mtime, no other
    step directory."""
    directory = lab.checkpoint_path(STEPS[0]).parent.parent
    for path in directory.iterdir():
        if path.name not in {lab.checkpoint_path(step).parent.name for step in STEPS}:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for step in STEPS:
        target, kept = lab.checkpoint_path(step), pristine / str(step)
        if not target.is_file() or target.stat().st_mtime_ns != kept.stat().st_mtime_ns:
            target.parent.mkdir(exist_ok=True)
            shutil.copy2(kept, target)


class InventoryView(labs.Lab):
    """A lab seen through another inventory file (a subset of its hosts)."""

    def __init__(self, lab: labs.Lab, inventory_path: Path) -> None:
        super().__init__(lab.state)
        self._inventory_path = inventory_path

    @property
    def inventory_path(self) -> Path:
        return self._inventory_path


def one_eval_host(lab: labs.Lab, directory: Path) -> labs.Lab:
    """The lab as a trainer and one eval host: its inventory without eval2."""
    document = yaml.safe_load(lab.inventory_path.read_text())
    hosts = document["hosts"]
    for name in [n for n, host in hosts.items() if host["role"] == "eval" and n != "eval"]:
        del hosts[name]
    path = directory / "one-eval-host.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return InventoryView(lab, path)


def with_sglang_url(lab: labs.Lab, url: str, directory: Path, host: str = "eval") -> Path:
    """The lab's inventory with `url` as `host`'s sglang_url (no other host gets one)."""
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["hosts"][host]["sglang_url"] = url
    path = directory / "inventory.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@contextmanager
def hidden_steps(lab: labs.Lab, *steps: int) -> Iterator[None]:
    """The trainer without these steps' checkpoints while held (renamed out of the layout's
    glob, bytes and mtime kept)."""
    moved = []
    try:
        for step in steps:
            directory = lab.checkpoint_path(step).parent
            hidden = directory.with_name(f".hidden-{directory.name}")
            directory.rename(hidden)
            moved.append((hidden, directory))
        yield
    finally:
        for hidden, directory in moved:
            hidden.rename(directory)


# --- a trainer writing checkpoints while a watch runs (test_watch*.py) ------------------------


class Trainer:
    """Hides the lab's checkpoints and makes them appear (as a trainer writes them: to a
    temporary name, then renamed), or writes a corrupt one."""

    def __init__(self, lab: labs.Lab, held: Path) -> None:
        self.lab, self.held = lab, held
        held.mkdir()
        for step in STEPS:
            shutil.copyfile(lab.checkpoint_path(step), held / str(step))
        self.only()

    def only(self, *steps: int) -> None:
        for step in STEPS:
            if step not in steps:
                shutil.rmtree(self.lab.checkpoint_path(step).parent, ignore_errors=True)
        for step in steps:
            self.appear(step)

    def appear(self, step: int, content: bytes | None = None) -> None:
        path = self.lab.checkpoint_path(step)
        path.parent.mkdir(exist_ok=True)
        temporary = path.with_name(".writing")
        if content is None:
            shutil.copyfile(self.held / str(step), temporary)
        else:
            temporary.write_bytes(content)
        temporary.replace(path)

    def restore(self) -> None:
        shutil.rmtree(self.lab.checkpoint_path(8000).parent, ignore_errors=True)
        self.only(*STEPS)


@pytest.fixture
def trainer(e2e_lab, tmp_path) -> Iterator[Trainer]:
    """The lab with no checkpoint yet; afterwards its checkpoints, runs and results as before."""
    made = Trainer(e2e_lab, tmp_path / "held")
    yield made
    made.restore()
    inventory = load(e2e_lab.inventory_path)
    for name, entry in inventory.eval_hosts.items():
        host = Host(inventory, name)
        for run in jobs.list_runs(host, entry):
            if not run.done:
                jobs.cancel(host, entry, run)
                jobs.wait_finished(host, entry, run.run_id)
        host.run(f"rm -rf {shlex.quote(jobs.runs_dir(entry))}")
        host.close()
    subprocess.run(["rm", "-rf", str(inventory.local.results)], check=True)


def pulled_steps(lab: labs.Lab) -> list[int]:
    results = load(lab.inventory_path).local.results
    return sorted(json.loads(p.read_text())["step"] for p in results.glob("*/run.json"))


def runs_on_hosts(lab: labs.Lab) -> list[jobs.Run]:
    return jobs.all_runs(load(lab.inventory_path))


# --- a lab with a features host (test_extract_features.py, test_run_eval_features.py) ----


@pytest.fixture(scope="session")
def features_lab(tmp_path_factory):
    """A lab with a features host (CPU, its own namespace) beside one eval host, used
    read-mostly: a test that damages a copy of the set leaves it repaired."""
    built = labs.up(
        labs.LabConfig(root=tmp_path_factory.mktemp("lab") / "lab", features_host=True),
        labs.trained_models,
    )
    try:
        yield built
    finally:
        assert not built.down()


@pytest.fixture(scope="session")
def features_provisioned(features_lab):
    """`fab setup-eval-host` over the whole lab: the eval host and the features host."""
    done = run_fab(features_lab.inventory_path, "setup-eval-host", timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="session")
def extracted(features_lab, features_provisioned) -> str:
    """The set computed on the features host and relayed to the eval host; its id."""
    done = extract(features_lab)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.split("fab run-eval --features ")[1].split()[0]
