"""setup-eval-host and deploy-harness against a real lab eval host (sshd in its own network
namespace with a tmpfs disk; no network there, as on an air-gapped eval server).

Installing CPU torch takes tens of seconds, so ONE module lab is provisioned once (with the
real `fab` command) and the other tests change it and check that the next run does the right
thing. After each test the `provisioned` fixture puts the host back as the lab inventory says
and checks that a further run finds nothing to do, so every test starts from the same state,
alone or in any order. Disk-full uses its own tiny lab.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shlex
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from dflash_eval.contract.version import harness_files, harness_hash

from dflash_lab import lab as labs
from dflash_ops.core.inventory import EvalHost, VenvSpec
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.provision.harness import HARNESS_SOURCE, deploy_harness, short_hash
from dflash_ops.provision.packages import TESTED_VERSIONS, Sources, requested, requirements
from dflash_ops.remote.connection import Host
from dflash_ops.remote.layout import EvalLayout
from tests.conftest import run_fab

pytestmark = pytest.mark.long(170)  # seconds in a cold `make test` (5 workers)


# --- without a host ------------------------------------------------------------------------


def test_requirements_pin_versions_and_keep_specifiers():
    spec = VenvSpec(
        path="/v",
        versions={"torch": "2.13.0+cpu", "transformers": ">=5,<6", "numpy": "2.1.0"},
        packages=["numpy", "rich[jupyter]"],
    )
    assert requirements(spec) == [
        "torch==2.13.0+cpu",
        "transformers>=5,<6",
        "safetensors",
        "requests",
        "numpy==2.1.0",
        "rich[jupyter]",
    ]


def test_transformers_defaults_to_the_tested_range():
    assert requirements(VenvSpec(path="/v"))[:2] == [
        "torch",
        f"transformers{TESTED_VERSIONS['transformers']}",
    ]


def test_cpu_torch_never_replaces_pypi():
    """The seed engineer's mistake: --index-url hid PyPI. CPU torch comes from uv's torch
    backend (online) or find-links; indexes are only ever *extra*."""
    spec = VenvSpec(path="/v", torch="cpu")
    online = Sources(extra_index_url=("https://mirror/simple",)).uv_args(spec)
    assert "--index-url" not in online and "--default-index" not in online
    assert online[-2:] == ["--torch-backend", "cpu"]
    offline = Sources(find_links=("/w",), offline=True).uv_args(spec)
    assert offline == ["--find-links", "/w", "--offline"]
    wheelhouse = Sources(find_links=("/h",), no_index=True).uv_args(spec)
    assert wheelhouse == ["--find-links", "/h", "--no-index", "--offline"]


def test_harness_hash_rule(tmp_path):
    """sha256 over sorted relative paths of *.py files: path NUL contents NUL."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.py").write_text("b = 1\n")
    (tmp_path / "sub" / "a.py").write_text("a = 2\n")
    (tmp_path / "notes.txt").write_text("not hashed")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.py").write_text("ignored")
    expected = hashlib.sha256(b"b.py\0b = 1\n\0sub/a.py\0a = 2\n\0").hexdigest()
    assert harness_files(tmp_path) == ["b.py", "sub/a.py"]
    assert harness_hash(tmp_path) == expected
    (tmp_path / "sub" / "a.py").write_text("a = 3\n")
    assert harness_hash(tmp_path) != expected


# --- one provisioned lab for the module --------------------------------------------------


@dataclass
class Provisioned:
    lab: labs.Lab
    inventory_path: Path
    fresh_seconds: float
    fresh_output: str

    @property
    def entry(self) -> EvalHost:
        return load_inventory(self.inventory_path).eval_hosts["eval"]

    def host(self, inventory_path: Path | None = None) -> Host:
        return Host(load_inventory(inventory_path or self.inventory_path), "eval")

    def remote(self, command: str) -> str:
        host = self.host()
        try:
            return host.run(command).stdout
        finally:
            host.close()

    def record(self) -> dict:
        return json.loads(
            self.remote(f"cat {shlex.quote(EvalLayout(self.entry).provision_record)}")
        )

    def variant(self, name: str, **venv_changes) -> Path:
        """A copy of the lab inventory with the eval venv spec changed."""
        document = yaml.safe_load(self.inventory_path.read_text())
        document["hosts"]["eval"]["venv"].update(venv_changes)
        path = self.lab.root / f"inventory-{name}.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path


