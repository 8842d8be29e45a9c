"""The lab tier: real sshd hosts (the session `lab`, or `make_lab` for a test that changes
one), random-byte or trained checkpoints, and no venvs: a test that sets up an eval host
belongs in tests/e2e, and fails here saying so."""

from __future__ import annotations

import pytest

from dflash_ops.provision import setup


@pytest.fixture(autouse=True)
def _no_venvs(monkeypatch):
    """Every way of setting up an eval host (the fab task, `setup_eval_hosts`, however it was
    imported) creates its venv through this one name."""

    def refuse(*args, **kwargs):
        pytest.fail("a lab-tier test sets up no eval host (a venv): it belongs in tests/e2e")

    monkeypatch.setattr(setup, "create_venv", refuse)
