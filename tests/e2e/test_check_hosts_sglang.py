"""`fab check-hosts` asks each eval host's SGLang server what it serves, from that host (the
SGLang stand-in runs in the eval host's namespace, which the workstation does not reach).

e2e tier: the served check runs in the eval venv, so the shared provisioned `e2e_lab`;
read-only, it leaves the lab as it was.
"""

from __future__ import annotations

from pathlib import Path
from subprocess import CompletedProcess

import pytest

from dflash_ops.core.inventory import load
from dflash_ops.evaluation.served import CHECK
from dflash_ops.remote import checks
from dflash_ops.remote.checks import Row, Status
from tests.conftest import run_fab
from tests.e2e.conftest import with_sglang_url
from tests.sglang_stand_in import started_in

pytestmark = pytest.mark.long(95)  # seconds in a cold `make test` (5 workers)


def check_hosts(inventory_path: Path, monkeypatch) -> tuple[CompletedProcess, Row]:
    """`fab check-hosts`, and the eval host's SGLang row as the task computed it (its detail
    unwrapped: the table folds long ones): one check of every host per call."""
    computed: list[list[Row]] = []
    check_inventory = checks.check_inventory

    def recorded(*args, **kwargs) -> list[Row]:
        computed.append(check_inventory(*args, **kwargs))
        return computed[-1]

    monkeypatch.setattr(checks, "check_inventory", recorded)
    done = run_fab(inventory_path, "check-hosts", "-v")
    [rows] = computed
    assert [row.host for row in rows if row.check == CHECK] == ["eval"]  # only it has a URL
    row = next(row for row in rows if row.check == CHECK)
    assert done.returncode == (1 if checks.failed(rows) else 0), done.stdout + done.stderr
    assert (row in checks.failed(rows)) == (row.status is Status.FAIL)
    return done, row


@pytest.fixture
def target(e2e_lab) -> str:
    return load(e2e_lab.inventory_path).eval_hosts["eval"].target_model


def test_a_server_serving_the_target_passes(e2e_lab, target, tmp_path, monkeypatch):
    log = tmp_path / "requests.jsonl"
    with started_in(e2e_lab, "eval", target, log) as (_, url):
        secret = url.replace("http://", "http://u:s3cret@")  # credentials reach no output
        inventory_path = with_sglang_url(e2e_lab, secret, tmp_path)
        done, row = check_hosts(inventory_path, monkeypatch)
    assert row.status is Status.OK, row
    assert row.detail == (
        f"{url}/*** serves {target} (version 0.0.0-stand-in): the inventory's target {target}"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sglang server" in done.stdout and "s3cret" not in done.stdout + done.stderr
    assert not log.exists()  # asked what it serves, never asked to generate


def test_a_server_serving_another_model_fails_naming_both(e2e_lab, target, tmp_path, monkeypatch):
    other = "/srv/models/another-model"
    with started_in(e2e_lab, "eval", target, tmp_path / "log", "--model-path", other) as (_, url):
        inventory_path = with_sglang_url(e2e_lab, url, tmp_path)
        done, row = check_hosts(inventory_path, monkeypatch)
    assert row.status is Status.FAIL, row
    assert f"SGLang at {url} serves {other}, but the target is {target}" in row.detail
    assert "Start SGLang with --model-path for this target" in row.detail
    assert done.returncode == 1
    assert "required check(s) failed: eval sglang server" in done.stderr


def test_an_unreachable_server_fails_with_what_to_do(e2e_lab, tmp_path, monkeypatch):
    nowhere = "http://127.0.0.1:9"  # the eval host's own loopback: nothing listens there
    inventory_path = with_sglang_url(e2e_lab, nowhere, tmp_path)
    done, row = check_hosts(inventory_path, monkeypatch)
    assert row.status is Status.FAIL, row
    assert "required check(s) failed: eval sglang server" in done.stderr
    assert f"Cannot reach the SGLang server at {nowhere}" in row.detail
    assert "Start it on the eval host" in row.detail


def test_a_server_that_is_not_sglang_fails(e2e_lab, target, tmp_path, monkeypatch):
    """A server without SGLang's native /get_model_info (a proxy, another server)."""
    with started_in(e2e_lab, "eval", target, tmp_path / "log", "--mode", "no-info") as (_, url):
        done, row = check_hosts(with_sglang_url(e2e_lab, url, tmp_path), monkeypatch)
    assert row.status is Status.FAIL, row
    assert "required check(s) failed: eval sglang server" in done.stderr
    assert f"SGLang's /get_model_info at {url} answered HTTP 404" in row.detail
