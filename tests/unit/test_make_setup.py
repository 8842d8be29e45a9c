"""`make setup` is done only when scripts/setup.sh finished: a setup cut short (Ctrl-C during
pip) is redone by the next `make`, whatever it left in .venv."""

from __future__ import annotations

import shutil
import subprocess

from tests.conftest import REPO


def planned(checkout) -> str:
    """What `make setup` would run there (make -n: nothing is run)."""
    return subprocess.run(
        ["make", "-n", "setup"], cwd=checkout, capture_output=True, text=True, check=True
    ).stdout


def test_a_setup_cut_short_is_redone_by_the_next_make(tmp_path):
    for name in ("Makefile", "pyproject.toml", "scripts/setup.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tmp_path / name)
    # What an interrupted setup can leave: a venv with an empty, non-executable `fab`.
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "fab").touch()
    assert "scripts/setup.sh" in planned(tmp_path)
    # setup.sh's last step, once `fab` ran: from then on there is nothing to do.
    (tmp_path / ".venv" / ".setup-complete").touch()
    assert "scripts/setup.sh" not in planned(tmp_path)