@pytest.fixture(scope="module")
def provisioned_once(tmp_path_factory) -> Iterator[Provisioned]:
    built = labs.up(
        labs.LabConfig(root=tmp_path_factory.mktemp("provision") / "lab", eval_disk="3g")
    )
    try:
        started = time.monotonic()
        result = run_fab(built.inventory_path, "setup-eval-host", timeout=600)
        seconds = time.monotonic() - started
        assert result.returncode == 0, result.stdout + result.stderr
        print(f"\nfresh setup-eval-host: {seconds:.1f}s")
        yield Provisioned(built, built.inventory_path, seconds, result.stdout)
    finally:
        problems = built.down()
        assert not problems, problems


@pytest.fixture
def provisioned(provisioned_once: Provisioned) -> Iterator[Provisioned]:
    """The module's provisioned lab for one test, restored and verified afterwards: a run of
    setup-eval-host with the lab inventory repairs whatever the test changed, a second one
    must find nothing to do, and `current` must be this repository's harness."""
    yield provisioned_once
    repaired = run_fab(provisioned_once.inventory_path, "setup-eval-host", timeout=600)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    if "eval: nothing to do" not in repaired.stdout:
        check = run_fab(provisioned_once.inventory_path, "setup-eval-host", timeout=300)
        assert "eval: nothing to do" in check.stdout, check.stdout + check.stderr
    harness = EvalLayout(provisioned_once.entry).harness_root
    current = provisioned_once.remote(f"readlink {harness}/current").strip()
    assert current == short_hash(harness_hash())


def test_fresh_host_gets_uv_venv_cpu_torch_and_harness(provisioned):
    out = provisioned.fresh_output
    assert "no venv yet" in out
    assert "uv pushed from the workstation" in out  # no installer or index in the lab
    assert "torch 2.13.0+cpu" in out and "CPU build" in out
    # The remote venv imports torch over SSH and it is the CPU build.
    venv_python = shlex.quote(f"{provisioned.entry.venv.path}/bin/python")
    answer = provisioned.remote(
        f"{venv_python} -c 'import torch, transformers; "
        "print(torch.__version__, torch.version.cuda, (torch.ones(2) * 3).sum().item())'"
    ).split()
    assert answer == ["2.13.0+cpu", "None", "6.0"]
    record = provisioned.record()
    assert record["requested"] == requested(provisioned.entry.venv)
    assert record["uv"]["method"] == "pushed"
    assert record["resolved"]["torch"] == "2.13.0+cpu"
    assert record["sources"]["find_links"] == ["/opt/wheels"]  # from $PIP_FIND_LINKS
    short = re.search(r"harness ([0-9a-f]{16}) uploaded", out).group(1)
    harness = EvalLayout(provisioned.entry).harness_root
    assert provisioned.remote(f"readlink {harness}/current").strip() == short
    # Byte-compiled by the venv's python, its packages too.
    assert "cpython-3" in provisioned.remote(f"ls {harness}/{short}/dflash_eval/__pycache__")
    package = f"{harness}/{short}/dflash_eval/contract"
    assert "cpython-3" in provisioned.remote(f"ls {package}/__pycache__")


def test_rerun_does_nothing(provisioned):
    venv = provisioned.entry.venv.path
    fingerprint = f"stat -c '%i %Y' {venv}/dflash-provision.json {venv}/bin/python"
    before = provisioned.remote(fingerprint)
    result = run_fab(provisioned.inventory_path, "setup-eval-host")  # (how fast: benchmarks)
    assert result.returncode == 0, result.stderr
    assert "eval: nothing to do" in result.stdout
    assert "installing" not in result.stdout and "uploaded" not in result.stdout
    assert provisioned.remote(fingerprint) == before


def test_one_hosts_failure_is_reported_under_its_name_and_the_other_host_finishes(provisioned):
    # A second eval host entry on the same lab host whose venv cannot be made, first in the
    # inventory: set up together with eval (in parallel), it fails alone; eval's own setup
    # still ends and is said (one after the other, eval2's error ended the task first).
    document = yaml.safe_load(provisioned.inventory_path.read_text())
    hosts = document["hosts"]
    twin = copy.deepcopy(hosts["eval"])
    twin["venv"]["path"] = "/proc/dflash-no-venv"
    document["hosts"] = {"trainer": hosts.pop("trainer"), "eval2": twin, **hosts}
    path = provisioned.lab.root / "inventory-twin.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    result = run_fab(path, "setup-eval-host", timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "eval: nothing to do" in result.stdout
    message = result.stderr.strip()
    assert message.startswith("error: eval2") and "\n" not in message, message
    assert "Traceback" not in result.stderr


