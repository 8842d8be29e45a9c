"""Where `make demo` builds its labs: a new directory of its own per run, and one demo per
checkout at a time (tests/lab/test_demo_lab.py runs it beside a lab that is up)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dflash_lab import demo
from dflash_ops.core.errors import LabError
from tests.conftest import REPO


def test_each_run_gets_a_new_private_directory(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    first, second = demo.run_directory(None), demo.run_directory(None)
    assert first != second and {first.parent, second.parent} == {tmp_path}
    for made in (first, second):
        assert list(made.iterdir()) == [] and made.stat().st_mode & 0o777 == 0o700


def test_a_named_directory_is_made_by_the_run_or_refused(tmp_path):
    named = tmp_path / "named" / "demo"
    assert demo.run_directory(str(named)) == named and named.is_dir()
    (named / "lab.json").write_text("{}")  # another demo's lab, say
    with pytest.raises(LabError, match=f"DFLASH_DEMO_DIR {named} already exists"):
        demo.run_directory(str(named))
    assert (named / "lab.json").read_text() == "{}"


def test_a_second_demo_of_the_same_checkout_is_refused_while_one_runs(tmp_path):
    results = tmp_path / "demo-results"
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'remote'}:{REPO}",
        "TMPDIR": str(tmp_path),
        "DFLASH_DEMO_RESULTS": str(results),
        "DFLASH_DEMO_DIR": str(tmp_path / "second"),
    }
    with demo.results_lock(results):
        second = subprocess.run(
            [sys.executable, "-m", "dflash_lab.demo"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert second.returncode == 1, second.stdout + second.stderr
    assert "another demo is running in this checkout" in second.stderr
    assert not (tmp_path / "second").exists() and not results.exists()
