"""Modes of the tool's own choosing, whatever the login's umask: with a umask of 000 on the
lab hosts (their shell's ~/.bashrc sets it for every ssh command) and on the workstation,
nothing staged, locked, fetched or reported is group- or world-writable; directories are
0755, files 0644, locks 0600."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_ops.core.files import make_dirs, write_atomic
from dflash_ops.core.inventory import load as load_inventory
from dflash_ops.evaluation import figures, results
from dflash_ops.remote.connection import Host
from dflash_ops.staging.delivery import StageOptions
from dflash_ops.staging.stage import stage
from dflash_ops.ui import report
from tests.unit.test_report import pull


@pytest.fixture
def careless_umask() -> Iterator[None]:
    """The workstation's umask at 000 for the test (put back after it)."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def modes(root: Path) -> dict[str, int]:
    """Path (relative to `root`) → permission bits, for everything under `root`."""
    return {
        str(path.relative_to(root)): stat.S_IMODE(path.lstat().st_mode)
        for path in root.rglob("*")
        if not path.is_symlink()
    }


def writable_by_others(found: dict[str, int]) -> dict[str, str]:
    return {name: oct(mode) for name, mode in found.items() if mode & 0o022}


def test_nothing_staged_is_writable_by_others_whatever_the_umask(make_lab, careless_umask):
    lab = make_lab(steps=(4000,), checkpoint_size="1m")
    for host in ("trainer", "eval"):
        (lab.data_dir(host) / "home" / ".bashrc").write_text("umask 000\n")
    inventory = load_inventory(lab.inventory_path)
    login = Host(inventory, "eval").run("umask", as_login_user=True).stdout.strip()
    assert login == "0000"  # the login's own umask really is the careless one

    stage(inventory, 4000, options=StageOptions(two_hop=True, report=lambda _: None))

    for root in (lab.data_dir("eval") / "eval", lab.workstation_dir / "staging"):
        found = modes(root)
        assert any(name.endswith("checkpoint.pt") for name in found), found
        assert not writable_by_others(found), root
        locks = {name: mode for name, mode in found.items() if name.endswith(".lock")}
        assert locks and set(locks.values()) == {0o600}, locks
        directories = {n for n in found if (root / n).is_dir()}
        assert {found[n] for n in directories} <= {0o755, 0o700}
        assert {found[n] for n in set(found) - directories - set(locks)} == {0o644}


def test_what_the_workstation_writes_has_its_own_modes(tmp_path, careless_umask):
    root = tmp_path / "results"
    write_atomic(root / "watch" / "state.json", json.dumps({"version": 1}))
    make_dirs(root / "private", 0o700)
    pull(root, 2000, 2.0)
    comparison = results.compare(results.load_runs(root))
    report.write(comparison, root / report.REPORT_NAME)
    figures.plot(comparison, root / "plots")
    found = modes(root)
    assert found["watch"] == found["plots"] == 0o755 and found["private"] == 0o700
    assert found["watch/state.json"] == found["report.html"] == 0o644
    assert found["plots/tau_vs_step.png"] == 0o644