def test_changed_transformers_version_is_upgraded(provisioned):
    installed = provisioned.record()["resolved"]["transformers"]
    other = "5.17.0" if installed != "5.17.0" else "5.18.0"  # both on this machine's mirrors
    changed = provisioned.variant(
        "transformers", versions={**provisioned.entry.venv.versions, "transformers": other}
    )
    result = run_fab(changed, "setup-eval-host", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "spec changed (versions)" in result.stdout
    assert f"transformers {other}" in result.stdout
    assert "venv created" not in result.stdout  # upgraded in place
    host = provisioned.host(changed)
    try:
        python = shlex.quote(f"{provisioned.entry.venv.path}/bin/python")
        version = host.run(f"{python} -c 'import transformers; print(transformers.__version__)'")
        assert version.stdout.strip() == other
    finally:
        host.close()


def test_deleted_venv_python_is_rebuilt(provisioned):
    venv = provisioned.entry.venv.path
    provisioned.remote(f"rm -f {venv}/bin/python {venv}/bin/python3 {venv}/bin/python3.*")
    started = time.monotonic()
    result = run_fab(provisioned.inventory_path, "setup-eval-host", timeout=300)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert "does not run" in result.stdout and "venv created" in result.stdout
    assert "uv pushed" not in result.stdout  # uv is still there
    print(f"\nrebuild from the uv cache: {seconds:.1f}s")
    answer = provisioned.remote(f"{venv}/bin/python -c 'import torch; print(torch.__version__)'")
    assert answer.strip() == "2.13.0+cpu"


def test_missing_uv_is_installed_and_force_recreates(provisioned):
    uv = f"{EvalLayout(provisioned.entry).uv_dir}/uv"
    venv = provisioned.entry.venv.path
    provisioned.remote(f"rm -f {uv}")
    before = provisioned.remote(f"stat -c %i {venv}/pyvenv.cfg")
    result = run_fab(provisioned.inventory_path, "setup-eval-host", "--force", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--force" in result.stdout and "venv created" in result.stdout
    assert "uv pushed from the workstation" in result.stdout
    # The lab's hosts are offline: no network attempt, the workstation's uv goes straight over.
    assert "offline host: installer and pip not tried" in result.stdout
    assert provisioned.remote(f"{uv} --version").startswith("uv ")
    assert provisioned.remote(f"stat -c %i {venv}/pyvenv.cfg") != before


def test_deploy_harness_twice_uploads_nothing(provisioned):
    harness = EvalLayout(provisioned.entry).harness_root
    first = run_fab(provisioned.inventory_path, "deploy-harness")
    assert first.returncode == 0, first.stderr
    short = provisioned.remote(f"readlink {harness}/current").strip()
    before = provisioned.remote(f"stat -c '%i %Y' {harness}/{short}")
    second = run_fab(provisioned.inventory_path, "deploy-harness")
    assert second.returncode == 0, second.stderr
    assert f"harness {short} already deployed and current; nothing uploaded" in second.stdout
    assert provisioned.remote(f"stat -c '%i %Y' {harness}/{short}") == before


def test_changed_harness_gets_new_hash_and_current_switches(provisioned, tmp_path):
    source = tmp_path / "dflash_eval"
    shutil.copytree(HARNESS_SOURCE, source, ignore=shutil.ignore_patterns("__pycache__"))
    with (source / "__init__.py").open("a") as init:
        init.write("\nCHANGED_IN_TEST = True\n")
    original = harness_hash()
    host = provisioned.host()
    entry = provisioned.entry
    messages: list[str] = []
    try:
        deployed = deploy_harness(host, entry, source, say=messages.append)
        assert deployed.uploaded and deployed.switched and deployed.digest != original
        new = short_hash(deployed.digest)
        harness = EvalLayout(entry).harness_root
        assert host.run(f"readlink {harness}/current").stdout.strip() == new
        python = f"{entry.venv.path}/bin/python"
        imported = host.run(
            f"cd {harness}/current && {python} -c 'import dflash_eval; "
            "print(dflash_eval.CHANGED_IN_TEST)'"
        )
        assert imported.stdout.strip() == "True"
        # Back to the repository's harness: already on the host, so only `current` moves.
        back = deploy_harness(host, entry, say=messages.append)
        assert not back.uploaded and back.switched
        assert host.run(f"readlink {harness}/current").stdout.strip() == (short_hash(original))
    finally:
        host.close()


def test_wheelhouse_mode_pushes_wheels_and_installs_without_index(provisioned, monkeypatch):
    monkeypatch.setenv("DFLASH_WHEELHOUSE", str(provisioned.lab.root / "wheelhouse-cache"))
    airgapped = provisioned.variant("wheelhouse", wheelhouse=True, extra_index_url=[])
    result = run_fab(airgapped, "setup-eval-host", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no index" in result.stdout and "wheel(s) pushed" in result.stdout
    wheels = provisioned.remote(f"ls {provisioned.entry.workdir}/wheelhouse")
    assert "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl" in wheels
    record = json.loads(
        provisioned.host(airgapped)
        .run(f"cat {EvalLayout(provisioned.entry).provision_record}")
        .stdout
    )
    assert record["sources"]["no_index"] is True


# --- a venv the tool did not make ----------------------------------------------------------


@pytest.fixture
def handmade(provisioned: Provisioned) -> Iterator[tuple[Path, str]]:
    """A venv the user made at another venv.path (no provision record), holding a file of
    theirs: the inventory pointing at it, and its path. Removed afterwards."""
    entry = provisioned.entry
    path = f"{Path(entry.venv.path).parent}/users-venv"
    uv = f"{EvalLayout(entry).uv_dir}/uv"
    provisioned.remote(
        f"{uv} venv --quiet --python {entry.venv.python} {path} && echo kept > {path}/notes.txt"
    )
    try:
        yield provisioned.variant("handmade", path=path), path
    finally:
        provisioned.remote(f"rm -rf {path}")


def _fab_error(result) -> str:
    return " ".join(result.stderr.split())


def test_a_venv_the_tool_did_not_make_is_left_alone_until_replace_is_said(provisioned, handmade):
    inventory, path = handmade
    inode = provisioned.remote(f"stat -c %i {path}/pyvenv.cfg")
    for flags in ((), ("--force",)):
        refused = run_fab(inventory, "setup-eval-host", *flags)
        assert refused.returncode == 1, refused.stdout
        message = _fab_error(refused)
        assert f"eval: {path} holds a venv without a provision record" in message
        assert "did not make it and changed nothing" in message
        assert "--adopt" in message and "--replace" in message and "venv.path" in message
        assert "Traceback" not in refused.stderr
        assert provisioned.remote(f"cat {path}/notes.txt").strip() == "kept"
        assert provisioned.remote(f"stat -c %i {path}/pyvenv.cfg") == inode

    provisioned.remote(f"rm {path}/pyvenv.cfg")  # now a directory of the user's, no venv
    refused = run_fab(inventory, "setup-eval-host", "--replace")
    assert refused.returncode == 1
    assert f"{path} exists and is not a venv (no pyvenv.cfg)" in _fab_error(refused)
    assert provisioned.remote(f"cat {path}/notes.txt").strip() == "kept"

    provisioned.remote(f"touch {path}/pyvenv.cfg")
    replaced = run_fab(inventory, "setup-eval-host", "--replace", timeout=300)
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    assert f"deleting {path}, a venv dflash-ops did not make" in replaced.stdout
    assert provisioned.remote(f"ls -A {path}").split().count("notes.txt") == 0
    record = json.loads(provisioned.remote(f"cat {path}/dflash-provision.json"))
    assert record["origin"] == "created"


def test_adopt_installs_into_the_users_venv_records_it_and_never_deletes_it(provisioned, handmade):
    inventory, path = handmade
    adopted = run_fab(inventory, "setup-eval-host", "--adopt", timeout=300)
    assert adopted.returncode == 0, adopted.stdout + adopted.stderr
    assert "adopting a venv dflash-ops did not make" in adopted.stdout
    assert "venv created" not in adopted.stdout
    assert provisioned.remote(f"cat {path}/notes.txt").strip() == "kept"
    record = json.loads(provisioned.remote(f"cat {path}/dflash-provision.json"))
    assert record["origin"] == "adopted" and record["resolved"]["torch"] == "2.13.0+cpu"
    assert "eval: nothing to do" in run_fab(inventory, "setup-eval-host").stdout

    forced = run_fab(inventory, "setup-eval-host", "--force")
    assert forced.returncode == 1
    assert "was adopted, not made, by dflash-ops" in _fab_error(forced)
    assert provisioned.remote(f"cat {path}/notes.txt").strip() == "kept"


# --- a disk that is too small --------------------------------------------------------------


def test_too_small_disk_is_refused_with_numbers(make_lab):
    tiny = make_lab(eval_disk="64m")
    result = run_fab(tiny.inventory_path, "setup-eval-host", "--host", "eval")
    assert result.returncode == 1
    message = " ".join(result.stderr.split())
    venv = load_inventory(tiny.inventory_path).eval_hosts["eval"].venv.path
    assert f"eval: not enough free space at {venv}" in message
    assert "need 2.0 GiB" in message and "free 6" in message  # ~64 MiB free
    assert "Traceback" not in result.stderr
    assert not (tiny.data_dir("eval") / "venv").exists()
